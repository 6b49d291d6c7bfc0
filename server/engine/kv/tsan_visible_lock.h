#ifndef MLASERVE_SERVER_ENGINE_KV_TSAN_VISIBLE_LOCK_H_
#define MLASERVE_SERVER_ENGINE_KV_TSAN_VISIBLE_LOCK_H_

#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace mlaserve::engine {

// absl::Mutex as ThreadSanitizer must be told about it.
//
// Debian builds abseil without -fsanitize=thread, so its Mutex carries no TSan annotations:
// TSan cannot see the ordering a lock provides and reports every access it guards as a race.
// Code that must stay checkable under TSan locks through these two helpers instead of
// absl::MutexLock and CondVar::Wait. In TSan builds they add what the lock means (a release
// when it is let go, an acquire when it is taken); otherwise they are the plain calls.

inline void TsanAcquire([[maybe_unused]] absl::Mutex* mu) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_acquire(mu);
#endif
}

inline void TsanRelease([[maybe_unused]] absl::Mutex* mu) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_release(mu);
#endif
}

// absl::MutexLock, visible to TSan.
class ABSL_SCOPED_LOCKABLE TsanVisibleLock {
 public:
  explicit TsanVisibleLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
    TsanAcquire(mu_);
  }
  TsanVisibleLock(const TsanVisibleLock&) = delete;
  TsanVisibleLock& operator=(const TsanVisibleLock&) = delete;
  ~TsanVisibleLock() ABSL_UNLOCK_FUNCTION() {
    TsanRelease(mu_);
    mu_->Unlock();
  }

 private:
  absl::Mutex* const mu_;
};

// cv.Wait(mu), visible to TSan: the wait lets the lock go and takes it again.
inline void TsanVisibleWait(absl::CondVar& cv, absl::Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  TsanRelease(mu);
  cv.Wait(mu);
  TsanAcquire(mu);
}

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_TSAN_VISIBLE_LOCK_H_
