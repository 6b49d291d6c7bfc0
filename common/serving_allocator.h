#ifndef MLASERVE_COMMON_SERVING_ALLOCATOR_H_
#define MLASERVE_COMMON_SERVING_ALLOCATOR_H_

namespace mlaserve {

// Tunes glibc's allocator for a process that serves Decode calls; call once at the process
// entry, before any thread starts.
//
// Every Decode allocates and frees its request's tensor bytes (megabytes for a batched call)
// on gRPC's threads. glibc's defaults hand a freed heap top back to the kernel once it passes
// 128 KiB (per thread arena) and map large blocks afresh, so each call page-faulted its
// request in again: about 900 faults for a 72-query call. Keeping up to 64 MiB per arena and
// mapping only blocks above 32 MiB makes the steady state nearly fault-free
// (docs/performance.md, "Edge"). The cost is memory held: at most 64 MiB per arena.
void TuneAllocatorForServing();

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_SERVING_ALLOCATOR_H_
