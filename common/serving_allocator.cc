#include "common/serving_allocator.h"

#include <malloc.h>

namespace mlaserve {

void TuneAllocatorForServing() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace mlaserve
