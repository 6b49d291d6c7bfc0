#include "common/heap_usage.h"

#include <malloc.h>

// A sanitizer replaces malloc; glibc's mallinfo2 then describes arenas nobody uses.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MLASERVE_SANITIZER_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MLASERVE_SANITIZER_MALLOC 1
#endif
#endif

namespace mlaserve {

std::optional<HeapUsage> ReadHeapUsage() {
#ifdef MLASERVE_SANITIZER_MALLOC
  return std::nullopt;
#else
  const struct mallinfo2 info = mallinfo2();
  HeapUsage usage;
  // uordblks: in use in the arenas; hblkhd: blocks mapped on their own (above the mmap
  // threshold), in use until freed.
  usage.in_use_bytes = static_cast<double>(info.uordblks + info.hblkhd);
  usage.free_bytes = static_cast<double>(info.fordblks);
  return usage;
#endif
}

}  // namespace mlaserve
