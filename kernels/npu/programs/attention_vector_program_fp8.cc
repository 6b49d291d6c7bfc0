#include "kernels/npu/programs/attention_vector_program.h"

// The AIV program's stages for FP8 groups (SnapMLA over AMLA): the queries' preparation, the
// keys' widening when the cube has no FP8 rate, and the softmax with the keys' scales.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <variant>
#include <vector>

#include "kernels/core/attention_rows.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/float8_e4m3.h"
#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/snap_amla.h"
#include "kernels/npu/programs/attention_device_kernel.h"

namespace mlaserve::npu {
namespace {

constexpr int kWidenTokens = 16;  // keys per UB pass of the FP8 widening
// Intra-core events of the two FP8 side buffers (key scales, row factors), one per task
// parity: MTE2 -> V and back. The slot rings use events 0..1 of the same pipe pairs.
constexpr int kSideEvent = 2;

}  // namespace

void VectorProgram::Prepare(const AttentionTask& t, int index) {
  const RowGroup& g = w_.groups[t.group];
  const auto* fp8 = std::get_if<Fp8Keys>(&g.keys);
  if (fp8 == nullptr) return;
  if (t.first) PrepareQueries(t, *fp8);
  if (!options_.fp8_matrix) WidenKeys(t, *fp8, index);
  aiv_.CrossCoreSetFlag(AttentionDeviceKernel::kFlagKeysReady, Pipe::kMte3);
}

void VectorProgram::DrainSide() {
  for (int parity = 0; parity < std::min(fp8_softmaxes_, 2); ++parity) {
    aiv_.WaitFlag(Pipe::kV, Pipe::kMte2, kSideEvent + parity);
  }
}

void VectorProgram::PrepareQueries(const AttentionTask& t, const Fp8Keys& fp8) {
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

void VectorProgram::WidenKeys(const AttentionTask& t, const Fp8Keys& fp8, int index) {
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

void VectorProgram::Fp8Softmax(const AttentionTask& t, const Fp8Keys& fp8, const GmBuffer& s_slot,
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
                 {VecClass::kBinary, e},  // P8, or the unrounded value where P8 < 2^-6
                 {VecClass::kBinary, e},  // weights P / sk_j, as P * (1 / sk_j)
                 {VecClass::kReduce, e},  // their sum
                 {VecClass::kUnary, rc},
                 {VecClass::kUnary, rc},
                 {VecClass::kExp, rc},
                 {VecClass::kUnary, rc},
                 {VecClass::kDiv, rc},
                 {VecClass::kUnary, rc}},
                Maybe([=, st = b_.snap_state, delta = b_.delta, first = t.first, begin = t.begin,
                       scales = side.key_scales, weights = side.weights, key_block = side.key_block,
                       factors = side.row_factors + (r0 - lo)] {
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

}  // namespace mlaserve::npu
