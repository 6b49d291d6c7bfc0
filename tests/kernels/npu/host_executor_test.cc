#include "kernels/npu/host_executor.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/npu/device.h"
#include "kernels/npu/device_profile.h"
#include "kernels/npu/local_memory.h"
#include "kernels/npu/program.h"
#include "tests/testing/npu_device.h"
#include "tests/testing/scripted_kernel.h"

namespace mlaserve::npu {
namespace {

class CoreLocalProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = LoadDeviceProfile("ascend910-die");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    profile_ = *loaded;
    storage_ = std::make_unique<LocalMemoryStorage>(profile_);
  }
  Program MakeProgram(int blocks) { return Program(profile_, blocks, storage_.get()); }

  DeviceProfile profile_;
  std::unique_ptr<LocalMemoryStorage> storage_;
};

// Two pipes of one AIV handing work over by flags, set before wait in program order: every
// dependency stays in the core and points forward, and the core's work is its payloads in
// program order.
TEST_F(CoreLocalProgramTest, FlagsWithinACoreInProgramOrderAreCoreLocal) {
  Program program = MakeProgram(2);
  CoreRecorder& aiv = program.Vector(1, 0);
  aiv.Vector(
      {{VecClass::kExp, 64}}, [] {}, "first");
  aiv.SetFlag(Pipe::kV, Pipe::kMte3, 0);
  aiv.WaitFlag(Pipe::kV, Pipe::kMte3, 0);
  aiv.WriteGm(
      GmRegion{}, AtomicMode::kNone, [] {}, "second");
  aiv.Vector(
      {{VecClass::kExp, 64}}, [] {}, "third");
  ASSERT_TRUE(program.Finalize().ok());
  EXPECT_TRUE(program.core_local());
  const int core = aiv.core_id();
  EXPECT_EQ(program.core_instructions(core), 5u);
  const std::span<const uint32_t> work = program.core_work(core);
  ASSERT_EQ(work.size(), 3u);
  EXPECT_STREQ(program.instructions()[work[0]].label, "first");
  EXPECT_STREQ(program.instructions()[work[1]].label, "second");
  EXPECT_STREQ(program.instructions()[work[2]].label, "third");
  EXPECT_TRUE(program.core_work(0).empty());
}

// An AIC waiting on its AIVs: the cores depend on each other, so the program runs instruction
// by instruction.
TEST_F(CoreLocalProgramTest, CrossCoreFlagsAreNotCoreLocal) {
  Program program = MakeProgram(1);
  for (int s = 0; s < 2; ++s) {
    program.Vector(0, s).Vector(
        {{VecClass::kExp, 64}}, [] {}, "produce");
    program.Vector(0, s).CrossCoreSetFlag(1, Pipe::kV);
  }
  program.Cube(0).CrossCoreWaitFlag(1);
  program.Cube(0).Mmad(
      16, 16, 16, [] {}, "consume");
  ASSERT_TRUE(program.Finalize().ok());
  EXPECT_FALSE(program.core_local());
}

// A wait recorded before its set (legal: the set's pipe runs on while the wait's pipe
// blocks) makes program order no valid order for the core's work.
TEST_F(CoreLocalProgramTest, AWaitBeforeItsSetIsNotCoreLocal) {
  Program program = MakeProgram(1);
  CoreRecorder& aiv = program.Vector(0, 0);
  aiv.WaitFlag(Pipe::kMte2, Pipe::kV, 0);
  aiv.Vector(
      {{VecClass::kExp, 64}}, [] {}, "after the wait");
  aiv.ReadGm(
      GmRegion{}, [] {}, "load");
  aiv.SetFlag(Pipe::kMte2, Pipe::kV, 0);
  ASSERT_TRUE(program.Finalize().ok());
  EXPECT_FALSE(program.core_local());
}

// A core-local program of long cores on a device of two host threads, held to one while they
// run: the core the held-back worker was running goes on where it stopped on the other, and
// every core's payloads run exactly once, in program order.
TEST(HostExecutorTest, ACoreHandedOverWhenItsWorkerIsHeldBackGoesOnWhereItStopped) {
  auto device = testing::MakeTestDevice(/*host_threads=*/2);
  ASSERT_NE(device, nullptr);
  constexpr int kBlocks = 2;
  constexpr int kSteps = 40;
  std::mutex mu;
  std::vector<std::vector<int>> ran(2 * kBlocks);
  std::atomic<int> started{0};
  Device* raw = device.get();
  const testing::ScriptedKernel kernel(kBlocks, [&](Program& program) -> absl::Status {
    for (int b = 0; b < kBlocks; ++b) {
      for (int s = 0; s < 2; ++s) {
        const int core = 2 * b + s;
        for (int step = 0; step < kSteps; ++step) {
          program.Vector(b, s).Vector(
              {{VecClass::kExp, 64}},
              [&, core, step] {
                if (started.fetch_add(1) == kSteps / 2) raw->SetHostParallelism(1);
                std::this_thread::sleep_for(std::chrono::microseconds(100));
                std::lock_guard<std::mutex> lock(mu);
                ran[core].push_back(step);
              },
              "step");
        }
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(device->Launch(kernel, ExecutionMode::kExecute).ok());
  for (int core = 0; core < 2 * kBlocks; ++core) {
    ASSERT_EQ(ran[core].size(), static_cast<size_t>(kSteps)) << "core " << core;
    for (int step = 0; step < kSteps; ++step) EXPECT_EQ(ran[core][step], step) << core;
  }
  device->SetHostParallelism(2);
}

}  // namespace
}  // namespace mlaserve::npu
