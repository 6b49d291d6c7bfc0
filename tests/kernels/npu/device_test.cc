// The emulated device's rules, each checked with a small hand-written kernel: local memory
// capacity and alignment, GM bounds, flag deadlocks and protocol violations, exact atomics,
// deterministic timing; and the two modelling claims of the AMLA paper the emulator must
// reproduce (preload helps, AMLA beats Base). Its machinery has files of its own (payload,
// global_memory, l2_cache_model, device_profile, launch_sequence tests).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/fp32_exponent_add.h"
#include "kernels/npu/device.h"
#include "kernels/npu/programs/latent_decode_on_device.h"
#include "kernels/npu/timing_model.h"
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

// A kernel whose every AIV core runs one vector op that notes how many of its kind are running
// at that moment (and stays a while, so that they meet).
ScriptedKernel CountingKernel(int blocks, std::atomic<int>& running, std::atomic<int>& most) {
  return ScriptedKernel(blocks, [blocks, &running, &most](Program& program) -> absl::Status {
    for (int b = 0; b < blocks; ++b) {
      for (int s = 0; s < 2; ++s) {
        program.Vector(b, s).Vector(
            {{VecClass::kExp, 64}},
            [&running, &most] {
              const int now = running.fetch_add(1) + 1;
              int seen = most.load();
              while (now > seen && !most.compare_exchange_weak(seen, now)) {
              }
              std::this_thread::sleep_for(std::chrono::microseconds(300));
              running.fetch_sub(1);
            },
            "counted");
      }
    }
    return absl::OkStatus();
  });
}

// A device of four host threads held to two runs two instructions at once and no more; let
// go to four, it runs more than two (the instructions sleep, so they meet even on few CPUs).
TEST(DeviceTest, HostParallelismBoundsTheThreadsRunningAtOnce) {
  auto device = testing::MakeTestDevice(/*host_threads=*/4);
  ASSERT_NE(device, nullptr);
  const int blocks = 8;
  for (const int parallelism : {2, 4, 1}) {
    SCOPED_TRACE(::testing::Message() << "parallelism " << parallelism);
    device->SetHostParallelism(parallelism);
    std::atomic<int> running{0}, most{0};
    const ScriptedKernel kernel = CountingKernel(blocks, running, most);
    ASSERT_TRUE(device->Launch(kernel, ExecutionMode::kExecute).ok());
    EXPECT_LE(most.load(), parallelism);
    if (parallelism > 1) {
      EXPECT_GE(most.load(), 2);
    }
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

}  // namespace
}  // namespace mlaserve::npu
