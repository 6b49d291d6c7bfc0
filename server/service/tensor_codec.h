#ifndef MLASERVE_SERVER_SERVICE_TENSOR_CODEC_H_
#define MLASERVE_SERVER_SERVICE_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/bfloat16.h"
#include "mlaserve/v1/tensor.pb.h"

namespace mlaserve::service {

// Wire tensors (mlaserve.v1.Tensor: dtype, shape, raw little-endian row-major bytes) to and
// from the engine's element types.

// A dimension of an expected shape that the request chooses (a row count); it must be >= 1.
inline constexpr int64_t kAnyExtent = -1;

// Bytes per element; 0 for DTYPE_UNSPECIFIED and values outside the enum.
std::size_t DTypeSize(v1::DType dtype);

// A wire tensor after validation, in bf16, the engine's storage type.
struct Bf16Tensor {
  std::vector<Bf16> values;
  std::vector<int64_t> shape;
};

// Checks `tensor` against `expected` (same rank; every fixed extent equal; every kAnyExtent
// at least 1), its dtype (BF16, FP16 or FP32) and its byte length, converts it to bf16
// (round to nearest even) and refuses NaN and infinities, including fp32 values too large
// for bf16. Every error is INVALID_ARGUMENT and starts with `field`, e.g.
//   queries[3].head.q_nope: shape [1,128,64] != [1,128,128]
absl::StatusOr<Bf16Tensor> DecodeToBf16(const v1::Tensor& tensor,
                                        std::span<const int64_t> expected,
                                        absl::string_view field);

// Writes fp32 values into `out` as `dtype` (BF16, FP16 or FP32; bf16 and fp16 round to
// nearest even) with the given shape, whose product must be values.size().
void EncodeFloats(std::span<const float> values, std::span<const int64_t> shape,
                  v1::DType dtype, v1::Tensor* out);

// "[1,128,64]"; kAnyExtent prints as "n".
std::string ShapeToString(std::span<const int64_t> shape);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_TENSOR_CODEC_H_
