#include "kernels/core/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/core/cpu_features.h"
#include "kernels/core/row_matmul.h"
#include "kernels/core/thread_scratch.h"
#include "kernels/core/vector_ops.h"
#include "oneapi/dnnl/dnnl.hpp"

// OpenBLAS's own worker pool (exported, used by its fork handler).
extern "C" int blas_thread_shutdown_(void);

namespace mlaserve {
namespace {

// Whether this process may turn written memory into code, which oneDNN's JIT needs. Under
// systemd's MemoryDenyWriteExecute= or the kernel's PR_SET_MDWE it may not; the probe makes
// that a fallback to OpenBLAS instead of a failure.
bool CanMapGeneratedCode() {
  const long page = sysconf(_SC_PAGESIZE);
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = mprotect(p, page, PROT_READ | PROT_EXEC) == 0;
  munmap(p, page);
  return ok;
}

// Why the matrix unit runs on OpenBLAS in this process, or "" for oneDNN (decided once).
// oneDNN's bf16 matmuls are fast from AVX-512 up (avx512_core emulation, avx512_core_bf16,
// AMX); below that it only has reference kernels, so plain AVX2 takes OpenBLAS's SGEMM on
// widened operands. MLASERVE_MATRIX_UNIT=openblas forces that path (to test it anywhere).
std::string OpenBlasReason() {
  const char* forced = std::getenv("MLASERVE_MATRIX_UNIT");
  if (forced != nullptr && std::string(forced) == "openblas")
    return "MLASERVE_MATRIX_UNIT=openblas";
  if (!HostCpu().avx512) return "no AVX-512 for oneDNN's bf16 matmul";
  if (!CanMapGeneratedCode()) return "generated code may not be mapped";
  return "";
}

bool DnnlUsable() {
  static const bool usable = OpenBlasReason().empty();
  return usable;
}

// A tile call's compact bf16 operands (A [m][k], B [k][n] or [n][k]) widened to fp32 in this
// thread's scratch, same layout, for the paths whose kernel takes fp32.
struct WidenedOperands {
  ThreadScratch<struct WideA, float> a;
  ThreadScratch<struct WideB, float> b;
  WidenedOperands(int m, int n, int k, const Bf16* a_bf16, const Bf16* b_bf16)
      : a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n) {
    WidenBf16(a_bf16, static_cast<int64_t>(m) * k, a.data());
    WidenBf16(b_bf16, static_cast<int64_t>(k) * n, b.data());
  }
};

// Whether oneDNN takes the operands widened to fp32 rather than as bf16 (decided once): where
// the CPU has no bf16 dot product (AVX-512 without AVX512_BF16 or AMX) oneDNN's bf16 matmul
// emulates one, and a 128 x 128 tile call ran 4.4x slower than its fp32 kernel on operands
// widened per call, the widening included (docs/performance.md 19). Products of bf16 values
// are exact in fp32 either way; the sum's order is the fp32 kernel's. MLASERVE_MATRIX_UNIT=
// onednn-bf16 or =onednn-f32 forces one (to compare them).
bool DnnlWidens() {
  static const bool widens = [] {
    const char* forced = std::getenv("MLASERVE_MATRIX_UNIT");
    if (forced != nullptr && std::string(forced) == "onednn-bf16") return false;
    if (forced != nullptr && std::string(forced) == "onednn-f32") return true;
    return !HostCpu().avx512_bf16 && !HostCpu().amx_bf16;
  }();
  return widens;
}

// The tile call as a oneDNN matmul: bf16 A [m][k] x bf16 B ([k][n], or [n][k] read
// transposed), accumulated into fp32 C [m][n] (leading dimension kMatrixTile) by the sum
// post-op; A and B widened to fp32 first where DnnlWidens. One per thread: a primitive shared
// between threads serialises them.
class DnnlTiles {
 public:
  DnnlTiles()
      : engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_),
        operands_(DnnlWidens() ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16) {
    // mlaserve runs many tiles concurrently from its own threads: one OpenMP thread per call.
    omp_set_num_threads(1);
  }

  void Run(int m, int n, int k, bool b_transposed, const Bf16* a, const Bf16* b, float* c) {
    Shape& shape = ShapeOf(m, n, k, b_transposed);
    if (operands_ == dnnl::memory::data_type::f32) {
      const WidenedOperands wide(m, n, k, a, b);
      Execute(shape, wide.a.data(), wide.b.data(), c);
      return;
    }
    // oneDNN's handles are not const-correct; the inputs are only read.
    Execute(shape, const_cast<Bf16*>(a), const_cast<Bf16*>(b), c);
  }

  std::string Implementation() const {
    return std::string(Describe(128, 128, 96, false).impl_info_str()) +
           (operands_ == dnnl::memory::data_type::f32 ? " on operands widened to fp32" : "");
  }

 private:
  struct Shape {
    dnnl::matmul matmul;
    dnnl::memory a, b, c;
  };

  void Execute(Shape& shape, void* a, void* b, float* c) {
    shape.a.set_data_handle(a);
    shape.b.set_data_handle(b);
    shape.c.set_data_handle(c);
    shape.matmul.execute(
        stream_, {{DNNL_ARG_SRC, shape.a}, {DNNL_ARG_WEIGHTS, shape.b}, {DNNL_ARG_DST, shape.c}});
  }

  dnnl::memory::desc ADesc(int m, int k) const { return {{m, k}, operands_, {k, 1}}; }
  dnnl::memory::desc BDesc(int k, int n, bool transposed) const {
    return {{k, n}, operands_, transposed ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1}};
  }
  static dnnl::memory::desc CDesc(int m, int n) {
    return {{m, n}, dnnl::memory::data_type::f32, {kMatrixTile, 1}};
  }

  dnnl::matmul::primitive_desc Describe(int m, int n, int k, bool b_transposed) const {
    dnnl::post_ops accumulate;
    accumulate.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(accumulate);
    return dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(ADesc(m, k), BDesc(k, n, b_transposed), CDesc(m, n)), attr, engine_);
  }

  Shape& ShapeOf(int m, int n, int k, bool b_transposed) {
    const auto key = std::tuple{m, n, k, b_transposed};
    auto it = shapes_.find(key);
    if (it == shapes_.end()) {
      Shape shape{dnnl::matmul(Describe(m, n, k, b_transposed)),
                  dnnl::memory(ADesc(m, k), engine_, nullptr),
                  dnnl::memory(BDesc(k, n, b_transposed), engine_, nullptr),
                  dnnl::memory(CDesc(m, n), engine_, nullptr)};
      it = shapes_.emplace(key, std::move(shape)).first;
    }
    return it->second;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::memory::data_type operands_;
  std::map<std::tuple<int, int, int, bool>, Shape> shapes_;
};

DnnlTiles& ThisThreadsTiles() {
  thread_local DnnlTiles tiles;
  return tiles;
}

void LibraryTileCall(int m, int n, int k, bool b_transposed, const Bf16* a, const Bf16* b,
                     float* c) {
  if (DnnlUsable()) {
    ThisThreadsTiles().Run(m, n, k, b_transposed, a, b, c);
    return;
  }
  // No JIT in this process: OpenBLAS on the widened operands, still one call per tile and
  // chunk (the same calls on every path, so host and device keep agreeing).
  const WidenedOperands wide(m, n, k, a, b);
  UseOneOpenBlasThreadPerCall();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
              wide.a.data(), k, wide.b.data(), b_transposed ? k : n, 1.0f, c, kMatrixTile);
}

void TileCall(int m, int n, int k, bool b_transposed, const Bf16* a, const Bf16* b, float* c) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  // A few rows: the weights' bytes are the work, read in place (row_matmul.h), on every path.
  if (!b_transposed && m <= kRowMatmulRows) {
    RowMatmulNN(m, n, k, a, b, c, kMatrixTile);
    return;
  }
  LibraryTileCall(m, n, k, b_transposed, a, b, c);
}

// Tiled's working memory, one set per thread for all its instantiations.
struct ATileScratch;
struct BChunkScratch;
struct OutputTileScratch;

// Copies a [rows][cols] block into compact bf16, row r read from row_of(r): fp32 operands
// are narrowed (exact for the bf16-valued matrices the entry points take), bf16 ones copied.
template <typename RowOf>
void CompactRows(int rows, int cols, RowOf row_of, Bf16* dst) {
  for (int r = 0; r < rows; ++r) {
    const auto* src = row_of(r);
    if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(src)>>, float>) {
      NarrowToBf16(src, cols, dst + static_cast<int64_t>(r) * cols);
    } else {
      std::copy_n(src, cols, dst + static_cast<int64_t>(r) * cols);
    }
  }
}

// B's operand for one tile call, made compact from rows read through b_row(i) (row i of
// [n][k] if b_transposed, of [k][n] otherwise), so B may be a strided matrix or rows
// scattered over pages.
template <typename BRow>
class CompactedB {
 public:
  explicit CompactedB(BRow b_row) : b_row_(b_row) {}
  // The compact operand of output columns [j, j + tn) and depth [k0, k0 + kc).
  const Bf16* operator()(bool b_transposed, int j, int tn, int k0, int kc, Bf16* scratch) const {
    if (b_transposed) {
      CompactRows(
          tn, kc, [&](int r) { return b_row_(j + r) + k0; }, scratch);
    } else {
      CompactRows(
          kc, tn, [&](int r) { return b_row_(k0 + r) + j; }, scratch);
    }
    return scratch;
  }

 private:
  BRow b_row_;
};

// B already in the matrix unit's tile layout (PackMatrixTiles): every operand is in place.
class TiledB {
 public:
  TiledB(const Bf16* b, int n, int k) : b_(b), n_(n), k_(k) {}
  const Bf16* operator()(bool b_transposed, int j, int tn, int k0, int kc, Bf16*) const {
    // NT: B [n][k] in blocks of depth columns, operand = rows [j, j + tn) of block k0 / 128.
    // NN: B [k][n] in blocks of output columns, operand = rows [k0, k0 + kc) of block j / 128.
    return b_transposed ? b_ + static_cast<int64_t>(k0) * n_ + static_cast<int64_t>(j) * kc
                        : b_ + static_cast<int64_t>(j) * k_ + static_cast<int64_t>(k0) * tn;
  }

 private:
  const Bf16* b_;
  int n_, k_;
};

// The host's side of the definition: per output tile, an L0C-like tile; per chunk, the
// operands made compact and one tile call; b_operand gives B's (CompactedB or TiledB).
template <typename TA, typename BOperand>
void Tiled(bool b_transposed, int m, int n, int k, const TA* a, int64_t lda,
           const BOperand& b_operand, float* c, int64_t ldc, bool accumulate, int k_chunk) {
  if (m <= 0 || n <= 0) return;
  const int chunk = k_chunk > 0 ? k_chunk : std::max(k, 1);
  // A's row tile, made compact once for all column tiles, chunk by chunk: chunk k0 is the
  // compact [tm][kc] block at k0 * tm.
  ThreadScratch<ATileScratch, Bf16> a_tile(static_cast<size_t>(kMatrixTile) * std::max(k, 1));
  ThreadScratch<BChunkScratch, Bf16> b_chunk(static_cast<size_t>(kMatrixTile) *
                                             std::min(chunk, std::max(k, 1)));
  ThreadScratch<OutputTileScratch, float> tile(static_cast<size_t>(kMatrixTile) * kMatrixTile);
  for (int i = 0; i < m; i += kMatrixTile) {
    const int tm = std::min(kMatrixTile, m - i);
    for (int k0 = 0; k0 < k; k0 += chunk) {
      CompactRows(
          tm, std::min(chunk, k - k0), [&](int r) { return a + (i + r) * lda + k0; },
          a_tile.data() + static_cast<int64_t>(k0) * tm);
    }
    for (int j = 0; j < n; j += kMatrixTile) {
      const int tn = std::min(kMatrixTile, n - j);
      float* out = c + i * ldc + j;
      for (int r = 0; r < tm; ++r) {
        float* row = tile.data() + r * kMatrixTile;
        if (accumulate) {
          std::copy_n(out + r * ldc, tn, row);
        } else {
          std::fill_n(row, tn, 0.0f);
        }
      }
      for (int k0 = 0; k0 < k; k0 += chunk) {
        const int kc = std::min(chunk, k - k0);
        TileCall(tm, tn, kc, b_transposed, a_tile.data() + static_cast<int64_t>(k0) * tm,
                 b_operand(b_transposed, j, tn, k0, kc, b_chunk.data()), tile.data());
      }
      for (int r = 0; r < tm; ++r) std::copy_n(tile.data() + r * kMatrixTile, tn, out + r * ldc);
    }
  }
}

template <typename T>
auto StridedRows(const T* b, int64_t ldb) {
  return CompactedB([b, ldb](int i) { return b + i * ldb; });
}

}  // namespace

void UseOneOpenBlasThreadPerCall() {
  static std::once_flag once;
  std::call_once(once, [] {
    openblas_set_num_threads(1);
    blas_thread_shutdown_();
  });
}

std::string MatrixUnitBackend() {
  return (DnnlUsable() ? "oneDNN " + ThisThreadsTiles().Implementation()
                       : "OpenBLAS (" + OpenBlasReason() + ")") +
         "; few rows: mlaserve's row kernel";
}

std::string MatrixPathDescription() {
  return "matrix unit: " + MatrixUnitBackend() + "; CPU: " + HostCpu().model + ", " +
         HostCpu().MatrixIsa();
}

void MatmulTileNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c) {
  TileCall(m, n, k, /*b_transposed=*/false, a, b, c);
}

void MatmulTileNT(int m, int n, int k, const Bf16* a, const Bf16* b, float* c) {
  TileCall(m, n, k, /*b_transposed=*/true, a, b, c);
}

void MatmulTileLibraryNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  LibraryTileCall(m, n, k, /*b_transposed=*/false, a, b, c);
}

void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  Tiled(/*b_transposed=*/false, m, n, k, a, lda, StridedRows(b, ldb), c, ldc, accumulate, k_chunk);
}

void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  Tiled(/*b_transposed=*/true, m, n, k, a, lda, StridedRows(b, ldb), c, ldc, accumulate, k_chunk);
}

void MatmulBf16(bool b_transposed, int m, int n, int k, const Bf16* a, int64_t lda, const Bf16* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate, int k_chunk) {
  Tiled(b_transposed, m, n, k, a, lda, StridedRows(b, ldb), c, ldc, accumulate, k_chunk);
}

void MatmulBf16Rows(bool b_transposed, int m, int n, int k, const Bf16* a, int64_t lda,
                    const Bf16* const* b_rows, float* c, int64_t ldc, bool accumulate,
                    int k_chunk) {
  Tiled(b_transposed, m, n, k, a, lda, CompactedB([b_rows](int i) { return b_rows[i]; }), c, ldc,
        accumulate, k_chunk);
}

void MatmulBf16Tiled(bool b_transposed, int m, int n, int k, const Bf16* a, int64_t lda,
                     const Bf16* b_tiles, float* c, int64_t ldc, bool accumulate) {
  Tiled(b_transposed, m, n, k, a, lda, TiledB(b_tiles, n, k), c, ldc, accumulate, kMatrixTile);
}

void PackMatrixTilesTransposed(const Bf16* src, int64_t ld, int rows, int cols, Bf16* dst) {
  // The transpose is [cols][rows]: block b holds its columns [128 b, ...), i.e. src's rows.
  for (int r0 = 0; r0 < rows; r0 += kMatrixTile) {
    const int width = std::min(kMatrixTile, rows - r0);
    Bf16* block = dst + static_cast<int64_t>(r0) * cols;
    for (int c = 0; c < cols; ++c) {
      for (int r = 0; r < width; ++r)
        block[static_cast<int64_t>(c) * width + r] = src[(r0 + r) * ld + c];
    }
  }
}

void PackMatrixTiles(const Bf16* src, int64_t ld, int rows, int cols, Bf16* dst) {
  for (int c0 = 0; c0 < cols; c0 += kMatrixTile) {
    const int width = std::min(kMatrixTile, cols - c0);
    Bf16* block = dst + static_cast<int64_t>(c0) * rows;
    for (int r = 0; r < rows; ++r) {
      std::copy_n(src + r * ld + c0, width, block + static_cast<int64_t>(r) * width);
    }
  }
}

void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b, int64_t ldb,
                    double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  UseOneOpenBlasThreadPerCall();
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b, int64_t ldb,
                    double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  UseOneOpenBlasThreadPerCall();
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

}  // namespace mlaserve
