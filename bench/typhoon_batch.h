#ifndef MLASERVE_BENCH_TYPHOON_BATCH_H_
#define MLASERVE_BENCH_TYPHOON_BATCH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/typhoon_command.h"
#include "kernels/mla/decode_batch.h"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/model/model_config.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::bench {

// The batch `mlaserve-bench typhoon` runs, on any device: one group of B head-space queries on
// a shared prefix, each with a suffix of its own.

// Where the batch's pages are: the prefix's whole pages first (shared by every query), then
// each query's own pages in query order, the first of which starts with its copy of the
// prefix's partial last page. Query m's pages do not depend on the batch size, so one layout
// for the largest batch serves every smaller one.
struct PageLayout {
  int page_size = 0;
  int shared_pages = 0;  // whole pages of the prefix
  int own_pages = 0;     // per query
  int members = 0;

  PageLayout(int page, int shared, int suffix, int queries)
      : page_size(page),
        shared_pages(shared / page),
        own_pages((shared + suffix + page - 1) / page - shared / page),
        members(queries) {}
  int64_t pages() const { return shared_pages + int64_t{own_pages} * members; }
  std::vector<int32_t> PagesOf(int member) const {
    std::vector<int32_t> pages(shared_pages + own_pages);
    for (int i = 0; i < shared_pages; ++i) pages[i] = i;
    for (int i = 0; i < own_pages; ++i)
      pages[shared_pages + i] = shared_pages + member * own_pages + i;
    return pages;
  }
};

// Random inputs of the largest batch, for executed runs.
struct HostData {
  std::vector<Bf16> pool;  // [pages][page_size][dk]
  std::vector<Bf16> q_nope, q_pe;
  std::optional<engine::ModelWeights> weights;
  std::optional<engine::ExpandedKvData> level;  // the prefix's expanded K/V
};

// Random inputs of the largest batch: the pool, the queries, the layer's weights and the
// prefix's expanded K/V.
absl::StatusOr<HostData> MakeHostData(const engine::ModelConfig& m, const PageLayout& layout,
                                      int shared, int sq);

// The batch in the kernels' terms: one head-space group of `batch` queries on a prefix of
// o.shared tokens, each with o.suffix of its own; hybrid runs the prefix as one naive pass.
// Without host data every pointer is null (a model-only launch).
DecodeBatch MakeBatch(const TyphoonCommandOptions& o, const engine::ModelConfig& m, int sq,
                      int batch, bool hybrid, const PageLayout& layout,
                      const std::vector<std::vector<int32_t>>& pages, const HostData* host,
                      int parallel_units);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_TYPHOON_BATCH_H_
