#ifndef MLASERVE_TESTS_TESTING_NPU_DEVICE_H_
#define MLASERVE_TESTS_TESTING_NPU_DEVICE_H_

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/npu/device.h"
#include "kernels/npu/device_profile.h"

namespace mlaserve::testing {

// An emulated device of a shipped profile, with host_threads threads running its cores; a
// failure to make one fails the calling test (and returns null).
inline std::unique_ptr<npu::Device> MakeTestDevice(int host_threads = 2,
                                                   const char* profile = "ascend910-die") {
  auto loaded = npu::LoadDeviceProfile(profile);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  auto device = npu::Device::Create(*loaded, {.host_threads = host_threads});
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return nullptr;
  return std::move(*device);
}

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_NPU_DEVICE_H_
