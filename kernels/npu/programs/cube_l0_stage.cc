#include "kernels/npu/programs/cube_l0_stage.h"

#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "kernels/core/matmul.h"

namespace mlaserve::npu {
namespace {
constexpr int64_t kL0HalfBytes = 32 * 1024;   // L0A/L0B ping-pong halves
constexpr int64_t kL0cTileBytes = 64 * 1024;  // one 128 x 128 fp32 tile
}  // namespace

absl::StatusOr<std::unique_ptr<CubeL0Stage>> CubeL0Stage::Create(CoreRecorder& aic) {
  std::unique_ptr<CubeL0Stage> stage(new CubeL0Stage(aic));
  std::vector<LocalTensor> halves, tiles;
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(LocalTensor a, aic.Alloc(Space::kL0A, kL0HalfBytes, "L0A half"));
    ASSIGN_OR_RETURN(LocalTensor b, aic.Alloc(Space::kL0B, kL0HalfBytes, "L0B half"));
    ASSIGN_OR_RETURN(LocalTensor c, aic.Alloc(Space::kL0C, kL0cTileBytes, "L0C tile"));
    (void)b;  // the L0B half pairs with L0A half i; its capacity is what matters here
    halves.push_back(a);
    tiles.push_back(c);
  }
  stage->l0_ = std::make_unique<SlotRing>(aic, Pipe::kMte1, Pipe::kM, 0, halves);
  stage->l0c_ = std::make_unique<SlotRing>(aic, Pipe::kM, Pipe::kFix, 0, tiles);
  return stage;
}

int CubeL0Stage::AcquireTile() { return l0c_->Acquire(); }

void CubeL0Stage::Multiply(int m, int n, int k, const Operand& a, const char* a_label,
                           const Operand& b, const char* b_label, bool b_transposed, int t,
                           bool accumulate, const char* label, int fp8_k) {
  const int l = l0_->Acquire();
  // Bytes of a depth-k operand with `width` rows (A) or columns (B) once its first fp8_k
  // depth elements are one byte each.
  const auto bytes = [&](int64_t width) { return width * (int64_t{fp8_k} + 2 * (k - fp8_k)); };
  aic_.LoadL0(Space::kL0A, bytes(m), nullptr, a_label);
  aic_.LoadL0(Space::kL0B, bytes(n), nullptr, b_label);
  l0_->Publish(l);
  l0_->Consume(l);
  Payload multiply;
  if (aic_.executes()) {
    float* c = tile(t);
    multiply = [=] {
      if (!accumulate) {
        for (int r = 0; r < m; ++r) std::fill_n(c + r * kTile, n, 0.0f);
      }
      if (b_transposed) {
        MatmulTileNT(m, n, k, a.src, b.src, c);
      } else {
        MatmulTileNN(m, n, k, a.src, b.src, c);
      }
    };
  }
  aic_.Mmad(m, n, k, std::move(multiply), label, fp8_k);
  l0_->Release(l);
}

void CubeL0Stage::Flush(int t, const GmRegion& dst, AtomicMode atomic, Payload write,
                        const char* label) {
  l0c_->Publish(t);
  l0c_->Consume(t);
  aic_.WriteGm(dst, atomic, std::move(write), label);
  l0c_->Release(t);
}

void CubeL0Stage::Drain() {
  l0_->Drain();
  l0c_->Drain();
}

void CopyRowsToL1(const Bf16* src, int64_t stride, int rows, int width, int block, Bf16* dst,
                  int buffer_rows, int row0) {
  for (int c0 = 0; c0 < width; c0 += block) {
    const int bw = std::min(block, width - c0);
    Bf16* out = dst + static_cast<int64_t>(c0) * buffer_rows + static_cast<int64_t>(row0) * bw;
    for (int r = 0; r < rows; ++r)
      std::copy_n(src + r * stride + c0, bw, out + static_cast<int64_t>(r) * bw);
  }
}

void WidenFp8RowsToL1(const std::byte* content, int64_t content_stride, const std::byte* rope,
                      int64_t rope_stride, int dl, int rows, int col0, int width, int block,
                      Bf16* dst, int buffer_rows, int row0) {
  std::vector<Bf16> row(width);
  const int content_cols = std::clamp(dl - col0, 0, width);
  for (int r = 0; r < rows; ++r) {
    if (content_cols > 0) {
      WidenFp8ToBf16(reinterpret_cast<const Fp8E4m3*>(content + r * content_stride) + col0,
                     content_cols, row.data());
    }
    if (content_cols < width) {
      const Bf16* rope_row = reinterpret_cast<const Bf16*>(rope + r * rope_stride);
      std::copy_n(rope_row + (col0 + content_cols - dl), width - content_cols,
                  row.data() + content_cols);
    }
    CopyRowsToL1(row.data(), width, 1, width, block, dst, buffer_rows, row0 + r);
  }
}

}  // namespace mlaserve::npu
