#ifndef MLASERVE_BENCH_HOST_DESCRIPTION_H_
#define MLASERVE_BENCH_HOST_DESCRIPTION_H_

#include <string>

namespace mlaserve::bench {

// "host: AMD EPYC 9R45 (2 logical cores), ISA AVX-512 BF16, matrix unit on oneDNN
// brg:avx512_core_bf16": every table a benchmark prints names the machine it ran on.
std::string HostDescription();

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_HOST_DESCRIPTION_H_
