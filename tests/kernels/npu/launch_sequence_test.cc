#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/npu/device.h"
#include "tests/testing/npu_device.h"
#include "tests/testing/scripted_kernel.h"

namespace mlaserve::npu {
namespace {

using ::testing::HasSubstr;
using testing::ScriptedKernel;

// Waits up to 10 s for `flag`; whether it came.
bool AwaitFor(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!flag.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return flag.load();
}

// The next launch is recorded while one runs, and still runs after it: the first launch's
// work waits (bounded) for the second's recording, which a recording after the run would
// never let happen; the second's work sees the first's finished.
TEST(LaunchSequenceTest, RecordsTheNextLaunchWhileOneRunsAndRunsThemInOrder) {
  auto device = mlaserve::testing::MakeTestDevice(1);
  std::atomic<bool> second_recorded{false}, first_done{false};
  bool first_saw_second_recorded = false, second_saw_first_done = false;
  ScriptedKernel first(
      1,
      [&](Program& program) {
        program.Cube(0).Mmad(
            16, 16, 16,
            [&] {
              first_saw_second_recorded = AwaitFor(second_recorded);
              first_done = true;
            },
            "first");
        return absl::OkStatus();
      },
      "first");
  ScriptedKernel second(
      1,
      [&](Program& program) {
        program.Cube(0).Mmad(
            16, 16, 16, [&] { second_saw_first_done = first_done.load(); }, "second");
        second_recorded = true;
        return absl::OkStatus();
      },
      "second");
  const DeviceKernel* const kernels[] = {&first, &second};
  auto reports = device->LaunchSequence(kernels, ExecutionMode::kExecute);
  ASSERT_TRUE(reports.ok()) << reports.status();
  EXPECT_TRUE(first_saw_second_recorded);
  EXPECT_TRUE(second_saw_first_done);
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].kernel, "first");
  EXPECT_EQ((*reports)[1].kernel, "second");
  for (const LaunchReport& r : *reports) {
    EXPECT_GT(r.modeled_us, 0);
    EXPECT_TRUE(r.host_ms.has_value());
  }
}

// A launch whose recording fails fails the sequence once the launch in flight has finished;
// nothing after it is recorded or run.
TEST(LaunchSequenceTest, ARecordingErrorEndsTheSequenceAfterTheLaunchInFlight) {
  auto device = mlaserve::testing::MakeTestDevice(2);
  std::atomic<bool> first_ran{false}, third_recorded{false};
  ScriptedKernel first(1, [&](Program& program) {
    program.Cube(0).Mmad(
        16, 16, 16, [&] { first_ran = true; }, "first");
    return absl::OkStatus();
  });
  const int64_t ub = device->profile().ub_bytes;
  ScriptedKernel broken(1, [ub](Program& program) {
    return program.Vector(0, 0).Alloc(Space::kUb, ub + 1, "oversized tile").status();
  });
  ScriptedKernel third(1, [&](Program&) {
    third_recorded = true;
    return absl::OkStatus();
  });
  const DeviceKernel* const kernels[] = {&first, &broken, &third};
  auto reports = device->LaunchSequence(kernels, ExecutionMode::kExecute);
  EXPECT_EQ(reports.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reports.status().message()), HasSubstr("oversized tile"));
  EXPECT_TRUE(first_ran);
  EXPECT_FALSE(third_recorded);
  // The device is whole afterwards: the sequence's buffers went back for the next launch.
  EXPECT_TRUE(device->Launch(first, ExecutionMode::kExecute).ok());
}

}  // namespace
}  // namespace mlaserve::npu
