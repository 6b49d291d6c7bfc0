#ifndef MLASERVE_SERVER_ENGINE_KV_ANONYMOUS_MAPPING_H_
#define MLASERVE_SERVER_ENGINE_KV_ANONYMOUS_MAPPING_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace mlaserve::engine {

// Private anonymous memory from mmap: zero-filled, backed by RAM only once written, and
// returned to the kernel when the mapping goes. Used for the two large arrays of the engine,
// where std::vector's value-initialisation would touch every byte once more than needed.
class AnonymousMapping {
 public:
  enum class Use {
    // Sized by a budget and possibly mostly untouched (the KV page pool): no swap
    // reservation (MAP_NORESERVE), small pages so RAM follows what is written.
    kSparse,
    // Written in full right away (weights): transparent huge pages, which cut the page
    // faults of filling 2 GiB by about 3x on this machine.
    kDense,
  };

  // RESOURCE_EXHAUSTED if the kernel refuses the mapping.
  static absl::StatusOr<AnonymousMapping> Create(std::size_t bytes, Use use);

  AnonymousMapping() = default;
  AnonymousMapping(AnonymousMapping&& other) noexcept;
  AnonymousMapping& operator=(AnonymousMapping&& other) noexcept;
  AnonymousMapping(const AnonymousMapping&) = delete;
  AnonymousMapping& operator=(const AnonymousMapping&) = delete;
  ~AnonymousMapping();

  void* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_ANONYMOUS_MAPPING_H_
