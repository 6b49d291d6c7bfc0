#ifndef MLASERVE_KERNELS_GPU_UPLOAD_WRITER_H_
#define MLASERVE_KERNELS_GPU_UPLOAD_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/gpu/gpu_jobs.h"

namespace mlaserve::gpu {

// A program's upload as it is written: sizes only when counting (no host memory), the bytes
// too when emitting. Addresses are those of the upload's copy on the device, so one pass of
// the same code sizes a program and another writes it.
class UploadWriter {
 public:
  UploadWriter(std::byte* host, DevicePtr device) : host_(host), device_(device) {}

  int64_t size() const { return size_; }

  // Room for `bytes` at `alignment`: its device address, and where to write it on the host
  // (null when counting).
  std::pair<DevicePtr, std::byte*> Reserve(int64_t bytes, int64_t alignment = 16) {
    size_ = (size_ + alignment - 1) / alignment * alignment;
    const int64_t at = size_;
    size_ += bytes;
    return {device_ + static_cast<DevicePtr>(at), host_ == nullptr ? nullptr : host_ + at};
  }
  DevicePtr Put(const void* data, int64_t bytes, int64_t alignment = 16) {
    auto [device, host] = Reserve(bytes, alignment);
    if (host != nullptr && bytes > 0) std::memcpy(host, data, static_cast<size_t>(bytes));
    return device;
  }
  template <typename T>
  DevicePtr PutArray(const std::vector<T>& items) {
    return Put(items.data(), static_cast<int64_t>(items.size() * sizeof(T)));
  }

 private:
  std::byte* host_;
  DevicePtr device_;
  int64_t size_ = 0;
};

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_UPLOAD_WRITER_H_
