#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_SLOT_RING_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_SLOT_RING_H_

#include <vector>

#include "kernels/npu/local_memory.h"
#include "kernels/npu/program.h"

namespace mlaserve::npu {

// A ring of local buffers handed from a producer pipe to a consumer pipe, with the standard
// Ascend C flag protocol (what TQue's EnQue/DeQue insert): each slot has a "ready" event
// (producer -> consumer) and a "free" event (releaser -> producer); all slots start free and
// are drained at the end, so every set is consumed exactly once. The releaser is usually the
// consumer; it differs when a later pipe is the last to use the data (an L1 buffer whose
// tiles the M pipe reads after MTE1 staged them).
class SlotRing {
 public:
  SlotRing(CoreRecorder& core, Pipe producer, Pipe consumer, int first_event,
           std::vector<LocalTensor> slots)
      : SlotRing(core, producer, consumer, consumer, first_event, std::move(slots)) {}

  SlotRing(CoreRecorder& core, Pipe producer, Pipe consumer, Pipe releaser, int first_event,
           std::vector<LocalTensor> slots)
      : core_(core),
        producer_(producer),
        consumer_(consumer),
        releaser_(releaser),
        first_event_(first_event),
        slots_(std::move(slots)) {
    for (int s = 0; s < size(); ++s) core_.SetFlag(releaser_, producer_, event(s));
  }

  int size() const { return static_cast<int>(slots_.size()); }
  const LocalTensor& slot(int s) const { return slots_[s]; }

  // Producer side: wait until the next slot is free, fill it, publish it.
  int Acquire() {
    const int s = next_;
    next_ = (next_ + 1) % size();
    core_.WaitFlag(releaser_, producer_, event(s));
    return s;
  }
  void Publish(int s) { core_.SetFlag(producer_, consumer_, event(s)); }

  // Consumer side: wait for a published slot, use it; the releaser gives it back.
  void Consume(int s) { core_.WaitFlag(producer_, consumer_, event(s)); }
  void Release(int s) { core_.SetFlag(releaser_, producer_, event(s)); }

  // Waits until every slot is free again (end of the program).
  void Drain() {
    for (int s = 0; s < size(); ++s) core_.WaitFlag(releaser_, producer_, event(s));
  }

 private:
  int event(int s) const { return first_event_ + s; }

  CoreRecorder& core_;
  Pipe producer_;
  Pipe consumer_;
  Pipe releaser_;
  int first_event_;
  std::vector<LocalTensor> slots_;
  int next_ = 0;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_SLOT_RING_H_
