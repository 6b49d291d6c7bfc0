#ifndef MLASERVE_KERNELS_MLA_RESCALE_ALGORITHM_H_
#define MLASERVE_KERNELS_MLA_RESCALE_ALGORITHM_H_

#include <string_view>

namespace mlaserve {

// How an attention kernel's output accumulator follows the running max between KV blocks.
// The host row kernels and the emulated NPU's attention kernel both come in these two forms.
enum class RescaleAlgorithm {
  // AMLA (docs/numerics.md, "AMLA"): the accumulator is rescaled by an int32 add on its fp32 bits,
  // so on
  // the NPU it never leaves global memory.
  kAmla,
  // Base FlashAttention-2 (docs/numerics.md, "Base"): the accumulator is multiplied by exp(m_old -
  // m_new).
  kBase,
};

constexpr std::string_view RescaleAlgorithmName(RescaleAlgorithm algorithm) {
  return algorithm == RescaleAlgorithm::kAmla ? "amla" : "base";
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_RESCALE_ALGORITHM_H_
