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
// (docs/performance.md, "Edge"). The cost is memory held, up to 64 MiB per arena, so the
// arenas are bounded too: glibc's default of 8 per core let a soak's RSS climb for as long
// as it ran (+12 % over 25 minutes on 2 cores, with in-use memory flat) as each of 16 arenas
// kept its own freed blocks; one arena per core, 2 to 8, held it flat at no measured cost in
// faults or throughput (docs/performance.md, "Soak").
void TuneAllocatorForServing();

// The arenas TuneAllocatorForServing allows: the logical cores, at least 2 and at most 8.
int ServingArenaCount();

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_SERVING_ALLOCATOR_H_
