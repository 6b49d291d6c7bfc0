#include "kernels/core/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/cpu_features.h"

namespace mlaserve {
namespace {

std::vector<float> RandomBf16Values(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = RoundToBf16(dist(rng));
  return v;
}

// oneDNN takes the operands widened to fp32 exactly where the CPU has no bf16 dot product (its
// bf16 matmul would emulate one there), and bf16 as they are where it has one.
TEST(MatmulTest, OperandsAreWidenedExactlyWhereTheCpuHasNoBf16DotProduct) {
  if (std::getenv("MLASERVE_MATRIX_UNIT") != nullptr) GTEST_SKIP() << "a path is forced";
  const std::string backend = MatrixUnitBackend();
  if (backend.rfind("oneDNN", 0) != 0) GTEST_SKIP() << backend;
  const bool widened = backend.find("widened to fp32") != std::string::npos;
  EXPECT_EQ(widened, !HostCpu().avx512_bf16 && !HostCpu().amx_bf16) << backend;
}

TEST(MatmulTest, ChunkedNTMatchesDoubleProduct) {
  std::mt19937 rng(1);
  const int m = 37, n = 53, k = 200;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(n * k, rng);
  std::vector<float> c(m * n, 123.0f);
  MatmulNT(m, n, k, a.data(), k, b.data(), k, c.data(), n, /*accumulate=*/false, 96);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = 0;
      for (int t = 0; t < k; ++t) exact += double(a[i * k + t]) * b[j * k + t];
      ASSERT_NEAR(c[i * n + j], exact, 1e-4 * std::sqrt(k)) << i << "," << j;
    }
  }
}

TEST(MatmulTest, AccumulateAddsToExistingValuesAndNNMatches) {
  std::mt19937 rng(2);
  const int m = 9, n = 17, k = 130;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(k * n, rng);
  std::vector<float> c(m * n, 2.0f);
  MatmulNN(m, n, k, a.data(), k, b.data(), n, c.data(), n, /*accumulate=*/true, 128);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = 2.0;
      for (int t = 0; t < k; ++t) exact += double(a[i * k + t]) * b[t * n + j];
      ASSERT_NEAR(c[i * n + j], exact, 1e-4 * std::sqrt(k));
    }
  }
}

std::vector<Bf16> Narrowed(const std::vector<float>& v, int rows, int cols, int ld, int row0,
                           int col0) {
  std::vector<Bf16> out(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      out[r * cols + c] = Bf16::FromFloat(v[(row0 + r) * ld + col0 + c]);
  }
  return out;
}

TEST(MatmulTest, ChunkOrderIsTheDefinedOne) {
  // One tile call per (tile, chunk) on compact operands, each adding into an L0C-like tile in
  // chunk order: compute the same thing call by call.
  std::mt19937 rng(3);
  const int m = 130, n = 5, k = 192;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(k * n, rng);
  std::vector<float> whole(m * n), by_hand(m * n, 0.0f);
  MatmulNN(m, n, k, a.data(), k, b.data(), n, whole.data(), n, false, 96);
  for (int i = 0; i < m; i += kMatrixTile) {
    const int tm = std::min(kMatrixTile, m - i);
    std::vector<float> tile(kMatrixTile * kMatrixTile, 0.0f);
    for (int k0 = 0; k0 < k; k0 += 96) {
      MatmulTileNN(tm, n, 96, Narrowed(a, tm, 96, k, i, k0).data(),
                   Narrowed(b, 96, n, n, k0, 0).data(), tile.data());
    }
    for (int r = 0; r < tm; ++r)
      std::copy_n(tile.data() + r * kMatrixTile, n, by_hand.data() + (i + r) * n);
  }
  EXPECT_EQ(whole, by_hand);
}

TEST(MatmulTest, NTIsTheSameCallsWithBGivenRowByRow) {
  // What the emulated cube does for Q K^T: Q and K blocks as they lie in L1, one NT tile call
  // per depth chunk, accumulating, with a non-zero starting C.
  std::mt19937 rng(4);
  const int m = 128, n = 65, k = 576;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(n * k, rng);
  const auto c0 = RandomBf16Values(m * n, rng);
  std::vector<float> nt = c0;
  MatmulNT(m, n, k, a.data(), k, b.data(), k, nt.data(), n, /*accumulate=*/true, 96);
  std::vector<float> tile(kMatrixTile * kMatrixTile), by_hand(m * n);
  for (int r = 0; r < m; ++r) std::copy_n(c0.data() + r * n, n, tile.data() + r * kMatrixTile);
  for (int k0 = 0; k0 < k; k0 += 96) {
    MatmulTileNT(m, n, 96, Narrowed(a, m, 96, k, 0, k0).data(), Narrowed(b, n, 96, k, 0, k0).data(),
                 tile.data());
  }
  for (int r = 0; r < m; ++r) std::copy_n(tile.data() + r * kMatrixTile, n, by_hand.data() + r * n);
  EXPECT_EQ(nt, by_hand);
}

std::vector<Bf16> Bf16s(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16::FromFloat(v[i]);
  return out;
}

// Weights packed once into the matrix unit's layout give the same tile calls on the same
// operands, so the same bits as B read from its row-major form: NN and NT, few rows (the row
// kernel) and many (the library), widths that leave partial blocks.
TEST(MatmulTest, TiledWeightsGiveTheBitsOfRowMajorWeights) {
  std::mt19937 rng(5);
  for (const bool transposed : {false, true}) {
    for (const int m : {1, 3, 8, 130}) {
      const int n = 200, k = 300;  // B: [k][n] or [n][k]
      const int rows = transposed ? n : k, cols = transposed ? k : n;
      const auto a = Bf16s(RandomBf16Values(m * k, rng));
      const auto b = Bf16s(RandomBf16Values(rows * cols, rng));
      std::vector<Bf16> tiles(b.size());
      PackMatrixTiles(b.data(), cols, rows, cols, tiles.data());
      std::vector<float> plain(m * n), tiled(m * n);
      MatmulBf16(transposed, m, n, k, a.data(), k, b.data(), cols, plain.data(), n, false, 128);
      MatmulBf16Tiled(transposed, m, n, k, a.data(), k, tiles.data(), tiled.data(), n, false);
      EXPECT_EQ(plain, tiled) << "transposed " << transposed << ", m " << m;
    }
  }
}

// The transposed packing turns B^T into an NN operand: the bits of NN on an explicit
// transpose, and within rounding of the exact product.
TEST(MatmulTest, TransposedTilesAreTheTransposesTiles) {
  std::mt19937 rng(6);
  const int m = 2, n = 150, k = 260;  // W [n][k]; the product A . W^T
  const auto a = Bf16s(RandomBf16Values(m * k, rng));
  const auto w = Bf16s(RandomBf16Values(n * k, rng));
  std::vector<Bf16> w_t(w.size());  // [k][n]
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < k; ++c) w_t[c * n + r] = w[r * k + c];
  std::vector<Bf16> tiles(w.size());
  PackMatrixTilesTransposed(w.data(), k, n, k, tiles.data());
  std::vector<float> explicit_nn(m * n), tiled(m * n);
  MatmulBf16(false, m, n, k, a.data(), k, w_t.data(), n, explicit_nn.data(), n, false, 128);
  MatmulBf16Tiled(false, m, n, k, a.data(), k, tiles.data(), tiled.data(), n, false);
  EXPECT_EQ(explicit_nn, tiled);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = 0;
      for (int t = 0; t < k; ++t) exact += double(a[i * k + t].ToFloat()) * w[j * k + t].ToFloat();
      ASSERT_NEAR(tiled[i * n + j], exact, 1e-4 * std::sqrt(k)) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace mlaserve
