#ifndef MLASERVE_TESTS_SERVER_ENGINE_KV_KV_STORE_TEST_UTIL_H_
#define MLASERVE_TESTS_SERVER_ENGINE_KV_KV_STORE_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/kv/kv_snapshot.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine::testing {

// The kv tests' page, in tokens, and TinyModel's latent row width (dl 16 + dr 4).
inline constexpr int kPageSize = 4;
inline constexpr int kWidth = 20;

// Small enough that a page is 160 bytes and every row can be checked.
inline ModelConfig TinyModel(int layers = 3) {
  return ModelConfig{.name = "tiny",
                     .heads = 2,
                     .dn = 8,
                     .dr = 4,
                     .dl = 16,
                     .dv = 8,
                     .layers = layers,
                     .softmax_scale = 0.3f};
}

inline uint64_t Hash(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// `n` rows whose every value depends on (tag, first_token + row, column): finite bf16 in
// [-2, 2), so rows from different appends or prefixes never coincide.
inline std::vector<Bf16> Rows(uint64_t tag, int64_t first_token, int64_t n, int width) {
  std::vector<Bf16> rows(static_cast<size_t>(n) * width);
  for (int64_t r = 0; r < n; ++r) {
    for (int c = 0; c < width; ++c) {
      const uint64_t h = Hash(Hash(tag, first_token + r), c);
      rows[r * width + c] = Bf16::FromBits(static_cast<uint16_t>(0x3f00 | (h & 0x80ff)));
    }
  }
  return rows;
}

inline TensorView<const Bf16, 2> View2(const std::vector<Bf16>& rows, int width) {
  return *TensorView<const Bf16, 2>::Create(std::span<const Bf16>(rows),
                                            {static_cast<int64_t>(rows.size()) / width, width});
}

// A prefix's latent rows for every layer, [layers][tokens][width]; layer l's rows are
// Rows(tag * 1000 + l, first_token, tokens).
struct Latent {
  int layers = 0;
  int64_t tokens = 0;
  int width = 0;
  std::vector<Bf16> data;

  Latent(uint64_t tag, int layers_, int64_t first_token, int64_t tokens_, int width_)
      : layers(layers_), tokens(tokens_), width(width_) {
    for (int l = 0; l < layers; ++l) {
      const std::vector<Bf16> rows = Rows(tag * 1000 + l, first_token, tokens, width);
      data.insert(data.end(), rows.begin(), rows.end());
    }
  }
  TensorView<const Bf16, 3> View() const {
    return *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(data), {layers, tokens, width});
  }
  std::vector<Bf16> Layer(int layer) const {
    const auto begin = data.begin() + static_cast<int64_t>(layer) * tokens * width;
    return {begin, begin + tokens * width};
  }
};

// Every row sequence `b` of a snapshot reads, through the kernels' own accessor.
inline std::vector<Bf16> ReadSequence(const KvSnapshot& snapshot, int b) {
  const PagedSequences tables = snapshot.tables();
  const int width = snapshot.cache().width();
  std::vector<Bf16> rows;
  for (int t = 0; t < tables.seqlens[b]; ++t) {
    const Bf16* row = TokenRow(snapshot.cache(), tables, b, t);
    rows.insert(rows.end(), row, row + width);
  }
  return rows;
}

// The FP8 form of every token sequence `b` of a snapshot holds (an FP8 sequence), each as the
// record content | scale | rope, and the same form of bf16 rows, to compare them byte for byte.
inline std::vector<std::byte> ReadFp8Sequence(const KvSnapshot& snapshot, int b) {
  const SequenceSnapshot& s = snapshot.sequence(b);
  const Fp8PagedKvCache& cache = snapshot.fp8_cache();
  const Fp8PageLayout& l = cache.layout;
  std::vector<std::byte> records;
  for (int t = 0; t < s.length; ++t) {
    const int32_t page = s.pages[t / l.page_size];
    const int row = t % l.page_size;
    const auto* content = reinterpret_cast<const std::byte*>(cache.content(page, row));
    records.insert(records.end(), content, content + l.dl);
    const float scale = cache.scale(page, row);
    const auto* scale_bytes = reinterpret_cast<const std::byte*>(&scale);
    records.insert(records.end(), scale_bytes, scale_bytes + sizeof scale);
    const auto* rope = reinterpret_cast<const std::byte*>(cache.rope(page, row));
    records.insert(records.end(), rope, rope + 2 * l.dr);
  }
  return records;
}

inline std::vector<std::byte> Fp8Records(const std::vector<Bf16>& rows, int dl, int dr) {
  const int width = dl + dr;
  const int64_t record = Fp8PageLayout::BytesPerToken(dl, dr);
  std::vector<std::byte> out(rows.size() / width * record);
  for (size_t r = 0; r < rows.size() / width; ++r) {
    QuantizeLatentRowToRecord(rows.data() + r * width, dl, dr, out.data() + r * record);
  }
  return out;
}

inline std::vector<Bf16> Concat(std::initializer_list<std::vector<Bf16>> parts) {
  std::vector<Bf16> all;
  for (const std::vector<Bf16>& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

}  // namespace mlaserve::engine::testing

#endif  // MLASERVE_TESTS_SERVER_ENGINE_KV_KV_STORE_TEST_UTIL_H_
