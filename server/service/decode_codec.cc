#include "server/service/decode_codec.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/service/kv_request_codec.h"
#include "server/service/tensor_codec.h"

namespace mlaserve::service {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::StatusOr<v1::DType> ParseOutputDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
      return v1::DTYPE_BF16;
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
    case v1::DTYPE_FP32:
      return dtype;
    default:
      return Invalid("output_dtype",
                     absl::StrCat(static_cast<int>(dtype),
                                  " is not one of DTYPE_BF16, DTYPE_FP16, DTYPE_FP32"));
  }
}

template <int kRank>
absl::StatusOr<TensorView<const Bf16, kRank>> View(const v1::Tensor& tensor, bool present,
                                                   const std::string& field,
                                                   std::vector<std::vector<Bf16>>& storage) {
  if (!present) return Invalid(field, "missing");
  ASSIGN_OR_RETURN(Bf16Data decoded, ViewAsBf16(tensor, kRank, field, storage));
  typename TensorView<const Bf16, kRank>::Index shape;
  int64_t elements = 1;
  for (int i = 0; i < kRank; ++i) {
    shape[i] = decoded.shape[i];
    elements *= shape[i];
  }
  return TensorView<const Bf16, kRank>::Create(
      std::span<const Bf16>(decoded.data, static_cast<size_t>(elements)), shape, field);
}

// One query; `field` is "queries[i]".
absl::Status ParseQuery(const v1::DecodeQuery& wire, const std::string& field,
                        v1::DType output_dtype, engine::DecodeQuery& query,
                        std::vector<std::vector<Bf16>>& storage) {
  query.sequence_id = wire.sequence_id();
  query.layer = wire.layer();
  query.sq = wire.sq();
  // fp16 answers are rounded from the fp32 values at the edge (bf16 has the wrong mantissa).
  query.output = output_dtype == v1::DTYPE_BF16 ? ElementType::kBf16 : ElementType::kFp32;
  switch (wire.q_case()) {
    case v1::DecodeQuery::kHead: {
      query.space = engine::QuerySpace::kHead;
      ASSIGN_OR_RETURN(query.q_nope, View<3>(wire.head().q_nope(), wire.head().has_q_nope(),
                                             field + ".head.q_nope", storage));
      query.first_head = wire.head().first_head();
      ASSIGN_OR_RETURN(query.q_pe, View<3>(wire.head().q_pe(), wire.head().has_q_pe(),
                                           field + ".head.q_pe", storage));
      break;
    }
    case v1::DecodeQuery::kLatent: {
      query.space = engine::QuerySpace::kLatent;
      ASSIGN_OR_RETURN(query.q_latent, View<3>(wire.latent(), true, field + ".latent", storage));
      break;
    }
    default:
      return Invalid(field + ".q", "neither head nor latent is set");
  }
  if (wire.has_append_rows()) {
    ASSIGN_OR_RETURN(query.append_rows,
                     View<2>(wire.append_rows(), true, field + ".append_rows", storage));
  }
  if (wire.has_append_position()) query.append_position = wire.append_position();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParsedDecode>> ParseDecodeRequest(const v1::DecodeRequest& request) {
  auto parsed = std::make_unique<ParsedDecode>();
  ASSIGN_OR_RETURN(parsed->output_dtype, ParseOutputDType(request.output_dtype()));
  if (request.has_softmax_scale()) parsed->softmax_scale = request.softmax_scale();
  parsed->queries.resize(request.queries_size());
  for (int i = 0; i < request.queries_size(); ++i) {
    RETURN_IF_ERROR(ParseQuery(request.queries(i), absl::StrCat("queries[", i, "]"),
                               parsed->output_dtype, parsed->queries[i], parsed->converted));
  }
  return parsed;
}

absl::Status FillDecodeResponse(std::span<const engine::DecodeQuery> queries,
                                const engine::ModelConfig& model, v1::DType output_dtype,
                                std::span<const engine::DecodeAnswer> answers,
                                v1::DecodeResponse* response) {
  if (answers.size() != queries.size()) {
    return absl::InternalError(
        absl::StrCat("the engine answered ", answers.size(), " of ", queries.size(), " queries"));
  }
  response->mutable_results()->Reserve(static_cast<int>(answers.size()));
  for (size_t i = 0; i < answers.size(); ++i) {
    const engine::DecodeQuery& query = queries[i];
    const engine::DecodeAnswer& answer = answers[i];
    const int width = query.space == engine::QuerySpace::kHead ? model.dv : model.dl;
    const int64_t heads = engine::QueryHeads(query);
    const std::array<int64_t, 3> out_shape{query.sq, heads, width};
    const std::array<int64_t, 2> lse_shape{query.sq, heads};
    const int64_t rows = int64_t{query.sq} * heads;
    if (answer.out == nullptr || answer.out_elements != rows * width ||
        static_cast<int64_t>(answer.lse.size()) != rows) {
      return absl::InternalError(absl::StrCat(
          "the engine answered queries[", i, "] with ", answer.out_elements, " outputs and ",
          answer.lse.size(), " LSEs; expected ", rows * width, " and ", rows));
    }
    v1::DecodeResult* result = response->add_results();
    EncodeValues(answer.out, answer.out_type, answer.out_elements, out_shape, output_dtype,
                 result->mutable_out());
    EncodeFloats(answer.lse, lse_shape, v1::DTYPE_FP32, result->mutable_lse());
    const engine::PlanInfo& plan = answer.plan;
    v1::DecodePlan* wire_plan = result->mutable_plan();
    wire_plan->set_formulation(plan.formulation == engine::Formulation::kHybrid
                                   ? v1::FORMULATION_HYBRID
                                   : v1::FORMULATION_ABSORB);
    wire_plan->set_prefix_id(plan.prefix_id);
    wire_plan->set_group_size(plan.group_size);
    wire_plan->set_b_theta(plan.b_theta);
    wire_plan->set_device(plan.device);
    wire_plan->set_batch_size(plan.batch_size);
    wire_plan->set_queue_us(plan.queue_us);
    wire_plan->set_device_modeled_us(plan.device_modeled_us);
    wire_plan->set_device_host_us(plan.device_host_ms * 1000.0);
    wire_plan->set_naive_tokens(plan.naive_tokens);
    wire_plan->set_naive_pass_query_tokens(plan.naive_pass_query_tokens);
    wire_plan->set_prepare_us(plan.prepare_us);
    wire_plan->set_absorb_kv_dtype(ToWire(plan.absorb_kv_dtype));
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::service
