#include "kernels/npu/programs/attention_vector_program.h"

// The AIV program's bf16 softmax, rescale (AMLA's atomic add, Base's [V2]) and final stage,
// and RecordVector, which allocates UB and drives them over the block's tasks; the FP8
// groups' stages are in attention_vector_program_fp8.cc.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <variant>
#include <vector>

#include "common/status_macros.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/block_scores.h"
#include "kernels/core/fp32_exponent_add.h"
#include "kernels/core/tiling.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"
#include "kernels/mla/snap_amla.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {

constexpr int kBaseUpdateRows = 8;    // rows per UB pass of Base's [V2] (O and P V together)
constexpr int kBroadcastLanes = 128;  // AMLA broadcasts each row's delta over 128 int32 lanes
constexpr int64_t kInSlotBytes = kChunkRows * kKvBlockTokens * 4;                    // 32 KiB
constexpr int64_t kOutSlotBytes = kChunkRows * kKvBlockTokens * 4 + kChunkRows * 4;  // + LSEs

}  // namespace

void VectorProgram::Softmax(const AttentionTask& t, int slot, int index) {
  const RowGroup& g = w_.groups[t.group];
  const auto [lo, hi] = Rows(g);
  aiv_.CrossCoreWaitFlag(AttentionDeviceKernel::kFlagScoresReady);
  const GmBuffer s_slot = ws_.SlotRows(ws_.scores, aiv_.block(), slot, kKvBlockTokens * 4);
  const GmBuffer p_slot = ws_.SlotRows(ws_.probs, aiv_.block(), slot, kKvBlockTokens * 2);
  const bool amla = options_.algorithm == RescaleAlgorithm::kAmla;
  if (const auto* fp8 = std::get_if<Fp8Keys>(&g.keys)) {
    Fp8Softmax(t, *fp8, s_slot, p_slot, lo, hi);
    return;
  }
  for (int r0 = lo; r0 < hi; r0 += kChunkRows) {
    const int rc = std::min(kChunkRows, hi - r0);
    const int n = t.tokens;
    const int i = ReadScores(s_slot, r0, rc, n);
    float* scores = b_.in.slot(i).as<float>();
    const int o = b_.out.Acquire();
    Bf16* probs = b_.out.slot(o).as<Bf16>();
    const int state_base = t.group_slot * kRowsPerCore + (r0 - lo);
    const int alpha_base = (index % 2) * kRowsPerCore + (r0 - lo);
    const int64_t e = static_cast<int64_t>(rc) * n;
    const AmlaOptions amla_options = options_.amla;
    const float scale = w_.softmax_scale;
    const int32_t* visible = g.visible.data() + r0;
    aiv_.Vector({{VecClass::kUnary, e},   // scale
                 {VecClass::kUnary, e},   // mask (select against -inf)
                 {VecClass::kReduce, e},  // row max
                 {VecClass::kBinary, e},  // subtract the max
                 {VecClass::kExp, e},     // exp
                 {VecClass::kReduce, e},  // row sum
                 {VecClass::kBinary, e},  // AMLA: * S16 / Base: identity
                 {VecClass::kUnary, e},   // cast to bf16
                 {VecClass::kUnary, rc},
                 {VecClass::kUnary, rc},
                 {VecClass::kExp, rc},
                 {VecClass::kUnary, rc},
                 {VecClass::kDiv, rc},
                 {VecClass::kUnary, rc}},
                Maybe([=, st = b_.amla_state, bs = b_.base_state, delta = b_.delta,
                       alpha = b_.alpha, first = t.first, begin = t.begin] {
                  const QueryRows rows{nullptr, 0, rc, 0, std::span<const int32_t>(visible, rc)};
                  ScaleAndMaskScores(rows, begin, n, scale, scores, kKvBlockTokens);
                  for (int r = 0; r < rc; ++r) {
                    float* row = scores + r * kKvBlockTokens;
                    if (amla) {
                      if (first) st[state_base + r] = AmlaRowState{};
                      delta[state_base + r] =
                          AmlaSoftmaxStep(row, n, amla_options, st[state_base + r]);
                    } else {
                      if (first) bs[state_base + r] = FlashBaseRowState{};
                      alpha[alpha_base + r] = FlashBaseSoftmaxStep(row, n, bs[state_base + r]);
                    }
                    for (int j = 0; j < n; ++j)
                      probs[r * kKvBlockTokens + j] = Bf16::FromFloat(row[j]);
                  }
                }),
                "softmax");
    b_.in.Release(i);
    b_.out.Publish(o);
    b_.out.Consume(o);
    WriteProbs(p_slot, r0, rc, n, 2, reinterpret_cast<const std::byte*>(probs));
    b_.out.Release(o);
  }
  aiv_.CrossCoreSetFlag(AttentionDeviceKernel::kFlagProbsReady, Pipe::kMte3);
}

void VectorProgram::AmlaRescale(const AttentionTask& t) {
  const RowGroup& g = w_.groups[t.group];
  const auto [lo, hi] = Rows(g);
  const GmBuffer acc = ws_.acc[t.group];
  for (int r0 = lo; r0 < hi; r0 += kChunkRows) {
    const int rc = std::min(kChunkRows, hi - r0);
    const int o = b_.out.Acquire();
    int32_t* lanes = b_.out.slot(o).as<int32_t>();
    const int state_base = t.group_slot * kRowsPerCore + (r0 - lo);
    aiv_.Vector({{VecClass::kUnary, static_cast<int64_t>(rc) * kBroadcastLanes}},  // Brcb
                Maybe([=, delta = b_.delta] {
                  for (int r = 0; r < rc; ++r)
                    std::fill_n(lanes + r * kBroadcastLanes, kBroadcastLanes,
                                delta[state_base + r]);
                }),
                "broadcast delta");
    b_.out.Publish(o);
    b_.out.Consume(o);
    const int dv = w_.dv;
    aiv_.WriteGm(GmRegion::Whole(acc.Slice(static_cast<int64_t>(r0) * dv * 4,
                                           static_cast<int64_t>(rc) * dv * 4)),
                 AtomicMode::kAddExponentI32, Maybe([=, dst = acc.as<float>()] {
                   for (int r = 0; r < rc; ++r) {
                     float* row = dst + static_cast<int64_t>(r0 + r) * dv;
                     const int32_t d = lanes[r * kBroadcastLanes];
                     AddToExponentFieldRow(row, dv, d);
                   }
                 }),
                 "O int32 atomic add");
    b_.out.Release(o);
  }
}

void VectorProgram::BaseUpdate(const AttentionTask& t, int slot, int index) {
  const RowGroup& g = w_.groups[t.group];
  const auto [lo, hi] = Rows(g);
  const GmBuffer acc = ws_.acc[t.group];
  const GmBuffer pv = ws_.SlotRows(ws_.partial, aiv_.block(), slot, w_.dv * 4);
  const int dv = w_.dv;
  for (int r0 = lo; r0 < hi; r0 += kBaseUpdateRows) {
    const int rc = std::min(kBaseUpdateRows, hi - r0);
    const int64_t bytes = static_cast<int64_t>(rc) * dv * 4;
    const int i = b_.in.Acquire();
    float* old_rows = b_.in.slot(i).as<float>();
    float* new_rows = old_rows + kBaseUpdateRows * kKvBlockTokens;
    if (!t.first) {
      aiv_.ReadGm(GmRegion::Whole(acc.Slice(static_cast<int64_t>(r0) * dv * 4, bytes)),
                  Maybe([=, src = acc.as<float>()] {
                    std::memcpy(old_rows, src + static_cast<int64_t>(r0) * dv, bytes);
                  }),
                  "O rows");
    }
    aiv_.ReadGm(GmRegion::Whole(pv.Slice(static_cast<int64_t>(r0) * dv * 4, bytes)),
                Maybe([=, src = pv.as<float>()] {
                  std::memcpy(new_rows, src + static_cast<int64_t>(r0) * dv, bytes);
                }),
                "PV rows");
    b_.in.Publish(i);
    b_.in.Consume(i);
    const int o = b_.out.Acquire();
    float* result = b_.out.slot(o).as<float>();
    const int alpha_base = (index % 2) * kRowsPerCore + (r0 - lo);
    aiv_.Vector({{VecClass::kBinary, static_cast<int64_t>(rc) * dv},
                 {VecClass::kBinary, static_cast<int64_t>(rc) * dv}},
                Maybe([=, alpha = b_.alpha, first = t.first] {
                  for (int r = 0; r < rc; ++r) {
                    float* row = result + static_cast<int64_t>(r) * dv;
                    if (!first)
                      std::memcpy(row, old_rows + static_cast<int64_t>(r) * dv, dv * sizeof(float));
                    FlashBaseRescaleAdd(row, new_rows + static_cast<int64_t>(r) * dv, dv,
                                        alpha[alpha_base + r], first);
                  }
                }),
                "O * alpha + PV");
    b_.in.Release(i);
    b_.out.Publish(o);
    b_.out.Consume(o);
    aiv_.WriteGm(GmRegion::Whole(acc.Slice(static_cast<int64_t>(r0) * dv * 4, bytes)),
                 AtomicMode::kNone, Maybe([=, dst = acc.as<float>()] {
                   std::memcpy(dst + static_cast<int64_t>(r0) * dv, result, bytes);
                 }),
                 "O rows");
    b_.out.Release(o);
  }
  // The next [V2] and the final stage read these rows of O back through MTE2: they must
  // not overtake the MTE3 writes (a GM read-after-write between two pipes of this core).
  aiv_.SetFlag(Pipe::kMte3, Pipe::kMte2, 0);
  aiv_.WaitFlag(Pipe::kMte3, Pipe::kMte2, 0);
}

void VectorProgram::Finalize(const AttentionTask& t) {
  const RowGroup& g = w_.groups[t.group];
  const auto [lo, hi] = Rows(g);
  const GmBuffer acc = ws_.acc[t.group];
  const int dv = w_.dv;
  const bool amla = options_.algorithm == RescaleAlgorithm::kAmla;
  for (int r0 = lo; r0 < hi; r0 += kChunkRows) {
    const int rc = std::min(kChunkRows, hi - r0);
    const int64_t bytes = static_cast<int64_t>(rc) * dv * 4;
    const int i = b_.in.Acquire();
    float* rows = b_.in.slot(i).as<float>();
    aiv_.ReadGm(GmRegion::Whole(acc.Slice(static_cast<int64_t>(r0) * dv * 4, bytes)),
                Maybe([=, src = acc.as<float>()] {
                  std::memcpy(rows, src + static_cast<int64_t>(r0) * dv, bytes);
                }),
                "O rows");
    b_.in.Publish(i);
    b_.in.Consume(i);
    const int o = b_.out.Acquire();
    float* out = b_.out.slot(o).as<float>();
    // The LSE rows follow the values in the slot (offsets, not pointers: a launch that only
    // models its time has no slot memory, and null plus an offset is undefined).
    const int64_t lse_at = static_cast<int64_t>(kChunkRows) * kKvBlockTokens;
    const int state_base = t.group_slot * kRowsPerCore + (r0 - lo);
    aiv_.Vector(
        {{VecClass::kDiv, rc},
         {VecClass::kBinary, static_cast<int64_t>(rc) * dv},
         {VecClass::kExp, rc},
         {VecClass::kUnary, rc}},
        Maybe([=, st = b_.amla_state, bs = b_.base_state, snap = b_.snap_state,
               fp8 = std::holds_alternative<Fp8Keys>(g.keys)] {
          for (int r = 0; r < rc; ++r) {
            const float* in_row = rows + static_cast<int64_t>(r) * dv;
            float* out_row = out + static_cast<int64_t>(r) * dv;
            if (fp8) {
              SnapAmlaFinalizeRow(in_row, dv, snap[state_base + r], out_row, out + lse_at + r);
            } else if (amla) {
              AmlaFinalizeRow(in_row, dv, st[state_base + r], out_row, out + lse_at + r);
            } else {
              FlashBaseFinalizeRow(in_row, dv, bs[state_base + r], out_row, out + lse_at + r);
            }
          }
        }),
        "normalise");
    b_.in.Release(i);
    b_.out.Publish(o);
    b_.out.Consume(o);
    const int64_t out_stride = g.out_stride > 0 ? g.out_stride : dv;
    const int elem = g.out_bf16 ? 2 : 4;
    const bool to_bf16 = g.out_bf16;
    aiv_.WriteGm(GmRegion::Rows(g.out, static_cast<int64_t>(r0) * out_stride * elem, rc, dv * elem,
                                out_stride * elem),
                 AtomicMode::kNone, Maybe([=, dst = g.out.host] {
                   for (int r = 0; r < rc; ++r) {
                     const float* row = out + static_cast<int64_t>(r) * dv;
                     const int64_t at = static_cast<int64_t>(r0 + r) * out_stride;
                     if (to_bf16) {
                       Bf16* d = reinterpret_cast<Bf16*>(dst) + at;
                       for (int c = 0; c < dv; ++c) d[c] = Bf16::FromFloat(row[c]);
                     } else {
                       std::memcpy(reinterpret_cast<float*>(dst) + at, row, dv * sizeof(float));
                     }
                   }
                 }),
                 "output rows");
    const int64_t lse_stride = g.lse_stride;
    aiv_.WriteGm(
        GmRegion::Rows(g.lse, static_cast<int64_t>(r0) * lse_stride * 4, rc, 4, lse_stride * 4),
        AtomicMode::kNone, Maybe([=, dst = g.lse.as<float>()] {
          for (int r = 0; r < rc; ++r) {
            dst[static_cast<int64_t>(r0 + r) * lse_stride] = out[lse_at + r];
          }
        }),
        "lse rows");
    b_.out.Release(o);
  }
}

int VectorProgram::ReadScores(const GmBuffer& s_slot, int r0, int rc, int n) {
  const int i = b_.in.Acquire();
  float* scores = b_.in.slot(i).as<float>();
  aiv_.ReadGm(GmRegion::Rows(s_slot, static_cast<int64_t>(r0) * kKvBlockTokens * 4, rc, n * 4,
                             kKvBlockTokens * 4),
              Maybe([=, src = s_slot.as<float>()] {
                for (int r = 0; r < rc; ++r) {
                  std::memcpy(scores + r * kKvBlockTokens,
                              src + static_cast<int64_t>(r0 + r) * kKvBlockTokens,
                              n * sizeof(float));
                }
              }),
              "S rows");
  b_.in.Publish(i);
  b_.in.Consume(i);
  return i;
}

void VectorProgram::WriteProbs(const GmBuffer& p_slot, int r0, int rc, int n, int64_t elem,
                               const std::byte* probs) {
  constexpr int64_t kRowBytes = kKvBlockTokens * 2;
  aiv_.WriteGm(
      GmRegion::Rows(p_slot, static_cast<int64_t>(r0) * kRowBytes, rc, n * elem, kRowBytes),
      AtomicMode::kNone, Maybe([=, dst = p_slot.host] {
        for (int r = 0; r < rc; ++r) {
          std::memcpy(dst + static_cast<int64_t>(r0 + r) * kRowBytes,
                      probs + int64_t{r} * kRowBytes, n * elem);
        }
      }),
      "P rows");
}

absl::Status AttentionDeviceKernel::RecordVector(CoreRecorder& aiv) const {
  std::vector<LocalTensor> in, out;
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(LocalTensor a, aiv.Alloc(Space::kUb, kInSlotBytes, "UB in"));
    ASSIGN_OR_RETURN(LocalTensor b, aiv.Alloc(Space::kUb, kOutSlotBytes, "UB out"));
    in.push_back(a);
    out.push_back(b);
  }
  const bool amla = options_.algorithm == RescaleAlgorithm::kAmla;
  ASSIGN_OR_RETURN(
      LocalTensor state,
      aiv.Alloc(Space::kUb,
                2 * kRowsPerCore * (amla ? sizeof(AmlaRowState) : sizeof(FlashBaseRowState)),
                "row state"));
  ASSIGN_OR_RETURN(LocalTensor factors,
                   aiv.Alloc(Space::kUb, 2 * kRowsPerCore * 4, "rescale factors"));
  VectorBuffers buffers{SlotRing(aiv, Pipe::kMte2, Pipe::kV, 0, in),
                        SlotRing(aiv, Pipe::kV, Pipe::kMte3, 0, out),
                        amla ? state.as<AmlaRowState>() : nullptr,
                        amla ? nullptr : state.as<FlashBaseRowState>(),
                        factors.as<int32_t>(),
                        factors.as<float>(),
                        nullptr,
                        {}};
  const bool fp8 = workload_.HasFp8();
  if (fp8) {
    ASSIGN_OR_RETURN(
        LocalTensor snap,
        aiv.Alloc(Space::kUb, 2 * kRowsPerCore * sizeof(SnapAmlaRowState), "SnapMLA row state"));
    buffers.snap_state = snap.as<SnapAmlaRowState>();
    for (VectorBuffers::Fp8Side& side : buffers.side) {
      ASSIGN_OR_RETURN(
          LocalTensor memory,
          aiv.Alloc(Space::kUb, (3 * kKvBlockTokens + kRowsPerCore) * 4 + sizeof(Fp8KeyBlock),
                    "key scales and inverses, weights, query factors"));
      side.key_scales = memory.as<float>();
      side.inverse_scales = side.key_scales + kKvBlockTokens;
      side.weights = side.inverse_scales + kKvBlockTokens;
      side.row_factors = side.weights + kKvBlockTokens;
      side.key_block = reinterpret_cast<Fp8KeyBlock*>(side.row_factors + kRowsPerCore);
    }
  }
  VectorProgram program(aiv, workload_, workspace_, options_, buffers);

  const std::vector<AttentionTask>& tasks = schedule_[aiv.block()];
  const int n = static_cast<int>(tasks.size());
  const int slots = workspace_.slots;
  if (amla) {
    // FP8 groups' [prep] runs preload + 1 tasks ahead of [V1], so the cube's [C1], which runs
    // preload tasks ahead of [C2], never waits for it; a key slot is rewritten only after
    // the P V of the task that last used it (waited for just before).
    const int prep_ahead = fp8 ? options_.preload + 1 : 0;
    for (int t = 0; t < std::min(n, prep_ahead); ++t) program.Prepare(tasks[t], t);
    for (int t = 0; t < n; ++t) {
      program.Softmax(tasks[t], t % slots, t);
      if (t > 0) aiv.CrossCoreWaitFlag(kFlagPvDone);  // P V of task t-1 is in O
      if (!tasks[t].first) program.AmlaRescale(tasks[t]);
      aiv.CrossCoreSetFlag(kFlagRescaleDone, Pipe::kMte3);
      if (t > 0 && tasks[t].first) program.Finalize(tasks[t - 1]);
      if (fp8 && t + prep_ahead < n) program.Prepare(tasks[t + prep_ahead], t + prep_ahead);
    }
    if (n > 0) {
      aiv.CrossCoreWaitFlag(kFlagPvDone);
      program.Finalize(tasks[n - 1]);
    }
  } else {
    if (n > 0) program.Softmax(tasks[0], 0, 0);
    for (int t = 0; t < n; ++t) {
      if (t + 1 < n) program.Softmax(tasks[t + 1], (t + 1) % slots, t + 1);
      aiv.CrossCoreWaitFlag(kFlagPvDone);
      program.BaseUpdate(tasks[t], t % slots, t);
      aiv.CrossCoreSetFlag(kFlagRescaleDone, Pipe::kMte3);
      if (tasks[t].last) program.Finalize(tasks[t]);
    }
  }
  program.DrainSide();
  buffers.in.Drain();
  buffers.out.Drain();
  return absl::OkStatus();
}

}  // namespace mlaserve::npu
