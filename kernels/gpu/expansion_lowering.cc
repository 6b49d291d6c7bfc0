#include "kernels/gpu/expansion_lowering.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/upload_writer.h"

namespace mlaserve::gpu {

absl::StatusOr<Program> LowerExpansion(const ExpansionSpec& s, DevicePtr upload_to,
                                       std::span<std::byte> upload) {
  const int32_t tokens = s.end - s.begin;
  if (tokens <= 0 || s.heads <= 0 || s.page_size <= 0 || s.begin < 0 ||
      static_cast<int64_t>(s.pages.size()) * s.page_size < s.end) {
    return absl::InternalError(absl::StrCat("expansion of tokens [", s.begin, ", ", s.end,
                                            ") over ", s.pages.size(), " pages"));
  }
  const int dk = s.dl + s.dr;
  const int dqk = s.dn + s.dr;
  const int64_t row_bytes = int64_t{dk} * 2;
  std::vector<GemmJob> jobs;
  std::vector<GemmTile> tiles;
  std::vector<CopyRowsJob> rope;
  for (int32_t t = s.begin; t < s.end;) {
    const int32_t row = t % s.page_size;
    const int32_t run = std::min(s.page_size - row, s.end - t);
    const DevicePtr latent =
        s.pool +
        static_cast<DevicePtr>(int64_t{s.pages[t / s.page_size]} * s.page_stride + row * row_bytes);
    const int64_t first = t - s.begin;
    for (int h = 0; h < s.heads; ++h) {
      const DevicePtr w_uk = s.kv_b + static_cast<DevicePtr>(int64_t{h} * (s.dn + s.dv) * s.dl * 2);
      const DevicePtr w_uv = w_uk + static_cast<DevicePtr>(int64_t{s.dn} * s.dl * 2);
      const DevicePtr k_rows =
          s.keys + static_cast<DevicePtr>((int64_t{h} * tokens + first) * dqk * 2);
      const DevicePtr v_rows =
          s.values + static_cast<DevicePtr>((int64_t{h} * tokens + first) * s.dv * 2);
      for (const auto& [w, out, n, ldc] :
           {std::tuple{w_uk, k_rows, s.dn, dqk}, std::tuple{w_uv, v_rows, s.dv, s.dv}}) {
        GemmJob job;
        job.a = latent;  // c_kv: the first dl columns of each row
        job.lda = dk;
        job.b = w;  // [n][dl]
        job.ldb = s.dl;
        job.transpose_b = 1;
        job.c = out;
        job.ldc = ldc;
        job.c_bf16 = 1;
        job.rows = run;
        job.n = n;
        job.k = s.dl;
        const int32_t index = static_cast<int32_t>(jobs.size());
        jobs.push_back(job);
        for (int32_t r = 0; r < run; r += kGemmTileRows) {
          for (int32_t c = 0; c < n; c += kGemmTileCols) tiles.push_back({index, r, c});
        }
      }
      rope.push_back(CopyRowsJob{latent + static_cast<DevicePtr>(int64_t{s.dl} * 2),
                                 k_rows + static_cast<DevicePtr>(int64_t{s.dn} * 2), row_bytes,
                                 int64_t{dqk} * 2, run, s.dr * 2});
    }
    t += run;
  }
  UploadWriter writer(upload.empty() ? nullptr : upload.data(), upload_to);
  Program program;
  Launch gemm{.kind = LaunchKind::kGemm, .name = "expand"};
  gemm.records = writer.PutArray(jobs);
  gemm.tiles = writer.PutArray(tiles);
  gemm.count = static_cast<int32_t>(tiles.size());
  program.launches.push_back(gemm);
  Launch copy{.kind = LaunchKind::kCopyRows, .name = "expand rope"};
  copy.tiles = writer.PutArray(rope);
  copy.count = static_cast<int32_t>(rope.size());
  // Every address and stride is a multiple of 16 for the served widths (dl, dn, dr, dv
  // multiples of 8 elements); the kernel checks nothing, so say so only when true.
  const auto a16 = [](int64_t x) { return x % 16 == 0; };
  copy.aligned16 = std::all_of(rope.begin(), rope.end(), [&](const CopyRowsJob& j) {
    return a16(static_cast<int64_t>(j.src)) && a16(static_cast<int64_t>(j.dst)) &&
           a16(j.src_stride) && a16(j.dst_stride) && a16(j.row_bytes);
  });
  program.launches.push_back(copy);
  program.upload_to = upload_to;
  program.upload_bytes = writer.size();
  if (!upload.empty() && static_cast<int64_t>(upload.size()) < writer.size()) {
    return absl::InternalError("expansion: upload smaller than its records");
  }
  return program;
}

}  // namespace mlaserve::gpu
