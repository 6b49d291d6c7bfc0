#include "kernels/core/block_scores.h"

#include <algorithm>
#include <limits>

#include "kernels/core/matmul.h"
#include "kernels/core/tiling.h"

namespace mlaserve {

void ComputeBlockScores(const QueryRows& rows, const KvBlock& block, int begin, int count,
                        float scale, float* s, int64_t lds) {
  MatmulNT(rows.count, count, rows.dk, rows.q, rows.ldq, block.k, block.ldk, s, lds,
           /*accumulate=*/false, kQkDepthChunk);
  ScaleAndMaskScores(rows, begin, count, scale, s, lds);
}

void ScaleAndMaskScores(const QueryRows& rows, int begin, int count, float scale, float* s,
                        int64_t lds) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < rows.count; ++i) {
    float* row = s + i * lds;
    const int visible = std::clamp(rows.visible[i] - begin, 0, count);
    for (int j = 0; j < visible; ++j) row[j] *= scale;
    std::fill(row + visible, row + count, kMasked);
  }
}

}  // namespace mlaserve
