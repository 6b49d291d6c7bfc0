#include "tests/testing/decode_batch_scenario.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/matmul.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/naive.h"

namespace mlaserve::testing {
namespace {

constexpr int kDn = 128, kDr = 64, kDl = 512, kDv = 128;

}  // namespace

UpProjection BatchScenario::Weights() const {
  const int H = batch_.dims.heads;
  const std::array<int64_t, 3> strides = {int64_t{kDn + kDv} * kDl, kDl, 1};
  const auto capacity = static_cast<size_t>(kv_b_.size());
  return UpProjection{
      *TensorView<const Bf16, 3>::CreateStrided(kv_b_.data(), capacity, {H, kDn, kDl}, strides,
                                                "w_uk"),
      *TensorView<const Bf16, 3>::CreateStrided(
          kv_b_.data() + int64_t{kDn} * kDl, capacity - kDn * kDl, {H, kDv, kDl}, strides, "w_uv")};
}

std::unique_ptr<BatchScenario> BatchScenario::Make(const BatchScenarioSpec& spec, uint64_t seed) {
  std::unique_ptr<BatchScenario> s(new BatchScenario());
  s->spec_ = spec;
  Rng rng(seed);
  const int H = spec.heads;
  const int dk = kDl + kDr;
  DecodeBatch& b = s->batch_;
  b.dims = MlaDims{H, kDn, kDr, kDl, kDv, static_cast<float>(1.0 / std::sqrt(192.0))};
  b.page_size = spec.page_size;
  b.parallel_units = spec.parallel_units;
  b.split_block_tokens = spec.split_block_tokens;
  b.batch_invariant = spec.batch_invariant;
  b.invariant_projection_rows = spec.invariant_projection_rows;
  s->kv_b_.resize(static_cast<size_t>(H) * (kDn + kDv) * kDl);
  FillNormal(s->kv_b_, 1.0 / std::sqrt(static_cast<double>(kDl)), rng);
  const UpProjection w = s->Weights();
  if (spec.weight_tiles) {
    s->kv_b_tiles_.resize(s->kv_b_.size());
    for (int h = 0; h < H; ++h) {
      const int64_t uk = int64_t{h} * (kDn + kDv) * kDl, uv = uk + int64_t{kDn} * kDl;
      PackMatrixTiles(s->kv_b_.data() + uk, kDl, kDn, kDl, s->kv_b_tiles_.data() + uk);
      PackMatrixTilesTransposed(s->kv_b_.data() + uv, kDl, kDv, kDl, s->kv_b_tiles_.data() + uv);
    }
  }

  // Prefix levels read by fp8 groups are expanded from their dequantised rows.
  const int levels = static_cast<int>(spec.prefixes.size());
  std::vector<bool> fp8_level(levels, false);
  for (const auto& group : spec.groups) {
    for (int p = group.prefix; p >= 0; p = spec.prefixes[p].parent) {
      if (group.kv_dtype == KvDtype::kFp8) fp8_level[p] = true;
    }
  }
  // Prefix levels: own rows, where they begin, and their expanded K/V.
  std::vector<std::vector<Bf16>> own(levels);
  std::vector<int32_t> begin(levels), end(levels);
  s->level_keys_.resize(levels);
  s->level_values_.resize(levels);
  for (int p = 0; p < levels; ++p) {
    const auto& prefix = spec.prefixes[p];
    begin[p] = prefix.parent < 0 ? 0 : end[prefix.parent];
    end[p] = begin[p] + prefix.tokens;
    own[p].resize(static_cast<size_t>(prefix.tokens) * dk);
    FillNormal(own[p], spec.data_scale, rng);
    std::vector<float> wide(own[p].size());
    WidenBf16(own[p].data(), static_cast<int64_t>(own[p].size()), wide.data());
    if (fp8_level[p]) {
      std::vector<Fp8E4m3> content(kDl);
      std::vector<Bf16> rope(kDr);
      for (int t = 0; t < prefix.tokens; ++t) {
        float scale = 0;
        float* row = wide.data() + static_cast<int64_t>(t) * dk;
        QuantizeLatentRow(own[p].data() + static_cast<int64_t>(t) * dk, kDl, kDr,
                          Fp8LatentRow{content.data(), &scale, rope.data()});
        DequantizeLatentRow(content.data(), scale, rope.data(), kDl, kDr, row);
      }
    }
    s->level_keys_[p].resize(static_cast<size_t>(H) * prefix.tokens * (kDn + kDr));
    s->level_values_[p].resize(static_cast<size_t>(H) * prefix.tokens * kDv);
    for (int h = 0; h < H; ++h) {
      ExpandHeadKv(wide.data(), dk, prefix.tokens, kDr, w, h,
                   s->level_keys_[p].data() + static_cast<int64_t>(h) * prefix.tokens * (kDn + kDr),
                   s->level_values_[p].data() + static_cast<int64_t>(h) * prefix.tokens * kDv);
    }
  }
  auto chain = [&](int p) {
    std::vector<int> levels_of;
    for (; p >= 0; p = spec.prefixes[p].parent) levels_of.push_back(p);
    std::reverse(levels_of.begin(), levels_of.end());
    return levels_of;
  };

  // Every member's rows, then pages for all of them in shuffled order.
  std::vector<std::vector<std::vector<Bf16>>> rows(spec.groups.size());
  int64_t pages_needed = 0;
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    const auto& group = spec.groups[g];
    for (int own_tokens : group.own_tokens) {
      std::vector<Bf16> seq;
      if (group.prefix >= 0) {
        for (int p : chain(group.prefix)) seq.insert(seq.end(), own[p].begin(), own[p].end());
      }
      std::vector<Bf16> mine(static_cast<size_t>(own_tokens) * dk);
      FillNormal(mine, spec.data_scale, rng);
      seq.insert(seq.end(), mine.begin(), mine.end());
      pages_needed += CeilDiv(static_cast<int64_t>(seq.size()) / dk, spec.page_size);
      rows[g].push_back(std::move(seq));
    }
  }
  const int64_t total_pages = pages_needed + 3;  // spare pages nobody owns
  std::vector<int32_t> order(total_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const Bf16 nan = Bf16::FromFloat(std::numeric_limits<float>::quiet_NaN());
  s->pool_.assign(static_cast<size_t>(total_pages) * spec.page_size * dk, nan);
  int64_t next_page = 0;
  s->pages_.resize(spec.groups.size());
  s->queries_.resize(spec.groups.size());
  s->rope_queries_.resize(spec.groups.size());
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    const auto& group = spec.groups[g];
    for (const std::vector<Bf16>& seq : rows[g]) {
      const int64_t tokens = static_cast<int64_t>(seq.size()) / dk;
      std::vector<int32_t> table;
      for (int64_t t0 = 0; t0 < tokens; t0 += spec.page_size) {
        const int32_t page = order[next_page++];
        table.push_back(page);
        const int64_t n = std::min<int64_t>(spec.page_size, tokens - t0);
        std::copy_n(seq.begin() + t0 * dk, n * dk,
                    s->pool_.begin() + int64_t{page} * spec.page_size * dk);
      }
      s->pages_[g].push_back(std::move(table));
      const int64_t q_rows = int64_t{group.sq} * H;
      std::vector<Bf16> q(q_rows * (group.head_space ? kDn : dk)), q_pe;
      FillNormal(q, spec.data_scale, rng);
      if (group.head_space) {
        q_pe.resize(q_rows * kDr);
        FillNormal(q_pe, spec.data_scale, rng);
      }
      s->queries_[g].push_back(std::move(q));
      s->rope_queries_[g].push_back(std::move(q_pe));
    }
  }
  b.pool = s->pool_.data();
  b.pool_pages = total_pages;
  const auto pool_view = TensorView<const Bf16, 3>::Create(std::span<const Bf16>(s->pool_),
                                                           {total_pages, spec.page_size, dk});
  s->fp8_pool_ = QuantizePagedCache(PagedKvCache{*pool_view}, kDl);
  b.fp8_pool = {s->fp8_pool_.data(), total_pages, Fp8PageLayout{spec.page_size, kDl, kDr}};

  std::map<int, int> shared_pass;  // prefix level -> pass
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    const auto& group = spec.groups[g];
    DecodeBatch::Group dg;
    dg.kv_dtype = group.kv_dtype;
    dg.head_space = group.head_space;
    dg.sq = group.sq;
    dg.kv_b_tiles = group.head_space && spec.weight_tiles;
    dg.kv_b = !group.head_space ? nullptr : dg.kv_b_tiles ? s->kv_b_tiles_.data() : s->kv_b_.data();
    dg.out_bf16 = group.out_bf16;
    for (size_t m = 0; m < group.own_tokens.size(); ++m) {
      DecodeBatch::Member member;
      member.pages = s->pages_[g][m];
      member.length = static_cast<int32_t>(rows[g][m].size() / dk);
      if (group.head_space) {
        member.q_nope = s->queries_[g][m].data();
        member.q_pe = s->rope_queries_[g][m].data();
      } else {
        member.q_latent = s->queries_[g][m].data();
      }
      dg.members.push_back(member);
    }
    if (group.hybrid && group.prefix >= 0) {
      for (int p : chain(group.prefix)) {
        auto it = spec.shared_passes ? shared_pass.find(p) : shared_pass.end();
        if (it == shared_pass.end()) {
          b.passes.push_back(
              {s->level_keys_[p].data(), s->level_values_[p].data(), begin[p], end[p], {}});
          it = shared_pass.insert_or_assign(p, static_cast<int>(b.passes.size()) - 1).first;
        }
        b.passes[it->second].groups.push_back(static_cast<int>(g));
        dg.naive_passes.push_back(it->second);
      }
      dg.absorb_from = end[group.prefix];
    }
    b.groups.push_back(std::move(dg));
  }
  return s;
}

GoldenOutput BatchScenario::Golden(int g, int m) const {
  const auto& group = spec_.groups[g];
  const int H = batch_.dims.heads;
  const int dk = kDl + kDr;
  const DecodeBatch::Member& member = batch_.groups[g].members[m];
  const PagedKvCache cache{*TensorView<const Bf16, 3>::Create(
      std::span<const Bf16>(pool_), {batch_.pool_pages, spec_.page_size, dk}, "pool")};
  const std::vector<int32_t>& table = pages_[g][m];
  const int32_t seqlen = member.length;
  const PagedSequences seqs{
      *TensorView<const int32_t, 2>::Create(std::span<const int32_t>(table),
                                            {1, static_cast<int64_t>(table.size())}),
      std::span<const int32_t>(&seqlen, 1)};
  const float scale = batch_.dims.softmax_scale;
  if (!group.head_space) {
    auto q = *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(queries_[g][m]),
                                                {1, group.sq, H, dk});
    return *GoldenLatentDecode({q, cache, seqs, kDl, scale, true});
  }
  const HeadSpaceDecodeProblem p{
      *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(queries_[g][m]),
                                         {1, group.sq, H, kDn}),
      *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(rope_queries_[g][m]),
                                         {1, group.sq, H, kDr}),
      Weights(),
      cache,
      seqs,
      scale,
      true};
  return *GoldenHeadSpaceDecode(p);
}

std::vector<NamedScenario> StandardBatchScenarios() {
  using Spec = BatchScenarioSpec;
  std::vector<NamedScenario> all;
  {
    Spec s;
    s.groups = {{.head_space = true, .sq = 1, .prefix = -1, .own_tokens = {1, 700, 130}}};
    all.push_back({"AbsorbHead", s});
  }
  {
    Spec s;
    s.groups = {
        {.head_space = true, .sq = 2, .prefix = -1, .own_tokens = {2, 513, 64}, .out_bf16 = true}};
    all.push_back({"AbsorbHeadMtpBf16", s});
  }
  {
    // Weights in the tile layout: few rows (the row kernel) and more (the library's tiles).
    Spec s;
    s.weight_tiles = true;
    s.groups = {{.head_space = true, .sq = 1, .prefix = -1, .own_tokens = {1, 700, 130}},
                {.head_space = true,
                 .sq = 2,
                 .prefix = -1,
                 .own_tokens = {4, 9, 70, 3, 6},
                 .out_bf16 = true}};
    all.push_back({"AbsorbHeadWeightTiles", s});
  }
  {
    Spec s;
    s.page_size = 128;
    s.groups = {{.head_space = false, .sq = 1, .prefix = -1, .own_tokens = {5, 640, 1300}}};
    all.push_back({"Latent", s});
  }
  {
    Spec s;
    s.prefixes = {{-1, 700}};
    s.groups = {
        {.head_space = true, .sq = 1, .prefix = 0, .own_tokens = {3, 129, 40}, .hybrid = true}};
    all.push_back({"HybridOneLevel", s});
  }
  Spec tree;
  tree.prefixes = {{-1, 600}, {0, 200}, {0, 300}};
  tree.groups = {{.head_space = true, .sq = 1, .prefix = 1, .own_tokens = {5, 60}, .hybrid = true},
                 {.head_space = true, .sq = 1, .prefix = 2, .own_tokens = {1, 300}, .hybrid = true},
                 {.head_space = true,
                  .sq = 1,
                  .prefix = 0,
                  .own_tokens = {20},
                  .hybrid = true,
                  .out_bf16 = true}};
  all.push_back({"HybridTreeShared", tree});
  tree.weight_tiles = true;
  all.push_back({"HybridTreeSharedWeightTiles", tree});
  tree.weight_tiles = false;
  tree.shared_passes = false;
  all.push_back({"HybridTreeFlat", tree});
  {
    Spec s;
    s.parallel_units = 24;
    s.groups = {{.head_space = true, .sq = 1, .prefix = -1, .own_tokens = {3000, 2100}}};
    all.push_back({"SplitLatent", s});
  }
  {
    // The host runner's split (64-key parts) of a query with more rows than a merge slice.
    Spec s;
    s.parallel_units = 6;
    s.heads = 24;
    s.split_block_tokens = 64;
    s.groups = {{.head_space = false, .sq = 1, .prefix = -1, .own_tokens = {700}}};
    all.push_back({"SplitLatentHostParts", s});
  }
  {
    Spec s;
    s.parallel_units = 24;
    s.heads = 4;
    s.prefixes = {{-1, 2600}};
    s.groups = {{.head_space = true,
                 .sq = 2,
                 .prefix = 0,
                 .own_tokens = {700},
                 .hybrid = true,
                 .out_bf16 = true}};
    all.push_back({"SplitNaiveAndLatentMtp", s});
  }
  {
    Spec s;
    s.parallel_units = 4;
    s.prefixes = {{-1, 300}};
    s.groups = {
        {.head_space = false, .sq = 1, .prefix = 0, .own_tokens = {9, 1100}},
        {.head_space = true, .sq = 1, .prefix = 0, .own_tokens = {4, 77}, .hybrid = true},
        {.head_space = true, .sq = 2, .prefix = -1, .own_tokens = {1500}, .out_bf16 = true}};
    all.push_back({"Mixed", s});
  }
  return all;
}

std::vector<NamedScenario> InvariantBatchScenarios() {
  std::vector<NamedScenario> all;
  for (NamedScenario& s : StandardBatchScenarios()) {
    bool hybrid = false;
    for (const auto& group : s.spec.groups) hybrid = hybrid || group.hybrid;
    if (hybrid) continue;
    s.name += "Invariant";
    s.spec.batch_invariant = true;
    // Fewer rows than any device's cut and not a divisor of a group's, so cuts end mid-way.
    s.spec.invariant_projection_rows = 3;
    all.push_back(std::move(s));
  }
  return all;
}

std::vector<NamedScenario> Fp8BatchScenarios() {
  std::vector<NamedScenario> all = StandardBatchScenarios();
  for (NamedScenario& scenario : all) {
    scenario.name += "Fp8";
    scenario.spec.data_scale = 0.1;
    for (auto& group : scenario.spec.groups) group.kv_dtype = KvDtype::kFp8;
  }
  // And one batch that holds both kinds of sequence.
  BatchScenarioSpec mixed;
  mixed.data_scale = 0.1;
  mixed.prefixes = {{-1, 600}, {-1, 300}};
  mixed.groups = {
      {.head_space = true,
       .sq = 1,
       .prefix = 0,
       .own_tokens = {5, 700},
       .hybrid = true,
       .kv_dtype = KvDtype::kFp8},
      {.head_space = true, .sq = 1, .prefix = 1, .own_tokens = {40}, .hybrid = true},
      {.head_space = false, .sq = 2, .prefix = -1, .own_tokens = {513}, .kv_dtype = KvDtype::kFp8}};
  all.push_back({"MixedBf16AndFp8", mixed});
  return all;
}

AnswerValues ReadAnswer(const BatchBuffers& buffers, const AnswerRef& ref) {
  AnswerValues v;
  v.out.resize(ref.out_elements);
  if (ref.out_type == ElementType::kBf16) {
    const std::span<const Bf16> out = buffers.Elements<Bf16>(ref.out, ref.out_elements);
    WidenBf16(out.data(), ref.out_elements, v.out.data());
  } else {
    const std::span<const float> out = buffers.Elements<float>(ref.out, ref.out_elements);
    std::copy(out.begin(), out.end(), v.out.begin());
  }
  const std::span<const float> lse = buffers.Elements<float>(ref.lse, ref.lse_elements);
  v.lse.assign(lse.begin(), lse.end());
  return v;
}

}  // namespace mlaserve::testing
