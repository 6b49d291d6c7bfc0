#include "server/engine/kv/anonymous_mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mlaserve::engine {

absl::StatusOr<AnonymousMapping> AnonymousMapping::Create(std::size_t bytes, Use use) {
  AnonymousMapping mapping;
  if (bytes == 0) return mapping;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (use == Use::kSparse ? MAP_NORESERVE : 0);
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  // Only advice: where THP is off the mapping works the same with small pages.
  if (use == Use::kDense) ::madvise(data, bytes, MADV_HUGEPAGE);
  mapping.data_ = data;
  mapping.size_ = bytes;
  return mapping;
}

AnonymousMapping::AnonymousMapping(AnonymousMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AnonymousMapping& AnonymousMapping::operator=(AnonymousMapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AnonymousMapping::~AnonymousMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace mlaserve::engine
