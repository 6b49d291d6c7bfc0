#ifndef MLASERVE_TESTS_FUZZ_MEMORY_FILE_H_
#define MLASERVE_TESTS_FUZZ_MEMORY_FILE_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mlaserve::fuzz {

// An input as a file for readers that take a path (safetensors, flag files): an anonymous
// memory file (memfd), named /proc/self/fd/N, gone when the object goes. Nothing touches the
// disk, and no file is left behind.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(memfd_create("fuzz-input", MFD_CLOEXEC)) {
    size_t written = 0;
    while (fd_ >= 0 && written < size) {
      const ssize_t n = write(fd_, data + written, size - written);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
  }
  ~MemoryFile() {
    if (fd_ >= 0) close(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace mlaserve::fuzz

#endif  // MLASERVE_TESTS_FUZZ_MEMORY_FILE_H_
