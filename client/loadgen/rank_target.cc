#include "client/loadgen/rank_target.h"

#include <cctype>

namespace mlaserve::loadgen {

int RankTarget::RankOf(const std::string& sequence_id, int ranks) {
  const std::optional<int> rank = RankIn(sequence_id);
  return rank.has_value() ? *rank % ranks : 0;
}

std::optional<int> RankTarget::RankIn(const std::string& sequence_id) {
  for (size_t slash = sequence_id.rfind('/'); slash != std::string::npos && slash > 0;
       slash = sequence_id.rfind('/', slash - 1)) {
    const size_t start = sequence_id.rfind('/', slash - 1);
    const size_t first = start == std::string::npos ? 0 : start + 1;
    if (slash - first < 2) continue;
    const char kind = sequence_id[first];
    if (kind != 'r' && kind != 'w') continue;
    int rank = 0;
    bool digits = true;
    for (size_t i = first + 1; i < slash; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(sequence_id[i]))) {
        digits = false;
        break;
      }
      rank = rank * 10 + (sequence_id[i] - '0');
    }
    if (digits) return rank;
  }
  return std::nullopt;
}

absl::Status RankTarget::RegisterPrefix(const std::string& id, std::span<const Bf16> latent,
                                        int tokens, std::optional<KvDtype> kv_dtype) {
  return RegisterPrefixOnEvery(ranks_, id, latent, tokens, kv_dtype);
}

absl::Status RankTarget::ReleasePrefix(const std::string& id) {
  return ReleasePrefixOnEvery(ranks_, id);
}

absl::Status RankTarget::CreateSequence(const std::string& id, const std::string& prefix_id,
                                        std::optional<KvDtype> kv_dtype) {
  return For(id).CreateSequence(id, prefix_id, kv_dtype);
}

absl::Status RankTarget::ReleaseSequence(const std::string& id) {
  return For(id).ReleaseSequence(id);
}

absl::Status RankTarget::AppendKv(const std::string& id, int layer, int64_t position,
                                  std::span<const Bf16> rows) {
  return For(id).AppendKv(id, layer, position, rows);
}

absl::StatusOr<std::vector<LoadAnswer>> RankTarget::Decode(const std::vector<LoadQuery>& queries) {
  if (queries.empty()) return ranks_.front()->Decode(queries);
  return For(queries.front().sequence_id).Decode(queries);
}

}  // namespace mlaserve::loadgen
