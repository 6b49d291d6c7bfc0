#include "kernels/mla/batch_step_builder.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/latent_decode.h"
#include "kernels/core/tiling.h"

namespace mlaserve {
namespace {

// An attention row group before split-KV: where it reads and writes.
struct RowGroupSpec {
  AttentionRowGroup group;
  int32_t length = 0;  // max visible
};

// Where a group's and a pass's tensors live.
struct GroupBuffers {
  int rows = 0;  // query rows R = members x sq; attention rows are R x heads
  int q_nope = -1, q_lat = -1, o_lat = -1, absorb_out = -1, out = -1, lse = -1, kv_b = -1;
  int width = 0;
};
struct PassBuffers {
  int rows = 0;
  int keys = -1, values = -1, q = -1, out = -1, lse = -1;
  std::map<int, int> row_of_group;  // group -> its first row in the pass
};

class Builder {
 public:
  explicit Builder(const DecodeBatch& batch) : b_(batch), d_(batch.dims) {}

  absl::StatusOr<BuiltBatch> Build() {
    RETURN_IF_ERROR(Check());
    Allocate();
    Stage();
    AbsorbQueries();
    std::vector<CombineJob> merges;
    AddAttention("latent", d_.dk(), d_.dl, LatentRowGroups(), merges);
    AddAttention("naive", d_.dqk(), d_.dv, NaiveRowGroups(), merges);
    if (!merges.empty()) out_.steps.steps.push_back(CombineStep{"split_merge", std::move(merges)});
    ProjectOut();
    PrefixMerge();
    Answers();
    return std::move(out_);
  }

 private:
  BatchSteps& steps() { return out_.steps; }

  absl::Status Check() const {
    if (d_.heads <= 0 || d_.dn <= 0 || d_.dr <= 0 || d_.dl <= 0 || d_.dv <= 0 ||
        !(d_.softmax_scale > 0)) {
      return absl::InvalidArgumentError("decode batch: dims must be positive");
    }
    if (b_.batch_invariant && !b_.passes.empty()) {
      // Whether a group's prefix runs in naive form depends on how many queries share it.
      return absl::InvalidArgumentError(
          "decode batch: a batch-invariant batch takes no naive passes");
    }
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      const std::string at = absl::StrCat("decode batch group ", g);
      if (group.sq < 1 || group.members.empty())
        return absl::InvalidArgumentError(at + ": no queries");
      const bool fp8 = group.kv_dtype == KvDtype::kFp8;
      const int page_size = fp8 ? b_.fp8_pool.layout.page_size : b_.page_size;
      if (fp8) {
        const Fp8PageLayout& layout = b_.fp8_pool.layout;
        if (layout.dl != d_.dl || layout.dr != d_.dr || layout.dl % 4 != 0 ||
            layout.page_size <= 0 || layout.stride() < layout.page_bytes()) {
          return absl::InvalidArgumentError(
              at +
              ": the FP8 pool's layout does not hold the dims' rows (dl + dr, dl a multiple "
              "of 4, positive page size, stride at least a page)");
        }
      }
      for (const DecodeBatch::Member& m : group.members) {
        if (m.length < 0 ||
            (m.length > 0 && (page_size <= 0 || CeilDiv(m.length, page_size) >
                                                    static_cast<int64_t>(m.pages.size())))) {
          return absl::InvalidArgumentError(absl::StrCat(at, ": a member of length ", m.length,
                                                         " has ", m.pages.size(), " pages"));
        }
      }
      if (!group.head_space && !group.naive_passes.empty()) {
        return absl::InvalidArgumentError(at + ": a latent-space group cannot take naive passes");
      }
      int32_t covered = 0;
      for (int p : group.naive_passes) {
        if (p < 0 || p >= static_cast<int>(b_.passes.size()))
          return absl::InvalidArgumentError(at + ": bad pass");
        const DecodeBatch::NaivePass& pass = b_.passes[p];
        if (pass.begin != covered || pass.end <= pass.begin ||
            std::find(pass.groups.begin(), pass.groups.end(), static_cast<int>(g)) ==
                pass.groups.end()) {
          return absl::InvalidArgumentError(at + ": its naive passes do not tile its prefix");
        }
        covered = pass.end;
      }
      if (covered != (group.naive_passes.empty() ? 0 : group.absorb_from) ||
          group.absorb_from < 0 || (group.naive_passes.empty() && group.absorb_from != 0)) {
        return absl::InvalidArgumentError(at + ": absorb_from is not the end of its naive passes");
      }
    }
    for (size_t p = 0; p < b_.passes.size(); ++p) {
      for (int g : b_.passes[p].groups) {
        if (g < 0 || g >= static_cast<int>(b_.groups.size()) ||
            std::count(b_.groups[g].naive_passes.begin(), b_.groups[g].naive_passes.end(),
                       static_cast<int>(p)) != 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("decode batch pass ", p, ": lists a group that does not take it"));
        }
      }
    }
    return absl::OkStatus();
  }

  // Caller memory, mapped once however many groups read it.
  int Input(const void* memory, int64_t elements, const std::string& name,
            ElementType type = ElementType::kBf16) {
    // The same memory may be read as two types (the store's pool as bf16 and as FP8 pages).
    const auto key = std::make_tuple(memory == nullptr ? name : std::string(), memory, type);
    auto it = inputs_.find(key);
    if (it != inputs_.end()) return it->second;
    const int id = steps().AddBuffer(StepBuffer{name, StepBuffer::Kind::kInput, type, elements,
                                                StepBuffer::Fill::kNone, memory});
    inputs_.emplace(key, id);
    return id;
  }
  int Buffer(std::string name, StepBuffer::Kind kind, ElementType type, int64_t elements,
             StepBuffer::Fill fill = StepBuffer::Fill::kNone) {
    return steps().AddBuffer(StepBuffer{std::move(name), kind, type, elements, fill, nullptr});
  }

  void Allocate() {
    const int H = d_.heads;
    const int64_t w_elements = int64_t{H} * (d_.dn + d_.dv) * d_.dl;
    bool any_bf16 = false, any_fp8 = false;
    for (const DecodeBatch::Group& group : b_.groups) {
      (group.kv_dtype == KvDtype::kFp8 ? any_fp8 : any_bf16) = true;
    }
    if (any_bf16) pool_ = Input(b_.pool, b_.pool_pages * b_.page_size * d_.dk(), "KV pool");
    if (any_fp8) {
      fp8_pool_ = Input(b_.fp8_pool.pages, b_.fp8_pool.num_pages * b_.fp8_pool.layout.stride(),
                        "FP8 KV pool", ElementType::kByte);
    }
    using K = StepBuffer::Kind;
    using F = StepBuffer::Fill;
    groups_.resize(b_.groups.size());
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      GroupBuffers& gb = groups_[g];
      gb.rows = static_cast<int>(group.members.size()) * group.sq;
      const int64_t A = int64_t{gb.rows} * H;
      const std::string tag = absl::StrCat(" g", g);
      gb.width = group.head_space ? d_.dv : d_.dl;
      gb.q_lat = Buffer("q_lat" + tag, K::kScratch, ElementType::kBf16, A * d_.dk());
      // A head-space group's answer is written whole by project_out or prefix_merge; a
      // latent group's is the attention's destination, whose rows without keys keep the fill.
      gb.out =
          Buffer("out" + tag, K::kOutput, group.out_bf16 ? ElementType::kBf16 : ElementType::kFp32,
                 A * gb.width, group.head_space ? F::kNone : F::kZero);
      gb.lse = Buffer("lse" + tag, K::kOutput, ElementType::kFp32, A, F::kNegInfinity);
      if (group.head_space) {
        gb.kv_b = Input(group.kv_b, w_elements, "kv_b_proj");
        gb.q_nope = Buffer("q_nope" + tag, K::kScratch, ElementType::kBf16, A * d_.dn);
        gb.o_lat = Buffer("o_lat" + tag, K::kScratch, ElementType::kBf16, A * d_.dl, F::kZero);
        if (!group.naive_passes.empty()) {
          gb.absorb_out = Buffer("absorb out" + tag, K::kScratch, ElementType::kFp32, A * d_.dv);
        }
      }
    }
    passes_.resize(b_.passes.size());
    for (size_t p = 0; p < b_.passes.size(); ++p) {
      const DecodeBatch::NaivePass& pass = b_.passes[p];
      PassBuffers& pb = passes_[p];
      for (int g : pass.groups) {
        pb.row_of_group[g] = pb.rows;
        pb.rows += groups_[g].rows;
      }
      const int64_t tokens = pass.end - pass.begin;
      const int64_t A = int64_t{pb.rows} * H;
      const std::string tag = absl::StrCat(" p", p);
      pb.keys = Input(pass.keys, H * tokens * d_.dqk(), "expanded K" + tag);
      pb.values = Input(pass.values, H * tokens * d_.dv, "expanded V" + tag);
      pb.q = Buffer("q_naive" + tag, K::kScratch, ElementType::kBf16, A * d_.dqk());
      pb.out = Buffer("naive out" + tag, K::kScratch, ElementType::kFp32, A * d_.dv, F::kZero);
      pb.lse = Buffer("naive lse" + tag, K::kScratch, ElementType::kFp32, A, F::kNegInfinity);
    }
  }

  // The queries' rows into the groups' and passes' layouts: q_nope [R][H][dn], the RoPE part
  // of q_lat [R][H][dl:dk] (or all of it in latent space), q_naive [H][R_pass][dqk].
  void Stage() {
    const int H = d_.heads;
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      const GroupBuffers& gb = groups_[g];
      const int rows = group.sq * H;  // per member
      for (size_t m = 0; m < group.members.size(); ++m) {
        const DecodeBatch::Member& member = group.members[m];
        const int64_t first = static_cast<int64_t>(m) * rows;
        if (!group.head_space) {
          Copy(member.q_latent, d_.dk(), {gb.q_lat, first * d_.dk()}, d_.dk(), rows, d_.dk());
          continue;
        }
        Copy(member.q_nope, d_.dn, {gb.q_nope, first * d_.dn}, d_.dn, rows, d_.dn);
        Copy(member.q_pe, d_.dr, {gb.q_lat, first * d_.dk() + d_.dl}, d_.dk(), rows, d_.dr);
        for (int p : group.naive_passes) {
          const PassBuffers& pb = passes_[p];
          const int64_t pass_stride = int64_t{pb.rows} * d_.dqk();
          for (int s = 0; s < group.sq; ++s) {
            const int64_t r =
                pb.row_of_group.at(static_cast<int>(g)) + static_cast<int64_t>(m) * group.sq + s;
            const int64_t src_row = int64_t{s} * H;
            Copy(member.q_nope == nullptr ? nullptr : member.q_nope + src_row * d_.dn, d_.dn,
                 {pb.q, r * d_.dqk()}, pass_stride, H, d_.dn);
            Copy(member.q_pe == nullptr ? nullptr : member.q_pe + src_row * d_.dr, d_.dr,
                 {pb.q, r * d_.dqk() + d_.dn}, pass_stride, H, d_.dr);
          }
        }
      }
    }
  }
  void Copy(const Bf16* src, int64_t src_stride, BufferRef dst, int64_t dst_stride, int rows,
            int width) {
    steps().staging.push_back(StageCopy{src, src_stride, dst, dst_stride, rows, width});
  }

  // W_UK[h] is rows [h (dn + dv), h (dn + dv) + dn) of kv_b_proj, W_UV[h] the dv rows after.
  int64_t WukOffset(int h) const { return int64_t{h} * (d_.dn + d_.dv) * d_.dl; }
  int64_t WuvOffset(int h) const { return WukOffset(h) + int64_t{d_.dn} * d_.dl; }

  // A projection job, cut into jobs of at most invariant_projection_rows rows (NN) or one
  // (NT) in the batch-invariant mode (the rows' order in A and C is the job's: row r of a cut is
  // row r0 + r of the whole).
  void AddProjection(ProjectionStep& step, const ProjectionJob& job) const {
    // The row kernel takes the NN form only: an NT job's few rows go to the library, whose
    // sums over m rows depend on m, so there one row a job.
    const int most = !b_.batch_invariant || b_.invariant_projection_rows <= 0
                         ? std::max(job.rows, 1)
                     : job.transpose_b ? 1
                                       : b_.invariant_projection_rows;
    for (int r0 = 0; r0 < job.rows; r0 += most) {
      ProjectionJob cut = job;
      cut.rows = std::min(most, job.rows - r0);
      cut.a.offset += int64_t{r0} * job.lda;
      cut.c.offset += int64_t{r0} * job.ldc;
      step.jobs.push_back(cut);
    }
  }

  void AbsorbQueries() {
    const int H = d_.heads;
    ProjectionStep step{"absorb_q", {}, b_.batch_invariant};
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      if (!b_.groups[g].head_space) continue;
      const GroupBuffers& gb = groups_[g];
      for (int h = 0; h < H; ++h) {
        AddProjection(step, {.a = {gb.q_nope, int64_t{h} * d_.dn},
                             .lda = int64_t{H} * d_.dn,
                             .b = {gb.kv_b, WukOffset(h)},
                             .ldb = d_.dl,
                             .transpose_b = false,
                             .b_tiles = b_.groups[g].kv_b_tiles,
                             .c = {gb.q_lat, int64_t{h} * d_.dk()},
                             .ldc = int64_t{H} * d_.dk(),
                             .c_bf16 = true,
                             .rows = gb.rows,
                             .n = d_.dl,
                             .k = d_.dn});
      }
    }
    if (!step.jobs.empty()) steps().steps.push_back(std::move(step));
  }

  // Each member's (sq x heads) rows, 256 at a time, over its latent keys from absorb_from.
  std::vector<RowGroupSpec> LatentRowGroups() const {
    const int H = d_.heads;
    std::vector<RowGroupSpec> specs;
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      const GroupBuffers& gb = groups_[g];
      const int member_rows = group.sq * H;
      const int32_t from = group.absorb_from;
      for (size_t m = 0; m < group.members.size(); ++m) {
        const DecodeBatch::Member& member = group.members[m];
        const int32_t keys = std::max(0, member.length - from);
        for (int r0 = 0; r0 < member_rows; r0 += kMaxRowGroupRows) {
          RowGroupSpec spec;
          AttentionRowGroup& rg = spec.group;
          rg.rows = std::min(kMaxRowGroupRows, member_rows - r0);
          const int64_t first = static_cast<int64_t>(m) * member_rows + r0;
          rg.q = {gb.q_lat, first * d_.dk()};
          for (int r = r0; r < r0 + rg.rows; ++r) {
            rg.visible.push_back(std::clamp(
                VisibleKeys(member.length, group.sq, r / H, group.causal) - from, 0, keys));
          }
          if (group.kv_dtype == KvDtype::kFp8) {
            rg.keys = Fp8PagedKeysRef{{fp8_pool_, 0}, b_.fp8_pool.layout, member.pages, from};
          } else {
            rg.keys = PagedKeysRef{{pool_, 0}, b_.page_size, d_.dk(), member.pages, from};
          }
          if (group.head_space) {
            rg.out = {gb.o_lat, first * d_.dl};
            rg.out_bf16 = true;
          } else {
            rg.out = {gb.out, first * d_.dl};
            rg.out_bf16 = group.out_bf16;
          }
          rg.out_stride = d_.dl;
          rg.lse = {gb.lse, first};
          spec.length = *std::max_element(rg.visible.begin(), rg.visible.end());
          specs.push_back(std::move(spec));
        }
      }
    }
    return specs;
  }

  // Every pass x head: the pass's rows, 256 at a time, written into its [R][heads][dv] layout.
  std::vector<RowGroupSpec> NaiveRowGroups() const {
    const int H = d_.heads;
    std::vector<RowGroupSpec> specs;
    for (size_t p = 0; p < b_.passes.size(); ++p) {
      const DecodeBatch::NaivePass& pass = b_.passes[p];
      const PassBuffers& pb = passes_[p];
      const int32_t tokens = pass.end - pass.begin;
      // Each row's visible keys within the level, in pass row order.
      std::vector<int32_t> visible;
      for (int g : pass.groups) {
        const DecodeBatch::Group& group = b_.groups[g];
        for (const DecodeBatch::Member& member : group.members) {
          for (int s = 0; s < group.sq; ++s) {
            visible.push_back(std::clamp(
                VisibleKeys(member.length, group.sq, s, group.causal) - pass.begin, 0, tokens));
          }
        }
      }
      for (int h = 0; h < H; ++h) {
        const DenseKeysRef keys{{pb.keys, int64_t{h} * tokens * d_.dqk()},
                                d_.dqk(),
                                {pb.values, int64_t{h} * tokens * d_.dv},
                                d_.dv};
        for (int r0 = 0; r0 < pb.rows; r0 += kMaxRowGroupRows) {
          RowGroupSpec spec;
          AttentionRowGroup& rg = spec.group;
          rg.rows = std::min(kMaxRowGroupRows, pb.rows - r0);
          rg.q = {pb.q, (int64_t{h} * pb.rows + r0) * d_.dqk()};
          rg.visible.assign(visible.begin() + r0, visible.begin() + r0 + rg.rows);
          rg.keys = keys;
          rg.out = {pb.out, (int64_t{r0} * H + h) * d_.dv};
          rg.out_stride = int64_t{H} * d_.dv;
          rg.lse = {pb.lse, int64_t{r0} * H + h};
          rg.lse_stride = H;
          spec.length = *std::max_element(rg.visible.begin(), rg.visible.end());
          specs.push_back(std::move(spec));
        }
      }
    }
    return specs;
  }

  // The keys a split part's length is a multiple of.
  int SplitBlockTokens() const {
    return b_.split_block_tokens > 0 ? b_.split_block_tokens : kKvBlockTokens;
  }

  // A batch-invariant part's length in split blocks (at least one) for a row group of `rows`:
  // the part tokens per 128 rows, so that a part holds about the same work whatever the
  // query's shape (an MTP query's 256 rows take parts twice as long).
  int InvariantPartBlocks(int rows) const {
    const int64_t tokens = int64_t{b_.invariant_part_tokens > 0 ? b_.invariant_part_tokens
                                                                : kBatchInvariantPartTokens} *
                           std::max<int64_t>(1, rows / kBatchInvariantPartRows);
    return std::max(1, static_cast<int>(CeilDiv(tokens, SplitBlockTokens())));
  }

  // One attention step; row groups of a sparse step are split (split-KV), their parts written
  // to scratch and their merges added to `merges`.
  void AddAttention(const char* name, int dk, int dv, std::vector<RowGroupSpec> specs,
                    std::vector<CombineJob>& merges) {
    if (specs.empty()) return;
    // A unit takes `unit_rows` rows at a time (a GPU thread block's 64): a row group of more
    // keeps that many units busy, and counts that many times in the balance.
    std::vector<int> group_blocks;
    for (const RowGroupSpec& s : specs) {
      if (s.length <= 0) continue;
      const int unit_rows =
          std::holds_alternative<DenseKeysRef>(s.group.keys) && b_.dense_unit_rows > 0
              ? b_.dense_unit_rows
              : b_.unit_rows;
      const int64_t units = unit_rows > 0 ? CeilDiv(s.group.rows, unit_rows) : 1;
      for (int64_t u = 0; u < units; ++u) {
        group_blocks.push_back(static_cast<int>(CeilDiv(s.length, SplitBlockTokens())));
      }
    }
    // Balanced parts depend on the whole batch; batch-invariant ones (below, per row group)
    // on the row group's own rows and keys.
    const int balanced_part_blocks =
        SplitPartBlocks(group_blocks, b_.parallel_units, b_.balance_waves,
                        b_.split_part_overhead_blocks > 0 ? b_.split_part_overhead_blocks : 1);
    AttentionStep step{name, b_.algorithm, b_.fp8_quantize_queries, dk, dv, d_.softmax_scale, {}};
    const std::string tag = absl::StrCat(name, " split");
    int split_out = -1, split_lse = -1;
    int64_t split_rows = 0;
    for (RowGroupSpec& spec : specs) {
      const int split_tokens = SplitBlockTokens();
      const int blocks = static_cast<int>(CeilDiv(spec.length, split_tokens));
      const int part_blocks =
          b_.batch_invariant ? InvariantPartBlocks(spec.group.rows) : balanced_part_blocks;
      const int parts = static_cast<int>(CeilDiv(blocks, std::max(part_blocks, 1)));
      if (parts <= 1) {
        step.groups.push_back(std::move(spec.group));
        continue;
      }
      if (split_out < 0) {
        split_out = Buffer(tag + " out", StepBuffer::Kind::kScratch, ElementType::kFp32, 0,
                           StepBuffer::Fill::kZero);
        split_lse = Buffer(tag + " lse", StepBuffer::Kind::kScratch, ElementType::kFp32, 0,
                           StepBuffer::Fill::kNegInfinity);
      }
      const AttentionRowGroup& whole = spec.group;
      const int blocks_per_part = static_cast<int>(CeilDiv(blocks, parts));
      CombineJob merge;
      merge.rows = whole.rows;
      merge.dv = dv;
      merge.out = whole.out;
      merge.out_stride = whole.out_stride;
      merge.out_bf16 = whole.out_bf16;
      merge.lse = whole.lse;
      merge.lse_stride = whole.lse_stride;
      for (int32_t k0 = 0; k0 < spec.length; k0 += blocks_per_part * split_tokens) {
        const int32_t k1 = std::min(spec.length, k0 + blocks_per_part * split_tokens);
        AttentionRowGroup part;
        part.q = whole.q;
        part.rows = whole.rows;
        for (int32_t v : whole.visible) part.visible.push_back(std::clamp(v - k0, 0, k1 - k0));
        if (const auto* paged = std::get_if<PagedKeysRef>(&whole.keys)) {
          PagedKeysRef keys = *paged;
          keys.first_token += k0;
          part.keys = keys;
        } else if (const auto* fp8 = std::get_if<Fp8PagedKeysRef>(&whole.keys)) {
          Fp8PagedKeysRef keys = *fp8;
          keys.first_token += k0;
          part.keys = keys;
        } else {
          DenseKeysRef keys = std::get<DenseKeysRef>(whole.keys);
          keys.k.offset += int64_t{k0} * keys.ldk;
          keys.v.offset += int64_t{k0} * keys.ldv;
          part.keys = keys;
        }
        part.out = {split_out, split_rows * dv};
        part.out_stride = dv;
        part.lse = {split_lse, split_rows};
        merge.parts.push_back({part.out, part.lse});
        split_rows += whole.rows;
        step.groups.push_back(std::move(part));
      }
      merges.push_back(std::move(merge));
    }
    if (split_out >= 0) {
      steps().buffers[split_out].elements = split_rows * dv;
      steps().buffers[split_lse].elements = split_rows;
    }
    steps().steps.push_back(std::move(step));
  }

  void ProjectOut() {
    const int H = d_.heads;
    ProjectionStep step{"project_out", {}, b_.batch_invariant};
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      if (!group.head_space) continue;
      const GroupBuffers& gb = groups_[g];
      const bool hybrid = !group.naive_passes.empty();
      for (int h = 0; h < H; ++h) {
        AddProjection(step, {.a = {gb.o_lat, int64_t{h} * d_.dl},
                             .lda = int64_t{H} * d_.dl,
                             .b = {gb.kv_b, WuvOffset(h)},
                             .ldb = group.kv_b_tiles ? d_.dv : d_.dl,
                             // Tiles hold W_UV^T [dl][dv]; kv_b_proj holds W_UV [dv][dl].
                             .transpose_b = !group.kv_b_tiles,
                             .b_tiles = group.kv_b_tiles,
                             .c = {hybrid ? gb.absorb_out : gb.out, int64_t{h} * d_.dv},
                             .ldc = int64_t{H} * d_.dv,
                             .c_bf16 = !hybrid && group.out_bf16,
                             .rows = gb.rows,
                             .n = d_.dv,
                             .k = d_.dl});
      }
    }
    if (!step.jobs.empty()) steps().steps.push_back(std::move(step));
  }

  // A hybrid group's answer: its rows of every naive pass (root first), then its absorb part.
  void PrefixMerge() {
    const int H = d_.heads;
    CombineStep step{"prefix_merge", {}};
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      if (group.naive_passes.empty()) continue;
      const GroupBuffers& gb = groups_[g];
      CombineJob job;
      job.rows = gb.rows * H;
      job.dv = d_.dv;
      for (int p : group.naive_passes) {
        const PassBuffers& pb = passes_[p];
        const int64_t first = int64_t{pb.row_of_group.at(static_cast<int>(g))} * H;
        job.parts.push_back({{pb.out, first * d_.dv}, {pb.lse, first}});
      }
      job.parts.push_back({{gb.absorb_out, 0}, {gb.lse, 0}});
      job.out = {gb.out, 0};
      job.out_stride = d_.dv;
      job.out_bf16 = group.out_bf16;
      job.lse = {gb.lse, 0};
      step.jobs.push_back(std::move(job));
    }
    if (!step.jobs.empty()) steps().steps.push_back(std::move(step));
  }

  void Answers() {
    const int H = d_.heads;
    out_.answers.resize(b_.groups.size());
    for (size_t g = 0; g < b_.groups.size(); ++g) {
      const DecodeBatch::Group& group = b_.groups[g];
      const GroupBuffers& gb = groups_[g];
      const int64_t rows = int64_t{group.sq} * H;
      for (size_t m = 0; m < group.members.size(); ++m) {
        out_.answers[g].push_back(
            AnswerRef{{gb.out, static_cast<int64_t>(m) * rows * gb.width},
                      group.out_bf16 ? ElementType::kBf16 : ElementType::kFp32,
                      rows * gb.width,
                      {gb.lse, static_cast<int64_t>(m) * rows},
                      rows});
      }
    }
  }

  const DecodeBatch& b_;
  const MlaDims d_;
  BuiltBatch out_;
  std::map<std::tuple<std::string, const void*, ElementType>, int> inputs_;
  int pool_ = -1;
  int fp8_pool_ = -1;
  std::vector<GroupBuffers> groups_;
  std::vector<PassBuffers> passes_;
};

}  // namespace

int SplitPartBlocks(std::span<const int> group_blocks, int parallel_units, bool balance_waves,
                    int part_overhead_blocks) {
  const int longest =
      group_blocks.empty() ? 1 : *std::max_element(group_blocks.begin(), group_blocks.end());
  const int64_t groups = static_cast<int64_t>(group_blocks.size());
  if (parallel_units <= 1 || groups == 0 || (groups >= parallel_units && !balance_waves)) {
    return longest;
  }
  const int64_t kPartOverheadBlocks = std::max(part_overhead_blocks, 0);
  int best = longest;
  // Unsplit: one wave when the groups fit, else as many as they take.
  int64_t best_cost = CeilDiv(groups, parallel_units) *
                      (longest + (groups > parallel_units ? kPartOverheadBlocks : 0));
  for (int part = longest - 1; part >= 1; --part) {
    int64_t items = 0;
    for (int blocks : group_blocks) items += CeilDiv(blocks, part);
    const int64_t cost = CeilDiv(items, parallel_units) * (part + kPartOverheadBlocks);
    if (cost < best_cost) {
      best = part;
      best_cost = cost;
    }
  }
  return best;
}

absl::StatusOr<BuiltBatch> BuildBatchSteps(const DecodeBatch& batch) {
  Builder builder(batch);
  return builder.Build();
}

}  // namespace mlaserve
