#include "bench/typhoon_batch.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/random_fill.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::bench {

using engine::ModelConfig;

absl::StatusOr<HostData> MakeHostData(const ModelConfig& m, const PageLayout& layout, int shared,
                                      int sq) {
  HostData d;
  Rng rng(2026);
  const int dk = m.dk_latent();
  d.pool.resize(static_cast<size_t>(layout.pages()) * layout.page_size * dk);
  FillNormal(d.pool, 1.0, rng);
  const int tail = shared % layout.page_size;  // prefix rows every query copies
  const int64_t page_elems = int64_t{layout.page_size} * dk;
  for (int member = 1; member < layout.members; ++member) {
    std::copy_n(d.pool.begin() + layout.PagesOf(0)[layout.shared_pages] * page_elems,
                int64_t{tail} * dk,
                d.pool.begin() + layout.PagesOf(member)[layout.shared_pages] * page_elems);
  }
  const int64_t rows = int64_t{layout.members} * sq * m.heads;
  d.q_nope.resize(rows * m.dn);
  d.q_pe.resize(rows * m.dr);
  FillNormal(d.q_nope, 1.0, rng);
  FillNormal(d.q_pe, 1.0, rng);
  ASSIGN_OR_RETURN(engine::ModelWeights weights, engine::ModelWeights::FromSeed(m, 7));
  d.weights.emplace(std::move(weights));
  ASSIGN_OR_RETURN(auto pages, (TensorView<const Bf16, 3>::Create(
                                   d.pool, {layout.pages(), layout.page_size, dk}, "pool")));
  const std::vector<int32_t> member0 = layout.PagesOf(0);
  d.level.emplace(engine::ExpandedKvData::Build(PagedKvCache{pages}, member0, 0, shared, m.dr,
                                                d.weights->Layer(0)));
  return d;
}

DecodeBatch MakeBatch(const TyphoonCommandOptions& o, const ModelConfig& m, int sq, int batch,
                      bool hybrid, const PageLayout& layout,
                      const std::vector<std::vector<int32_t>>& pages, const HostData* host,
                      int parallel_units) {
  DecodeBatch b;
  b.dims = m.dims();
  b.pool = host != nullptr ? host->pool.data() : nullptr;
  b.pool_pages = layout.pages();
  b.page_size = layout.page_size;
  b.parallel_units = parallel_units;
  DecodeBatch::Group g;
  g.head_space = true;
  g.sq = sq;
  g.kv_b = host != nullptr ? host->weights->KvBProj(0).data() : nullptr;
  const int64_t rows = int64_t{sq} * m.heads;
  for (int member = 0; member < batch; ++member) {
    DecodeBatch::Member x;
    x.pages = pages[member];
    x.length = o.shared + o.suffix;
    if (host != nullptr) {
      x.q_nope = host->q_nope.data() + member * rows * m.dn;
      x.q_pe = host->q_pe.data() + member * rows * m.dr;
    }
    g.members.push_back(x);
  }
  if (hybrid) {
    g.absorb_from = o.shared;
    g.naive_passes = {0};
    b.passes.push_back({host != nullptr ? host->level->keys().data() : nullptr,
                        host != nullptr ? host->level->values().data() : nullptr,
                        0,
                        o.shared,
                        {0}});
  }
  b.groups.push_back(std::move(g));
  return b;
}

}  // namespace mlaserve::bench
