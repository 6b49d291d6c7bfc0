#include "bench/fp8_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "common/status_macros.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/fp8_accuracy.h"
#include "kernels/mla/snap_amla.h"
#include "nlohmann/json.hpp"

namespace mlaserve::bench {
namespace {

constexpr int kDl = 512;
constexpr int kDr = 64;
constexpr int kWidth = kDl + kDr;
constexpr int kPageSize = 64;

struct Row {
  std::string path;  // "kernel" or "kv-only"
  KvFormat format;
};

// Mean errors over seeds, and the kernels' best host time.
struct Accumulated {
  AttentionErrors mean;
  KeyErrors keys;  // mean over seeds
  double best_ms = 0;
};

void Add(const AttentionErrors& e, int seeds, AttentionErrors& into) {
  into.rel_l2 += e.rel_l2 / seeds;
  into.cos_dist += e.cos_dist / seeds;
  into.rmse += e.rmse / seeds;
  into.lse_max_err = std::max(into.lse_max_err, e.lse_max_err);  // worst over seeds
}

template <typename F>
auto Timed(F&& f, double& best_ms) {
  const auto start = std::chrono::steady_clock::now();
  auto result = f();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  best_ms = best_ms == 0 ? ms : std::min(best_ms, ms);
  return result;
}

}  // namespace

absl::Status RunFp8Command(const Fp8CommandOptions& o, std::ostream& out) {
  if (o.seeds <= 0 || o.heads <= 0 || o.sq <= 0 || o.context <= 0 || o.sequences <= 0 ||
      !(o.data_scale > 0)) {
    return absl::InvalidArgumentError(
        "fp8: seeds, heads, sq, sk, sequences and data-scale must be positive");
  }
  const float scale = 1.0f / std::sqrt(192.0f);
  const int pages_per_sequence = (o.context + kPageSize - 1) / kPageSize;
  const int pages = pages_per_sequence * o.sequences;

  std::vector<Row> rows = {{"kernel", KvFormat::kBf16},
                           {"kernel", KvFormat::kFp8RopeAware},
                           {"kernel-q-bf16", KvFormat::kFp8RopeAware}};
  for (const KvFormat f : AllKvFormats()) rows.push_back({"kv-only", f});

  if (!o.json) {
    out << absl::StrFormat(
        "FP8 latent cache accuracy: %d sequences x %d keys, H=%d, Sq=%d, Dl=%d Dr=%d, scale "
        "1/sqrt(192), data scale %g, %d seed(s)\n%s\n"
        "errors against the fp64 golden on the unquantised data; rel_l2, cos_dist, rmse: mean "
        "over seeds; lse_max_err: worst;\ncontent, rope: rel_l2 of the keys as the format holds "
        "them (before any attention)\n\n",
        o.sequences, o.context, o.heads, o.sq, kDl, kDr, o.data_scale, o.seeds, HostDescription());
    out << absl::StrFormat("%-14s %-19s %-13s %10s %10s %10s %11s %6s %9s %9s %9s\n", "data",
                           "format", "path", "rel_l2", "cos_dist", "rmse", "lse_max_err", "bytes",
                           "content", "rope", "host_ms");
  }
  for (const KvDataSet set : AllKvDataSets()) {
    std::vector<Accumulated> acc(rows.size());
    for (int seed = 0; seed < o.seeds; ++seed) {
      Rng rng(20261123 + 7919 * seed + 104729 * static_cast<int>(set));
      const KvDataSampler sampler(set, kDl, kDr, rng, o.data_scale);
      std::vector<Bf16> q(static_cast<size_t>(o.sequences) * o.sq * o.heads * kWidth);
      std::vector<Bf16> cache(static_cast<size_t>(pages) * kPageSize * kWidth);
      sampler.FillQueries(q, rng);
      sampler.FillKeys(cache, rng);
      std::vector<int32_t> table(pages);
      std::iota(table.begin(), table.end(), 0);
      const std::vector<int32_t> seqlens(o.sequences, o.context);
      ASSIGN_OR_RETURN(auto q_view, (TensorView<const Bf16, 4>::Create(
                                        q, {o.sequences, o.sq, o.heads, kWidth}, "q")));
      ASSIGN_OR_RETURN(auto pages_view, (TensorView<const Bf16, 3>::Create(
                                            cache, {pages, kPageSize, kWidth}, "cache")));
      ASSIGN_OR_RETURN(auto table_view, (TensorView<const int32_t, 2>::Create(
                                            table, {o.sequences, pages_per_sequence}, "table")));
      const PagedSequences seqs{table_view, seqlens};
      const LatentDecodeProblem bf16{q_view, PagedKvCache{pages_view}, seqs, kDl, scale, true};
      const std::vector<std::byte> fp8_pages = QuantizePagedCache(bf16.cache, kDl);
      const Fp8LatentDecodeProblem fp8{
          q_view, Fp8PagedKvCache{fp8_pages.data(), pages, {kPageSize, kDl, kDr}}, seqs, scale,
          true};
      ASSIGN_OR_RETURN(const GoldenOutput golden, GoldenLatentDecode(bf16));

      for (size_t r = 0; r < rows.size(); ++r) {
        const KeyErrors held =
            CompareKeys(QuantizedKeyValues(rows[r].format, cache, pages * kPageSize, kDl, kDr),
                        cache, pages * kPageSize, kDl, kDr);
        acc[r].keys.content_rel_l2 += held.content_rel_l2 / o.seeds;
        acc[r].keys.rope_rel_l2 += held.rope_rel_l2 / o.seeds;
        if (rows[r].path != "kv-only") {
          double& best = acc[r].best_ms;
          const SnapAmlaOptions options{.quantize_queries = rows[r].path == "kernel"};
          ASSIGN_OR_RETURN(const AttentionOutput result,
                           rows[r].format == KvFormat::kBf16
                               ? Timed([&] { return AmlaDecode(bf16); }, best)
                               : Timed([&] { return SnapAmlaDecode(fp8, options); }, best));
          Add(CompareWithGolden(result.out, result.lse, golden), o.seeds, acc[r].mean);
          continue;
        }
        // kv-only: fp64 attention over the keys as the format holds them.
        GoldenOutput actual;
        const int rows_per_sequence = o.sq * o.heads;
        for (int b = 0; b < o.sequences; ++b) {
          const std::span<const Bf16> keys(
              cache.data() + static_cast<size_t>(b) * pages_per_sequence * kPageSize * kWidth,
              static_cast<size_t>(o.context) * kWidth);
          const std::vector<double> k =
              QuantizedKeyValues(rows[r].format, keys, o.context, kDl, kDr);
          std::vector<double> v(static_cast<size_t>(o.context) * kDl);
          for (int t = 0; t < o.context; ++t)
            std::copy_n(k.begin() + static_cast<ptrdiff_t>(t) * kWidth, kDl,
                        v.begin() + static_cast<ptrdiff_t>(t) * kDl);
          std::vector<double> qd(static_cast<size_t>(rows_per_sequence) * kWidth);
          std::vector<int32_t> visible(rows_per_sequence);
          for (int s = 0; s < o.sq; ++s) {
            for (int h = 0; h < o.heads; ++h) {
              const int row = s * o.heads + h;
              visible[row] = VisibleKeys(o.context, o.sq, s, true);
              const Bf16* src = q_view.row(b, s, h);
              for (int c = 0; c < kWidth; ++c)
                qd[static_cast<size_t>(row) * kWidth + c] = src[c].ToFloat();
            }
          }
          const GoldenOutput part = GoldenAttentionRows(qd, rows_per_sequence, kWidth, k, v,
                                                        o.context, kDl, visible, scale);
          actual.out.insert(actual.out.end(), part.out.begin(), part.out.end());
          actual.lse.insert(actual.lse.end(), part.lse.begin(), part.lse.end());
        }
        Add(CompareWithGolden(actual, golden), o.seeds, acc[r].mean);
      }
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const AttentionErrors& e = acc[r].mean;
      const int64_t bytes = KvBytesPerToken(rows[r].format, kDl, kDr);
      if (o.json) {
        nlohmann::json j = {{"data", std::string(KvDataSetName(set))},
                            {"format", std::string(KvFormatName(rows[r].format))},
                            {"path", rows[r].path},
                            {"rel_l2", e.rel_l2},
                            {"cos_dist", e.cos_dist},
                            {"rmse", e.rmse},
                            {"lse_max_err", e.lse_max_err},
                            {"bytes_per_token", bytes},
                            {"content_rel_l2", acc[r].keys.content_rel_l2},
                            {"rope_rel_l2", acc[r].keys.rope_rel_l2},
                            {"data_scale", o.data_scale},
                            {"seeds", o.seeds}};
        if (rows[r].path != "kv-only") j["host_ms"] = acc[r].best_ms;
        out << j.dump() << "\n";
      } else {
        out << absl::StrFormat(
            "%-14s %-19s %-13s %10.3e %10.3e %10.3e %11.3e %6d %9.2e %9.2e %9s\n",
            KvDataSetName(set), KvFormatName(rows[r].format), rows[r].path, e.rel_l2, e.cos_dist,
            e.rmse, e.lse_max_err, bytes, acc[r].keys.content_rel_l2, acc[r].keys.rope_rel_l2,
            rows[r].path != "kv-only" ? absl::StrFormat("%.1f", acc[r].best_ms) : "-");
      }
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
