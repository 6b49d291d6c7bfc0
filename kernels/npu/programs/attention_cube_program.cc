// The AIC side of AttentionKernel: [C1] S = Q K^T and [C2] P V for every task of a block,
// C1 running `preload` tasks ahead of C2.
#include <algorithm>
#include <cstring>
#include <variant>

#include "kernels/core/bfloat16.h"
#include "kernels/core/matmul.h"
#include "kernels/core/status_macros.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/npu/programs/attention_kernel.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {

// Hierarchical tiling (AMLA paper §4.2).
constexpr int kTileRows = 128;       // baseM
constexpr int kTileCols = 128;       // baseN
constexpr int kQStripeDepth = 288;   // an L1 stripe of Q: 128 rows x 288 dims bf16 = 72 KiB
constexpr int kPStripeTokens = 256;  // an L1 stripe of P: 128 rows x 256 keys bf16 = 64 KiB
constexpr int kKChunkTokens = 128;   // an L1 chunk of K: 128 keys x 288 dims = 72 KiB
constexpr int kVChunkTokens = 256;   // an L1 chunk of V: 256 keys x 128 dims = 64 KiB
constexpr int64_t kL1SlotBytes = 72 * 1024;
constexpr int kStripeSlots = 4;      // L1: four buffers for Q/P stripes ...
constexpr int kChunkSlots = 3;       // ... and three for K/V chunks: 7 x 72 KiB of 512 KiB
constexpr int64_t kL0HalfBytes = 32 * 1024;   // L0A/L0B ping-pong halves
constexpr int64_t kL0cHalfBytes = 64 * 1024;  // L0C ping-pong: one 128 x 128 fp32 tile each

// Where a row range of keys or values lives: either a request's pages or a dense matrix.
struct KeyRows {
  const RowGroup* group;
  bool values;  // V (dense groups keep it apart; paged groups read K's first columns)
};

// Copies `rows` bf16 rows of `width` (source row stride `stride`) into L1's fp32 shadow.
void WidenRows(const Bf16* src, int64_t stride, int rows, int width, float* dst) {
  for (int r = 0; r < rows; ++r) WidenBf16(src + r * stride, width, dst + static_cast<int64_t>(r) * width);
}

// Issues the MTE2 copies of rows [token0, token0 + count) x columns [col0, col0 + width) of
// a group's keys (or values) into an L1 buffer laid out [count][width]; one DMA per
// contiguous run (a page, for paged keys).
void ReadKeyRows(CoreRecorder& aic, const KeyRows& src, int token0, int count, int col0, int width,
                 float* dst, const char* label) {
  const bool execute = aic.executes();
  if (const auto* paged = std::get_if<PagedKeys>(&src.group->keys)) {
    for (int done = 0; done < count;) {
      const int token = token0 + done;
      const int page = paged->pages[token / paged->page_size];
      const int row = token % paged->page_size;
      const int run = std::min(paged->page_size - row, count - done);
      const int64_t first = (static_cast<int64_t>(page) * paged->page_size + row) * paged->width + col0;
      const GmRegion region = GmRegion::Rows(paged->pool, first * 2, run, width * 2, paged->width * 2);
      Payload copy;
      if (execute) {
        const Bf16* base = paged->pool.as<Bf16>() + first;
        float* out = dst + static_cast<int64_t>(done) * width;
        const int64_t stride = paged->width;
        copy = [base, out, run, width, stride] { WidenRows(base, stride, run, width, out); };
      }
      aic.ReadGm(region, std::move(copy), label);
      done += run;
    }
    return;
  }
  const auto& dense = std::get<DenseKeys>(src.group->keys);
  const GmBuffer& matrix = src.values ? dense.v : dense.k;
  const int64_t ld = src.values ? dense.ldv : dense.ldk;
  const int64_t first = static_cast<int64_t>(token0) * ld + col0;
  Payload copy;
  if (execute) {
    const Bf16* base = matrix.as<Bf16>() + first;
    copy = [base, dst, count, width, ld] { WidenRows(base, ld, count, width, dst); };
  }
  aic.ReadGm(GmRegion::Rows(matrix, first * 2, count, width * 2, ld * 2), std::move(copy), label);
}

// The MMAD reads its operands where MTE1 staged them from, so an L1 buffer is free again
// only after the M pipe's last MMAD on its tiles: L1 rings are released by M.
struct CubeBuffers {
  SlotRing stripes;  // L1 Q/P stripes: MTE2 -> MTE1, freed by M; events 0..3
  SlotRing chunks;   // L1 K/V chunks:  MTE2 -> MTE1, freed by M; events 4..6
  SlotRing l0;       // L0A + L0B halves: MTE1 -> M, events 0..1
  SlotRing l0c;      // L0C tiles: M -> FIX, events 0..1
};

class CubeProgram {
 public:
  CubeProgram(CoreRecorder& aic, const AttentionWorkload& workload, const AttentionWorkspace& ws,
              const AttentionKernelOptions& options, CubeBuffers& buffers)
      : aic_(aic), w_(workload), ws_(ws), options_(options), b_(buffers) {}

  // [C1]: S = Q K^T for one task, written to the task's scores slot. All of Q stays in L1
  // (up to 4 stripes: 2 row tiles x 2 depth halves) so each K chunk is read from GM once and
  // used by every row tile; L0C holds one 128 x 128 accumulator per row tile.
  void Scores(const AttentionTask& t, int slot) {
    const RowGroup& g = w_.groups[t.group];
    const GmBuffer s_slot = SlotRows(ws_.scores, slot, kKvBlockTokens * 4);
    const std::vector<Tile> m_tiles = Tiles(g.rows, kTileRows);
    const std::vector<Tile> depth = Tiles(w_.dk, kQStripeDepth);
    // Stripe-major order, so the first depth half is released first at the end.
    std::vector<std::vector<int>> q_slot(depth.size(), std::vector<int>(m_tiles.size()));
    for (size_t d = 0; d < depth.size(); ++d) {
      for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
        const auto [m0, m] = m_tiles[mt];
        const auto [d0, width] = depth[d];
        const int s = b_.stripes.Acquire();
        float* dst = b_.stripes.slot(s).as<float>();
        const int64_t first = static_cast<int64_t>(m0) * w_.dk + d0;
        Payload copy;
        if (aic_.executes()) {
          const Bf16* src = g.q.as<Bf16>() + first;
          const int dk = w_.dk;
          copy = [src, dst, m, width, dk] { WidenRows(src, dk, m, width, dst); };
        }
        aic_.ReadGm(GmRegion::Rows(g.q, first * 2, m, width * 2, w_.dk * 2), std::move(copy), "Q stripe");
        b_.stripes.Publish(s);
        q_slot[d][mt] = s;
      }
    }
    const std::vector<Tile> n_tiles = Tiles(t.tokens, kKChunkTokens);
    for (size_t nt = 0; nt < n_tiles.size(); ++nt) {
      const auto [n0, n] = n_tiles[nt];
      std::vector<int> c(m_tiles.size());
      // Hand a finished row tile to FIX at once, so it drains while the cube works on the
      // next row tile.
      auto flush = [&](size_t mt) {
        const auto [m0, m] = m_tiles[mt];
        b_.l0c.Publish(c[mt]);
        b_.l0c.Consume(c[mt]);
        const float* acc = b_.l0c.slot(c[mt]).as<float>();
        const int64_t first = static_cast<int64_t>(m0) * kKvBlockTokens + n0;
        Payload write;
        if (aic_.executes()) {
          float* dst = s_slot.as<float>() + first;
          write = [acc, dst, m = m, n = n] {
            for (int r = 0; r < m; ++r) std::memcpy(dst + r * kKvBlockTokens, acc + r * kTileCols, n * sizeof(float));
          };
        }
        aic_.WriteGm(GmRegion::Rows(s_slot, first * 4, m, n * 4, kKvBlockTokens * 4), AtomicMode::kNone,
                     std::move(write), "S tile");
        b_.l0c.Release(c[mt]);
      };
      for (size_t d = 0; d < depth.size(); ++d) {
        const auto [d0, width] = depth[d];
        const int k = b_.chunks.Acquire();
        float* chunk = b_.chunks.slot(k).as<float>();
        ReadKeyRows(aic_, {&g, false}, t.begin + n0, n, d0, width, chunk, "K chunk");
        b_.chunks.Publish(k);
        b_.chunks.Consume(k);
        for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
          const int m = m_tiles[mt].size;
          if (nt == 0) b_.stripes.Consume(q_slot[d][mt]);  // first use of this stripe
          if (d == 0) c[mt] = b_.l0c.Acquire();             // first write of this tile
          const float* q_stripe = b_.stripes.slot(q_slot[d][mt]).as<float>();
          float* acc = b_.l0c.slot(c[mt]).as<float>();
          for (int k0 = 0; k0 < width; k0 += kQkDepthChunk) {
            const int kk = std::min(kQkDepthChunk, width - k0);
            const bool accumulate = d > 0 || k0 > 0;
            MultiplyTile(m, n, kk, {q_stripe + k0, width, m, kk}, "Q tile",
                         {chunk + k0, width, n, kk}, "K tile", /*transpose_b=*/true, acc,
                         accumulate, "QK^T");
          }
          if (d + 1 == depth.size()) flush(mt);
        }
        b_.chunks.Release(k);
        if (nt + 1 == n_tiles.size()) {
          for (int s : q_slot[d]) b_.stripes.Release(s);  // this depth half is done
        }
      }
    }
    aic_.CrossCoreSetFlag(AttentionKernel::kFlagScoresReady, Pipe::kFix);
  }

  // [C2]: P V for one task, added into the group's accumulator (AMLA) or written to the
  // task's P V slot (Base). `index` is the task's position on this block. All of P stays in
  // L1 (up to 4 stripes: 2 row tiles x 2 key halves) and each V chunk is read once.
  void Values(const AttentionTask& t, int slot, int index) {
    const RowGroup& g = w_.groups[t.group];
    const GmBuffer p_slot = SlotRows(ws_.probs, slot, kKvBlockTokens * 2);
    const bool amla = options_.algorithm == RescaleAlgorithm::kAmla;
    const GmBuffer target = amla ? ws_.acc[t.group] : SlotRows(ws_.partial, slot, w_.dv * 4);
    const std::vector<Tile> m_tiles = Tiles(g.rows, kTileRows);
    const std::vector<Tile> halves = Tiles(t.tokens, kPStripeTokens);
    aic_.CrossCoreWaitFlag(AttentionKernel::kFlagProbsReady);
    std::vector<std::vector<int>> p_slot_of(halves.size(), std::vector<int>(m_tiles.size()));
    for (size_t h = 0; h < halves.size(); ++h) {
      for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
        const auto [m0, m] = m_tiles[mt];
        const auto [k0, width] = halves[h];
        const int s = b_.stripes.Acquire();
        float* dst = b_.stripes.slot(s).as<float>();
        const int64_t first = static_cast<int64_t>(m0) * kKvBlockTokens + k0;
        Payload copy;
        if (aic_.executes()) {
          const Bf16* src = p_slot.as<Bf16>() + first;
          copy = [src, dst, m, width] { WidenRows(src, kKvBlockTokens, m, width, dst); };
        }
        aic_.ReadGm(GmRegion::Rows(p_slot, first * 2, m, width * 2, kKvBlockTokens * 2), std::move(copy), "P stripe");
        b_.stripes.Publish(s);
        p_slot_of[h][mt] = s;
      }
    }
    bool first_write = true;
    const std::vector<Tile> n_tiles = Tiles(w_.dv, kTileCols);
    for (size_t nt = 0; nt < n_tiles.size(); ++nt) {
      const auto [n0, n] = n_tiles[nt];
      std::vector<int> c(m_tiles.size());
      auto flush = [&](size_t mt) {
        const auto [m0, m] = m_tiles[mt];
        b_.l0c.Publish(c[mt]);
        b_.l0c.Consume(c[mt]);
        if (first_write) {
          // AMLA adds into O only after the AIVs rescaled it for this block; Base reuses a
          // P V slot only after [V2] of the task that last used it.
          if (amla || index >= ws_.slots) aic_.CrossCoreWaitFlag(AttentionKernel::kFlagRescaleDone);
          first_write = false;
        }
        const float* acc = b_.l0c.slot(c[mt]).as<float>();
        const int64_t first = static_cast<int64_t>(m0) * w_.dv + n0;
        const bool add = amla && !t.first;
        Payload write;
        if (aic_.executes()) {
          float* dst = target.as<float>() + first;
          const int dv = w_.dv;
          write = [acc, dst, m = m, n = n, dv, add] {
            for (int r = 0; r < m; ++r) {
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
        aic_.WriteGm(GmRegion::Rows(target, first * 4, m, n * 4, w_.dv * 4),
                     add ? AtomicMode::kAddF32 : AtomicMode::kNone, std::move(write),
                     amla ? "PV atomic add" : "PV tile");
        b_.l0c.Release(c[mt]);
      };
      for (size_t h = 0; h < halves.size(); ++h) {
        const auto [k0, width] = halves[h];
        const int v = b_.chunks.Acquire();
        float* chunk = b_.chunks.slot(v).as<float>();
        ReadKeyRows(aic_, {&g, true}, t.begin + k0, width, n0, n, chunk, "V chunk");
        b_.chunks.Publish(v);
        b_.chunks.Consume(v);
        for (size_t mt = 0; mt < m_tiles.size(); ++mt) {
          const int m = m_tiles[mt].size;
          if (nt == 0) b_.stripes.Consume(p_slot_of[h][mt]);  // first use of this stripe
          if (h == 0) c[mt] = b_.l0c.Acquire();                 // first write of this tile
          const float* p_stripe = b_.stripes.slot(p_slot_of[h][mt]).as<float>();
          float* acc = b_.l0c.slot(c[mt]).as<float>();
          for (int j = 0; j < width; j += kPvDepthChunk) {
            const int kk = std::min(kPvDepthChunk, width - j);
            const bool accumulate = h > 0 || j > 0;
            MultiplyTile(m, n, kk, {p_stripe + j, width, m, kk}, "P tile",
                         {chunk + static_cast<int64_t>(j) * n, n, kk, n}, "V tile",
                         /*transpose_b=*/false, acc, accumulate, "PV");
          }
          if (h + 1 == halves.size()) flush(mt);
        }
        b_.chunks.Release(v);
        if (nt + 1 == n_tiles.size()) {
          for (int s : p_slot_of[h]) b_.stripes.Release(s);
        }
      }
    }
    aic_.CrossCoreSetFlag(AttentionKernel::kFlagPvDone, Pipe::kFix);
  }

 private:
  struct Tile {
    int begin;
    int size;
  };
  static std::vector<Tile> Tiles(int extent, int tile) {
    std::vector<Tile> tiles;
    for (int b = 0; b < extent; b += tile) tiles.push_back({b, std::min(tile, extent - b)});
    return tiles;
  }

  // A [rows][cols] window of an L1 buffer (row stride ld): one MMAD operand.
  struct TileSource {
    const float* src;
    int64_t ld;
    int rows;
    int cols;
  };

  // MTE1 stages both operands into an L0 ping-pong half (modelled; on the host the MMAD
  // reads them from L1 directly), M multiplies them into `acc`.
  void MultiplyTile(int m, int n, int k, const TileSource& a, const char* a_label,
                    const TileSource& b, const char* b_label, bool transpose_b, float* acc,
                    bool accumulate, const char* label) {
    const int l = b_.l0.Acquire();
    aic_.LoadL0(Space::kL0A, static_cast<int64_t>(a.rows) * a.cols * 2, nullptr, a_label);
    aic_.LoadL0(Space::kL0B, static_cast<int64_t>(b.rows) * b.cols * 2, nullptr, b_label);
    b_.l0.Publish(l);
    b_.l0.Consume(l);
    Payload multiply;
    if (aic_.executes()) {
      multiply = [=] {
        if (transpose_b) {
          MatmulTileNT(m, n, k, a.src, a.ld, b.src, b.ld, acc, kTileCols, accumulate);
        } else {
          MatmulTileNN(m, n, k, a.src, a.ld, b.src, b.ld, acc, kTileCols, accumulate);
        }
      };
    }
    aic_.Mmad(m, n, k, std::move(multiply), label);
    b_.l0.Release(l);
  }

  Payload Maybe(Payload p) const { return aic_.executes() ? std::move(p) : nullptr; }

  // This block's rows of a [blocks][slots][256][row_elems] workspace.
  GmBuffer SlotRows(const GmBuffer& workspace, int slot, int64_t row_bytes) const {
    const int64_t slot_bytes = kMaxGroupRows * row_bytes;
    return workspace.Slice((static_cast<int64_t>(aic_.block()) * ws_.slots + slot) * slot_bytes, slot_bytes);
  }

  CoreRecorder& aic_;
  const AttentionWorkload& w_;
  const AttentionWorkspace& ws_;
  const AttentionKernelOptions& options_;
  CubeBuffers& b_;
};

}  // namespace

absl::Status AttentionKernel::RecordCube(CoreRecorder& aic) const {
  std::vector<LocalTensor> stripes, chunks, l0a, l0b, l0c;
  for (int i = 0; i < kStripeSlots; ++i) {
    ASSIGN_OR_RETURN(LocalTensor t, aic.Alloc(Space::kL1, kL1SlotBytes, "Q/P stripe"));
    stripes.push_back(t);
  }
  for (int i = 0; i < kChunkSlots; ++i) {
    ASSIGN_OR_RETURN(LocalTensor t, aic.Alloc(Space::kL1, kL1SlotBytes, "K/V chunk"));
    chunks.push_back(t);
  }
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(LocalTensor a, aic.Alloc(Space::kL0A, kL0HalfBytes, "L0A half"));
    ASSIGN_OR_RETURN(LocalTensor b, aic.Alloc(Space::kL0B, kL0HalfBytes, "L0B half"));
    ASSIGN_OR_RETURN(LocalTensor c, aic.Alloc(Space::kL0C, kL0cHalfBytes, "L0C tile"));
    l0a.push_back(a);
    l0b.push_back(b);
    l0c.push_back(c);
  }
  CubeBuffers buffers{SlotRing(aic, Pipe::kMte2, Pipe::kMte1, Pipe::kM, 0, stripes),
                      SlotRing(aic, Pipe::kMte2, Pipe::kMte1, Pipe::kM, kStripeSlots, chunks),
                      SlotRing(aic, Pipe::kMte1, Pipe::kM, 0, l0a),
                      SlotRing(aic, Pipe::kM, Pipe::kFix, 0, l0c)};
  CubeProgram program(aic, workload_, workspace_, options_, buffers);

  const std::vector<AttentionTask>& tasks = schedule_[aic.block()];
  const int n = static_cast<int>(tasks.size());
  const int ahead = options_.preload;
  const int slots = workspace_.slots;
  for (int t = 0; t < std::min(ahead, n); ++t) program.Scores(tasks[t], t % slots);
  for (int t = 0; t < n; ++t) {
    if (t + ahead < n) program.Scores(tasks[t + ahead], (t + ahead) % slots);
    program.Values(tasks[t], t % slots, t);
  }
  if (options_.algorithm == RescaleAlgorithm::kBase) {
    // Consume the [V2] completions not yet waited for, so every set is paired.
    for (int t = 0; t < std::min(n, slots); ++t) aic.CrossCoreWaitFlag(kFlagRescaleDone);
  }
  buffers.stripes.Drain();
  buffers.chunks.Drain();
  buffers.l0.Drain();
  buffers.l0c.Drain();
  return absl::OkStatus();
}

}  // namespace mlaserve::npu
