// The emulated device's rules, each checked with a small hand-written kernel: local memory
// capacity and alignment, GM bounds, flag deadlocks and protocol violations, exact atomics,
// deterministic timing, profile validation; the emulator's own machinery (payloads, GM
// host-memory reuse, atomic guards, the L2 model against its documented semantics); and the
// two modelling claims of the AMLA paper the emulator must reproduce (preload helps, AMLA
// beats Base).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/fp32_exponent_add.h"
#include "kernels/npu/device.h"
#include "kernels/npu/l2_cache_model.h"
#include "kernels/npu/programs/latent_decode_on_device.h"
#include "kernels/npu/timing_model.h"
#include "nlohmann/json.hpp"
#include "tests/testing/npu_device.h"
#include "tests/testing/scripted_kernel.h"

namespace mlaserve::npu {
namespace {

using ::testing::HasSubstr;

using testing::ScriptedKernel;

TEST(DeviceTest, LocalBufferBeyondCapacityIsAKernelErrorNamingTheBuffer) {
  auto device = testing::MakeTestDevice();
  const int64_t ub = device->profile().ub_bytes;
  ScriptedKernel kernel(1, [ub](Program& program) -> absl::Status {
    CoreRecorder& aiv = program.Vector(0, 0);
    RETURN_IF_ERROR(aiv.Alloc(Space::kUb, ub / 2, "first half").status());
    return aiv.Alloc(Space::kUb, ub / 2 + 1, "score tile").status();
  });
  const auto report = device->Launch(kernel, ExecutionMode::kExecute);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(report.status().message(), HasSubstr("score tile"));
  EXPECT_THAT(report.status().message(), HasSubstr("AIV 0.0"));
}

TEST(DeviceTest, LocalSpacesExistOnlyOnTheirCoreKind) {
  auto device = testing::MakeTestDevice();
  ScriptedKernel kernel(1, [](Program& program) {
    return program.Cube(0).Alloc(Space::kUb, 32, "cube UB").status();
  });
  const auto report = device->Launch(kernel, ExecutionMode::kModelOnly);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("has no UB"));
}

TEST(DeviceTest, LocalAllocationsAreAlignedToTheProfile) {
  auto device = testing::MakeTestDevice();
  const DeviceProfile& p = device->profile();
  ScriptedKernel kernel(1, [&p](Program& program) -> absl::Status {
    for (const auto& [space, alignment] :
         {std::pair{Space::kL1, p.l1_alignment}, std::pair{Space::kL0C, p.l0c_alignment}}) {
      ASSIGN_OR_RETURN(LocalTensor a, program.Cube(0).Alloc(space, 1, "a"));
      ASSIGN_OR_RETURN(LocalTensor b, program.Cube(0).Alloc(space, 3, "b"));
      EXPECT_EQ(a.offset % alignment, 0);
      EXPECT_EQ(b.offset, alignment) << SpaceName(space);
    }
    ASSIGN_OR_RETURN(LocalTensor u, program.Vector(0, 1).Alloc(Space::kUb, 5, "u"));
    ASSIGN_OR_RETURN(LocalTensor v, program.Vector(0, 1).Alloc(Space::kUb, 5, "v"));
    EXPECT_EQ(v.offset - u.offset, p.ub_alignment);
    return absl::OkStatus();
  });
  EXPECT_TRUE(device->Launch(kernel, ExecutionMode::kExecute).ok());
}

TEST(DeviceTest, GmAccessOutsideItsBufferIsRefusedBeforeAnythingRuns) {
  auto device = testing::MakeTestDevice();
  auto buffer = device->gm().Allocate(1000, true, "lse out");
  ASSERT_TRUE(buffer.ok());
  std::atomic<bool> ran{false};
  ScriptedKernel overrun(1, [&](Program& program) -> absl::Status {
    CoreRecorder& aiv = program.Vector(0, 0);
    aiv.WriteGm(
        GmRegion::Rows(*buffer, 900, 2, 64, 64), AtomicMode::kNone, [&ran] { ran = true; },
        "lse rows");
    return absl::OkStatus();
  });
  auto report = device->Launch(overrun, ExecutionMode::kExecute);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(report.status().message(),
              HasSubstr("overruns GM buffer 'lse out' (1000 B) by 28 B"));
  EXPECT_THAT(report.status().message(), HasSubstr("lse rows"));
  EXPECT_FALSE(ran);

  device->gm().Release(*buffer);  // use after release
  ScriptedKernel stale(1, [&](Program& program) -> absl::Status {
    program.Cube(0).ReadGm(GmRegion::Whole(*buffer), nullptr, "stale read");
    return absl::OkStatus();
  });
  report = device->Launch(stale, ExecutionMode::kModelOnly);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(report.status().message(), HasSubstr("hits no live buffer"));
}

TEST(DeviceTest, AWaitWithoutItsSetIsReportedAsADeadlock) {
  auto device = testing::MakeTestDevice();
  ScriptedKernel kernel(2, [](Program& program) {
    program.Vector(1, 1).CrossCoreWaitFlag(3);  // the AIC of block 1 never sets flag 3
    program.Cube(0).SetFlag(Pipe::kMte2, Pipe::kM, 0);
    program.Cube(0).WaitFlag(Pipe::kMte2, Pipe::kM, 0);
    return absl::OkStatus();
  });
  const auto report = device->Launch(kernel, ExecutionMode::kExecute);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("deadlock"));
  EXPECT_THAT(report.status().message(), HasSubstr("AIV 1.1 waits on cross-core flag 3"));
}

TEST(DeviceTest, ACycleOfCrossCoreWaitsIsReportedAsADeadlockNotAHang) {
  auto device = testing::MakeTestDevice();
  // The AIC waits for the AIVs' flag 1 before setting flag 2; the AIVs wait for flag 2
  // before setting flag 1. Every wait has its set, yet nothing can ever issue.
  ScriptedKernel kernel(1, [](Program& program) {
    CoreRecorder& aic = program.Cube(0);
    aic.CrossCoreWaitFlag(1);
    aic.CrossCoreSetFlag(2, Pipe::kFix);
    for (int s = 0; s < 2; ++s) {
      CoreRecorder& aiv = program.Vector(0, s);
      aiv.CrossCoreWaitFlag(2);
      aiv.CrossCoreSetFlag(1, Pipe::kMte3);
    }
    return absl::OkStatus();
  });
  const auto report = device->Launch(kernel, ExecutionMode::kExecute);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("a cycle in the flag protocol"));
}

TEST(DeviceTest, ASetNobodyWaitsForIsAProtocolViolation) {
  auto device = testing::MakeTestDevice();
  ScriptedKernel kernel(1, [](Program& program) {
    program.Cube(0).SetFlag(Pipe::kM, Pipe::kFix, 2);
    return absl::OkStatus();
  });
  const auto report = device->Launch(kernel, ExecutionMode::kModelOnly);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("flag protocol"));
}

TEST(DeviceTest, ASecondSetBeforeTheFirstIsConsumedIsAProtocolViolation) {
  auto device = testing::MakeTestDevice();
  // M is busy with a long MMAD, so the first wait starts late, long after MTE2 (idle) has
  // fired both sets. The legal pattern has MTE2 wait for M to hand the buffer back first.
  auto kernel = [](bool legal) {
    return ScriptedKernel(1, [legal](Program& program) {
      CoreRecorder& aic = program.Cube(0);
      aic.Mmad(128, 128, 4096, nullptr, "long mmad");
      aic.SetFlag(Pipe::kMte2, Pipe::kM, 0);
      aic.WaitFlag(Pipe::kMte2, Pipe::kM, 0);
      if (legal) {
        aic.SetFlag(Pipe::kM, Pipe::kMte2, 0);
        aic.WaitFlag(Pipe::kM, Pipe::kMte2, 0);
      }
      aic.SetFlag(Pipe::kMte2, Pipe::kM, 0);
      aic.WaitFlag(Pipe::kMte2, Pipe::kM, 0);
      return absl::OkStatus();
    });
  };
  EXPECT_TRUE(device->Launch(kernel(true), ExecutionMode::kModelOnly).ok());
  const auto report = device->Launch(kernel(false), ExecutionMode::kModelOnly);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("while the previous set is still outstanding"));
}

TEST(DeviceTest, ASeventeenthOutstandingCrossCoreSetIsAProtocolViolation) {
  auto device = testing::MakeTestDevice();
  // The AIC first waits for flag 1, which the AIVs set only after a long vector op; by then
  // they have set flag 2 `sets` times.
  auto kernel = [](int sets) {
    return ScriptedKernel(1, [sets](Program& program) {
      CoreRecorder& aic = program.Cube(0);
      aic.CrossCoreWaitFlag(1);
      for (int k = 0; k < sets; ++k) aic.CrossCoreWaitFlag(2);
      for (int s = 0; s < 2; ++s) {
        CoreRecorder& aiv = program.Vector(0, s);
        for (int k = 0; k < sets; ++k) aiv.CrossCoreSetFlag(2, Pipe::kMte3);
        aiv.Vector({{VecClass::kDiv, 1 << 20}}, nullptr, "long vector op");
        aiv.CrossCoreSetFlag(1, Pipe::kV);
      }
      return absl::OkStatus();
    });
  };
  EXPECT_TRUE(device->Launch(kernel(kMaxOutstandingCrossCoreSets), ExecutionMode::kModelOnly).ok());
  const auto report =
      device->Launch(kernel(kMaxOutstandingCrossCoreSets + 1), ExecutionMode::kModelOnly);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("17th outstanding set"));
}

TEST(DeviceTest, BadFlagIdsAndMissingPipesAreRecordingErrors) {
  auto device = testing::MakeTestDevice();
  ScriptedKernel bad_event(1, [](Program& program) {
    program.Cube(0).SetFlag(Pipe::kM, Pipe::kFix, kMaxEventId + 1);
    return absl::OkStatus();
  });
  EXPECT_THAT(device->Launch(bad_event, ExecutionMode::kModelOnly).status().message(),
              HasSubstr("is not a valid event"));
  ScriptedKernel vector_on_cube(1, [](Program& program) {
    program.Cube(0).Vector({{VecClass::kExp, 64}}, nullptr, "exp");
    return absl::OkStatus();
  });
  EXPECT_THAT(device->Launch(vector_on_cube, ExecutionMode::kModelOnly).status().message(),
              HasSubstr("which an AIC does not have"));
}

// Every AIV of the grid atomically adds into the same GM rows, many times, from both host
// threads at once: fp32 adds of small integers (exact in any order) and AMLA's int32
// exponent adds must lose nothing.
TEST(DeviceTest, AtomicAddsIntoSharedRowsAreExact) {
  auto device = testing::MakeTestDevice(/*host_threads=*/2);
  const int blocks = device->profile().cube_cores;
  constexpr int kRows = 64, kAdds = 8;
  auto sum = device->gm().Allocate(kRows * 4, true, "sum");
  auto scaled = device->gm().Allocate(kRows * 4, true, "scaled");
  ASSERT_TRUE(sum.ok() && scaled.ok());
  std::fill_n(sum->as<float>(), kRows, 0.0f);
  std::fill_n(scaled->as<float>(), kRows, 1.0f);
  ScriptedKernel kernel(blocks, [&](Program& program) -> absl::Status {
    for (int b = 0; b < blocks; ++b) {
      for (int s = 0; s < 2; ++s) {
        CoreRecorder& aiv = program.Vector(b, s);
        const float value = static_cast<float>(1 + 2 * b + s);
        for (int k = 0; k < kAdds; ++k) {
          aiv.WriteGm(
              GmRegion::Whole(*sum), AtomicMode::kAddF32,
              [dst = sum->as<float>(), value] {
                for (int r = 0; r < kRows; ++r) dst[r] += value;
              },
              "add");
        }
        // One exponent add of +1 per core: x 2 each.
        aiv.WriteGm(
            GmRegion::Whole(*scaled), AtomicMode::kAddExponentI32,
            [dst = scaled->as<float>()] {
              for (int r = 0; r < kRows; ++r) dst[r] = AddToExponentField(dst[r], int32_t{1} << 23);
            },
            "rescale");
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(device->Launch(kernel, ExecutionMode::kExecute).ok());
  const int cores = 2 * blocks;
  const float expected = static_cast<float>(kAdds * cores * (cores + 1) / 2);
  for (int r = 0; r < kRows; ++r) {
    ASSERT_EQ(sum->as<float>()[r], expected) << r;
    ASSERT_EQ(scaled->as<float>()[r], std::ldexp(1.0f, cores)) << r;
  }
}

LatentDecodeShape PaperShape(int batch, int sq, int sk) {
  return {.heads = 128,
          .sq = sq,
          .seqlens = std::vector<int32_t>(batch, sk),
          .dk = 576,
          .dv = 512,
          .page_size = 128,
          .causal = true};
}

TEST(DeviceTest, ModelledTimeIsDeterministicForAProfileAndShape) {
  const LatentDecodeShape shape = PaperShape(24, 2, 2048);
  std::vector<int64_t> cycles;
  for (int threads : {1, 2, 1}) {
    auto device = testing::MakeTestDevice(threads);
    auto report = ModelLatentDecodeOnDevice(*device, shape);
    ASSERT_TRUE(report.ok()) << report.status();
    cycles.push_back(report->modeled_cycles);
    EXPECT_FALSE(report->host_ms.has_value());  // nothing executed
    EXPECT_GT(report->host_model_ms, 0.0);      // but the model's host time is reported
  }
  EXPECT_GT(cycles[0], 0);
  EXPECT_EQ(cycles[0], cycles[1]);
  EXPECT_EQ(cycles[0], cycles[2]);
}

// The launch head, as the profile's figures define it (Huawei's empty-kernel curve: a fixed
// part and a part per core started, by kernel type, per die), then a core prologue.
TEST(DeviceTest, TheLaunchHeadGrowsWithTheCoresStartedByKernelType) {
  auto die = LoadDeviceProfile("ascend910-die");
  auto dual = LoadDeviceProfile("ascend910");
  ASSERT_TRUE(die.ok() && dual.ok());
  const DeviceProfile& p = *die;
  EXPECT_EQ(LaunchHeadCycles(p, 24, true, true), 4150 + 24 * 778 + 1800);  // MIX: 12.66 us + 1 us
  EXPECT_EQ(LaunchHeadCycles(p, 1, true, true), 4150 + 778 + 1800);        // 2.72 us + 1 us
  EXPECT_EQ(LaunchHeadCycles(p, 24, true, false),
            4150 + 24 * 249 + 1800);  // AIC-only: 5.70 us + 1 us
  EXPECT_EQ(LaunchHeadCycles(p, 24, false, true), 1575 + 48 * 33 + 1800);  // AIV-only, 48 AIVs
  // Two dies start their blocks side by side: 48 blocks cost what 24 cost on one die.
  EXPECT_EQ(LaunchHeadCycles(*dual, 48, true, true), LaunchHeadCycles(p, 24, true, true));
  // And a real launch pays it: an AIV-only kernel of one vector op on each of 2 blocks.
  auto device = testing::MakeTestDevice();
  ScriptedKernel kernel(2, [](Program& program) {
    for (int block = 0; block < 2; ++block) {
      for (int sub = 0; sub < 2; ++sub)
        program.Vector(block, sub).Vector({{VecClass::kUnary, 64}}, {}, "op");
    }
    return absl::OkStatus();
  });
  auto report = device->Launch(kernel, ExecutionMode::kModelOnly);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GE(report->modeled_cycles, LaunchHeadCycles(p, 2, false, true));
  EXPECT_LT(report->modeled_cycles, LaunchHeadCycles(p, 2, false, true) + 200);
}

TEST(DeviceTest, ThePreloadPipelineModelsFasterThanNoPreloadWhenComputeBound) {
  auto device = testing::MakeTestDevice();
  const LatentDecodeShape shape = PaperShape(48, 2, 4096);
  auto serial = ModelLatentDecodeOnDevice(*device, shape, {.preload = 0});
  auto pipelined = ModelLatentDecodeOnDevice(*device, shape, {.preload = 2});
  ASSERT_TRUE(serial.ok() && pipelined.ok());
  EXPECT_LT(pipelined->modeled_us, 0.9 * serial->modeled_us)
      << serial->modeled_us << " us without preload, " << pipelined->modeled_us << " with";
}

TEST(DeviceTest, AmlaModelsFasterThanBaseFlashAttention) {
  auto device = testing::MakeTestDevice();
  const LatentDecodeShape shape = PaperShape(48, 1, 4096);
  auto amla = ModelLatentDecodeOnDevice(*device, shape, {.algorithm = RescaleAlgorithm::kAmla});
  auto base = ModelLatentDecodeOnDevice(*device, shape, {.algorithm = RescaleAlgorithm::kBase});
  ASSERT_TRUE(amla.ok() && base.ok());
  EXPECT_LT(amla->modeled_us, base->modeled_us);
  EXPECT_GT(amla->fu, base->fu);
  // Base moves O through UB every block; AMLA never reads O back.
  EXPECT_GT(base->gm_read_bytes, amla->gm_read_bytes);
}

// A callable that counts its live copies and its calls (through pointers, so copies
// share the counters), padded to a chosen size to land inside a Payload or on the heap.
template <size_t kBytes>
struct Counted {
  int* live;
  int* calls;
  std::array<char, kBytes> padding{};
  Counted(int* l, int* c) : live(l), calls(c) { ++*live; }
  Counted(const Counted& o) : live(o.live), calls(o.calls), padding(o.padding) { ++*live; }
  Counted(Counted&& o) noexcept : live(o.live), calls(o.calls), padding(o.padding) { ++*live; }
  ~Counted() { --*live; }
  void operator()() { ++*calls; }
};

template <size_t kBytes>
void ExpectPayloadBehavesLikeAFunction() {
  int live = 0, calls = 0;
  {
    Payload a = Counted<kBytes>(&live, &calls);
    EXPECT_TRUE(a);
    EXPECT_EQ(live, 1);
    a();
    Payload b = a;  // a copy has its own target
    EXPECT_EQ(live, 2);
    b();
    Payload c = std::move(a);  // a move takes it over
    EXPECT_FALSE(a);
    EXPECT_EQ(live, 2);
    c();
    std::vector<Payload> grown;
    for (int i = 0; i < 40; ++i) grown.push_back(c);  // relocated as the vector grows
    EXPECT_EQ(live, 42);
    for (const Payload& p : grown) p();
    grown.clear();
    EXPECT_EQ(live, 2);
    b = nullptr;
    EXPECT_TRUE(b == nullptr);
    EXPECT_EQ(live, 1);
    c = [&calls] { calls += 100; };  // replacing the target destroys the old one
    EXPECT_EQ(live, 0);
    c();
  }
  EXPECT_EQ(live, 0);
  EXPECT_EQ(calls, 3 + 40 + 100);
}

TEST(PayloadTest, InlineTargetsBehaveLikeStdFunction) {
  static_assert(sizeof(Counted<16>) <= Payload::kInlineBytes);
  ExpectPayloadBehavesLikeAFunction<16>();
}

TEST(PayloadTest, TargetsTooLargeToStoreInlineBehaveLikeStdFunction) {
  static_assert(sizeof(Counted<200>) > Payload::kInlineBytes);
  ExpectPayloadBehavesLikeAFunction<200>();
}

TEST(PayloadTest, EmptyPayloadsAreFalseAndNull) {
  Payload empty;
  EXPECT_FALSE(empty);
  EXPECT_TRUE(empty == nullptr);
  Payload null = nullptr;
  EXPECT_FALSE(null);
  int state = 0;
  const Payload counter = [state, &out = state]() mutable { out = ++state; };  // mutable target
  counter();
  counter();
  EXPECT_EQ(state, 2);
}

TEST(GlobalMemoryTest, AReleasedBuffersHostMemoryServesTheNextAllocationOfItsSize) {
  GlobalMemory gm(1 << 30, 512);
  auto a = gm.Allocate(1 << 20, true, "a");
  ASSERT_TRUE(a.ok());
  std::byte* const host = a->host;
  gm.Release(*a);
  EXPECT_EQ(gm.spare_host_bytes(), 1 << 20);
  auto unbacked = gm.Allocate(1 << 20, false, "addresses only");
  ASSERT_TRUE(unbacked.ok());
  EXPECT_EQ(unbacked->host, nullptr);
  EXPECT_EQ(gm.spare_host_bytes(), 1 << 20);  // not taken by an unbacked buffer
  auto tiny = gm.Allocate(1000, true, "much smaller");
  ASSERT_TRUE(tiny.ok());
  EXPECT_NE(tiny->host, host);  // would waste most of the spare
  auto b = gm.Allocate((1 << 20) - 4096, true, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, host);
  EXPECT_EQ(gm.spare_host_bytes(), 0);
  auto c = gm.Allocate(1 << 20, true, "c");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->host, host);  // b still holds it
}

TEST(GlobalMemoryTest, ReuseNeverHandsOutALiveBuffersMemoryAndKeepsAtMostThePeak) {
  GlobalMemory gm(int64_t{1} << 32, 512);
  std::mt19937_64 rng(7);
  struct Held {
    GmBuffer buffer;
    uint8_t pattern;
  };
  std::vector<Held> live;
  int64_t live_bytes = 0, peak = 0;
  auto intact = [](const Held& h) {
    for (int64_t i = 0; i < h.buffer.bytes; i += 61) {
      if (h.buffer.host[i] != std::byte{h.pattern}) return false;
    }
    return h.buffer.host[h.buffer.bytes - 1] == std::byte{h.pattern};
  };
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      // A handful of recurring sizes and some odd ones, as batches allocate.
      const int64_t sizes[] = {4096, 65536, 200000, 1 << 20};
      const int64_t bytes =
          rng() % 4 == 0 ? static_cast<int64_t>(1 + rng() % 300000) : sizes[rng() % 4];
      auto b = gm.Allocate(bytes, true, "buffer");
      ASSERT_TRUE(b.ok()) << b.status();
      for (const Held& h : live) {
        const bool disjoint =
            b->host + b->bytes <= h.buffer.host || h.buffer.host + h.buffer.bytes <= b->host;
        ASSERT_TRUE(disjoint) << "step " << step
                              << ": a live buffer's host memory handed out again";
      }
      const auto pattern = static_cast<uint8_t>(step);
      std::memset(b->host, pattern, static_cast<size_t>(bytes));
      live.push_back({*b, pattern});
      live_bytes += bytes;
      peak = std::max(peak, live_bytes);
    } else {
      const size_t k = rng() % live.size();
      ASSERT_TRUE(intact(live[k])) << "step " << step << ": a live buffer was overwritten";
      gm.Release(live[k].buffer);
      live_bytes -= live[k].buffer.bytes;
      live[k] = live.back();
      live.pop_back();
    }
    // Reused backings may be up to twice their buffer's size.
    ASSERT_LE(gm.spare_host_bytes(), 2 * peak);
  }
  for (const Held& h : live) EXPECT_TRUE(intact(h));
}

TEST(GlobalMemoryTest, AtomicGuardsOverWrappingStripeRangesExcludeEachOtherWithoutDeadlock) {
  GlobalMemory gm(int64_t{1} << 36, 512);
  // Stripes are 16 KiB of address space, 1024 of them, reused modulo 1024. These ranges share
  // stripe 0 (address 16 MiB); the first three wrap from the last stripes round to the first
  // ones, the last covers every stripe.
  constexpr uint64_t kStripe = 16 << 10, kStripes = 1024;
  std::vector<std::pair<uint64_t, int64_t>> ranges = {{(kStripes - 2) * kStripe, 4 * kStripe},
                                                      {(kStripes - 1) * kStripe + 100, 2 * kStripe},
                                                      {(kStripes - 20) * kStripe, 40 * kStripe},
                                                      {kStripes * kStripe, 64}};
#if !defined(__SANITIZE_THREAD__)  // ThreadSanitizer tracks at most 64 locks held at once
  ranges.push_back({kStripe / 2, (kStripes + 5) * kStripe});
#endif
  std::atomic<int> counter{0};
  constexpr int kRounds = 3000;
  std::vector<std::thread> threads;
  for (const auto& range : ranges) {
    // Named copies: clang 14 (the asan preset) cannot capture structured bindings.
    threads.emplace_back([&gm, &counter, addr = range.first, bytes = range.second] {
      for (int i = 0; i < kRounds; ++i) {
        GlobalMemory::AtomicGuard guard(gm, addr, bytes);
        // A read-modify-write in two steps: only mutual exclusion keeps every increment.
        const int v = counter.load(std::memory_order_relaxed);
        std::this_thread::yield();
        counter.store(v + 1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter.load(), static_cast<int>(ranges.size()) * kRounds);
}

// The L2 model's documented semantics, written as plainly as possible: one hash-map entry
// per line ever touched. The model itself must give the same outcome for every access.
class ReferenceL2 {
 public:
  ReferenceL2(uint64_t capacity, uint64_t line) : capacity_(capacity), line_(line) {}
  L2CacheModel::Outcome Access(const GmRegion& region) {
    L2CacheModel::Outcome outcome;
    for (int64_t r = 0; r < region.rows; ++r) {
      const uint64_t lo = region.addr + static_cast<uint64_t>(r * region.stride);
      const uint64_t hi = lo + static_cast<uint64_t>(region.row_bytes);
      for (uint64_t line = lo / line_; line * line_ < hi; ++line) {
        const uint64_t bytes = std::min(hi, (line + 1) * line_) - std::max(lo, line * line_);
        const auto it = last_touch_.find(line);
        if (it != last_touch_.end() && traffic_ - it->second < capacity_) {
          outcome.hit_bytes += static_cast<int64_t>(bytes);
        } else {
          outcome.fetched_bytes += static_cast<int64_t>(line_);
        }
        last_touch_[line] = traffic_;
        traffic_ += bytes;
      }
    }
    return outcome;
  }

 private:
  uint64_t capacity_, line_;
  uint64_t traffic_ = 0;
  std::unordered_map<uint64_t, uint64_t> last_touch_;
};

TEST(L2CacheModelTest, ReuseDistanceIsCountedInBytesMoved) {
  L2CacheModel l2(/*capacity_bytes=*/1024, /*line_bytes=*/512);
  using HitFetched = std::pair<int64_t, int64_t>;
  auto access = [&](uint64_t addr, int64_t bytes) {
    const L2CacheModel::Outcome o = l2.Access({addr, 1, bytes, bytes});
    return HitFetched{o.hit_bytes, o.fetched_bytes};
  };
  EXPECT_EQ(access(512, 512), HitFetched(0, 512));      // cold
  EXPECT_EQ(access(512, 100), HitFetched(100, 0));      // 512 B since: resident
  EXPECT_EQ(access(600, 1000), HitFetched(424, 1024));  // line 1 hits, lines 2 and 3 miss
  EXPECT_EQ(access(1024, 1), HitFetched(1, 0));         // touched 576 B ago
  EXPECT_EQ(access(1536, 30), HitFetched(30, 0));       // touched 65 B ago
  EXPECT_EQ(access(512, 1), HitFetched(0, 512));        // 1031 B since: evicted
}

TEST(L2CacheModelTest, MatchesTheDocumentedSemanticsOnRandomStreams) {
  std::mt19937_64 rng(20260521);
  for (const uint64_t line : {512ull, 768ull, 4096ull}) {
    for (const uint64_t capacity : {0ull, 4096ull, 96ull << 10, 1ull << 20, 1ull << 40}) {
      L2CacheModel model(static_cast<int64_t>(capacity), static_cast<int64_t>(line));
      ReferenceL2 reference(capacity, line);
      int64_t hits = 0, misses = 0;
      for (int i = 0; i < 3000; ++i) {
        // Regions over 4 MiB (many 64 KiB blocks), unaligned, overlapping or strided rows,
        // now and then empty rows; later accesses revisit earlier ones.
        GmRegion region;
        region.addr = 4096 + rng() % (4 << 20);
        region.rows = static_cast<int64_t>(1 + rng() % 8);
        region.row_bytes = rng() % 16 == 0 ? 0 : static_cast<int64_t>(1 + rng() % 6000);
        switch (rng() % 3) {
          case 0:
            region.stride = region.row_bytes;
            break;
          case 1:
            region.stride = static_cast<int64_t>(rng() % (region.row_bytes + 1));
            break;
          default:
            region.stride = static_cast<int64_t>(rng() % 200000);
        }
        const L2CacheModel::Outcome got = model.Access(region);
        const L2CacheModel::Outcome want = reference.Access(region);
        ASSERT_EQ(got.hit_bytes, want.hit_bytes)
            << "line " << line << " capacity " << capacity << " #" << i;
        ASSERT_EQ(got.fetched_bytes, want.fetched_bytes)
            << "line " << line << " capacity " << capacity << " #" << i;
        hits += got.hit_bytes;
        misses += got.fetched_bytes;
      }
      // The streams exercise both outcomes wherever the capacity allows a hit at all.
      if (capacity > line) {
        EXPECT_GT(hits, 0) << line << " " << capacity;
      }
      EXPECT_GT(misses, 0);
    }
  }
}

// A shipped profile's text, to break one field at a time.
nlohmann::json ShippedProfile() {
  std::ifstream in(std::string(MLASERVE_TEST_PROFILE_DIR) + "/ascend910-die.json");
  return nlohmann::json::parse(in);
}

TEST(DeviceProfileTest, ShippedProfilesLoadWithAnOriginForEveryNumber) {
  for (const char* name : {"ascend910", "ascend910-die"}) {
    auto p = LoadDeviceProfile(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_GT(p->PeakFlops(), 0);
    for (const auto& [key, origin] : p->origins) EXPECT_FALSE(origin.empty()) << key;
  }
  auto dual = LoadDeviceProfile("ascend910");
  auto die = LoadDeviceProfile("ascend910-die");
  EXPECT_EQ(dual->cube_cores, 2 * die->cube_cores);
  EXPECT_DOUBLE_EQ(dual->HbmBytesPerSecond(), 2 * die->HbmBytesPerSecond());
}

TEST(DeviceProfileTest, LoadingValidatesEveryParameter) {
  const nlohmann::json good = ShippedProfile();
  ASSERT_TRUE(ParseDeviceProfile(good.dump()).ok());
  const std::string some_key = good["parameters"].begin().key();
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[&](nlohmann::json& d) { d["parameters"].erase(some_key); }, "is missing"},
      {[&](nlohmann::json& d) { d["parameters"][some_key].erase("origin"); }, "needs an 'origin'"},
      {[&](nlohmann::json& d) { d["parameters"][some_key]["value"] = "fast"; },
       "needs a numeric 'value'"},
      {[](nlohmann::json& d) { d["parameters"]["cube_cores"]["value"] = 0; }, "is outside"},
      {[](nlohmann::json& d) {
         d["parameters"]["warp_size"] = {{"value", 32}, {"origin", "x"}};
       },
       "unknown parameter 'warp_size'"},
      {[](nlohmann::json& d) { d["parameters"]["ub_alignment"]["value"] = 48; }, "powers of two"},
      {[](nlohmann::json& d) { d.erase("name"); }, "'name'"},
  };
  for (const Case& c : cases) {
    nlohmann::json doc = good;
    c.edit(doc);
    const auto parsed = ParseDeviceProfile(doc.dump());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message));
  }
  EXPECT_EQ(ParseDeviceProfile("{ not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDeviceProfile("no-such-npu").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mlaserve::npu
