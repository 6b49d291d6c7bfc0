#ifndef MLASERVE_COMMON_HEAP_RELEASER_H_
#define MLASERVE_COMMON_HEAP_RELEASER_H_

#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace mlaserve {

// Hands the pages of freed memory back to the kernel every `interval`, on a thread of its
// own, with malloc_trim(0).
//
// TuneAllocatorForServing lets each arena keep up to 64 MiB freed at its top so that a
// Decode does not page-fault its request in afresh, and freed blocks inside the heaps stay
// resident whatever the threshold. Over an hour the RSS of a serving process then climbs by
// what fragmentation strands (a soak measured +11.5 % with the in-use bytes flat) before it
// levels off. malloc_trim also returns whole free pages inside the heaps (MADV_DONTNEED), so
// RSS follows the memory in use; the calls after a release fault their pages in once, which
// at one release a minute costs far less than it saves (docs/performance.md, "Soak").
class HeapReleaser {
 public:
  // `on_release` (may be empty) is called after each release with the time it took, from
  // the releaser's thread. Needs interval > 0.
  HeapReleaser(absl::Duration interval, absl::AnyInvocable<void(absl::Duration)> on_release);
  HeapReleaser(const HeapReleaser&) = delete;
  HeapReleaser& operator=(const HeapReleaser&) = delete;
  // Stops the thread; a release under way finishes first.
  ~HeapReleaser();

  // One release now, on the calling thread; returns the time it took.
  static absl::Duration ReleaseNow();

 private:
  void Run();

  const absl::Duration interval_;
  absl::AnyInvocable<void(absl::Duration)> on_release_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_HEAP_RELEASER_H_
