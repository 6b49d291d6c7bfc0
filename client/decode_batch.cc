#include "client/decode_batch.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/serving_client.h"
#include "client/tensor_helpers.h"

namespace mlaserve::client {
namespace {

v1::DType OutputDType(v1::DType dtype) {
  return dtype == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_BF16 : dtype;
}

absl::Status Invalid(absl::string_view argument, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(argument, ": ", problem));
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::Status CheckStacked(const BatchTensor& tensor, absl::string_view name, size_t rank,
                          int64_t sequences) {
  if (DTypeSize(tensor.dtype) == 0) {
    return Invalid(name, absl::StrCat("dtype ", v1::DType_Name(tensor.dtype),
                                      " is not one of DTYPE_BF16, DTYPE_FP16, DTYPE_FP32"));
  }
  if (tensor.shape.size() != rank || tensor.shape[0] != sequences) {
    return Invalid(name, absl::StrCat("want ", rank, " dimensions with ", sequences,
                                      " sequences first, got shape ", Shape(tensor.shape)));
  }
  for (int64_t extent : tensor.shape) {
    if (extent < 0)
      return Invalid(name, absl::StrCat("shape ", Shape(tensor.shape), " is negative"));
  }
  if (tensor.data == nullptr && tensor.elements() > 0) return Invalid(name, "no data");
  return absl::OkStatus();
}

// Sequences [first, first + count) of a stacked tensor, as a wire tensor.
void SliceInto(const BatchTensor& tensor, int64_t first, int64_t count, v1::Tensor* wire,
               PlaceTensor place) {
  wire->set_dtype(tensor.dtype);
  wire->add_shape(count);
  for (size_t d = 1; d < tensor.shape.size(); ++d) wire->add_shape(tensor.shape[d]);
  place(tensor, first, count, wire);
}

void SetOptions(const DecodeBatchRequest& request, v1::DecodeRequest& wire) {
  wire.mutable_options()->set_output_dtype(request.output_dtype);
  if (request.softmax_scale) wire.mutable_options()->set_softmax_scale(*request.softmax_scale);
  if (request.batch_invariant) {
    wire.mutable_options()->set_batch_invariant(*request.batch_invariant);
  }
}

// Copies one answer tensor's bytes to its place in the caller's memory.
// `stacked`: the tensor holds `count` sequences' answers (the packed form); else one's.
absl::Status CopyOut(const v1::Tensor& tensor, v1::DType dtype, absl::string_view name,
                     std::span<std::byte> into, int64_t sequences, int64_t first, int64_t count,
                     bool stacked) {
  if (tensor.dtype() != dtype || tensor.shape_size() == 0 ||
      (stacked ? tensor.shape(0) != count : count != 1) ||
      tensor.data().size() % static_cast<size_t>(count) != 0) {
    return absl::InternalError(absl::StrCat(
        "the server answered ", name, " with shape [", absl::StrJoin(tensor.shape(), ","), "] of ",
        v1::DType_Name(tensor.dtype()), " for ", count, " sequences"));
  }
  const size_t per = tensor.data().size() / static_cast<size_t>(count);
  if (into.size() != per * static_cast<size_t>(sequences)) {
    return Invalid(name, absl::StrCat(into.size(), " bytes for ", sequences,
                                      " sequences; the answers take ", per, " each"));
  }
  if (per > 0) {
    std::memcpy(into.data() + per * static_cast<size_t>(first), tensor.data().data(),
                tensor.data().size());
  }
  return absl::OkStatus();
}

}  // namespace

SharedArray HeapArray(uint64_t bytes) {
  const size_t size = (std::max<uint64_t>(bytes, 1) + 63) / 64 * 64;
  std::shared_ptr<void> owner(::operator new[](size, std::align_val_t{64}),
                              [](void* p) { ::operator delete[](p, std::align_val_t{64}); });
  return SharedArray{std::span<std::byte>(static_cast<std::byte*>(owner.get()), bytes),
                     std::move(owner)};
}

void CopyIntoMessage(const BatchTensor& tensor, int64_t first, int64_t count, v1::Tensor* wire) {
  const size_t per = tensor.bytes() / static_cast<size_t>(tensor.shape[0]);
  wire->set_data(static_cast<const char*>(tensor.data) + per * static_cast<size_t>(first),
                 per * static_cast<size_t>(count));
}

int64_t BatchTensor::elements() const {
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  return shape.empty() ? 0 : n;
}

size_t BatchTensor::bytes() const { return static_cast<size_t>(elements()) * DTypeSize(dtype); }

int64_t DecodeBatchRequest::sq() const {
  const BatchTensor& q = head_space() ? q_nope : latent;
  return q.shape.size() == 4 ? q.shape[1] : 0;
}

int64_t DecodeBatchRequest::heads() const {
  const BatchTensor& q = head_space() ? q_nope : latent;
  return q.shape.size() == 4 ? q.shape[2] : 0;
}

DecodeBatchBuffers::DecodeBatchBuffers(const DecodeBatchRequest& request, int width)
    : out(static_cast<size_t>(request.sequences() * request.sq() * request.heads() * width) *
          DTypeSize(OutputDType(request.output_dtype))),
      lse(static_cast<size_t>(request.sequences() * request.sq() * request.heads())),
      output{out, lse, {}} {}

absl::Status CheckDecodeBatch(const DecodeBatchRequest& request) {
  const int64_t b = request.sequences();
  if (b == 0) return Invalid("sequence_ids", "at least one sequence");
  if (request.latent.present() && (request.q_nope.present() || request.q_pe.present())) {
    return Invalid("latent", "set with q_nope or q_pe: a batch is in one space");
  }
  if (request.head_space()) {
    if (!request.q_nope.present() || !request.q_pe.present()) {
      return Invalid("q_nope", "q_nope and q_pe (a head-space batch) or latent (a latent one)");
    }
    if (absl::Status s = CheckStacked(request.q_nope, "q_nope", 4, b); !s.ok()) return s;
    if (absl::Status s = CheckStacked(request.q_pe, "q_pe", 4, b); !s.ok()) return s;
    if (request.q_pe.shape[1] != request.q_nope.shape[1] ||
        request.q_pe.shape[2] != request.q_nope.shape[2]) {
      return Invalid("q_pe", absl::StrCat("[sq, heads] of shape ", Shape(request.q_pe.shape),
                                          " are not q_nope's ", Shape(request.q_nope.shape)));
    }
  } else if (absl::Status s = CheckStacked(request.latent, "latent", 4, b); !s.ok()) {
    return s;
  }
  if (request.append_rows.present() != !request.append_positions.empty()) {
    return Invalid("append_rows", "append_rows and append_positions go together");
  }
  if (request.append_rows.present()) {
    if (absl::Status s = CheckStacked(request.append_rows, "append_rows", 3, b); !s.ok()) return s;
    if (static_cast<int64_t>(request.append_positions.size()) != b) {
      return Invalid("append_positions",
                     absl::StrCat("want ", b, " positions, got ", request.append_positions.size()));
    }
  }
  if (DTypeSize(OutputDType(request.output_dtype)) == 0) {
    return Invalid("output_dtype",
                   absl::StrCat(v1::DType_Name(request.output_dtype),
                                " is not one of DTYPE_BF16, DTYPE_FP16, DTYPE_FP32"));
  }
  return absl::OkStatus();
}

size_t BatchBytes(const DecodeBatchRequest& request, int64_t first, int64_t count) {
  (void)first;  // sequences are the same size
  size_t bytes = 0;
  for (const BatchTensor* t :
       {&request.q_nope, &request.q_pe, &request.latent, &request.append_rows}) {
    if (t->present() && t->shape[0] > 0) {
      bytes += t->bytes() / static_cast<size_t>(t->shape[0]) * static_cast<size_t>(count);
    }
  }
  return bytes;
}

v1::DecodeRequest PackedDecodeRequest(const DecodeBatchRequest& request, int64_t first,
                                      int64_t count, PlaceTensor place) {
  v1::DecodeRequest wire;
  SetOptions(request, wire);
  v1::PackedQueries& packed = *wire.mutable_packed();
  for (int64_t b = first; b < first + count; ++b) {
    packed.add_sequence_ids(request.sequence_ids[static_cast<size_t>(b)]);
  }
  packed.set_layer(request.layer);
  if (request.head_space()) {
    SliceInto(request.q_nope, first, count, packed.mutable_head()->mutable_q_nope(), place);
    SliceInto(request.q_pe, first, count, packed.mutable_head()->mutable_q_pe(), place);
    packed.mutable_head()->set_first_head(request.first_head);
  } else {
    SliceInto(request.latent, first, count, packed.mutable_latent(), place);
  }
  if (request.append_rows.present()) {
    SliceInto(request.append_rows, first, count, packed.mutable_append_rows(), place);
    for (int64_t b = first; b < first + count; ++b) {
      packed.add_append_positions(request.append_positions[static_cast<size_t>(b)]);
    }
  }
  return wire;
}

v1::DecodeRequest ListDecodeRequest(const DecodeBatchRequest& request, int64_t first,
                                    int64_t count) {
  const v1::DecodeRequest packed = PackedDecodeRequest(request, first, count);
  v1::DecodeRequest wire;
  *wire.mutable_options() = packed.options();
  // Slice b of each stacked tensor, one rank lower.
  auto unstack = [](const v1::Tensor& stacked, int64_t b, v1::Tensor* one) {
    one->set_dtype(stacked.dtype());
    for (int d = 1; d < stacked.shape_size(); ++d) one->add_shape(stacked.shape(d));
    const size_t per = stacked.data().size() / static_cast<size_t>(stacked.shape(0));
    one->set_data(stacked.data().substr(per * static_cast<size_t>(b), per));
  };
  const v1::PackedQueries& p = packed.packed();
  for (int64_t b = 0; b < count; ++b) {
    v1::DecodeQuery& query = *wire.add_queries();
    query.set_sequence_id(p.sequence_ids(static_cast<int>(b)));
    query.set_layer(p.layer());
    query.set_sq(static_cast<int>(request.sq()));
    if (p.has_head()) {
      unstack(p.head().q_nope(), b, query.mutable_head()->mutable_q_nope());
      unstack(p.head().q_pe(), b, query.mutable_head()->mutable_q_pe());
      query.mutable_head()->set_first_head(p.head().first_head());
    } else {
      unstack(p.latent(), b, query.mutable_latent());
    }
    if (p.has_append_rows()) {
      unstack(p.append_rows(), b, query.mutable_append_rows());
      query.set_append_position(p.append_positions(static_cast<int>(b)));
    }
  }
  return wire;
}

absl::Status ReadBatchAnswers(const DecodeBatchRequest& request, v1::DecodeResponse& response,
                              int64_t first, int64_t count, DecodeBatchOutput& output) {
  const v1::DType dtype = OutputDType(request.output_dtype);
  const int64_t sequences = request.sequences();
  const std::span<std::byte> lse = std::as_writable_bytes(output.lse);
  if (response.has_packed()) {
    v1::PackedResults& packed = *response.mutable_packed();
    if (packed.plans_size() != count) {
      return absl::InternalError(absl::StrCat("the server answered ", packed.plans_size(),
                                              " plans for ", count, " sequences"));
    }
    if (absl::Status s =
            CopyOut(packed.out(), dtype, "out", output.out, sequences, first, count, true);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CopyOut(packed.lse(), v1::DTYPE_FP32, "lse", lse, sequences, first, count, true);
        !s.ok()) {
      return s;
    }
    for (v1::DecodePlan& plan : *packed.mutable_plans()) output.plans.push_back(std::move(plan));
    return absl::OkStatus();
  }
  if (response.results_size() != count) {
    return absl::InternalError(
        absl::StrCat("the server answered ", response.results_size(), " queries of ", count));
  }
  for (int64_t b = 0; b < count; ++b) {
    v1::DecodeResult& result = *response.mutable_results(static_cast<int>(b));
    if (absl::Status s =
            CopyOut(result.out(), dtype, "out", output.out, sequences, first + b, 1, false);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CopyOut(result.lse(), v1::DTYPE_FP32, "lse", lse, sequences, first + b, 1, false);
        !s.ok()) {
      return s;
    }
    output.plans.push_back(std::move(*result.mutable_plan()));
  }
  return absl::OkStatus();
}

absl::Status ServingClient::DecodeBatch(const DecodeBatchRequest& request,
                                        DecodeBatchOutput& output) {
  if (absl::Status checked = CheckDecodeBatch(request); !checked.ok()) return checked;
  absl::StatusOr<v1::DecodeResponse> response =
      DecodeRaw(ListDecodeRequest(request, 0, request.sequences()));
  if (!response.ok()) return response.status();
  output.plans.clear();
  return ReadBatchAnswers(request, *response, 0, request.sequences(), output);
}

}  // namespace mlaserve::client
