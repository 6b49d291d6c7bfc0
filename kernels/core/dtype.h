#ifndef MLASERVE_KERNELS_CORE_DTYPE_H_
#define MLASERVE_KERNELS_CORE_DTYPE_H_

#include <cstddef>
#include <string_view>

namespace mlaserve {

// Element types that cross an API boundary (wire tensors, weight files, caches).
enum class DType { kBf16, kFp16, kFp32, kFp8E4m3 };

constexpr std::size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kBf16:
    case DType::kFp16:
      return 2;
    case DType::kFp32:
      return 4;
    case DType::kFp8E4m3:
      return 1;
  }
  return 0;
}

constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp32:
      return "fp32";
    case DType::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "?";
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_DTYPE_H_
