// The AIV side of AttentionDeviceKernel. Each of a block's two AIVs owns half of every row group's
// rows and runs, per task: [V1] online softmax (S -> P), then the rescale of the output
// accumulator (AMLA: an int32 atomic add on O's bits; Base: [V2], O = O * alpha + P V through
// UB), and, when a group's last block is done, the final normalisation.
#include <algorithm>
#include <cstring>
#include <span>

#include "common/status_macros.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/block_scores.h"
#include "kernels/core/fp32_exponent_add.h"
#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"
#include "kernels/mla/snap_amla.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {
namespace {

constexpr int kChunkRows = 16;      // rows per UB pass of [V1], rescale and final
constexpr int kBaseUpdateRows = 8;  // rows per UB pass of Base's [V2] (O and P V together)
constexpr int kRowsPerCore = kMaxGroupRows / 2;
constexpr int kBroadcastLanes = 128;  // AMLA broadcasts each row's delta over 128 int32 lanes
constexpr int64_t kInSlotBytes = kChunkRows * kKvBlockTokens * 4;                    // 32 KiB
constexpr int64_t kOutSlotBytes = kChunkRows * kKvBlockTokens * 4 + kChunkRows * 4;  // + LSEs
constexpr int kWidenTokens = 16;  // keys per UB pass of the FP8 widening
// Intra-core events of the two FP8 side buffers (key scales, row factors), one per task
// parity: MTE2 -> V and back. The slot rings use events 0..1 of the same pipe pairs.
constexpr int kSideEvent = 2;

struct VectorBuffers {
  SlotRing in;   // GM -> UB: MTE2 -> V, events 0..1
  SlotRing out;  // UB -> GM: V -> MTE3, events 0..1
  // Per-row state that lives in UB across a group's tasks, double-buffered by group so a
  // group's final stage can run after the next group's first softmax.
  AmlaRowState* amla_state;       // [2][kRowsPerCore]
  FlashBaseRowState* base_state;  // [2][kRowsPerCore]
  int32_t* delta;                 // [2][kRowsPerCore]: AMLA rescale, by group slot
  float* alpha;                   // [2][kRowsPerCore]: Base rescale, by task parity
  // FP8 launches: SnapMLA's row state (by group slot), and two side buffers (by task
  // parity, so the next task's scales load while this one's softmax runs): a task's keys'
  // scales, the softmax's weight scratch, this AIV's rows' query factors.
  SnapAmlaRowState* snap_state = nullptr;  // [2][kRowsPerCore]
  struct Fp8Side {
    float* key_scales = nullptr;       // [kKvBlockTokens]
    float* inverse_scales = nullptr;   // [kKvBlockTokens]
    float* weights = nullptr;          // [kKvBlockTokens]
    float* row_factors = nullptr;      // [kRowsPerCore]
    Fp8KeyBlock* key_block = nullptr;  // the task's, from the scales
  };
  Fp8Side side[2];
};

class VectorProgram {
 public:
  VectorProgram(CoreRecorder& aiv, const AttentionWorkload& workload, const AttentionWorkspace& ws,
                const AttentionDeviceKernelOptions& options, VectorBuffers& buffers)
      : aiv_(aiv), w_(workload), ws_(ws), options_(options), b_(buffers) {}

  // [V1]: softmax of this AIV's rows of task t; P goes to the task's probs slot.
  void Softmax(const AttentionTask& t, int slot, int index) {
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

  // [prep] of an FP8 group's task, ahead of its [C1]: on the group's first task this AIV's
  // rows of the queries in [C1]'s form (kernels/mla/snap_amla.h, PrepareQueryRows) and their
  // factors; without an FP8 cube, this AIV's half of the task's keys widened to bf16 into
  // the task's key slot. Then kFlagKeysReady. Nothing for a bf16 group's task.
  void Prepare(const AttentionTask& t, int index) {
    const RowGroup& g = w_.groups[t.group];
    const auto* fp8 = std::get_if<Fp8Keys>(&g.keys);
    if (fp8 == nullptr) return;
    if (t.first) PrepareQueries(t, *fp8);
    if (!options_.fp8_matrix) WidenKeys(t, *fp8, index);
    aiv_.CrossCoreSetFlag(AttentionDeviceKernel::kFlagKeysReady, Pipe::kMte3);
  }

  // Balances the side buffer's last release (every FP8 softmax sets it once).
  void DrainSide() {
    for (int parity = 0; parity < std::min(fp8_softmaxes_, 2); ++parity) {
      aiv_.WaitFlag(Pipe::kV, Pipe::kMte2, kSideEvent + parity);
    }
  }

  // AMLA: O *= 2^(n_t - n_{t-1}) * c_{t-1}/c_t as one int32 atomic add per element, in GM.
  void AmlaRescale(const AttentionTask& t) {
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

  // Base [V2]: O = O * alpha + P V, through UB.
  void BaseUpdate(const AttentionTask& t, int slot, int index) {
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
                        std::memcpy(row, old_rows + static_cast<int64_t>(r) * dv,
                                    dv * sizeof(float));
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

  // Final stage: out = O / (l * S16) (AMLA) or O / l (Base), and the LSE.
  void Finalize(const AttentionTask& t) {
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
      aiv_.WriteGm(GmRegion::Rows(g.out, static_cast<int64_t>(r0) * out_stride * elem, rc,
                                  dv * elem, out_stride * elem),
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

 private:
  Payload Maybe(Payload p) const { return aiv_.executes() ? std::move(p) : nullptr; }

  // Rows [r0, r0 + rc) of a task's scores (n each) into an in-slot of UB, published and
  // consumed; returns the slot, for the caller to release.
  int ReadScores(const GmBuffer& s_slot, int r0, int rc, int n) {
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

  // Rows [r0, r0 + rc) of P (n elements of `elem` bytes each, rows a bf16 row's bytes apart
  // in UB and in the slot) to the task's probs slot.
  void WriteProbs(const GmBuffer& p_slot, int r0, int rc, int n, int64_t elem,
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

  void PrepareQueries(const AttentionTask& t, const Fp8Keys& fp8) {
    const RowGroup& g = w_.groups[t.group];
    const auto [lo, hi] = Rows(g);
    const int dk = w_.dk;
    const int dl = fp8.layout.dl;
    const int dr = fp8.layout.dr;
    const bool fp8_form = options_.fp8_matrix;
    const int64_t out_row = fp8_form ? AttentionWorkspace::Fp8QueryRowBytes(dl, dr) : dk * 2;
    const GmBuffer q_prep = ws_.q_prep[t.group];
    const GmBuffer q_factor = ws_.q_factor[t.group];
    const float scale = w_.softmax_scale;
    const SnapAmlaOptions snap{.quantize_queries = w_.fp8_quantize_queries};
    for (int r0 = lo; r0 < hi; r0 += kChunkRows) {
      const int rc = std::min(kChunkRows, hi - r0);
      const int i = b_.in.Acquire();
      Bf16* q = b_.in.slot(i).as<Bf16>();
      aiv_.ReadGm(GmRegion::Rows(g.q, int64_t{r0} * dk * 2, rc, dk * 2, dk * 2),
                  Maybe([=, src = g.q.as<Bf16>()] {
                    std::memcpy(q, src + int64_t{r0} * dk, int64_t{rc} * dk * sizeof(Bf16));
                  }),
                  "Q rows");
      b_.in.Publish(i);
      b_.in.Consume(i);
      const int o = b_.out.Acquire();
      std::byte* prepared = b_.out.slot(o).as<std::byte>();
      float* factors = reinterpret_cast<float*>(prepared + kChunkRows * out_row);
      const int64_t e = int64_t{rc} * dk;
      Payload prepare = Maybe([=] {
        std::vector<float> wide(static_cast<size_t>(rc) * dk);
        WidenBf16(q, int64_t{rc} * dk, wide.data());
        for (int r = 0; r < rc; ++r) {
          const float* row = wide.data() + int64_t{r} * dk;
          std::byte* out = prepared + r * out_row;
          if (!fp8_form) {
            const std::vector<int32_t> none(1, 0);
            PrepareQueryRows(QueryRows{row, dk, 1, dk, none}, dl, scale, snap,
                             reinterpret_cast<Bf16*>(out), factors + r);
            continue;
          }
          float q_scale = 0;
          QuantizeLatentRow(row, dl, dr,
                            Fp8LatentRow{reinterpret_cast<Fp8E4m3*>(out), &q_scale,
                                         reinterpret_cast<Bf16*>(out + dl)});
          factors[r] = q_scale * scale;
        }
      });
      // What the vector unit does depends on the path: quantise and keep the FP8 form (FP8
      // cube), quantise and widen back (no FP8 rate), or only copy bf16 queries through.
      if (fp8_form) {
        aiv_.Vector({{VecClass::kUnary, e},   // widen bf16 -> fp32
                     {VecClass::kReduce, e},  // amax of the content
                     {VecClass::kDiv, e},     // / scale
                     {VecClass::kUnary, e},   // cast to e4m3 / bf16
                     {VecClass::kBinary, rc}},
                    std::move(prepare), "quantise Q");
      } else if (snap.quantize_queries) {
        aiv_.Vector({{VecClass::kUnary, e},   // widen bf16 -> fp32
                     {VecClass::kReduce, e},  // amax of the content
                     {VecClass::kDiv, e},     // / scale
                     {VecClass::kUnary, e},   // cast to e4m3 / bf16
                     {VecClass::kUnary, e},   // widen e4m3 -> bf16
                     {VecClass::kBinary, rc}},
                    std::move(prepare), "quantise Q");
      } else {
        aiv_.Vector({{VecClass::kUnary, rc}}, std::move(prepare), "bf16 Q");  // factors only
      }
      b_.in.Release(i);
      b_.out.Publish(o);
      b_.out.Consume(o);
      aiv_.WriteGm(GmRegion::Rows(q_prep, int64_t{r0} * out_row, rc, out_row, out_row),
                   AtomicMode::kNone, Maybe([=, dst = q_prep.host] {
                     std::memcpy(dst + int64_t{r0} * out_row, prepared, rc * out_row);
                   }),
                   "prepared Q rows");
      aiv_.WriteGm(GmRegion::Rows(q_factor, int64_t{r0} * 4, 1, int64_t{rc} * 4, int64_t{rc} * 4),
                   AtomicMode::kNone, Maybe([=, dst = q_factor.as<float>()] {
                     std::memcpy(dst + r0, factors, rc * sizeof(float));
                   }),
                   "query factors");
      b_.out.Release(o);
    }
  }

  // This AIV's half of the task's keys, widened into the task's key slot ([512][dk] bf16).
  void WidenKeys(const AttentionTask& t, const Fp8Keys& fp8, int index) {
    const Fp8PageLayout& layout = fp8.layout;
    const int dk = w_.dk;
    const int half = (t.tokens + 1) / 2;
    const int k_lo = aiv_.sub_block() == 0 ? 0 : half;
    const int k_hi = aiv_.sub_block() == 0 ? half : t.tokens;
    const GmBuffer slot = ws_.KeySlot(aiv_.block(), index % ws_.key_slots, dk);
    for (int k0 = k_lo; k0 < k_hi; k0 += kWidenTokens) {
      const int kc = std::min(kWidenTokens, k_hi - k0);
      const int i = b_.in.Acquire();
      std::byte* raw = b_.in.slot(i).as<std::byte>();
      std::byte* rope_raw = raw + kWidenTokens * layout.dl;
      for (int done = 0; done < kc;) {
        const int token = fp8.first_token + t.begin + k0 + done;
        const int page = fp8.pages[token / layout.page_size];
        const int row = token % layout.page_size;
        const int run = std::min(layout.page_size - row, kc - done);
        const int64_t page_base = int64_t{page} * layout.stride();
        const int64_t content_at = page_base + layout.content_offset(row);
        const int64_t rope_at = page_base + layout.rope_offset(row);
        const int64_t rope_bytes = int64_t{layout.dr} * 2;
        aiv_.ReadGm(GmRegion::Rows(fp8.pool, content_at, 1, int64_t{run} * layout.dl,
                                   int64_t{run} * layout.dl),
                    Maybe([=, src = fp8.pool.host] {
                      std::memcpy(raw + int64_t{done} * layout.dl, src + content_at,
                                  int64_t{run} * layout.dl);
                    }),
                    "FP8 key content");
        aiv_.ReadGm(GmRegion::Rows(fp8.pool, rope_at, 1, run * rope_bytes, run * rope_bytes),
                    Maybe([=, src = fp8.pool.host] {
                      std::memcpy(rope_raw + done * rope_bytes, src + rope_at, run * rope_bytes);
                    }),
                    "FP8 key RoPE");
        done += run;
      }
      b_.in.Publish(i);
      b_.in.Consume(i);
      const int o = b_.out.Acquire();
      Bf16* wide = b_.out.slot(o).as<Bf16>();
      aiv_.Vector({{VecClass::kUnary, int64_t{kc} * layout.dl}},  // cast e4m3 -> bf16
                  Maybe([=] {
                    for (int k = 0; k < kc; ++k) {
                      Bf16* key = wide + int64_t{k} * dk;
                      WidenFp8ToBf16(reinterpret_cast<const Fp8E4m3*>(raw) + int64_t{k} * layout.dl,
                                     layout.dl, key);
                      std::memcpy(key + layout.dl, rope_raw + int64_t{k} * layout.dr * 2,
                                  layout.dr * sizeof(Bf16));
                    }
                  }),
                  "widen keys");
      b_.in.Release(i);
      b_.out.Publish(o);
      b_.out.Consume(o);
      aiv_.WriteGm(
          GmRegion::Rows(slot, int64_t{k0} * dk * 2, 1, int64_t{kc} * dk * 2, int64_t{kc} * dk * 2),
          AtomicMode::kNone, Maybe([=, dst = slot.as<Bf16>()] {
            std::memcpy(dst + int64_t{k0} * dk, wide, int64_t{kc} * dk * sizeof(Bf16));
          }),
          "widened keys");
      b_.out.Release(o);
    }
  }

  // [V1] of an FP8 group (SnapAmlaSoftmaxStep): the task's key scales and this AIV's query
  // factors come in through the side buffer; P leaves as e4m3 bytes on an FP8 cube, as its
  // (exact) bf16 values otherwise.
  void Fp8Softmax(const AttentionTask& t, const Fp8Keys& fp8, const GmBuffer& s_slot,
                  const GmBuffer& p_slot, int lo, int hi) {
    const Fp8PageLayout& layout = fp8.layout;
    const int n = t.tokens;
    const VectorBuffers::Fp8Side& side = b_.side[fp8_softmaxes_ % 2];
    const int event = kSideEvent + fp8_softmaxes_ % 2;
    if (fp8_softmaxes_ >= 2) aiv_.WaitFlag(Pipe::kV, Pipe::kMte2, event);
    ++fp8_softmaxes_;
    for (int done = 0; done < n;) {
      const int token = fp8.first_token + t.begin + done;
      const int page = fp8.pages[token / layout.page_size];
      const int row = token % layout.page_size;
      const int run = std::min(layout.page_size - row, n - done);
      const int64_t at = int64_t{page} * layout.stride() + layout.scale_offset(row);
      aiv_.ReadGm(GmRegion::Rows(fp8.pool, at, 1, int64_t{run} * 4, int64_t{run} * 4),
                  Maybe([=, src = fp8.pool.host, dst = side.key_scales] {
                    std::memcpy(dst + done, src + at, run * sizeof(float));
                  }),
                  "key scales");
      done += run;
    }
    const GmBuffer q_factor = ws_.q_factor[t.group];
    aiv_.ReadGm(
        GmRegion::Rows(q_factor, int64_t{lo} * 4, 1, int64_t{hi - lo} * 4, int64_t{hi - lo} * 4),
        Maybe([=, src = q_factor.as<float>(), dst = side.row_factors] {
          std::memcpy(dst, src + lo, (hi - lo) * sizeof(float));
        }),
        "query factors");
    aiv_.SetFlag(Pipe::kMte2, Pipe::kV, event);
    aiv_.WaitFlag(Pipe::kMte2, Pipe::kV, event);
    aiv_.Vector(
        {{VecClass::kDiv, n}, {VecClass::kReduce, n}},  // 1 / sk_j, max_j sk_j
        Maybe([=, block = side.key_block, scales = side.key_scales, inverse = side.inverse_scales] {
          *block = MakeFp8KeyBlock(scales, n, inverse);
        }),
        "key block");

    const RowGroup& g = w_.groups[t.group];
    const bool fp8_p = options_.fp8_matrix;
    for (int r0 = lo; r0 < hi; r0 += kChunkRows) {
      const int rc = std::min(kChunkRows, hi - r0);
      const int i = ReadScores(s_slot, r0, rc, n);
      float* scores = b_.in.slot(i).as<float>();
      const int o = b_.out.Acquire();
      std::byte* probs = b_.out.slot(o).as<std::byte>();
      const int state_base = t.group_slot * kRowsPerCore + (r0 - lo);
      const int64_t e = static_cast<int64_t>(rc) * n;
      const int32_t* visible = g.visible.data() + r0;
      aiv_.Vector({{VecClass::kUnary, e},   // * f_i (a scalar per row)
                   {VecClass::kBinary, e},  // * sk_j
                   {VecClass::kUnary, e},   // mask
                   {VecClass::kReduce, e},  // row max
                   {VecClass::kBinary, e},  // subtract the max
                   {VecClass::kExp, e},     // exp
                   {VecClass::kReduce, e},  // row sum
                   {VecClass::kUnary, e},   // * S16 2^-e (a scalar per row)
                   {VecClass::kBinary, e},  // * sk_j (V's scale into P)
                   {VecClass::kUnary, e},   // cast to e4m3
                   {VecClass::kBinary, e},  // weights P / sk_j, as P * (1 / sk_j)
                   {VecClass::kReduce, e},  // their sum
                   {VecClass::kUnary, rc},
                   {VecClass::kUnary, rc},
                   {VecClass::kExp, rc},
                   {VecClass::kUnary, rc},
                   {VecClass::kDiv, rc},
                   {VecClass::kUnary, rc}},
                  Maybe([=, st = b_.snap_state, delta = b_.delta, first = t.first, begin = t.begin,
                         scales = side.key_scales, weights = side.weights,
                         key_block = side.key_block, factors = side.row_factors + (r0 - lo)] {
                    ScaleAndMaskFp8Scores(std::span<const int32_t>(visible, rc), begin, n, factors,
                                          scales, scores, kKvBlockTokens);
                    for (int r = 0; r < rc; ++r) {
                      float* row = scores + r * kKvBlockTokens;
                      if (first) st[state_base + r] = SnapAmlaRowState{};
                      delta[state_base + r] =
                          SnapAmlaSoftmaxStep(row, *key_block, n, weights, st[state_base + r]);
                      std::byte* out = probs + int64_t{r} * kKvBlockTokens * 2;
                      if (fp8_p) {
                        NarrowToFp8(row, n, reinterpret_cast<Fp8E4m3*>(out));
                      } else {
                        NarrowToBf16(row, n, reinterpret_cast<Bf16*>(out));
                      }
                    }
                  }),
                  "softmax");
      b_.in.Release(i);
      b_.out.Publish(o);
      b_.out.Consume(o);
      WriteProbs(p_slot, r0, rc, n, fp8_p ? 1 : 2, probs);
      b_.out.Release(o);
    }
    aiv_.SetFlag(Pipe::kV, Pipe::kMte2, event);
    aiv_.CrossCoreSetFlag(AttentionDeviceKernel::kFlagProbsReady, Pipe::kMte3);
  }

  int fp8_softmaxes_ = 0;  // FP8 softmaxes recorded so far on this AIV

  // This AIV's half of a group's rows.
  std::pair<int, int> Rows(const RowGroup& g) const {
    const int half = (g.rows + 1) / 2;
    return aiv_.sub_block() == 0 ? std::pair{0, half} : std::pair{half, g.rows};
  }

  CoreRecorder& aiv_;
  const AttentionWorkload& w_;
  const AttentionWorkspace& ws_;
  const AttentionDeviceKernelOptions& options_;
  VectorBuffers& b_;
};

}  // namespace

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
