#include "common/serving_allocator.h"

#include <malloc.h>

#include <algorithm>
#include <thread>

namespace mlaserve {

int ServingArenaCount() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u));
}

void TuneAllocatorForServing() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  mallopt(M_ARENA_MAX, ServingArenaCount());
}

}  // namespace mlaserve
