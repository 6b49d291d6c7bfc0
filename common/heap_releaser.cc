#include "common/heap_releaser.h"

#include <malloc.h>

#include <utility>

namespace mlaserve {

HeapReleaser::HeapReleaser(absl::Duration interval,
                           absl::AnyInvocable<void(absl::Duration)> on_release)
    : interval_(interval), on_release_(std::move(on_release)), thread_([this] { Run(); }) {}

HeapReleaser::~HeapReleaser() {
  stop_.Notify();
  thread_.join();
}

absl::Duration HeapReleaser::ReleaseNow() {
  const absl::Time start = absl::Now();
  malloc_trim(0);
  return absl::Now() - start;
}

void HeapReleaser::Run() {
  while (!stop_.WaitForNotificationWithTimeout(interval_)) {
    const absl::Duration took = ReleaseNow();
    if (on_release_) on_release_(took);
  }
}

}  // namespace mlaserve
