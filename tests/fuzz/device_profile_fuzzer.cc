// Device profile JSON (kernels/npu/profiles, or a file an operator passes to --profile).

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"
#include "kernels/npu/device_profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  mlaserve::npu::ParseDeviceProfile(text).IgnoreError();
  return 0;
}
