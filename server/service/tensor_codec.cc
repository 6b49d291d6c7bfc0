#include "server/service/tensor_codec.h"

#include <algorithm>
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
// to overflow (checked before the product is formed).
absl::StatusOr<int64_t> CountDeclared(const v1::Tensor& tensor, std::size_t element_size,
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
  return elements;
}

// ... and that it matches the bytes it carries.
absl::StatusOr<int64_t> CountElements(const v1::Tensor& tensor, std::size_t element_size,
                                      absl::string_view field) {
  ASSIGN_OR_RETURN(const int64_t elements, CountDeclared(tensor, element_size, field));
  if (static_cast<uint64_t>(elements) * element_size != tensor.data().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", tensor.data().size(), " bytes != ", elements, " elements of ",
                     v1::DType_Name(tensor.dtype()), " (", elements * element_size, " bytes)"));
  }
  return elements;
}

class InlineBytes final : public TensorBytes {
 public:
  absl::StatusOr<absl::string_view> Bytes(const v1::Tensor& tensor, absl::string_view field,
                                          uint64_t size, TensorUse /*use*/) override {
    if (tensor.has_region_offset()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ".region_offset: only the same-host data plane reads a caller's "
                       "registered memory; over gRPC a tensor's bytes are in `data`"));
    }
    if (size != tensor.data().size()) {
      const std::size_t element_size = DTypeSize(tensor.dtype());
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", tensor.data().size(), " bytes != ", size / element_size,
                       " elements of ", v1::DType_Name(tensor.dtype()), " (", size, " bytes)"));
    }
    return absl::string_view(tensor.data());
  }
};

}  // namespace

TensorBytes& InlineTensorBytes() {
  static InlineBytes* const source = new InlineBytes();  // stateless
  return *source;
}

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
                                    std::vector<std::vector<Bf16>>& storage, TensorBytes& source,
                                    TensorUse use) {
  ASSIGN_OR_RETURN(const std::size_t element_size, ElementSize(tensor, field));
  const std::span<const int64_t> shape(tensor.shape().data(), tensor.shape().size());
  if (static_cast<int>(shape.size()) != rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeToString(shape), " has ",
                                                   shape.size(), " dimensions, not ", rank));
  }
  ASSIGN_OR_RETURN(const int64_t elements, CountDeclared(tensor, element_size, field));
  ASSIGN_OR_RETURN(
      const absl::string_view data,
      source.Bytes(tensor, field, static_cast<uint64_t>(elements) * element_size, use));
  Bf16Data out{nullptr, std::vector<int64_t>(shape.begin(), shape.end())};
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

namespace {

void EncodeFloatsTo(const float* values, int64_t count, v1::DType dtype, void* out) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      NarrowToBf16(values, count, static_cast<Bf16*>(out));
      return;
    case v1::DTYPE_FP16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t bits = Fp16::FromFloat(values[i]).bits;
        std::memcpy(static_cast<char*>(out) + 2 * i, &bits, 2);
      }
      return;
    default:  // DTYPE_FP32
      if (count > 0) std::memcpy(out, values, static_cast<size_t>(count) * sizeof(float));
      return;
  }
}

void SetDeclaration(v1::DType dtype, std::span<const int64_t> shape, v1::Tensor* out) {
  out->set_dtype(dtype);
  out->mutable_shape()->Assign(shape.begin(), shape.end());
}

}  // namespace

namespace {

// `out` aligned for `dtype`.
void EncodeAligned(const void* values, ElementType type, int64_t count, v1::DType dtype,
                   void* out) {
  if (type == ElementType::kFp32) {
    EncodeFloatsTo(static_cast<const float*>(values), count, dtype, out);
    return;
  }
  const auto* bf16 = static_cast<const Bf16*>(values);
  if (dtype == v1::DTYPE_BF16) {
    if (count > 0) std::memcpy(out, bf16, static_cast<size_t>(count) * 2);
    return;
  }
  std::vector<float> wide(static_cast<size_t>(count));
  WidenBf16(bf16, count, wide.data());
  EncodeFloatsTo(wide.data(), count, dtype, out);
}

}  // namespace

void EncodeValuesTo(const void* values, ElementType type, int64_t count, v1::DType dtype,
                    void* out) {
  // Callers pass a validated output dtype; anything else is encoded losslessly.
  if (DTypeSize(dtype) == 0) dtype = v1::DTYPE_FP32;
  const size_t element = DTypeSize(dtype);
  if (reinterpret_cast<uintptr_t>(out) % element == 0) {
    EncodeAligned(values, type, count, dtype, out);
    return;
  }
  // A message's bytes start anywhere: through an aligned buffer, a cache's worth at a time.
  constexpr int64_t kChunk = 2048;
  alignas(64) unsigned char buffer[kChunk * sizeof(float)];
  const size_t in_size = type == ElementType::kFp32 ? sizeof(float) : sizeof(Bf16);
  for (int64_t i = 0; i < count; i += kChunk) {
    const int64_t n = std::min(kChunk, count - i);
    EncodeAligned(static_cast<const char*>(values) + i * in_size, type, n, dtype, buffer);
    std::memcpy(static_cast<char*>(out) + i * element, buffer, static_cast<size_t>(n) * element);
  }
}

void EncodeValues(const void* values, ElementType type, int64_t count,
                  std::span<const int64_t> shape, v1::DType dtype, v1::Tensor* out) {
  if (DTypeSize(dtype) == 0) dtype = v1::DTYPE_FP32;
  SetDeclaration(dtype, shape, out);
  std::string* data = out->mutable_data();
  data->resize(static_cast<size_t>(count) * DTypeSize(dtype));
  EncodeValuesTo(values, type, count, dtype, data->data());
}

void EncodeFloats(std::span<const float> values, std::span<const int64_t> shape, v1::DType dtype,
                  v1::Tensor* out) {
  EncodeValues(values.data(), ElementType::kFp32, static_cast<int64_t>(values.size()), shape, dtype,
               out);
}

}  // namespace mlaserve::service
