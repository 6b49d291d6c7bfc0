#include "client/tensor_helpers.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/fp8_latent_row.h"

namespace mlaserve::client {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire is little-endian; host bytes are sent as they are");

template <typename T>
v1::Tensor RawTensor(v1::DType dtype, std::span<const T> values, std::span<const int64_t> shape) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  tensor.set_data(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  return tensor;
}

}  // namespace

v1::Tensor Bf16Tensor(std::span<const Bf16> values, std::span<const int64_t> shape) {
  return RawTensor(v1::DTYPE_BF16, values, shape);
}

v1::Tensor Fp16Tensor(std::span<const Fp16> values, std::span<const int64_t> shape) {
  return RawTensor(v1::DTYPE_FP16, values, shape);
}

v1::Tensor Fp32Tensor(std::span<const float> values, std::span<const int64_t> shape) {
  return RawTensor(v1::DTYPE_FP32, values, shape);
}

v1::Tensor FloatTensor(std::span<const float> values, std::span<const int64_t> shape,
                       v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16: {
      std::vector<Bf16> converted(values.size());
      for (size_t i = 0; i < values.size(); ++i) converted[i] = Bf16::FromFloat(values[i]);
      return Bf16Tensor(converted, shape);
    }
    case v1::DTYPE_FP16: {
      std::vector<Fp16> converted(values.size());
      for (size_t i = 0; i < values.size(); ++i) converted[i] = Fp16::FromFloat(values[i]);
      return Fp16Tensor(converted, shape);
    }
    default:
      return Fp32Tensor(values, shape);
  }
}

int64_t ElementCount(const v1::Tensor& tensor) {
  int64_t count = 1;
  for (int64_t extent : tensor.shape()) count *= extent;
  return count;
}

absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor) {
  const size_t element_size = DTypeSize(tensor.dtype());
  const int64_t count = ElementCount(tensor);
  if (element_size == 0 || count < 0 ||
      static_cast<size_t>(count) * element_size != tensor.data().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of dtype ", v1::DType_Name(tensor.dtype()), " and ", count,
                     " elements carries ", tensor.data().size(), " bytes"));
  }
  std::vector<float> values(static_cast<size_t>(count));
  const char* data = tensor.data().data();
  for (size_t i = 0; i < values.size(); ++i) {
    if (element_size == 4) {
      std::memcpy(&values[i], data + 4 * i, 4);
      continue;
    }
    uint16_t bits;
    std::memcpy(&bits, data + 2 * i, 2);
    values[i] = tensor.dtype() == v1::DTYPE_BF16 ? Bf16::FromBits(bits).ToFloat()
                                                 : Fp16::FromBits(bits).ToFloat();
  }
  return values;
}

v1::Fp8Rows QuantizeFp8Rows(std::span<const Bf16> rows, int dl, int dr) {
  const int width = dl + dr;
  const int64_t n = static_cast<int64_t>(rows.size()) / width;
  const int64_t row_bytes = dl + static_cast<int64_t>(sizeof(float)) + 2 * int64_t{dr};
  v1::Fp8Rows out;
  out.set_count(n);
  std::string& data = *out.mutable_data();
  data.resize(static_cast<size_t>(n * row_bytes));
  for (int64_t r = 0; r < n; ++r) {
    QuantizeLatentRowToRecord(rows.data() + r * width, dl, dr,
                              reinterpret_cast<std::byte*>(data.data() + r * row_bytes));
  }
  return out;
}

v1::Tensor SliceOuter(const v1::Tensor& tensor, int64_t first, int64_t count) {
  v1::Tensor slice;
  slice.set_dtype(tensor.dtype());
  slice.add_shape(count);
  for (int d = 1; d < tensor.shape_size(); ++d) slice.add_shape(tensor.shape(d));
  // A tensor whose bytes do not match its shape slices to whatever bytes there are; the
  // server names what is wrong with it.
  if (tensor.shape_size() == 0 || tensor.shape(0) <= 0 || first < 0 || count < 0) return slice;
  const size_t entry_bytes = tensor.data().size() / static_cast<size_t>(tensor.shape(0));
  const size_t begin = std::min(tensor.data().size(), static_cast<size_t>(first) * entry_bytes);
  slice.set_data(tensor.data().substr(begin, static_cast<size_t>(count) * entry_bytes));
  return slice;
}

}  // namespace mlaserve::client
