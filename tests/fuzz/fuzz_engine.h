#ifndef MLASERVE_TESTS_FUZZ_FUZZ_ENGINE_H_
#define MLASERVE_TESTS_FUZZ_FUZZ_ENGINE_H_

#include <memory>

#include "server/engine/engine.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/moved_sequences.h"
#include "server/service/service_metrics.h"

namespace mlaserve::fuzz {

// The real engine on a small model (4 heads, dn 32, dr 16, dl 64, dv 32, 2 layers, 16-token
// pages, a 64 MiB budget, the host device), made once per fuzzer process, with the state
// every input starts from:
//   prefix "p" (20 bf16 tokens), sequences "s" (bf16, on "p", +12 tokens) and "f" (FP8, 30
//   tokens), each on both layers.
// Reset() puts that state back after an input changed it, so that every input meets the
// same engine (libFuzzer's inputs must be replayable one by one).
class FuzzEngine {
 public:
  static FuzzEngine& Get();

  engine::Engine& engine() { return *engine_; }
  service::DecodeDispatcher& dispatcher() { return *dispatcher_; }
  void Reset();

 private:
  FuzzEngine();
  void Populate();

  std::unique_ptr<service::ServiceMetrics> metrics_;
  std::unique_ptr<engine::Engine> engine_;
  // None is ever moved here: the dispatcher's moved-sequence check stays on its fast path.
  service::MovedSequences moved_;
  std::unique_ptr<service::DecodeDispatcher> dispatcher_;
};

}  // namespace mlaserve::fuzz

#endif  // MLASERVE_TESTS_FUZZ_FUZZ_ENGINE_H_
