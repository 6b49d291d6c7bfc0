#ifndef MLASERVE_TESTS_FUZZ_DECODE_ONCE_H_
#define MLASERVE_TESTS_FUZZ_DECODE_ONCE_H_

#include <cstdint>

#include "mlaserve/v1/decode.pb.h"

namespace mlaserve::fuzz {

// Runs `request` through the fuzz engine's dispatcher and waits for its answer (bounded by
// `timeout_us` when positive, as a DecodeStream request's), then restores the engine's state
// if a query carried an append.
void DecodeOnce(v1::DecodeRequest request, uint64_t timeout_us = 0);

}  // namespace mlaserve::fuzz

#endif  // MLASERVE_TESTS_FUZZ_DECODE_ONCE_H_
