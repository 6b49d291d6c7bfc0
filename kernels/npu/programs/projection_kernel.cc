#include "kernels/npu/programs/projection_kernel.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/matmul.h"
#include "kernels/core/tiling.h"
#include "kernels/npu/programs/cube_l0_stage.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {
constexpr int kTile = CubeL0Stage::kTile;
constexpr int kDepth = kProjectionDepthChunk;
constexpr int64_t kL1SlotBytes = 32 * 1024;  // one 128 x 128 bf16 operand chunk
constexpr int kL1Slots = 4;                  // A and B of two depth chunks in flight
static_assert(kDepth == kMatrixTile, "tiled weights hold depth blocks of one chunk");
}  // namespace

ProjectionKernel::ProjectionKernel(std::vector<ProjectionJob> jobs, int max_blocks)
    : jobs_(std::move(jobs)) {
  std::vector<OutputTile> all;
  for (int j = 0; j < static_cast<int>(jobs_.size()); ++j) {
    for (int m0 = 0; m0 < jobs_[j].rows; m0 += kTile)
      for (int n0 = 0; n0 < jobs_[j].n; n0 += kTile) all.push_back({j, m0, n0});
  }
  const int blocks = std::min<int>(max_blocks, static_cast<int>(all.size()));
  tiles_.resize(blocks);
  for (size_t i = 0; i < all.size(); ++i) tiles_[i % blocks].push_back(all[i]);
}

double ProjectionKernel::Flops() const {
  double flops = 0;
  for (const ProjectionJob& j : jobs_) flops += 2.0 * j.rows * j.n * j.k;
  return flops;
}

absl::Status ProjectionKernel::Record(Program& program) const {
  for (const ProjectionJob& j : jobs_) {
    if (j.rows <= 0 || j.n <= 0 || j.k <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("projection job of ", j.rows, " x ", j.n, " x ", j.k));
    }
  }
  for (int block = 0; block < BlockDim(); ++block) {
    CoreRecorder& aic = program.Cube(block);
    std::vector<LocalTensor> slots;
    for (int i = 0; i < kL1Slots; ++i) {
      ASSIGN_OR_RETURN(LocalTensor t, aic.Alloc(Space::kL1, kL1SlotBytes, "projection operand"));
      slots.push_back(t);
    }
    SlotRing l1(aic, Pipe::kMte2, Pipe::kMte1, Pipe::kM, 0, slots);
    ASSIGN_OR_RETURN(std::unique_ptr<CubeL0Stage> l0, CubeL0Stage::Create(aic));
    const bool execute = aic.executes();
    for (const OutputTile& tile : tiles_[block]) {
      const ProjectionJob& j = jobs_[tile.job];
      const int m = std::min(kTile, j.rows - tile.m0);
      const int n = std::min(kTile, j.n - tile.n0);
      const int c = l0->AcquireTile();
      for (int k0 = 0; k0 < j.k; k0 += kDepth) {
        const int kc = std::min(kDepth, j.k - k0);
        // A chunk: rows [m0, m0 + m) x depth [k0, k0 + kc) -> L1 [m][kc].
        const int a_slot = l1.Acquire();
        Bf16* a = l1.slot(a_slot).as<Bf16>();
        const int64_t a_first = static_cast<int64_t>(tile.m0) * j.lda + k0;
        Payload copy_a;
        if (execute) {
          copy_a = [src = j.a.as<Bf16>() + a_first, lda = j.lda, m, kc, a] {
            CopyRowsToL1(src, lda, m, kc, kc, a, m, 0);
          };
        }
        aic.ReadGm(GmRegion::Rows(j.a, a_first * 2, m, kc * 2, j.lda * 2), std::move(copy_a),
                   "A chunk");
        l1.Publish(a_slot);
        // B chunk: [kc][n] from [k][n], or [n][kc] from [n][k]; tiled weights hold it as
        // one run already.
        const int b_slot = l1.Acquire();
        const int b_rows = j.transpose_b ? n : kc;
        const int b_cols = j.transpose_b ? kc : n;
        const Bf16* b = l1.slot(b_slot).as<Bf16>();
        if (j.b_tiles) {
          const int64_t b_first = j.transpose_b ? int64_t{k0} * j.n + int64_t{tile.n0} * kc
                                                : int64_t{tile.n0} * j.k + int64_t{k0} * n;
          // The weights stay in GM on the host: the MMAD reads them where they are (equal
          // bits: the operand is the same compact block the copy would have made). The DMA is
          // still recorded, as the device moves these bytes into L1.
          b = j.b.host == nullptr ? nullptr : j.b.as<Bf16>() + b_first;
          aic.ReadGm(GmRegion::Rows(j.b, b_first * 2, 1, int64_t{b_rows} * b_cols * 2,
                                    int64_t{b_rows} * b_cols * 2),
                     Payload(), "B chunk (tiled)");
        } else {
          const int64_t b_first = j.transpose_b ? static_cast<int64_t>(tile.n0) * j.ldb + k0
                                                : static_cast<int64_t>(k0) * j.ldb + tile.n0;
          Payload copy_b;
          if (execute) {
            copy_b = [src = j.b.as<Bf16>() + b_first, ldb = j.ldb, b_rows, b_cols,
                      dst = l1.slot(b_slot).as<Bf16>()] {
              CopyRowsToL1(src, ldb, b_rows, b_cols, b_cols, dst, b_rows, 0);
            };
          }
          aic.ReadGm(GmRegion::Rows(j.b, b_first * 2, b_rows, b_cols * 2, j.ldb * 2),
                     std::move(copy_b), "B chunk");
        }
        l1.Publish(b_slot);
        l1.Consume(a_slot);
        l1.Consume(b_slot);
        l0->Multiply(m, n, kc, {a, m, kc}, "A tile", {b, b_rows, b_cols}, "B tile", j.transpose_b,
                     c, k0 > 0, "projection");
        l1.Release(a_slot);
        l1.Release(b_slot);
      }
      const int elem = j.c_bf16 ? 2 : 4;
      const int64_t c_first = static_cast<int64_t>(tile.m0) * j.ldc + tile.n0;
      Payload write;
      if (execute) {
        write = [acc = l0->tile(c), dst = j.c.host + c_first * elem, ldc = j.ldc, m, n,
                 to_bf16 = j.c_bf16] {
          for (int r = 0; r < m; ++r) {
            const float* row = acc + r * kTile;
            if (to_bf16) {
              Bf16* d = reinterpret_cast<Bf16*>(dst) + static_cast<int64_t>(r) * ldc;
              for (int x = 0; x < n; ++x) d[x] = Bf16::FromFloat(row[x]);
            } else {
              std::memcpy(reinterpret_cast<float*>(dst) + static_cast<int64_t>(r) * ldc, row,
                          n * sizeof(float));
            }
          }
        };
      }
      l0->Flush(c, GmRegion::Rows(j.c, c_first * elem, m, n * elem, j.ldc * elem),
                AtomicMode::kNone, std::move(write), j.c_bf16 ? "C tile (cast bf16)" : "C tile");
    }
    l1.Drain();
    l0->Drain();
  }
  return program.status();
}

}  // namespace mlaserve::npu
