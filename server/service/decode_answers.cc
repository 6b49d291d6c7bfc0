#include "server/service/decode_answers.h"

#include <array>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/slice.h"
#include "server/engine/kv/client_id.h"
#include "server/service/kv_request_codec.h"
#include "server/service/tensor_codec.h"
#include "server/service/wire_writer.h"

namespace mlaserve::service {
namespace {

// Field numbers of the messages written here (decode.proto, tensor.proto).
constexpr int kResponseResults = 1, kResponsePacked = 2;
constexpr int kResultOut = 1, kResultLse = 2, kResultPlan = 3;
constexpr int kPackedOut = 1, kPackedLse = 2, kPackedPlans = 3;
constexpr int kTensorDtype = 1, kTensorShape = 2, kTensorData = 3;
constexpr int kStreamRequestId = 1, kStreamStatus = 2, kStreamResponse = 3;

// A Tensor message whose data bytes the caller fills after its header.
struct TensorMessage {
  v1::DType dtype = v1::DTYPE_FP32;
  std::array<int64_t, 4> dims{};
  size_t rank = 0;
  uint64_t data_bytes = 0;

  std::span<const int64_t> shape() const { return {dims.data(), rank}; }
  // The shape, with `sequences` in front where a packed call stacks its queries.
  void SetShape(std::optional<int64_t> sequences, std::initializer_list<int64_t> inner) {
    rank = 0;
    if (sequences) dims[rank++] = *sequences;
    for (const int64_t extent : inner) dims[rank++] = extent;
  }

  size_t Size() const {
    size_t size = WireWriter::VarintFieldSize(kTensorDtype, dtype);
    if (rank > 0) {
      size += WireWriter::LengthDelimitedSize(kTensorShape, WireWriter::PackedVarintsSize(shape()));
    }
    if (data_bytes > 0) size += WireWriter::LengthDelimitedSize(kTensorData, data_bytes);
    return size;
  }
  // Writes the field `field` holding this tensor; returns where its data bytes go.
  uint8_t* Write(int field, WireWriter& writer) const {
    writer.LengthDelimited(field, Size());
    writer.VarintField(kTensorDtype, dtype);
    writer.PackedVarints(kTensorShape, shape());
    if (data_bytes == 0) return writer.at();
    writer.LengthDelimited(kTensorData, data_bytes);
    return writer.Skip(data_bytes);
  }
};

int QueryWidth(const engine::DecodeQuery& query, const engine::ModelConfig& model) {
  return query.space == engine::QuerySpace::kHead ? model.dv : model.dl;
}

// Shapes of query i's outputs, with `sequences` in front for a packed call.
TensorMessage OutMessage(const AnsweredDecode& a, size_t i, std::optional<int64_t> sequences) {
  const engine::DecodeQuery& query = a.call->queries[i];
  TensorMessage message{.dtype = a.call->output_dtype};
  message.SetShape(sequences, {query.sq, engine::QueryHeads(query), QueryWidth(query, *a.model)});
  message.data_bytes = a.OutBytes(i) * static_cast<uint64_t>(sequences.value_or(1));
  return message;
}

TensorMessage LseMessage(const AnsweredDecode& a, size_t i, std::optional<int64_t> sequences) {
  const engine::DecodeQuery& query = a.call->queries[i];
  TensorMessage message{.dtype = v1::DTYPE_FP32};
  message.SetShape(sequences, {query.sq, engine::QueryHeads(query)});
  message.data_bytes = a.answers[i].lse.size_bytes() * static_cast<uint64_t>(sequences.value_or(1));
  return message;
}

void EncodeOut(const AnsweredDecode& a, size_t i, void* out) {
  const engine::DecodeAnswer& answer = a.answers[i];
  EncodeValuesTo(answer.out, answer.out_type, answer.out_elements, a.call->output_dtype, out);
}

void WritePlan(int field, const v1::DecodePlan& plan, WireWriter& writer) {
  const size_t size = plan.GetCachedSize();
  writer.LengthDelimited(field, size);
  plan.SerializeWithCachedSizesToArray(writer.Skip(size));
}

// The list form: a DecodeResult per query.
size_t ResultSize(const AnsweredDecode& a, size_t i, const v1::DecodePlan& plan) {
  return WireWriter::LengthDelimitedSize(kResultOut, OutMessage(a, i, {}).Size()) +
         WireWriter::LengthDelimitedSize(kResultLse, LseMessage(a, i, {}).Size()) +
         WireWriter::LengthDelimitedSize(kResultPlan, plan.GetCachedSize());
}

size_t ListSize(const AnsweredDecode& a, std::span<const v1::DecodePlan> plans) {
  size_t size = 0;
  for (size_t i = 0; i < a.answers.size(); ++i) {
    size += WireWriter::LengthDelimitedSize(kResponseResults, ResultSize(a, i, plans[i]));
  }
  return size;
}

void WriteList(const AnsweredDecode& a, std::span<const v1::DecodePlan> plans, WireWriter& writer) {
  for (size_t i = 0; i < a.answers.size(); ++i) {
    writer.LengthDelimited(kResponseResults, ResultSize(a, i, plans[i]));
    EncodeOut(a, i, OutMessage(a, i, {}).Write(kResultOut, writer));
    const TensorMessage lse = LseMessage(a, i, {});
    if (lse.data_bytes > 0) {
      std::memcpy(lse.Write(kResultLse, writer), a.answers[i].lse.data(), lse.data_bytes);
    } else {
      lse.Write(kResultLse, writer);
    }
    WritePlan(kResultPlan, plans[i], writer);
  }
}

// The packed form: one PackedResults.
size_t PackedResultsSize(const AnsweredDecode& a, std::span<const v1::DecodePlan> plans) {
  const int64_t sequences = static_cast<int64_t>(a.answers.size());
  size_t size = WireWriter::LengthDelimitedSize(kPackedOut, OutMessage(a, 0, sequences).Size()) +
                WireWriter::LengthDelimitedSize(kPackedLse, LseMessage(a, 0, sequences).Size());
  for (const v1::DecodePlan& plan : plans) {
    size += WireWriter::LengthDelimitedSize(kPackedPlans, plan.GetCachedSize());
  }
  return size;
}

void WritePacked(const AnsweredDecode& a, std::span<const v1::DecodePlan> plans,
                 WireWriter& writer) {
  const int64_t sequences = static_cast<int64_t>(a.answers.size());
  writer.LengthDelimited(kResponsePacked, PackedResultsSize(a, plans));
  uint8_t* out = OutMessage(a, 0, sequences).Write(kPackedOut, writer);
  uint8_t* lse = LseMessage(a, 0, sequences).Write(kPackedLse, writer);
  EncodePackedOutputs(a, out, lse);
  for (const v1::DecodePlan& plan : plans) WritePlan(kPackedPlans, plan, writer);
}

}  // namespace

int64_t AnsweredDecode::OutElements(size_t i) const {
  const engine::DecodeQuery& query = call->queries[i];
  return int64_t{query.sq} * engine::QueryHeads(query) * QueryWidth(query, *model);
}

uint64_t AnsweredDecode::OutBytes(size_t i) const {
  return static_cast<uint64_t>(OutElements(i)) * DTypeSize(call->output_dtype);
}

absl::Status CheckAnswers(const AnsweredDecode& answered) {
  const std::vector<engine::DecodeQuery>& queries = answered.call->queries;
  if (answered.answers.size() != queries.size()) {
    return absl::InternalError(absl::StrCat("the engine answered ", answered.answers.size(), " of ",
                                            queries.size(), " queries"));
  }
  for (size_t i = 0; i < queries.size(); ++i) {
    const engine::DecodeAnswer& answer = answered.answers[i];
    const int64_t rows = int64_t{queries[i].sq} * engine::QueryHeads(queries[i]);
    const int64_t elements = answered.OutElements(i);
    if (answer.out == nullptr || answer.out_elements != elements ||
        static_cast<int64_t>(answer.lse.size()) != rows) {
      return absl::InternalError(absl::StrCat(
          "the engine answered queries[", i, "] with ", answer.out_elements, " outputs and ",
          answer.lse.size(), " LSEs; expected ", elements, " and ", rows));
    }
  }
  return absl::OkStatus();
}

v1::DecodePlan WirePlan(const engine::PlanInfo& plan, Tenant* tenant) {
  v1::DecodePlan wire;
  wire.set_formulation(plan.formulation == engine::Formulation::kHybrid ? v1::FORMULATION_HYBRID
                                                                        : v1::FORMULATION_ABSORB);
  wire.set_prefix_id(tenant != nullptr ? std::string(engine::ClientPart(plan.prefix_id))
                                       : plan.prefix_id);
  wire.set_group_size(plan.group_size);
  wire.set_b_theta(plan.b_theta);
  wire.set_device(plan.device);
  wire.set_batch_size(plan.batch_size);
  wire.set_queue_us(plan.queue_us);
  wire.set_device_modeled_us(plan.device_modeled_us);
  wire.set_device_host_us(plan.device_host_ms * 1000.0);
  wire.set_naive_tokens(plan.naive_tokens);
  wire.set_naive_pass_query_tokens(plan.naive_pass_query_tokens);
  wire.set_prepare_us(plan.prepare_us);
  wire.set_absorb_kv_dtype(ToWire(plan.absorb_kv_dtype));
  return wire;
}

void EncodePackedOutputs(const AnsweredDecode& answered, void* out, void* lse) {
  auto* out_bytes = static_cast<char*>(out);
  auto* lse_bytes = static_cast<char*>(lse);
  for (size_t i = 0; i < answered.answers.size(); ++i) {
    EncodeOut(answered, i, out_bytes);
    out_bytes += answered.OutBytes(i);
    const std::span<const float> row = answered.answers[i].lse;
    if (!row.empty()) std::memcpy(lse_bytes, row.data(), row.size_bytes());
    lse_bytes += row.size_bytes();
  }
}

absl::StatusOr<grpc::ByteBuffer> WriteDecodeResponse(const AnsweredDecode& answered,
                                                     std::optional<uint64_t> stream_request_id) {
  if (absl::Status checked = CheckAnswers(answered); !checked.ok()) return checked;
  std::vector<v1::DecodePlan> plans;
  plans.reserve(answered.answers.size());
  for (const engine::DecodeAnswer& answer : answered.answers) {
    plans.push_back(WirePlan(answer.plan, answered.tenant));
    plans.back().ByteSizeLong();  // caches the sizes the writers read
  }
  const bool packed = answered.call->form == DecodeForm::kPacked;
  const size_t response =
      packed ? WireWriter::LengthDelimitedSize(kResponsePacked, PackedResultsSize(answered, plans))
             : ListSize(answered, plans);
  size_t total = response;
  if (stream_request_id) {
    total = WireWriter::VarintFieldSize(kStreamRequestId, *stream_request_id) +
            WireWriter::LengthDelimitedSize(kStreamStatus, 0) +
            WireWriter::LengthDelimitedSize(kStreamResponse, response);
  }
  grpc::Slice slice(grpc_slice_malloc(total), grpc::Slice::STEAL_REF);
  WireWriter writer(const_cast<uint8_t*>(slice.begin()));
  if (stream_request_id) {
    writer.VarintField(kStreamRequestId, *stream_request_id);
    writer.LengthDelimited(kStreamStatus, 0);  // OK: a status with every field at its default
    writer.LengthDelimited(kStreamResponse, response);
  }
  if (packed) {
    WritePacked(answered, plans, writer);
  } else {
    WriteList(answered, plans, writer);
  }
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace mlaserve::service
