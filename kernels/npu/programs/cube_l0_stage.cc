#include "kernels/npu/programs/cube_l0_stage.h"

#include "kernels/core/matmul.h"
#include "kernels/core/status_macros.h"
#include "kernels/core/vector_ops.h"

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
                           const Operand& b, const char* b_label, bool transpose_b, int t,
                           bool accumulate, const char* label) {
  const int l = l0_->Acquire();
  aic_.LoadL0(Space::kL0A, static_cast<int64_t>(a.rows) * a.cols * 2, nullptr, a_label);
  aic_.LoadL0(Space::kL0B, static_cast<int64_t>(b.rows) * b.cols * 2, nullptr, b_label);
  l0_->Publish(l);
  l0_->Consume(l);
  Payload multiply;
  if (aic_.executes()) {
    float* c = tile(t);
    multiply = [=] {
      if (transpose_b) {
        MatmulTileNT(m, n, k, a.src, a.ld, b.src, b.ld, c, kTile, accumulate);
      } else {
        MatmulTileNN(m, n, k, a.src, a.ld, b.src, b.ld, c, kTile, accumulate);
      }
    };
  }
  aic_.Mmad(m, n, k, std::move(multiply), label);
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

void WidenRowsToL1(const Bf16* src, int64_t stride, int rows, int width, float* dst) {
  for (int r = 0; r < rows; ++r) WidenBf16(src + r * stride, width, dst + static_cast<int64_t>(r) * width);
}

}  // namespace mlaserve::npu
