#ifndef MLASERVE_KERNELS_NPU_HOST_EXECUTOR_H_
#define MLASERVE_KERNELS_NPU_HOST_EXECUTOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/npu/global_memory.h"
#include "kernels/npu/program.h"

namespace mlaserve::npu {

// Runs a program's host work for real on a fixed set of host threads, honouring exactly the
// dependencies the device would: each pipe in order, every wait after its set. AIC and AIV
// work of different pipes and cores therefore overlaps on the host as the preload pipeline
// overlaps it on the device, and a program missing a flag shows up as a data race.
//
// std::mutex rather than absl::Mutex: Debian's abseil is not built for ThreadSanitizer, and
// the executor is exactly what the TSan runs must see through.
//
// A program whose dependencies all stay within a core and follow its program order
// (Program::core_local: the projections, the split-KV merge) runs a core's host work as one
// item, in program order, the cores side by side: the same payloads in an order the device
// allows, without the per-instruction hand-offs (a projection's 11,600 instructions, most
// without host work, cost more to release one by one than their arithmetic). Programs whose
// cores wait on each other (the attention's AIC <-> AIV flags) run instruction by instruction.
// MLASERVE_NPU_EXECUTION=instruction runs every program so (to compare the two; a missing
// intra-core flag shows up as a ThreadSanitizer race only there).
class HostExecutor {
 public:
  explicit HostExecutor(int threads);
  ~HostExecutor();
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  // Blocks until every instruction of `program` has run. One Run at a time. The program's
  // dependencies must be acyclic (Device::Launch checks): a cycle never finishes.
  void Run(const Program& program, GlobalMemory& gm) {
    Start(program, gm);
    Wait();
  }
  // Run in two halves, so that the caller's thread, idle while the workers run the program,
  // can do other work meanwhile (the device models the launch's timing there). `program` and
  // `gm` must stay alive until Wait returns; every Start needs its Wait.
  void Start(const Program& program, GlobalMemory& gm);
  void Wait();
  int threads() const { return static_cast<int>(workers_.size()); }
  // From now on at most `n` (1..threads()) workers run instructions at once, also while a
  // program runs (a worker held back stops after its current instruction): a device of a pool
  // runs on its own CPUs, and on those of idle devices that lend it theirs
  // (server/engine/devices/device_pool.h). All of them until first called. Thread-safe.
  void SetParallelism(int n);

 private:
  void WorkerLoop(int index);
  // Runs core `core`'s host work from where it stopped (a core-local program); returns true
  // when that finished the program. A worker held back meanwhile leaves the rest of the core
  // in `spawned` instead.
  bool RunCore(const Program& program, int core, int index, std::vector<uint32_t>& spawned);
  // Wakes up to `n` sleeping workers among those allowed to run (under mu_).
  void WakeLocked(size_t n);
  // Work a worker enabled or handed back, onto the queue for the others (takes mu_); empties
  // `spawned`.
  void QueueSpawned(std::vector<uint32_t>& spawned);
  void Execute(const Program& program, uint32_t id);
  // Marks `id` done and releases its successors. Successors without host work (flags, waits)
  // are completed on the spot; the first one with work is returned for the caller to run
  // next, the others are appended to `spawned` for the caller to queue. Returns -1 when there
  // is nothing to continue with; sets `all_done` when this completed the program's last
  // instruction. Takes no lock: a chain of instructions (most of a program: each pipe's
  // stream) runs from one worker without touching mu_, which one batch's 10,000s of
  // sub-microsecond instructions otherwise queue on (measured: 8 threads ran a 72-query
  // batch only 2.1x faster than one).
  int64_t Complete(uint32_t id, std::vector<uint32_t>& stack, std::vector<uint32_t>& spawned,
                   bool& all_done);

  std::mutex mu_;
  // Each worker's own wake-up (ready_ gained an entry it may take, or stopping_), so that
  // work wakes only workers allowed to run it.
  std::vector<std::unique_ptr<std::condition_variable>> wake_;
  std::condition_variable done_;  // remaining_ reached zero
  // Guarded by mu_:
  // Last in, first out: the work enabled most recently reads what its predecessor just
  // wrote, still in the host's caches; first-in-first-out interleaves all the cores'
  // working sets (about 1 MiB each) and was measured ~15 % slower at 16 busy cores.
  std::vector<uint32_t> ready_;
  // Workers [0, parallelism_) may run; written under mu_ (by the constructor and
  // SetParallelism), also read without it by a worker in the middle of a chain, after each
  // instruction: a stale value only ends the chain an instruction late or early.
  std::atomic<int> parallelism_;
  std::vector<char> waiting_;  // per worker: asleep on its wake_
  const Program* program_ = nullptr;
  // This program runs a core at a time: ready_ holds cores, core_next_ how far each got (read
  // and written only by the worker holding the core, handed over under mu_).
  bool by_core_ = false;
  const bool by_instruction_only_;
  std::vector<size_t> core_next_;
  GlobalMemory* gm_ = nullptr;
  bool stopping_ = false;
  // Set by Run before any instruction is queued, then counted down by the workers without a
  // lock: the decrement that reaches zero owns the instruction (acquire-release, so it sees
  // everything its predecessors wrote).
  std::unique_ptr<std::atomic<uint32_t>[]> pending_;  // unfinished predecessors per instruction
  size_t pending_size_ = 0;
  std::atomic<int64_t> remaining_{0};  // instructions not yet completed
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer's view: one sync object per instruction, released by every instruction
  // with host work that enables it (see host_executor.cc).
  std::vector<char> tsan_sync_;
  std::vector<std::vector<uint32_t>> tsan_successors_;
  char tsan_all_done_ = 0;
  char tsan_launch_ = 0;
#endif

  std::vector<std::thread> workers_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_HOST_EXECUTOR_H_
