// The AIC side of AttentionDeviceKernel: [C1] S = Q K^T and [C2] P V for every task of a block,
// C1 running `preload` tasks ahead of C2.
#include <algorithm>
#include <cstring>
#include <memory>
#include <variant>

#include "common/status_macros.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/tiling.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "kernels/npu/programs/cube_l0_stage.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {

// Hierarchical tiling (AMLA paper §4.2).
constexpr int kTileRows = CubeL0Stage::kTile;  // baseM
constexpr int kTileCols = CubeL0Stage::kTile;  // baseN
constexpr int kQStripeDepth = 288;   // an L1 stripe of Q: 128 rows x 288 dims bf16 = 72 KiB
constexpr int kPStripeTokens = 256;  // an L1 stripe of P: 128 rows x 256 keys bf16 = 64 KiB
constexpr int kKChunkTokens = 128;   // an L1 chunk of K: 128 keys x 288 dims = 72 KiB
constexpr int64_t kL1SlotBytes = 72 * 1024;
constexpr int kStripeSlots = 4;  // L1: four buffers for Q/P stripes ...
constexpr int kChunkSlots = 3;   // ... and three for K/V chunks: 7 x 72 KiB of 512 KiB

struct Tile {
  int begin;
  int size;
};

std::vector<Tile> Tiles(int extent, int tile) {
  std::vector<Tile> tiles;
  for (int b = 0; b < extent; b += tile) tiles.push_back({b, std::min(tile, extent - b)});
  return tiles;
}

// Where an FP8 group's task finds its keys: on an FP8 cube, in the cache's pages (the bytes
// as stored); otherwise in the task's slot of widened keys ([512][dk] bf16, row 0 = the
// task's first key).
struct Fp8KeySource {
  bool fp8_matrix = false;
  GmBuffer widened;
  int task_begin = 0;
};

// The FP8 cache's bytes of keys [token0, token0 + count) x columns [col0, col0 + width), per
// page run: the content columns' e4m3 bytes and the RoPE columns' bf16, widened into L1.
void ReadFp8PageRows(CoreRecorder& aic, const Fp8Keys& fp8, int token0, int count, int col0,
                     int width, int block, Bf16* dst, const char* label) {
  const Fp8PageLayout& layout = fp8.layout;
  const int content_cols = std::clamp(layout.dl - col0, 0, width);
  const int rope_cols = width - content_cols;
  const int rope_col0 = std::max(col0, layout.dl) - layout.dl;
  for (int done = 0; done < count;) {
    const int token = fp8.first_token + token0 + done;
    const int page = fp8.pages[token / layout.page_size];
    const int row = token % layout.page_size;
    const int run = std::min(layout.page_size - row, count - done);
    const int64_t page_base = int64_t{page} * layout.stride();
    const int64_t content_at = page_base + layout.content_offset(row) + col0;
    const int64_t rope_at = page_base + layout.rope_offset(row) + int64_t{rope_col0} * 2;
    Payload copy;
    if (aic.executes()) {
      const std::byte* base = fp8.pool.host;
      copy = [=] {
        WidenFp8RowsToL1(base + page_base + layout.content_offset(row), layout.dl,
                         base + page_base + layout.rope_offset(row), int64_t{layout.dr} * 2,
                         layout.dl, run, col0, width, block, dst, count, done);
      };
    }
    if (content_cols > 0) {
      aic.ReadGm(GmRegion::Rows(fp8.pool, content_at, run, content_cols, layout.dl),
                 std::move(copy), label);
      copy = nullptr;
    }
    if (rope_cols > 0) {
      aic.ReadGm(
          GmRegion::Rows(fp8.pool, rope_at, run, int64_t{rope_cols} * 2, int64_t{layout.dr} * 2),
          std::move(copy), label);
    }
    done += run;
  }
}

// Issues the MTE2 copies of keys (or values) [token0, token0 + count) x columns
// [col0, col0 + width) of a group into an L1 buffer in depth blocks of `block` columns
// (CopyRowsToL1); one DMA per contiguous run (a page, for paged keys).
void ReadKeyRows(CoreRecorder& aic, const RowGroup& group, bool values, int token0, int count,
                 int col0, int width, int block, Bf16* dst, const char* label,
                 const Fp8KeySource& fp8_source = {}) {
  const bool execute = aic.executes();
  if (const auto* fp8 = std::get_if<Fp8Keys>(&group.keys)) {
    if (fp8_source.fp8_matrix) {
      ReadFp8PageRows(aic, *fp8, token0, count, col0, width, block, dst, label);
      return;
    }
    const int64_t ld = int64_t{fp8->layout.dl} + fp8->layout.dr;
    const int64_t first = int64_t{token0 - fp8_source.task_begin} * ld + col0;
    Payload copy;
    if (execute) {
      const Bf16* base = fp8_source.widened.as<Bf16>() + first;
      copy = [base, ld, count, width, block, dst] {
        CopyRowsToL1(base, ld, count, width, block, dst, count, 0);
      };
    }
    aic.ReadGm(GmRegion::Rows(fp8_source.widened, first * 2, count, width * 2, ld * 2),
               std::move(copy), label);
    return;
  }
  if (const auto* paged = std::get_if<PagedKeys>(&group.keys)) {
    for (int done = 0; done < count;) {
      const int token = paged->first_token + token0 + done;
      const int page = paged->pages[token / paged->page_size];
      const int row = token % paged->page_size;
      const int run = std::min(paged->page_size - row, count - done);
      const int64_t first =
          (static_cast<int64_t>(page) * paged->page_size + row) * paged->width + col0;
      Payload copy;
      if (execute) {
        const Bf16* base = paged->pool.as<Bf16>() + first;
        const int64_t stride = paged->width;
        copy = [base, stride, run, width, block, dst, count, done] {
          CopyRowsToL1(base, stride, run, width, block, dst, count, done);
        };
      }
      aic.ReadGm(GmRegion::Rows(paged->pool, first * 2, run, width * 2, paged->width * 2),
                 std::move(copy), label);
      done += run;
    }
    return;
  }
  const auto& dense = std::get<DenseKeys>(group.keys);
  const GmBuffer& matrix = values ? dense.v : dense.k;
  const int64_t ld = values ? dense.ldv : dense.ldk;
  const int64_t first = static_cast<int64_t>(token0) * ld + col0;
  Payload copy;
  if (execute) {
    const Bf16* base = matrix.as<Bf16>() + first;
    copy = [base, ld, count, width, block, dst] {
      CopyRowsToL1(base, ld, count, width, block, dst, count, 0);
    };
  }
  aic.ReadGm(GmRegion::Rows(matrix, first * 2, count, width * 2, ld * 2), std::move(copy), label);
}

// The MMAD reads its operands from L1 (see CubeL0Stage), so L1 buffers are freed by M.
struct L1Rings {
  SlotRing stripes;  // Q/P stripes: MTE2 -> MTE1, freed by M; events 0..3
  SlotRing chunks;   // K/V chunks:  MTE2 -> MTE1, freed by M; events 4..6
};

class CubeProgram {
 public:
  CubeProgram(CoreRecorder& aic, const AttentionWorkload& workload, const AttentionWorkspace& ws,
              const AttentionDeviceKernelOptions& options, L1Rings& l1, CubeL0Stage& l0)
      : aic_(aic), w_(workload), ws_(ws), options_(options), l1_(l1), l0_(l0) {}

  // [C1]: S = Q K^T for one task, into the task's scores slot. All of Q stays in L1 (up to
  // 4 stripes: 2 row tiles x 2 depth halves) so each K chunk is read from GM once and used
  // by every row tile; each row tile accumulates in its own L0C tile.
  void Scores(const AttentionTask& t, int slot, int index) {
    const RowGroup& g = w_.groups[t.group];
    const auto* fp8 = std::get_if<Fp8Keys>(&g.keys);
    // The AIVs prepare an FP8 group's queries (and, without an FP8 cube, widen the keys).
    if (fp8 != nullptr) aic_.CrossCoreWaitFlag(AttentionDeviceKernel::kFlagKeysReady);
    const bool fp8_cube = fp8 != nullptr && options_.fp8_matrix;
    const Fp8KeySource key_source = KeySource(t, index);
    const GmBuffer s_slot = ws_.SlotRows(ws_.scores, aic_.block(), slot, kKvBlockTokens * 4);
    const std::vector<Tile> m_tiles = Tiles(g.rows, kTileRows);
    const std::vector<Tile> depth = Tiles(w_.dk, kQStripeDepth);
    const auto q_slot = LoadStripes(depth, m_tiles, [&](Tile d, Tile m, Bf16* dst) {
      if (fp8_cube) {
        ReadFp8Stripe(ws_.q_prep[t.group],
                      AttentionWorkspace::Fp8QueryRowBytes(fp8->layout.dl, fp8->layout.dr),
                      fp8->layout.dl, m, d, kQkDepthChunk, dst, "Q stripe");
      } else {
        ReadBf16Stripe(fp8 != nullptr ? ws_.q_prep[t.group] : g.q, w_.dk, m, d, kQkDepthChunk, dst,
                       "Q stripe");
      }
    });

    const std::vector<Tile> n_tiles = Tiles(t.tokens, kKChunkTokens);
    for (size_t nt = 0; nt < n_tiles.size(); ++nt) {
      const auto [n0, n] = n_tiles[nt];
      std::vector<int> c(m_tiles.size());
      for (size_t d = 0; d < depth.size(); ++d) {
        const auto [d0, width] = depth[d];
        const int k = l1_.chunks.Acquire();
        Bf16* chunk = l1_.chunks.slot(k).as<Bf16>();
        ReadKeyRows(aic_, g, /*values=*/false, t.begin + n0, n, d0, width, kQkDepthChunk, chunk,
                    "K chunk", key_source);
        l1_.chunks.Publish(k);
        l1_.chunks.Consume(k);
        for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
          const int m = m_tiles[mt].size;
          if (nt == 0) l1_.stripes.Consume(q_slot[d][mt]);  // first use of this stripe
          if (d == 0) c[mt] = l0_.AcquireTile();            // first write of this tile
          const Bf16* q = l1_.stripes.slot(q_slot[d][mt]).as<Bf16>();
          for (int k0 = 0; k0 < width; k0 += kQkDepthChunk) {
            const int kk = std::min(kQkDepthChunk, width - k0);
            const int b = k0 / kQkDepthChunk;
            // On an FP8 cube the content columns of the chunk are e4m3 (SnapMLA's QK).
            const int fp8_k = fp8_cube ? std::clamp(fp8->layout.dl - (d0 + k0), 0, kk) : 0;
            l0_.Multiply(m, n, kk, {L1Block(q, m, kQkDepthChunk, b), m, kk}, "Q tile",
                         {L1Block(chunk, n, kQkDepthChunk, b), n, kk}, "K tile",
                         /*b_transposed=*/true, c[mt], d > 0 || k0 > 0, "QK^T", fp8_k);
          }
          // The last depth half of a row tile: hand its S tile to FIX while the cube goes on.
          if (d + 1 == depth.size()) FlushScores(s_slot, m_tiles[mt], n0, n, c[mt]);
        }
        l1_.chunks.Release(k);
        if (nt + 1 == n_tiles.size()) {
          for (int s : q_slot[d]) l1_.stripes.Release(s);  // this depth half is done
        }
      }
    }
    aic_.CrossCoreSetFlag(AttentionDeviceKernel::kFlagScoresReady, Pipe::kFix);
  }

  // [C2]: P V for one task, added into the group's accumulator (AMLA) or written to the
  // task's P V slot (Base). `index` is the task's position on this block. All of P stays in
  // L1 (up to 4 stripes: 2 row tiles x 2 key halves) and each V chunk is read once.
  void Values(const AttentionTask& t, int slot, int index) {
    const RowGroup& g = w_.groups[t.group];
    const GmBuffer p_slot = ws_.SlotRows(ws_.probs, aic_.block(), slot, kKvBlockTokens * 2);
    const bool fp8 = std::holds_alternative<Fp8Keys>(g.keys);
    const bool fp8_cube = fp8 && options_.fp8_matrix;
    const Fp8KeySource key_source = KeySource(t, index);
    const bool amla = options_.algorithm == RescaleAlgorithm::kAmla;  // always, with FP8 groups
    const GmBuffer target =
        amla ? ws_.acc[t.group] : ws_.SlotRows(ws_.partial, aic_.block(), slot, w_.dv * 4);
    const std::vector<Tile> m_tiles = Tiles(g.rows, kTileRows);
    const std::vector<Tile> halves = Tiles(t.tokens, kPStripeTokens);
    aic_.CrossCoreWaitFlag(AttentionDeviceKernel::kFlagProbsReady);
    const auto p_slot_of = LoadStripes(halves, m_tiles, [&](Tile h, Tile m, Bf16* dst) {
      if (fp8_cube) {  // e4m3 bytes at the start of each row of the slot
        ReadFp8Stripe(p_slot, kKvBlockTokens * 2, kKvBlockTokens, m, h, kPvDepthChunk, dst,
                      "P stripe");
      } else {
        ReadBf16Stripe(p_slot, kKvBlockTokens, m, h, kPvDepthChunk, dst, "P stripe");
      }
    });

    bool first_write = true;
    const std::vector<Tile> n_tiles = Tiles(w_.dv, kTileCols);
    for (size_t nt = 0; nt < n_tiles.size(); ++nt) {
      const auto [n0, n] = n_tiles[nt];
      std::vector<int> c(m_tiles.size());
      for (size_t h = 0; h < halves.size(); ++h) {
        const auto [k0, width] = halves[h];
        const int v = l1_.chunks.Acquire();
        Bf16* chunk = l1_.chunks.slot(v).as<Bf16>();  // [width keys][n]
        ReadKeyRows(aic_, g, /*values=*/true, t.begin + k0, width, n0, n, n, chunk, "V chunk",
                    key_source);
        l1_.chunks.Publish(v);
        l1_.chunks.Consume(v);
        for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
          const int m = m_tiles[mt].size;
          if (nt == 0) l1_.stripes.Consume(p_slot_of[h][mt]);
          if (h == 0) c[mt] = l0_.AcquireTile();
          const Bf16* p = l1_.stripes.slot(p_slot_of[h][mt]).as<Bf16>();
          for (int j = 0; j < width; j += kPvDepthChunk) {
            const int kk = std::min(kPvDepthChunk, width - j);
            l0_.Multiply(m, n, kk, {L1Block(p, m, kPvDepthChunk, j / kPvDepthChunk), m, kk},
                         "P tile", {chunk + static_cast<int64_t>(j) * n, kk, n}, "V tile",
                         /*b_transposed=*/false, c[mt], h > 0 || j > 0, "PV", fp8_cube ? kk : 0);
          }
          if (h + 1 == halves.size()) {
            if (first_write) {
              // AMLA adds into O only after the AIVs rescaled it for this block; Base reuses
              // a P V slot only after [V2] of the task that last used it.
              if (amla || index >= ws_.slots)
                aic_.CrossCoreWaitFlag(AttentionDeviceKernel::kFlagRescaleDone);
              first_write = false;
            }
            FlushValues(target, m_tiles[mt], n0, n, c[mt], /*add=*/amla && !t.first);
          }
        }
        l1_.chunks.Release(v);
        if (nt + 1 == n_tiles.size()) {
          for (int s : p_slot_of[h]) l1_.stripes.Release(s);
        }
      }
    }
    aic_.CrossCoreSetFlag(AttentionDeviceKernel::kFlagPvDone, Pipe::kFix);
  }

 private:
  // Loads every (outer, row tile) stripe of a stage into the stripe ring, outer-major so the
  // first outer half is the first to be released. `read(outer, m_tile, dst)` issues the
  // stripe's GM reads into `dst`, stored in depth blocks (CopyRowsToL1's layout).
  template <typename Read>
  std::vector<std::vector<int>> LoadStripes(const std::vector<Tile>& outer,
                                            const std::vector<Tile>& m_tiles, Read read) {
    std::vector<std::vector<int>> slots(outer.size(), std::vector<int>(m_tiles.size()));
    for (size_t o = 0; o < outer.size(); ++o) {
      for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
        const int s = l1_.stripes.Acquire();
        read(outer[o], m_tiles[mt], l1_.stripes.slot(s).as<Bf16>());
        l1_.stripes.Publish(s);
        slots[o][mt] = s;
      }
    }
    return slots;
  }

  // A stripe of bf16 rows: rows m of `base` (row stride `ld` elements), columns d.
  void ReadBf16Stripe(const GmBuffer& base, int64_t ld, Tile m, Tile d, int block, Bf16* dst,
                      const char* label) {
    const int64_t first = static_cast<int64_t>(m.begin) * ld + d.begin;
    Payload copy;
    if (aic_.executes()) {
      copy = [src = base.as<Bf16>() + first, ld, dst, rows = m.size, width = d.size, block] {
        CopyRowsToL1(src, ld, rows, width, block, dst, rows, 0);
      };
    }
    aic_.ReadGm(GmRegion::Rows(base, first * 2, m.size, d.size * 2, ld * 2), std::move(copy),
                label);
  }

  // A stripe of FP8-form rows (`row_bytes` apart: dl e4m3 bytes then bf16), widened into L1.
  void ReadFp8Stripe(const GmBuffer& base, int64_t row_bytes, int dl, Tile m, Tile d, int block,
                     Bf16* dst, const char* label) {
    const int content_cols = std::clamp(dl - d.begin, 0, d.size);
    const int rope_cols = d.size - content_cols;
    const int64_t first_row = static_cast<int64_t>(m.begin) * row_bytes;
    Payload copy;
    if (aic_.executes()) {
      copy = [=, host = base.host] {
        WidenFp8RowsToL1(host + first_row, row_bytes, host + first_row + dl, row_bytes, dl, m.size,
                         d.begin, d.size, block, dst, m.size, 0);
      };
    }
    if (content_cols > 0) {
      aic_.ReadGm(GmRegion::Rows(base, first_row + d.begin, m.size, content_cols, row_bytes),
                  std::move(copy), label);
      copy = nullptr;
    }
    if (rope_cols > 0) {
      const int64_t rope_at = first_row + dl + 2 * int64_t{std::max(d.begin, dl) - dl};
      aic_.ReadGm(GmRegion::Rows(base, rope_at, m.size, int64_t{rope_cols} * 2, row_bytes),
                  std::move(copy), label);
    }
  }

  Fp8KeySource KeySource(const AttentionTask& t, int index) const {
    Fp8KeySource source;
    source.fp8_matrix = options_.fp8_matrix;
    source.task_begin = t.begin;
    if (!options_.fp8_matrix && ws_.key_slots > 0) {
      source.widened = ws_.KeySlot(aic_.block(), index % ws_.key_slots, w_.dk);
    }
    return source;
  }

  void FlushScores(const GmBuffer& s_slot, Tile m, int n0, int n, int c) {
    const int64_t first = static_cast<int64_t>(m.begin) * kKvBlockTokens + n0;
    Payload write;
    if (aic_.executes()) {
      write = [acc = l0_.tile(c), dst = s_slot.as<float>() + first, rows = m.size, n] {
        for (int r = 0; r < rows; ++r)
          std::memcpy(dst + r * kKvBlockTokens, acc + r * kTileCols, n * sizeof(float));
      };
    }
    l0_.Flush(c, GmRegion::Rows(s_slot, first * 4, m.size, n * 4, kKvBlockTokens * 4),
              AtomicMode::kNone, std::move(write), "S tile");
  }

  void FlushValues(const GmBuffer& target, Tile m, int n0, int n, int c, bool add) {
    const int64_t first = static_cast<int64_t>(m.begin) * w_.dv + n0;
    Payload write;
    if (aic_.executes()) {
      write = [acc = l0_.tile(c), dst = target.as<float>() + first, rows = m.size, n, dv = w_.dv,
               add] {
        for (int r = 0; r < rows; ++r) {
          float* row = dst + static_cast<int64_t>(r) * dv;
          const float* src = acc + r * kTileCols;
          if (add) {
            for (int d = 0; d < n; ++d) row[d] += src[d];
          } else {
            std::memcpy(row, src, n * sizeof(float));
          }
        }
      };
    }
    l0_.Flush(c, GmRegion::Rows(target, first * 4, m.size, n * 4, w_.dv * 4),
              add ? AtomicMode::kAddF32 : AtomicMode::kNone, std::move(write),
              options_.algorithm == RescaleAlgorithm::kAmla ? "PV atomic add" : "PV tile");
  }

  CoreRecorder& aic_;
  const AttentionWorkload& w_;
  const AttentionWorkspace& ws_;
  const AttentionDeviceKernelOptions& options_;
  L1Rings& l1_;
  CubeL0Stage& l0_;
};

}  // namespace

absl::Status AttentionDeviceKernel::RecordCube(CoreRecorder& aic) const {
  std::vector<LocalTensor> stripes, chunks;
  for (int i = 0; i < kStripeSlots; ++i) {
    ASSIGN_OR_RETURN(LocalTensor t, aic.Alloc(Space::kL1, kL1SlotBytes, "Q/P stripe"));
    stripes.push_back(t);
  }
  for (int i = 0; i < kChunkSlots; ++i) {
    ASSIGN_OR_RETURN(LocalTensor t, aic.Alloc(Space::kL1, kL1SlotBytes, "K/V chunk"));
    chunks.push_back(t);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CubeL0Stage> l0, CubeL0Stage::Create(aic));
  L1Rings l1{SlotRing(aic, Pipe::kMte2, Pipe::kMte1, Pipe::kM, 0, stripes),
             SlotRing(aic, Pipe::kMte2, Pipe::kMte1, Pipe::kM, kStripeSlots, chunks)};
  CubeProgram program(aic, workload_, workspace_, options_, l1, *l0);

  const std::vector<AttentionTask>& tasks = schedule_[aic.block()];
  const int n = static_cast<int>(tasks.size());
  const int ahead = options_.preload;
  const int slots = workspace_.slots;
  for (int t = 0; t < std::min(ahead, n); ++t) program.Scores(tasks[t], t % slots, t);
  for (int t = 0; t < n; ++t) {
    if (t + ahead < n) program.Scores(tasks[t + ahead], (t + ahead) % slots, t + ahead);
    program.Values(tasks[t], t % slots, t);
  }
  if (options_.algorithm == RescaleAlgorithm::kBase) {
    // Consume the [V2] completions not yet waited for, so every set is paired.
    for (int t = 0; t < std::min(n, slots); ++t) aic.CrossCoreWaitFlag(kFlagRescaleDone);
  }
  l1.stripes.Drain();
  l1.chunks.Drain();
  l0->Drain();
  return absl::OkStatus();
}

}  // namespace mlaserve::npu
