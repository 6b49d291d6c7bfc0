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
#include "kernels/core/element_type.h"
#include "mlaserve/v1/tensor.pb.h"
#include "proto/dtype_size.h"
#include "server/engine/tensor_shape.h"

namespace mlaserve::service {

// Wire tensors (mlaserve.v1.Tensor: dtype, shape, raw little-endian row-major bytes) to and
// from the engine's element types.

using engine::kAnyExtent;
using engine::ShapeMatches;
using engine::ShapeToString;

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
absl::StatusOr<Bf16Tensor> DecodeToBf16(const v1::Tensor& tensor, std::span<const int64_t> expected,
                                        absl::string_view field);

// Where a tensor's bytes are: in the message (`data`, gRPC), or at `region_offset` of the
// caller's registered memory (the same-host data plane), whose source copies them out first
// so that what is checked is what the engine reads.
// What a tensor's bytes are for: a source may leave queries where they are for a device that
// reads them itself, while rows for the cache are always the server's own copy.
enum class TensorUse { kQueries, kRows };

class TensorBytes {
 public:
  virtual ~TensorBytes() = default;
  // The `size` bytes of `tensor` (its dtype and shape already checked), or INVALID_ARGUMENT
  // starting with `field`.
  virtual absl::StatusOr<absl::string_view> Bytes(const v1::Tensor& tensor, absl::string_view field,
                                                  uint64_t size, TensorUse use) = 0;
};

// The bytes in the message: `data`, of exactly the declared size; a region_offset is refused.
TensorBytes& InlineTensorBytes();

// A wire tensor's dtype and byte length checked against its own shape, and its values as
// bf16: a view of the tensor's bytes when they are bf16 (nothing copied; they must outlive
// the view), otherwise converted (round to nearest even) into a vector appended to
// `storage`. Extents and values are the caller's to check (the engine's, for Decode).
// INVALID_ARGUMENT starting with `field` for an unknown dtype, a rank other than `rank`, a
// negative or overflowing extent, or bytes that do not match.
struct Bf16Data {
  const Bf16* data = nullptr;
  std::vector<int64_t> shape;
};
absl::StatusOr<Bf16Data> ViewAsBf16(const v1::Tensor& tensor, int rank, absl::string_view field,
                                    std::vector<std::vector<Bf16>>& storage,
                                    TensorBytes& source = InlineTensorBytes(),
                                    TensorUse use = TensorUse::kRows);

// Writes `count` values, bf16 or fp32, to `out` (count * DTypeSize(dtype) bytes) as `dtype`
// (BF16, FP16 or FP32; narrowing rounds to nearest even).
void EncodeValuesTo(const void* values, ElementType type, int64_t count, v1::DType dtype,
                    void* out);

// Writes `count` values, bf16 or fp32, into `out` as `dtype` (BF16, FP16 or FP32; narrowing
// rounds to nearest even; bf16 to BF16 and fp32 to FP32 are plain copies) with `shape`.
void EncodeValues(const void* values, ElementType type, int64_t count,
                  std::span<const int64_t> shape, v1::DType dtype, v1::Tensor* out);

// Writes fp32 values into `out` as `dtype` (BF16, FP16 or FP32; bf16 and fp16 round to
// nearest even) with the given shape, whose product must be values.size().
void EncodeFloats(std::span<const float> values, std::span<const int64_t> shape, v1::DType dtype,
                  v1::Tensor* out);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_TENSOR_CODEC_H_
