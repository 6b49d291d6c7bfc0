#include "client/loadgen/query_pool.h"

#include "kernels/core/random_fill.h"

namespace mlaserve::loadgen {

QueryPool::QueryPool(const TargetModel& m, int sq, uint64_t seed) : dk_(m.dk()), sq_(sq) {
  Rng rng(seed);
  nope_ = int64_t{sq} * m.heads * m.dn;
  pe_ = int64_t{sq} * m.heads * m.dr;
  latent_ = int64_t{sq} * m.heads * m.dk();
  q_nope_.resize(nope_ * kQueries);
  q_pe_.resize(pe_ * kQueries);
  q_latent_.resize(latent_ * kQueries);
  rows_.resize(int64_t{kRows} * m.dk());
  for (auto* v : {&q_nope_, &q_pe_, &q_latent_, &rows_}) FillNormal(*v, 1.0, rng);
}

LoadQuery QueryPool::Query(int64_t k, const std::string& sequence_id, int layer, bool head_space,
                           int64_t position) const {
  LoadQuery q;
  const int64_t query = k % kQueries;
  q.sequence_id = sequence_id;
  q.layer = layer;
  q.sq = sq_;
  q.head_space = head_space;
  q.q_nope = std::span<const Bf16>(q_nope_).subspan(query * nope_, nope_);
  q.q_pe = std::span<const Bf16>(q_pe_).subspan(query * pe_, pe_);
  q.q_latent = std::span<const Bf16>(q_latent_).subspan(query * latent_, latent_);
  q.append = std::span<const Bf16>(rows_).subspan((k % kRows) * dk_, dk_);
  q.append_position = position;
  return q;
}

}  // namespace mlaserve::loadgen
