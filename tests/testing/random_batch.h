#ifndef MLASERVE_TESTS_TESTING_RANDOM_BATCH_H_
#define MLASERVE_TESTS_TESTING_RANDOM_BATCH_H_

#include <cstdint>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/head_space_decode.h"
#include "kernels/core/latent_decode.h"
#include "kernels/core/random_fill.h"
#include "kernels/core/up_projection.h"

namespace mlaserve::testing {

// A random paged decode batch laid out the way a serving framework's cache looks: pages in
// shuffled order, spare pages, and every cache row no request owns filled with NaN, so a
// kernel that reads past a sequence's end poisons its own output (FlashMLA's test trick).
struct PagedBatchSpec {
  int sq = 1;
  int heads = 16;
  int dk = 576;
  int page_size = 64;
  std::vector<int32_t> seqlens;
  double q_sigma = 1.0;
  double kv_sigma = 1.0;
};

struct RandomPagedBatch {
  PagedBatchSpec spec;
  int max_pages = 0;
  int num_pages = 0;
  std::vector<Bf16> q;               // [batch][sq][heads][dk]
  std::vector<Bf16> pages;           // [num_pages][page_size][dk]
  std::vector<int32_t> block_table;  // [batch][max_pages]

  int batch() const { return static_cast<int>(spec.seqlens.size()); }
  LatentDecodeProblem Latent(int dv, float scale, bool causal = true) const;
};

RandomPagedBatch MakeRandomPagedBatch(const PagedBatchSpec& spec, Rng& rng);

// Adds head-space queries and up-projection weights to a latent batch whose dk = dl + dr.
struct RandomHeadSpaceBatch {
  RandomPagedBatch latent;
  int dn = 128, dr = 64, dl = 512, dv = 128;
  std::vector<Bf16> q_nope;  // [batch][sq][heads][dn]
  std::vector<Bf16> q_pe;    // [batch][sq][heads][dr]
  std::vector<Bf16> w_uk;    // [heads][dn][dl]
  std::vector<Bf16> w_uv;    // [heads][dv][dl]

  UpProjection Weights() const;
  HeadSpaceDecodeProblem Problem(float scale, bool causal = true) const;
};

RandomHeadSpaceBatch MakeRandomHeadSpaceBatch(const PagedBatchSpec& spec, Rng& rng, int dn = 128,
                                              int dr = 64, int dv = 128);

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_RANDOM_BATCH_H_
