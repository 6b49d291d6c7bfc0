#ifndef MLASERVE_KERNELS_CORE_ELEMENT_TYPE_H_
#define MLASERVE_KERNELS_CORE_ELEMENT_TYPE_H_

#include <cstdint>

namespace mlaserve {

// The element types a batch's buffers and answers come in: bf16 (the KV cache's and the
// matrix unit's), fp32 (accumulators, LSEs, unrounded answers), and raw bytes (memory with a
// layout of its own, such as the FP8 cache's pages).
enum class ElementType { kBf16, kFp32, kByte };

constexpr int64_t ElementBytes(ElementType type) {
  return type == ElementType::kBf16 ? 2 : type == ElementType::kFp32 ? 4 : 1;
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_ELEMENT_TYPE_H_
