#include "server/engine/decode_validation.h"

#include <array>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/tensor_shape.h"

namespace mlaserve::engine {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// Shape, layout and finiteness of one tensor against the shape its field requires.
template <int kRank>
absl::Status CheckTensor(const TensorView<const Bf16, kRank>& view,
                         const std::array<int64_t, kRank>& expected, const std::string& field) {
  if (!ShapeMatches(view.shape(), expected)) {
    return Invalid(field, absl::StrCat("shape ", ShapeToString(view.shape()),
                                       " != ", ShapeToString(expected)));
  }
  int64_t stride = 1;
  for (int i = kRank - 1; i >= 0; --i) {
    if (view.dim(i) > 1 && view.stride(i) != stride)
      return Invalid(field, "not row-major and contiguous");
    stride *= view.dim(i);
  }
  const std::span<const Bf16> values(view.data(), static_cast<size_t>(view.size()));
  const size_t i = FirstNonFinite(values);
  if (i == values.size()) return absl::OkStatus();
  return Invalid(field,
                 absl::StrCat("element ", i, " is ",
                              values[i].ToFloat() != values[i].ToFloat() ? "NaN" : "infinite",
                              "; inputs must be finite (and, from fp32, within bf16's range)"));
}

absl::Status CheckQuery(const DecodeQuery& q, const EngineInfo& info, const std::string& at) {
  const ModelConfig& m = info.model;
  RETURN_IF_ERROR(CheckClientId(at + ".sequence_id", q.sequence_id));
  if (q.layer < 0 || q.layer >= m.layers) {
    return Invalid(at + ".layer", absl::StrCat(q.layer, " is outside [0, ", m.layers, ")"));
  }
  if (q.sq < 1 || q.sq > info.max_sq) {
    return Invalid(at + ".sq",
                   absl::StrCat(q.sq, " is outside [1, ", info.max_sq, "] (limits.max_sq)"));
  }
  // The heads are q's own (dim 1): a contiguous range of the model's in head space, any
  // number in latent space; each tensor is then held to that count.
  const int64_t heads = QueryHeads(q);
  if (q.space == QuerySpace::kHead) {
    if (q.first_head < 0 || q.first_head >= m.heads) {
      return Invalid(at + ".head.first_head",
                     absl::StrCat(q.first_head, " is outside [0, ", m.heads, ")"));
    }
    const int64_t room = m.heads - q.first_head;
    RETURN_IF_ERROR(CheckTensor<3>(
        q.q_nope, {q.sq, heads >= 1 && heads <= room ? heads : room, m.dn}, at + ".head.q_nope"));
    RETURN_IF_ERROR(CheckTensor<3>(q.q_pe, {q.sq, heads, m.dr}, at + ".head.q_pe"));
  } else {
    if (q.first_head != 0) {
      return Invalid(at + ".first_head", "must be 0 for a latent query");
    }
    RETURN_IF_ERROR(CheckTensor<3>(
        q.q_latent, {q.sq, heads >= 1 && heads <= kMaxLatentHeads ? heads : m.heads, m.dk_latent()},
        at + ".latent"));
  }
  const bool rows = !q.append_rows.empty();
  if (rows && q.append_position < 0) {
    return Invalid(at + ".append_position", q.append_position == -1
                                                ? "missing; append_rows needs a position"
                                                : absl::StrCat(q.append_position, " is negative"));
  }
  if (!rows && q.append_position != -1)
    return Invalid(at + ".append_rows", "missing; append_position is set");
  if (rows)
    RETURN_IF_ERROR(
        CheckTensor<2>(q.append_rows, {kAnyExtent, m.dk_latent()}, at + ".append_rows"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDecodeCall(std::span<const DecodeQuery> queries, const EngineInfo& info,
                                const KvStore& store) {
  if (queries.empty()) return Invalid("queries", "empty; a Decode needs at least one query");
  if (static_cast<int>(queries.size()) > info.max_batch) {
    return Invalid("queries", absl::StrCat(queries.size(), " queries exceed limits.max_batch = ",
                                           info.max_batch, "; split them over several calls"));
  }
  std::set<std::pair<std::string, int>> seen;
  for (size_t i = 0; i < queries.size(); ++i) {
    const std::string at = absl::StrCat("queries[", i, "]");
    RETURN_IF_ERROR(CheckQuery(queries[i], info, at));
    if (!seen.emplace(queries[i].sequence_id, queries[i].layer).second) {
      return Invalid(at, absl::StrCat("sequence ", QuoteId(queries[i].sequence_id), " layer ",
                                      queries[i].layer, " appears twice in one call"));
    }
    // A device batch runs one head range (the batcher keys on the call's first query).
    if (QueryHeads(queries[i]) != QueryHeads(queries[0]) ||
        queries[i].first_head != queries[0].first_head) {
      return Invalid(
          at, absl::StrCat(QueryHeads(queries[i]), " heads from head ", queries[i].first_head,
                           ", but queries[0] has ", QueryHeads(queries[0]), " from head ",
                           queries[0].first_head, "; a call's queries share their heads"));
    }
  }
  for (size_t i = 0; i < queries.size(); ++i) {
    if (!store.GetSequence(queries[i].sequence_id).ok()) {
      return absl::NotFoundError(absl::StrCat(
          "queries[", i, "].sequence_id: ", QuoteId(queries[i].sequence_id), " is not a sequence"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDecodeOptions(const DecodeOptions& options) {
  if (options.softmax_scale.has_value() &&
      !(std::isfinite(*options.softmax_scale) && *options.softmax_scale > 0)) {
    return Invalid("softmax_scale",
                   absl::StrCat(*options.softmax_scale, " is not a positive finite number"));
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::engine
