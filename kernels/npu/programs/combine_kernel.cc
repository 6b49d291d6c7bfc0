#include "kernels/npu/programs/combine_kernel.h"

#include <algorithm>
#include <cstring>

#include "common/status_macros.h"
#include "kernels/mla/lse_combine.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {
constexpr int kChunkRows = 8;
constexpr int kMaxDv = 512;
// In: both parts' rows and LSEs; out: merged rows and LSEs.
constexpr int64_t kInBytes = 2 * (kChunkRows * kMaxDv * 4 + kChunkRows * 4);
constexpr int64_t kOutBytes = kChunkRows * kMaxDv * 4 + kChunkRows * 4;
}  // namespace

CombineKernel::CombineKernel(std::vector<CombineJob> jobs, int max_blocks) : jobs_(std::move(jobs)) {
  std::vector<Chunk> all;
  for (int j = 0; j < static_cast<int>(jobs_.size()); ++j) {
    for (int r = 0; r < jobs_[j].rows; r += kChunkRows) all.push_back({j, r, std::min(kChunkRows, jobs_[j].rows - r)});
  }
  blocks_ = std::max(1, std::min<int>(max_blocks, static_cast<int>((all.size() + 1) / 2)));
  chunks_.resize(2 * blocks_);
  for (size_t i = 0; i < all.size(); ++i) chunks_[i % chunks_.size()].push_back(all[i]);
}

absl::Status CombineKernel::Record(Program& program) const {
  for (const CombineJob& j : jobs_) {
    if (j.dv <= 0 || j.dv > kMaxDv) return absl::InvalidArgumentError("combine: dv must be in 1..512");
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
        const int rc = chunk.rows;
        const int64_t row_bytes = static_cast<int64_t>(rc) * j.dv * 4;
        const int64_t out_off = static_cast<int64_t>(chunk.row0) * j.dv * 4;
        const int64_t lse_off = static_cast<int64_t>(chunk.row0) * 4;
        const int i = in_ring.Acquire();
        float* ua = in_ring.slot(i).as<float>();  // a rows, a lse, b rows, b lse
        float* ua_lse = ua == nullptr ? nullptr : ua + kChunkRows * kMaxDv;
        float* ub = ua == nullptr ? nullptr : ua_lse + kChunkRows;
        float* ub_lse = ua == nullptr ? nullptr : ub + kChunkRows * kMaxDv;
        auto read = [&](const GmBuffer& src, int64_t offset, int64_t bytes, float* dst, const char* label) {
          Payload copy;
          if (execute) copy = [from = src.host + offset, dst, bytes] { std::memcpy(dst, from, bytes); };
          aiv.ReadGm(GmRegion::Whole(src.Slice(offset, bytes)), std::move(copy), label);
        };
        read(j.a_out, out_off, row_bytes, ua, "part A rows");
        read(j.a_lse, lse_off, rc * 4, ua_lse, "part A lse");
        read(j.b_out, out_off, row_bytes, ub, "part B rows");
        read(j.b_lse, lse_off, rc * 4, ub_lse, "part B lse");
        in_ring.Publish(i);
        in_ring.Consume(i);
        const int o = out_ring.Acquire();
        float* uo = out_ring.slot(o).as<float>();
        float* uo_lse = uo == nullptr ? nullptr : uo + kChunkRows * kMaxDv;
        Payload merge;
        if (execute) {
          merge = [=, dv = j.dv] {
            CombineLseRows(rc, dv, ua, ua_lse, ub, ub_lse, dv, uo, uo_lse);
          };
        }
        aiv.Vector({{VecClass::kBinary, rc},  // max of the two LSEs
                    {VecClass::kExp, 2 * rc},
                    {VecClass::kDiv, 2 * rc},
                    {VecClass::kBinary, static_cast<int64_t>(rc) * j.dv},
                    {VecClass::kBinary, static_cast<int64_t>(rc) * j.dv},
                    {VecClass::kExp, rc}},
                   std::move(merge), "lse combine");
        in_ring.Release(i);
        out_ring.Publish(o);
        out_ring.Consume(o);
        Payload write_rows, write_lse;
        if (execute) {
          write_rows = [to = j.out.host + out_off, uo, row_bytes] { std::memcpy(to, uo, row_bytes); };
          write_lse = [to = j.lse.host + lse_off, uo_lse, rc] { std::memcpy(to, uo_lse, rc * 4); };
        }
        aiv.WriteGm(GmRegion::Whole(j.out.Slice(out_off, row_bytes)), AtomicMode::kNone, std::move(write_rows),
                    "merged rows");
        aiv.WriteGm(GmRegion::Whole(j.lse.Slice(lse_off, rc * 4)), AtomicMode::kNone, std::move(write_lse),
                    "merged lse");
        out_ring.Release(o);
      }
      in_ring.Drain();
      out_ring.Drain();
    }
  }
  return program.status();
}

}  // namespace mlaserve::npu
