#include "kernels/npu/programs/combine_kernel.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/lse_combine.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {
constexpr int kMaxChunkRows = 8;
constexpr int kMaxDv = 512;
// One UB slot of inputs: every part's rows and LSEs of a chunk.
constexpr int64_t kInBytes = 72 * 1024;
// One UB slot of outputs: merged rows and LSEs.
constexpr int64_t kOutBytes = kMaxChunkRows * kMaxDv * 4 + kMaxChunkRows * 4;
}  // namespace

int CombineKernel::ChunkRows(const CombineJob& job) {
  const int64_t per_row = static_cast<int64_t>(job.parts.size()) * (job.dv * 4 + 4);
  return static_cast<int>(
      std::clamp<int64_t>(kInBytes / std::max<int64_t>(per_row, 1), 1, kMaxChunkRows));
}

CombineKernel::CombineKernel(std::vector<CombineJob> jobs, int max_blocks)
    : jobs_(std::move(jobs)) {
  std::vector<Chunk> all;
  for (int j = 0; j < static_cast<int>(jobs_.size()); ++j) {
    const int chunk = ChunkRows(jobs_[j]);
    for (int r = 0; r < jobs_[j].rows; r += chunk)
      all.push_back({j, r, std::min(chunk, jobs_[j].rows - r)});
  }
  blocks_ = std::max(1, std::min<int>(max_blocks, static_cast<int>((all.size() + 1) / 2)));
  chunks_.resize(2 * blocks_);
  for (size_t i = 0; i < all.size(); ++i) chunks_[i % chunks_.size()].push_back(all[i]);
}

absl::Status CombineKernel::Record(Program& program) const {
  for (const CombineJob& j : jobs_) {
    if (j.dv <= 0 || j.dv > kMaxDv)
      return absl::InvalidArgumentError("combine: dv must be in 1..512");
    if (j.parts.empty() || static_cast<int>(j.parts.size()) > kMaxCombineParts) {
      return absl::InvalidArgumentError(absl::StrCat("combine: ", j.parts.size(), " parts; 1..",
                                                     kMaxCombineParts, " are supported"));
    }
  }
  for (int block = 0; block < blocks_; ++block) {
    for (int sub = 0; sub < 2; ++sub) {
      CoreRecorder& aiv = program.Vector(block, sub);
      const std::vector<Chunk>& mine = chunks_[block * 2 + sub];
      if (mine.empty()) continue;
      std::vector<LocalTensor> in, out;
      for (int i = 0; i < 2; ++i) {
        ASSIGN_OR_RETURN(LocalTensor a, aiv.Alloc(Space::kUb, kInBytes, "combine in"));
        ASSIGN_OR_RETURN(LocalTensor b, aiv.Alloc(Space::kUb, kOutBytes, "combine out"));
        in.push_back(a);
        out.push_back(b);
      }
      SlotRing in_ring(aiv, Pipe::kMte2, Pipe::kV, 0, in);
      SlotRing out_ring(aiv, Pipe::kV, Pipe::kMte3, 0, out);
      const bool execute = aiv.executes();
      for (const Chunk& chunk : mine) {
        const CombineJob& j = jobs_[chunk.job];
        const int parts = static_cast<int>(j.parts.size());
        const int rc = chunk.rows;
        const int64_t rows_bytes = static_cast<int64_t>(rc) * j.dv * 4;
        const int64_t part_off = static_cast<int64_t>(chunk.row0) * j.dv * 4;
        const int64_t part_lse_off = static_cast<int64_t>(chunk.row0) * 4;
        // UB layout of the in slot: every part's rows, then every part's LSEs.
        const int i = in_ring.Acquire();
        float* u_rows = in_ring.slot(i).as<float>();
        float* u_lse =
            u_rows == nullptr ? nullptr : u_rows + static_cast<int64_t>(parts) * rc * j.dv;
        for (int p = 0; p < parts; ++p) {
          Payload copy_rows, copy_lse;
          if (execute) {
            copy_rows = [from = j.parts[p].out.host + part_off,
                         to = u_rows + static_cast<int64_t>(p) * rc * j.dv,
                         rows_bytes] { std::memcpy(to, from, rows_bytes); };
            copy_lse = [from = j.parts[p].lse.host + part_lse_off,
                        to = u_lse + static_cast<int64_t>(p) * rc,
                        rc] { std::memcpy(to, from, rc * 4); };
          }
          aiv.ReadGm(GmRegion::Whole(j.parts[p].out.Slice(part_off, rows_bytes)),
                     std::move(copy_rows), "part rows");
          aiv.ReadGm(GmRegion::Whole(j.parts[p].lse.Slice(part_lse_off, rc * 4)),
                     std::move(copy_lse), "part lse");
        }
        in_ring.Publish(i);
        in_ring.Consume(i);
        const int o = out_ring.Acquire();
        float* uo = out_ring.slot(o).as<float>();
        float* uo_lse = uo == nullptr ? nullptr : uo + kMaxChunkRows * kMaxDv;
        Payload merge;
        if (execute) {
          merge = [=, dv = j.dv, to_bf16 = j.out_bf16] {
            std::array<const float*, kMaxCombineParts> outs;
            std::array<float, kMaxCombineParts> lses;
            for (int r = 0; r < rc; ++r) {
              for (int p = 0; p < parts; ++p) {
                outs[p] = u_rows + (static_cast<int64_t>(p) * rc + r) * dv;
                lses[p] = u_lse[static_cast<int64_t>(p) * rc + r];
              }
              float* row = uo + static_cast<int64_t>(r) * dv;
              CombineLseParts(parts, outs.data(), lses.data(), dv, row, uo_lse + r);
              // bf16 rows are packed in place at the front of the fp32 row (the cast's output).
              if (to_bf16) NarrowToBf16(row, dv, reinterpret_cast<Bf16*>(row));
            }
          };
        }
        // Per row: the max of the LSEs, the weights, their normalisation, the log of their
        // total; per element: every part scaled and added, and the cast when bf16 is asked for.
        const int64_t lse_ops = static_cast<int64_t>(rc) * parts;
        const int64_t elements = static_cast<int64_t>(rc) * j.dv;
        if (j.out_bf16) {
          aiv.Vector({{VecClass::kBinary, lse_ops},
                      {VecClass::kExp, lse_ops},
                      {VecClass::kDiv, lse_ops},
                      {VecClass::kExp, rc},
                      {VecClass::kBinary, 2 * elements * parts},
                      {VecClass::kUnary, elements}},
                     std::move(merge), "lse combine (cast bf16)");
        } else {
          aiv.Vector({{VecClass::kBinary, lse_ops},
                      {VecClass::kExp, lse_ops},
                      {VecClass::kDiv, lse_ops},
                      {VecClass::kExp, rc},
                      {VecClass::kBinary, 2 * elements * parts}},
                     std::move(merge), "lse combine");
        }
        in_ring.Release(i);
        out_ring.Publish(o);
        out_ring.Consume(o);
        const int elem = j.out_bf16 ? 2 : 4;
        const int64_t out_first = static_cast<int64_t>(chunk.row0) * j.out_stride * elem;
        const int64_t lse_first = static_cast<int64_t>(chunk.row0) * j.lse_stride * 4;
        Payload write_rows, write_lse;
        if (execute) {
          write_rows = [to = j.out.host + out_first, uo, rc, dv = j.dv, elem,
                        stride = j.out_stride * elem] {
            for (int r = 0; r < rc; ++r) {
              std::memcpy(to + r * stride,
                          reinterpret_cast<const std::byte*>(uo + static_cast<int64_t>(r) * dv),
                          static_cast<size_t>(dv) * elem);
            }
          };
          write_lse = [to = j.lse.host + lse_first, uo_lse, rc, stride = j.lse_stride * 4] {
            for (int r = 0; r < rc; ++r) std::memcpy(to + r * stride, uo_lse + r, 4);
          };
        }
        aiv.WriteGm(GmRegion::Rows(j.out, out_first, rc, int64_t{j.dv} * elem, j.out_stride * elem),
                    AtomicMode::kNone, std::move(write_rows),
                    j.out_bf16 ? "merged rows (bf16)" : "merged rows");
        aiv.WriteGm(GmRegion::Rows(j.lse, lse_first, rc, 4, j.lse_stride * 4), AtomicMode::kNone,
                    std::move(write_lse), "merged lse");
        out_ring.Release(o);
      }
      in_ring.Drain();
      out_ring.Drain();
    }
  }
  return program.status();
}

}  // namespace mlaserve::npu
