// A device program must say every dependency it has through flags: the host executor, like
// the hardware, is free to run anything whose flags have fired. Executing the same program in
// many random dependency-respecting orders must therefore give the same bits every time;
// a missing flag shows up here deterministically (for a seed) instead of as a rare race.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"
#include "kernels/mla/snap_amla.h"
#include "kernels/npu/device.h"
#include "kernels/npu/local_memory.h"
#include "kernels/npu/program.h"
#include "kernels/npu/programs/latent_decode_on_device.h"
#include "tests/testing/random_batch.h"

namespace mlaserve::npu {
namespace {

// Runs every payload of a finalized program on this thread, in a random topological order.
void RunInRandomOrder(const Program& program, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> pending = program.in_degree();
  std::vector<uint32_t> ready;
  for (uint32_t i = 0; i < pending.size(); ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  size_t executed = 0;
  while (!ready.empty()) {
    std::uniform_int_distribution<size_t> pick(0, ready.size() - 1);
    const size_t k = pick(rng);
    const uint32_t id = ready[k];
    ready[k] = ready.back();
    ready.pop_back();
    if (const Payload* payload = program.payload(program.instructions()[id])) (*payload)();
    ++executed;
    for (uint32_t e = program.edge_offsets()[id]; e < program.edge_offsets()[id + 1]; ++e) {
      if (--pending[program.edges()[e].to] == 0) ready.push_back(program.edges()[e].to);
    }
  }
  ASSERT_EQ(executed, program.instructions().size());
}

// Outputs and LSEs whose bits differ from the host's (sizes must match).
int64_t DifferingWords(const AttentionOutput& device, const AttentionOutput& host) {
  if (device.out.size() != host.out.size() || device.lse.size() != host.lse.size()) return -1;
  int64_t differing = 0;
  for (size_t i = 0; i < host.out.size(); ++i) {
    differing += std::bit_cast<uint32_t>(device.out[i]) != std::bit_cast<uint32_t>(host.out[i]);
  }
  for (size_t i = 0; i < host.lse.size(); ++i) {
    differing += std::bit_cast<uint32_t>(device.lse[i]) != std::bit_cast<uint32_t>(host.lse[i]);
  }
  return differing;
}

// Records `launch`'s attention kernel, runs it in one random dependency-respecting order and
// reads its answer.
AttentionOutput RunInRandomOrder(LatentDecodeLaunch& launch, const DeviceProfile& profile,
                                 const LocalMemoryStorage& storage, uint64_t seed) {
  Program program(profile, launch.kernel()->BlockDim(), &storage);
  EXPECT_TRUE(launch.kernel()->Record(program).ok());
  EXPECT_TRUE(program.Finalize().ok());
  RunInRandomOrder(program, seed);
  return launch.ReadOutput();
}

// How many random orders each case runs (MLASERVE_PROGRAM_ORDERS overrides, for soak runs).
const uint64_t kOrders = [] {
  const char* env = std::getenv("MLASERVE_PROGRAM_ORDERS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 6ull;
}();

struct OrderCase {
  RescaleAlgorithm algorithm;
  int preload;
  int heads;
  int sq;
};

class ProgramOrderTest : public ::testing::TestWithParam<OrderCase> {};

TEST_P(ProgramOrderTest, EveryDependencyRespectingOrderGivesTheHostResult) {
  const OrderCase c = GetParam();
  Rng rng(900 + c.heads + c.sq);
  const auto batch = testing::MakeRandomPagedBatch(
      {.sq = c.sq, .heads = c.heads, .dk = 576, .page_size = 64, .seqlens = {0, 1, 65, 511, 1300}},
      rng);
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
  auto host =
      c.algorithm == RescaleAlgorithm::kAmla ? AmlaDecode(problem) : FlashBaseDecode(problem);
  ASSERT_TRUE(host.ok());

  auto profile = LoadDeviceProfile("ascend910-die");
  ASSERT_TRUE(profile.ok());
  auto device = Device::Create(*profile);
  ASSERT_TRUE(device.ok());
  const LocalMemoryStorage storage(*profile);
  for (uint64_t seed = 0; seed < kOrders; ++seed) {
    auto launch = LatentDecodeLaunch::Prepare(
        **device, problem, {.algorithm = c.algorithm, .preload = c.preload, .amla = {}});
    ASSERT_TRUE(launch.ok()) << launch.status();
    const AttentionOutput out = RunInRandomOrder(**launch, *profile, storage, seed);
    ASSERT_EQ(DifferingWords(out, *host), 0) << "order seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, ProgramOrderTest,
                         ::testing::Values(OrderCase{RescaleAlgorithm::kAmla, 2, 16, 2},
                                           OrderCase{RescaleAlgorithm::kAmla, 1, 128, 2},
                                           OrderCase{RescaleAlgorithm::kAmla, 0, 32, 1},
                                           OrderCase{RescaleAlgorithm::kBase, 2, 16, 2},
                                           OrderCase{RescaleAlgorithm::kBase, 1, 128, 1}),
                         [](const ::testing::TestParamInfo<OrderCase>& param_info) {
                           return absl::StrCat(param_info.param.algorithm == RescaleAlgorithm::kAmla
                                                   ? "amla"
                                                   : "base",
                                               "_preload", param_info.param.preload, "_h",
                                               param_info.param.heads, "_sq", param_info.param.sq);
                         });

// The FP8 pipeline's own dependencies ([prep] running ahead of the cube, the widened-key
// slots and their reuse, the side buffer of key scales, the query factors written by one
// pipe and read by another), on the 910 (keys widened by the AIVs) and on the hypothetical
// FP8 cube, under every preload count.
TEST(ProgramOrderTest, Fp8ProgramsGiveTheHostResultInEveryDependencyRespectingOrder) {
  Rng rng(977);
  const auto batch = testing::MakeRandomPagedBatch({.sq = 2,
                                                    .heads = 16,
                                                    .dk = 576,
                                                    .page_size = 64,
                                                    .seqlens = {0, 1, 65, 700, 1300},
                                                    .q_sigma = 0.5,
                                                    .kv_sigma = 0.5},
                                                   rng);
  const LatentDecodeProblem bf16 = batch.Latent(512, 1.0f / std::sqrt(192.0f));
  const std::vector<std::byte> pages = QuantizePagedCache(bf16.cache, 512);
  const Fp8LatentDecodeProblem problem{
      bf16.q, Fp8PagedKvCache{pages.data(), bf16.cache.num_pages(), {64, 512, 64}}, bf16.seqs,
      bf16.softmax_scale, true};
  auto host = SnapAmlaDecode(problem);
  ASSERT_TRUE(host.ok()) << host.status();
  for (const char* profile_name : {"ascend910-die", "ascend910-fp8"}) {
    auto profile = LoadDeviceProfile(profile_name);
    ASSERT_TRUE(profile.ok());
    auto device = Device::Create(*profile);
    ASSERT_TRUE(device.ok());
    const LocalMemoryStorage storage(*profile);
    for (const int preload : {0, 1, 2}) {
      for (uint64_t seed = 0; seed < std::max<uint64_t>(2, kOrders / 2); ++seed) {
        auto launch = LatentDecodeLaunch::PrepareFp8(**device, problem, {.preload = preload});
        ASSERT_TRUE(launch.ok()) << launch.status();
        const AttentionOutput out = RunInRandomOrder(**launch, *profile, storage, seed);
        ASSERT_EQ(DifferingWords(out, *host), 0)
            << profile_name << " preload " << preload << " order " << seed;
      }
    }
  }
}

}  // namespace
}  // namespace mlaserve::npu
