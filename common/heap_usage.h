#ifndef MLASERVE_COMMON_HEAP_USAGE_H_
#define MLASERVE_COMMON_HEAP_USAGE_H_

#include <optional>

namespace mlaserve {

// glibc's allocator as mallinfo2() reports it, over every arena. RSS alone cannot tell a leak
// from memory the allocator keeps for reuse; these two can: a leak grows `in_use_bytes`,
// retention grows `free_bytes` with in-use flat.
struct HeapUsage {
  double in_use_bytes = 0;  // handed out by malloc and not yet freed (mmapped blocks included)
  double free_bytes = 0;    // freed but kept by the arenas (resident or not)
};

// The allocator's current usage; nullopt where mallinfo2 is not glibc's (a sanitizer's
// allocator serves malloc then, and glibc's arenas hold almost nothing). Takes every arena's
// lock in turn: for a scrape, not for a hot path.
std::optional<HeapUsage> ReadHeapUsage();

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_HEAP_USAGE_H_
