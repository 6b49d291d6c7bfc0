#include "server/service/decode_codec.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mlaserve::service {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::StatusOr<v1::DType> ParseOutputDType(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
      return v1::DTYPE_BF16;
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
    case v1::DTYPE_FP32:
      return dtype;
    default:
      return Invalid(field, absl::StrCat(static_cast<int>(dtype),
                                         " is not one of DTYPE_BF16, DTYPE_FP16, DTYPE_FP32"));
  }
}

// The call's options, from `options` or from the older top-level fields (never both).
absl::Status ParseCallOptions(const v1::DecodeRequest& request, ParsedDecode& parsed) {
  if (request.has_options()) {
    if (request.output_dtype() != v1::DTYPE_UNSPECIFIED || request.has_softmax_scale()) {
      return Invalid("options",
                     "set beside the top-level output_dtype or softmax_scale, which mean the "
                     "same; set options alone");
    }
    ASSIGN_OR_RETURN(parsed.output_dtype,
                     ParseOutputDType(request.options().output_dtype(), "options.output_dtype"));
    if (request.options().has_softmax_scale()) {
      parsed.softmax_scale = request.options().softmax_scale();
    }
    if (request.options().has_batch_invariant()) {
      parsed.batch_invariant = request.options().batch_invariant();
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(parsed.output_dtype, ParseOutputDType(request.output_dtype(), "output_dtype"));
  if (request.has_softmax_scale()) parsed.softmax_scale = request.softmax_scale();
  return absl::OkStatus();
}

// fp16 answers are rounded from the fp32 values at the edge (bf16 has the wrong mantissa).
ElementType AnswerType(v1::DType output_dtype) {
  return output_dtype == v1::DTYPE_BF16 ? ElementType::kBf16 : ElementType::kFp32;
}

template <int kRank>
absl::StatusOr<TensorView<const Bf16, kRank>> View(const v1::Tensor& tensor, bool present,
                                                   const std::string& field, ParsedDecode& parsed,
                                                   TensorBytes& source, TensorUse use) {
  if (!present) return Invalid(field, "missing");
  ASSIGN_OR_RETURN(Bf16Data decoded,
                   ViewAsBf16(tensor, kRank, field, parsed.converted, source, use));
  typename TensorView<const Bf16, kRank>::Index shape;
  int64_t elements = 1;
  for (int i = 0; i < kRank; ++i) {
    shape[i] = decoded.shape[i];
    elements *= shape[i];
  }
  return TensorView<const Bf16, kRank>::Create(
      std::span<const Bf16>(decoded.data, static_cast<size_t>(elements)), shape, field);
}

// One query of the list form; `field` is "queries[i]".
absl::Status ParseQuery(const v1::DecodeQuery& wire, const std::string& field,
                        engine::DecodeQuery& query, ParsedDecode& parsed, TensorBytes& source) {
  query.sequence_id = wire.sequence_id();
  query.layer = wire.layer();
  query.sq = wire.sq();
  query.output = AnswerType(parsed.output_dtype);
  switch (wire.q_case()) {
    case v1::DecodeQuery::kHead: {
      query.space = engine::QuerySpace::kHead;
      ASSIGN_OR_RETURN(query.q_nope,
                       View<3>(wire.head().q_nope(), wire.head().has_q_nope(),
                               field + ".head.q_nope", parsed, source, TensorUse::kQueries));
      query.first_head = wire.head().first_head();
      ASSIGN_OR_RETURN(query.q_pe,
                       View<3>(wire.head().q_pe(), wire.head().has_q_pe(), field + ".head.q_pe",
                               parsed, source, TensorUse::kQueries));
      break;
    }
    case v1::DecodeQuery::kLatent: {
      query.space = engine::QuerySpace::kLatent;
      ASSIGN_OR_RETURN(query.q_latent, View<3>(wire.latent(), true, field + ".latent", parsed,
                                               source, TensorUse::kQueries));
      break;
    }
    default:
      return Invalid(field + ".q", "neither head nor latent is set");
  }
  if (wire.has_append_rows()) {
    ASSIGN_OR_RETURN(query.append_rows, View<2>(wire.append_rows(), true, field + ".append_rows",
                                                parsed, source, TensorUse::kRows));
  }
  if (wire.has_append_position()) query.append_position = wire.append_position();
  return absl::OkStatus();
}

// A stacked tensor [B][...] of the packed form, B = `sequences`; each query views its slice.
template <int kRank>
absl::StatusOr<TensorView<const Bf16, kRank>> Stacked(const v1::Tensor& tensor, bool present,
                                                      const std::string& field, int64_t sequences,
                                                      ParsedDecode& parsed, TensorBytes& source,
                                                      TensorUse use) {
  ASSIGN_OR_RETURN(auto view, View<kRank>(tensor, present, field, parsed, source, use));
  if (view.dim(0) != sequences) {
    return Invalid(field, absl::StrCat("shape ", ShapeToString(view.shape()), " holds ",
                                       view.dim(0), " sequences; sequence_ids has ", sequences));
  }
  return view;
}

// Slice b of a stacked tensor, one rank lower.
template <int kRank>
TensorView<const Bf16, kRank - 1> Slice(const TensorView<const Bf16, kRank>& stacked, int64_t b) {
  typename TensorView<const Bf16, kRank - 1>::Index shape;
  int64_t elements = 1;
  for (int i = 1; i < kRank; ++i) {
    shape[i - 1] = stacked.dim(i);
    elements *= stacked.dim(i);
  }
  const Bf16* first = stacked.data() + b * elements;
  // Cannot fail: the slice lies within the stacked tensor's checked elements.
  return *TensorView<const Bf16, kRank - 1>::Create(
      std::span<const Bf16>(first, static_cast<size_t>(elements)), shape);
}

absl::Status ParsePacked(const v1::PackedQueries& wire, ParsedDecode& parsed, TensorBytes& source) {
  const int64_t sequences = wire.sequence_ids_size();
  if (sequences == 0) return Invalid("packed.sequence_ids", "empty; a Decode needs a sequence");
  TensorView<const Bf16, 4> q_nope, q_pe, latent;
  switch (wire.q_case()) {
    case v1::PackedQueries::kHead: {
      ASSIGN_OR_RETURN(
          q_nope, Stacked<4>(wire.head().q_nope(), wire.head().has_q_nope(), "packed.head.q_nope",
                             sequences, parsed, source, TensorUse::kQueries));
      ASSIGN_OR_RETURN(q_pe,
                       Stacked<4>(wire.head().q_pe(), wire.head().has_q_pe(), "packed.head.q_pe",
                                  sequences, parsed, source, TensorUse::kQueries));
      break;
    }
    case v1::PackedQueries::kLatent: {
      ASSIGN_OR_RETURN(latent, Stacked<4>(wire.latent(), true, "packed.latent", sequences, parsed,
                                          source, TensorUse::kQueries));
      break;
    }
    default:
      return Invalid("packed.q", "neither head nor latent is set");
  }
  TensorView<const Bf16, 3> rows;
  if (wire.has_append_rows()) {
    ASSIGN_OR_RETURN(rows, Stacked<3>(wire.append_rows(), true, "packed.append_rows", sequences,
                                      parsed, source, TensorUse::kRows));
    if (wire.append_positions_size() != sequences) {
      return Invalid(
          "packed.append_positions",
          absl::StrCat(wire.append_positions_size(), " positions; append_rows holds rows for ",
                       sequences, " sequences, one position each"));
    }
  } else if (wire.append_positions_size() > 0) {
    return Invalid("packed.append_rows", "missing; append_positions is set");
  }
  const bool head = wire.q_case() == v1::PackedQueries::kHead;
  parsed.queries.resize(static_cast<size_t>(sequences));
  for (int64_t b = 0; b < sequences; ++b) {
    engine::DecodeQuery& query = parsed.queries[static_cast<size_t>(b)];
    query.sequence_id = wire.sequence_ids(static_cast<int>(b));
    query.layer = wire.layer();
    query.output = AnswerType(parsed.output_dtype);
    if (head) {
      query.space = engine::QuerySpace::kHead;
      query.q_nope = Slice<4>(q_nope, b);
      query.q_pe = Slice<4>(q_pe, b);
      query.first_head = wire.head().first_head();
      query.sq = static_cast<int>(std::min<int64_t>(q_nope.dim(1), INT32_MAX));
    } else {
      query.space = engine::QuerySpace::kLatent;
      query.q_latent = Slice<4>(latent, b);
      query.sq = static_cast<int>(std::min<int64_t>(latent.dim(1), INT32_MAX));
    }
    if (!rows.empty()) {
      query.append_rows = Slice<3>(rows, b);
      query.append_position = wire.append_positions(static_cast<int>(b));
    }
  }
  return absl::OkStatus();
}

// The packed form's name for a list-form field of query `i` (the text after "queries[i]").
std::string PackedName(absl::string_view index, absl::string_view suffix) {
  struct Rename {
    absl::string_view list;
    absl::string_view packed;
    bool indexed;  // the packed field holds one entry per sequence
  };
  static constexpr Rename kRenames[] = {
      {".head.q_nope", "packed.head.q_nope", true},
      {".head.q_pe", "packed.head.q_pe", true},
      {".head.first_head", "packed.head.first_head", false},
      {".latent", "packed.latent", true},
      {".sequence_id", "packed.sequence_ids", true},
      {".layer", "packed.layer", false},
      {".sq", "packed sq (dim 1 of the query tensors)", false},
      {".append_rows", "packed.append_rows", true},
      {".append_position", "packed.append_positions", true},
      {".append", "packed.append_rows", false},
  };
  for (const Rename& rename : kRenames) {
    if (absl::StartsWith(suffix, rename.list)) {
      const absl::string_view rest = suffix.substr(rename.list.size());
      // ".append" must not swallow ".append_rows": the next character ends the name.
      if (!rest.empty() && (absl::ascii_isalnum(rest[0]) || rest[0] == '_')) continue;
      return absl::StrCat(rename.packed, rename.indexed ? absl::StrCat("[", index, "]") : "", rest);
    }
  }
  return absl::StrCat("packed.sequence_ids[", index, "]", suffix);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParsedDecode>> ParseDecodeRequest(const v1::DecodeRequest& request,
                                                                 TensorBytes& source) {
  auto parsed = std::make_unique<ParsedDecode>();
  RETURN_IF_ERROR(ParseCallOptions(request, *parsed));
  if (request.has_packed()) {
    if (request.queries_size() > 0) {
      return Invalid("packed", "set beside queries; a call carries its queries in one form");
    }
    parsed->form = DecodeForm::kPacked;
    RETURN_IF_ERROR(ParsePacked(request.packed(), *parsed, source));
    return parsed;
  }
  parsed->queries.resize(request.queries_size());
  for (int i = 0; i < request.queries_size(); ++i) {
    RETURN_IF_ERROR(ParseQuery(request.queries(i), absl::StrCat("queries[", i, "]"),
                               parsed->queries[i], *parsed, source));
  }
  return parsed;
}

absl::Status NamePackedFields(const absl::Status& status) {
  absl::string_view text = status.message();
  std::string renamed;
  constexpr absl::string_view kList = "queries";
  for (size_t at = text.find(kList); at != absl::string_view::npos; at = text.find(kList)) {
    absl::StrAppend(&renamed, text.substr(0, at));
    const absl::string_view after = text.substr(at + kList.size());
    const size_t close = after.find(']');
    int64_t index = 0;
    if (absl::StartsWith(after, "[") && close != absl::string_view::npos &&
        absl::SimpleAtoi(after.substr(1, close - 1), &index)) {
      const absl::string_view rest = after.substr(close + 1);
      size_t end = 0;  // the field's name runs to the first character no name holds
      while (end < rest.size() &&
             (absl::ascii_isalnum(rest[end]) || rest[end] == '_' || rest[end] == '.')) {
        ++end;
      }
      absl::StrAppend(&renamed, PackedName(after.substr(1, close - 1), rest.substr(0, end)));
      text = rest.substr(end);
    } else if (at == 0 && absl::StartsWith(after, ":")) {
      absl::StrAppend(&renamed, "packed.sequence_ids");  // the call's queries as a whole
      text = after;
    } else {
      absl::StrAppend(&renamed, kList);
      text = after;
    }
  }
  absl::StrAppend(&renamed, text);
  return absl::Status(status.code(), renamed);
}

}  // namespace mlaserve::service
