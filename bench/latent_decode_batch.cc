#include "bench/latent_decode_batch.h"

#include <utility>

namespace mlaserve::bench {

DecodeBatch MakeLatentBatch(int batch, int heads, int sq, int sk, std::span<const int32_t> table,
                            int pages_per_seq, const Bf16* q, const NamedPool& pool,
                            int parallel_units) {
  DecodeBatch b;
  b.dims = {heads, 128, kRopeWidth, kLatentWidth, 128, kDeepSeekScale};
  b.parallel_units = parallel_units;
  DecodeBatch::Group group;
  group.kv_dtype = pool.fp8 ? KvDtype::kFp8 : KvDtype::kBf16;
  group.head_space = false;
  group.sq = sq;
  group.out_bf16 = true;
  const int64_t q_elements = int64_t{sq} * heads * kKeyWidth;
  for (int m = 0; m < batch; ++m) {
    DecodeBatch::Member member;
    member.pages = table.subspan(static_cast<size_t>(m) * pages_per_seq, pages_per_seq);
    member.length = sk;
    member.q_latent = q + m * q_elements;
    group.members.push_back(member);
  }
  b.groups.push_back(std::move(group));
  b.pool = static_cast<const Bf16*>(pool.name);
  b.pool_pages = pool.pages;
  b.page_size = pool.page_size;
  b.fp8_pool = {static_cast<const std::byte*>(pool.name), pool.pages, pool.fp8_layout};
  return b;
}

}  // namespace mlaserve::bench
