#ifndef MLASERVE_CLIENT_TENSOR_HELPERS_H_
#define MLASERVE_CLIENT_TENSOR_HELPERS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/float16.h"
#include "mlaserve/v1/tensor.pb.h"
#include "proto/dtype_size.h"

namespace mlaserve::client {

// Host arrays to and from mlaserve.v1.Tensor (raw little-endian, row-major). The product of
// `shape` must equal the number of values.

v1::Tensor Bf16Tensor(std::span<const Bf16> values, std::span<const int64_t> shape);
v1::Tensor Fp16Tensor(std::span<const Fp16> values, std::span<const int64_t> shape);
v1::Tensor Fp32Tensor(std::span<const float> values, std::span<const int64_t> shape);
// fp32 values sent as `dtype`, rounded to nearest even for bf16 and fp16.
v1::Tensor FloatTensor(std::span<const float> values, std::span<const int64_t> shape,
                       v1::DType dtype);

// Any wire tensor as fp32 values (exact for every dtype). INVALID_ARGUMENT if its bytes do
// not match its dtype and shape.
absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor);

// Elements a tensor's shape holds.
int64_t ElementCount(const v1::Tensor& tensor);
// Entries [first, first + count) of the outermost dimension (rows of [n][..], tokens of
// [sq][heads][..]), as a tensor of the same dtype.
v1::Tensor SliceOuter(const v1::Tensor& tensor, int64_t first, int64_t count);

// Latent rows [n][dl + dr] in the FP8 form an FP8 sequence stores (SnapMLA's RoPE-aware
// per-token quantisation, the server's own formula: the bytes equal what the server would
// write from the bf16 rows), ready for an AppendKv of 644 bytes a row instead of 1152.
v1::Fp8Rows QuantizeFp8Rows(std::span<const Bf16> rows, int dl, int dr);

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_TENSOR_HELPERS_H_
