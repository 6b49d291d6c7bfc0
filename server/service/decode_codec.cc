#include "server/service/decode_codec.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
      return Invalid("output_dtype", absl::StrCat(static_cast<int>(dtype),
                                                  " is not one of DTYPE_BF16, DTYPE_FP16, "
                                                  "DTYPE_FP32"));
  }
}

absl::StatusOr<std::vector<Bf16>> DecodeField(const v1::Tensor& tensor, bool present,
                                              std::span<const int64_t> expected,
                                              const std::string& field) {
  if (!present) return Invalid(field, absl::StrCat("missing; expected ", ShapeToString(expected)));
  ASSIGN_OR_RETURN(Bf16Tensor decoded, DecodeToBf16(tensor, expected, field));
  return std::move(decoded.values);
}

// One query; `field` is "queries[i]".
absl::Status ParseQuery(const v1::DecodeQuery& wire, const engine::EngineInfo& info,
                        const std::string& field, engine::DecodeQuery& query,
                        AnswerLayout& layout) {
  const engine::ModelConfig& model = info.model;
  if (wire.sequence_id().empty()) return Invalid(field + ".sequence_id", "empty");
  if (wire.layer() < 0 || wire.layer() >= model.layers) {
    return Invalid(field + ".layer",
                   absl::StrCat(wire.layer(), " is outside [0, ", model.layers, ")"));
  }
  if (wire.sq() < 1 || wire.sq() > info.max_sq) {
    return Invalid(field + ".sq", absl::StrCat(wire.sq(), " is outside [1, ", info.max_sq,
                                               "] (limits.max_sq)"));
  }
  query.sequence_id = wire.sequence_id();
  query.layer = wire.layer();
  query.sq = wire.sq();
  const int64_t sq = wire.sq();
  const int64_t heads = model.heads;
  switch (wire.q_case()) {
    case v1::DecodeQuery::kHead: {
      query.space = engine::QuerySpace::kHead;
      const std::array<int64_t, 3> nope_shape{sq, heads, model.dn};
      const std::array<int64_t, 3> pe_shape{sq, heads, model.dr};
      ASSIGN_OR_RETURN(query.q_nope, DecodeField(wire.head().q_nope(), wire.head().has_q_nope(),
                                                 nope_shape, field + ".head.q_nope"));
      ASSIGN_OR_RETURN(query.q_pe, DecodeField(wire.head().q_pe(), wire.head().has_q_pe(),
                                               pe_shape, field + ".head.q_pe"));
      layout = {wire.sq(), model.heads, model.dv};
      break;
    }
    case v1::DecodeQuery::kLatent: {
      query.space = engine::QuerySpace::kLatent;
      const std::array<int64_t, 3> shape{sq, heads, model.dk_latent()};
      ASSIGN_OR_RETURN(query.q_latent,
                       DecodeField(wire.latent(), true, shape, field + ".latent"));
      layout = {wire.sq(), model.heads, model.dl};
      break;
    }
    default:
      return Invalid(field + ".q", "neither head nor latent is set");
  }
  if (wire.has_append_rows() != wire.has_append_position()) {
    return wire.has_append_rows()
               ? Invalid(field + ".append_position", "missing; append_rows needs a position")
               : Invalid(field + ".append_rows", "missing; append_position is set");
  }
  if (wire.has_append_rows()) {
    if (wire.append_position() < 0) {
      return Invalid(field + ".append_position",
                     absl::StrCat(wire.append_position(), " is negative"));
    }
    const std::array<int64_t, 2> shape{kAnyExtent, model.dk_latent()};
    ASSIGN_OR_RETURN(query.append_rows,
                     DecodeField(wire.append_rows(), true, shape, field + ".append_rows"));
    query.append_position = wire.append_position();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedDecode> ParseDecodeRequest(const v1::DecodeRequest& request,
                                                const engine::EngineInfo& info) {
  ParsedDecode parsed;
  ASSIGN_OR_RETURN(parsed.output_dtype, ParseOutputDType(request.output_dtype()));
  const int count = request.queries_size();
  if (count == 0) return Invalid("queries", "empty; a Decode needs at least one query");
  if (count > info.max_batch) {
    return Invalid("queries", absl::StrCat(count, " queries exceed limits.max_batch = ",
                                           info.max_batch, "; split them over several calls"));
  }
  parsed.queries.resize(count);
  parsed.layouts.resize(count);
  for (int i = 0; i < count; ++i) {
    RETURN_IF_ERROR(ParseQuery(request.queries(i), info, absl::StrCat("queries[", i, "]"),
                               parsed.queries[i], parsed.layouts[i]));
  }
  return parsed;
}

absl::Status FillDecodeResponse(const std::vector<AnswerLayout>& layouts,
                                v1::DType output_dtype,
                                const std::vector<engine::DecodeAnswer>& answers,
                                v1::DecodeResponse* response) {
  if (answers.size() != layouts.size()) {
    return absl::InternalError(absl::StrCat("the engine answered ", answers.size(),
                                            " of ", layouts.size(), " queries"));
  }
  response->mutable_results()->Reserve(static_cast<int>(answers.size()));
  for (std::size_t i = 0; i < answers.size(); ++i) {
    const AnswerLayout& layout = layouts[i];
    const engine::DecodeAnswer& answer = answers[i];
    const std::array<int64_t, 3> out_shape{layout.sq, layout.heads, layout.width};
    const std::array<int64_t, 2> lse_shape{layout.sq, layout.heads};
    const auto rows = static_cast<std::size_t>(layout.sq) * layout.heads;
    if (answer.out.size() != rows * layout.width || answer.lse.size() != rows) {
      return absl::InternalError(absl::StrCat(
          "the engine answered queries[", i, "] with ", answer.out.size(), " outputs and ",
          answer.lse.size(), " LSEs; expected ", rows * layout.width, " and ", rows));
    }
    v1::DecodeResult* result = response->add_results();
    EncodeFloats(answer.out, out_shape, output_dtype, result->mutable_out());
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
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::service
