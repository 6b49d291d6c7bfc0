#ifndef MLASERVE_KERNELS_CORE_ELEMENT_TYPE_H_
#define MLASERVE_KERNELS_CORE_ELEMENT_TYPE_H_

#include <cstdint>

namespace mlaserve {

// The element types a batch's buffers and answers come in: bf16 (the KV cache's and the
// matrix unit's) and fp32 (accumulators, LSEs, unrounded answers).
enum class ElementType { kBf16, kFp32 };

constexpr int64_t ElementBytes(ElementType type) { return type == ElementType::kBf16 ? 2 : 4; }

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_ELEMENT_TYPE_H_
