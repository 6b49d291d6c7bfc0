#include "server/service/tensor_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/core/float16.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve::service {
namespace {

// The wire is little-endian; so is every host this builds for, which lets a tensor's bytes
// be copied as they are.
static_assert(std::endian::native == std::endian::little);

// The exponent field all ones: infinity or NaN.
bool Fp16IsFinite(uint16_t bits) { return (bits & 0x7c00u) != 0x7c00u; }

absl::Status NonFinite(absl::string_view field, int64_t index, float value) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": element ", index, " is ",
                                                 std::isnan(value) ? "NaN" : "infinite",
                                                 "; inputs must be finite"));
}

template <typename Wire>
std::vector<Wire> CopyElements(const std::string& data) {
  std::vector<Wire> elements(data.size() / sizeof(Wire));
  // An empty vector's data() may be null, and memcpy's pointers must not be even for 0 bytes.
  if (!elements.empty()) std::memcpy(elements.data(), data.data(), elements.size() * sizeof(Wire));
  return elements;
}

absl::StatusOr<std::vector<Bf16>> ToBf16(v1::DType dtype, const std::string& data,
                                         absl::string_view field) {
  std::vector<Bf16> values;
  switch (dtype) {
    case v1::DTYPE_BF16: {
      values = CopyElements<Bf16>(data);
      const std::size_t i = FirstNonFinite(values);
      if (i < values.size()) return NonFinite(field, i, values[i].ToFloat());
      return values;
    }
    case v1::DTYPE_FP16: {
      const std::vector<Fp16> halves = CopyElements<Fp16>(data);
      values.resize(halves.size());
      for (std::size_t i = 0; i < halves.size(); ++i) {
        if (!Fp16IsFinite(halves[i].bits)) return NonFinite(field, i, halves[i].ToFloat());
        values[i] = Bf16::FromFloat(halves[i].ToFloat());  // exact range, 3 fewer mantissa bits
      }
      return values;
    }
    case v1::DTYPE_FP32: {
      const std::vector<float> floats = CopyElements<float>(data);
      values.resize(floats.size());
      for (std::size_t i = 0; i < floats.size(); ++i) {
        if (!std::isfinite(floats[i])) return NonFinite(field, i, floats[i]);
        values[i] = Bf16::FromFloat(floats[i]);
        if (!values[i].IsFinite()) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ": element ", i, " (", floats[i], ") overflows bf16"));
        }
      }
      return values;
    }
    default:
      break;
  }
  return absl::InternalError(absl::StrCat(field, ": unchecked dtype"));
}

}  // namespace

std::size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      return 2;
    case v1::DTYPE_FP32:
      return 4;
    default:
      return 0;
  }
}

namespace {

absl::StatusOr<std::size_t> ElementSize(const v1::Tensor& tensor, absl::string_view field) {
  const std::size_t element_size = DTypeSize(tensor.dtype());
  if (element_size > 0) return element_size;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": dtype ",
      v1::DType_Name(tensor.dtype()).empty() ? absl::StrCat(static_cast<int>(tensor.dtype()))
                                             : v1::DType_Name(tensor.dtype()),
      " is not one of DTYPE_BF16, DTYPE_FP16, DTYPE_FP32"));
}

// The number of elements the tensor's shape declares, once it is known not to be negative nor
// to overflow (checked before the product is formed) and to match the bytes it carries.
absl::StatusOr<int64_t> CountElements(const v1::Tensor& tensor, std::size_t element_size,
                                      absl::string_view field) {
  const std::span<const int64_t> shape(tensor.shape().data(), tensor.shape().size());
  const int64_t max_elements =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(element_size);
  int64_t elements = 1;
  for (int64_t extent : shape) {
    if (extent < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeToString(shape), " is negative"));
    }
    if (extent > 0 && elements > max_elements / extent) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeToString(shape), " overflows int64"));
    }
    elements *= extent;
  }
  if (static_cast<uint64_t>(elements) * element_size != tensor.data().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", tensor.data().size(), " bytes != ", elements, " elements of ",
                     v1::DType_Name(tensor.dtype()), " (", elements * element_size, " bytes)"));
  }
  return elements;
}

}  // namespace

absl::StatusOr<Bf16Tensor> DecodeToBf16(const v1::Tensor& tensor, std::span<const int64_t> expected,
                                        absl::string_view field) {
  ASSIGN_OR_RETURN(const std::size_t element_size, ElementSize(tensor, field));
  const std::span<const int64_t> shape(tensor.shape().data(), tensor.shape().size());
  if (!ShapeMatches(shape, expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape ", ShapeToString(shape), " != ", ShapeToString(expected)));
  }
  RETURN_IF_ERROR(CountElements(tensor, element_size, field).status());
  absl::StatusOr<std::vector<Bf16>> values = ToBf16(tensor.dtype(), tensor.data(), field);
  if (!values.ok()) return values.status();
  return Bf16Tensor{*std::move(values), std::vector<int64_t>(shape.begin(), shape.end())};
}

absl::StatusOr<Bf16Data> ViewAsBf16(const v1::Tensor& tensor, int rank, absl::string_view field,
                                    std::vector<std::vector<Bf16>>& storage) {
  ASSIGN_OR_RETURN(const std::size_t element_size, ElementSize(tensor, field));
  const std::span<const int64_t> shape(tensor.shape().data(), tensor.shape().size());
  if (static_cast<int>(shape.size()) != rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeToString(shape), " has ",
                                                   shape.size(), " dimensions, not ", rank));
  }
  ASSIGN_OR_RETURN(const int64_t elements, CountElements(tensor, element_size, field));
  Bf16Data out{nullptr, std::vector<int64_t>(shape.begin(), shape.end())};
  const std::string& data = tensor.data();
  // An empty tensor points at the request's (never null, never read) bytes: an empty vector's
  // data() may be null, and callers copy zero bytes from what they get.
  if (elements == 0 || (tensor.dtype() == v1::DTYPE_BF16 &&
                        reinterpret_cast<uintptr_t>(data.data()) % alignof(Bf16) == 0)) {
    out.data = reinterpret_cast<const Bf16*>(data.data());  // the request's own bytes
    return out;
  }
  std::vector<Bf16>& values = storage.emplace_back(static_cast<size_t>(elements));
  switch (tensor.dtype()) {
    case v1::DTYPE_BF16:
      std::memcpy(values.data(), data.data(), data.size());
      break;
    case v1::DTYPE_FP16:
      for (int64_t i = 0; i < elements; ++i) {
        Fp16 half;
        std::memcpy(&half.bits, data.data() + 2 * i, 2);
        values[i] = Bf16::FromFloat(half.ToFloat());  // exact range, 3 fewer mantissa bits
      }
      break;
    default: {  // DTYPE_FP32
      std::vector<float> floats(static_cast<size_t>(elements));
      std::memcpy(floats.data(), data.data(), data.size());
      NarrowToBf16(floats.data(), elements, values.data());
      break;
    }
  }
  out.data = values.data();
  return out;
}

void EncodeValues(const void* values, ElementType type, int64_t count,
                  std::span<const int64_t> shape, v1::DType dtype, v1::Tensor* out) {
  if (DTypeSize(dtype) == 0) dtype = v1::DTYPE_FP32;
  if (type == ElementType::kFp32) {
    EncodeFloats(
        std::span<const float>(static_cast<const float*>(values), static_cast<size_t>(count)),
        shape, dtype, out);
    return;
  }
  const auto* bf16 = static_cast<const Bf16*>(values);
  if (dtype == v1::DTYPE_BF16) {
    out->set_dtype(dtype);
    out->mutable_shape()->Assign(shape.begin(), shape.end());
    out->set_data(reinterpret_cast<const char*>(bf16), static_cast<size_t>(count) * 2);
    return;
  }
  std::vector<float> wide(static_cast<size_t>(count));
  WidenBf16(bf16, count, wide.data());
  EncodeFloats(wide, shape, dtype, out);
}

void EncodeFloats(std::span<const float> values, std::span<const int64_t> shape, v1::DType dtype,
                  v1::Tensor* out) {
  // Callers pass a validated output dtype; anything else is encoded losslessly.
  if (DTypeSize(dtype) == 0) dtype = v1::DTYPE_FP32;
  out->set_dtype(dtype);
  out->mutable_shape()->Assign(shape.begin(), shape.end());
  std::string* data = out->mutable_data();
  data->resize(values.size() * DTypeSize(dtype));
  switch (dtype) {
    case v1::DTYPE_BF16:
      NarrowToBf16(values.data(), static_cast<int64_t>(values.size()),
                   reinterpret_cast<Bf16*>(data->data()));
      return;
    case v1::DTYPE_FP16:
      for (std::size_t i = 0; i < values.size(); ++i) {
        const uint16_t bits = Fp16::FromFloat(values[i]).bits;
        std::memcpy(data->data() + 2 * i, &bits, 2);
      }
      return;
    default:  // DTYPE_FP32
      std::memcpy(data->data(), values.data(), values.size() * sizeof(float));
      return;
  }
}

}  // namespace mlaserve::service
