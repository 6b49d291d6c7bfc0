#include "kernels/npu/host_executor.h"

#include <algorithm>
#include <cstdlib>
#include <span>
#include <string_view>

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer must see the happens-before the *device program* guarantees, not the one
// the executor's queue lock happens to create between unrelated instructions (which would
// hide a missing flag). In TSan builds the workers' use of that lock is made invisible to
// TSan and ordering is published along the program's dependency edges only.
extern "C" void AnnotateIgnoreSyncBegin(const char* file, int line);
extern "C" void AnnotateIgnoreSyncEnd(const char* file, int line);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
// The executor's own bookkeeping (queue, counters), which is correctly locked, is hidden
// from TSan together with its lock.
#define MLASERVE_TSAN_BOOKKEEPING_BEGIN()          \
  do {                                             \
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);  \
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__); \
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);   \
  } while (false)
#define MLASERVE_TSAN_BOOKKEEPING_END()          \
  do {                                           \
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);   \
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__); \
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);  \
  } while (false)
#else
#define MLASERVE_TSAN_BOOKKEEPING_BEGIN()
#define MLASERVE_TSAN_BOOKKEEPING_END()
#endif

namespace mlaserve::npu {
namespace {

#if defined(__SANITIZE_THREAD__)
// For every instruction with host work: the instructions with host work it enables,
// looking through flag instructions (which have none).
std::vector<std::vector<uint32_t>> WorkSuccessors(const Program& program) {
  const auto& ins = program.instructions();
  std::vector<std::vector<uint32_t>> out(ins.size());
  std::vector<uint32_t> stack;
  std::vector<uint32_t> seen(ins.size(), UINT32_MAX);
  for (uint32_t x = 0; x < ins.size(); ++x) {
    if (program.payload(ins[x]) == nullptr) continue;
    stack.assign(1, x);
    while (!stack.empty()) {
      const uint32_t y = stack.back();
      stack.pop_back();
      for (uint32_t e = program.edge_offsets()[y]; e < program.edge_offsets()[y + 1]; ++e) {
        const uint32_t to = program.edges()[e].to;
        if (seen[to] == x) continue;
        seen[to] = x;
        if (program.payload(ins[to]) != nullptr) {
          out[x].push_back(to);
        } else {
          stack.push_back(to);
        }
      }
    }
  }
  return out;
}
#endif

}  // namespace

HostExecutor::HostExecutor(int threads)
    : parallelism_(std::max(threads, 1)),
      waiting_(static_cast<size_t>(parallelism_.load()), 0),
      by_instruction_only_([] {
        const char* forced = std::getenv("MLASERVE_NPU_EXECUTION");
        return forced != nullptr && std::string_view(forced) == "instruction";
      }()) {
  const int n = parallelism_.load();
  for (int i = 0; i < n; ++i) wake_.push_back(std::make_unique<std::condition_variable>());
  for (int i = 0; i < n; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

void HostExecutor::SetParallelism(int n) {
  MLASERVE_TSAN_BOOKKEEPING_BEGIN();
  {
    std::lock_guard<std::mutex> lock(mu_);
    parallelism_.store(std::clamp(n, 1, threads()), std::memory_order_relaxed);
    WakeLocked(static_cast<size_t>(threads()));  // more may run now
  }
  MLASERVE_TSAN_BOOKKEEPING_END();
}

HostExecutor::~HostExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& wake : wake_) wake->notify_all();
  }
  for (std::thread& t : workers_) t.join();
}

void HostExecutor::WakeLocked(size_t n) {
  // Only workers allowed to run are woken: waking one held back costs a context switch for
  // nothing, on every instruction a chain spawns.
  for (int i = 0; i < parallelism_ && n > 0; ++i) {
    if (!waiting_[i]) continue;
    wake_[i]->notify_one();
    --n;
  }
}

void HostExecutor::Start(const Program& program, GlobalMemory& gm) {
#if defined(__SANITIZE_THREAD__)
  tsan_sync_.assign(program.instructions().size(), 0);
  tsan_successors_ = WorkSuccessors(program);
  __tsan_release(&tsan_launch_);  // everything set up so far is visible to the work
#endif
  MLASERVE_TSAN_BOOKKEEPING_BEGIN();
  std::unique_lock<std::mutex> lock(mu_);
  program_ = &program;
  gm_ = &gm;
  const std::vector<uint32_t>& in_degree = program.in_degree();
  if (pending_size_ < in_degree.size()) {
    pending_ = std::make_unique<std::atomic<uint32_t>[]>(in_degree.size());
    pending_size_ = in_degree.size();
  }
  for (size_t i = 0; i < in_degree.size(); ++i) {
    pending_[i].store(in_degree[i], std::memory_order_relaxed);
  }
  remaining_.store(static_cast<int64_t>(in_degree.size()), std::memory_order_relaxed);
  by_core_ = program.core_local() && !by_instruction_only_;
  if (by_core_) {
    const int cores = program.num_cores();
    core_next_.assign(static_cast<size_t>(cores), 0);
    for (int core = cores - 1; core >= 0; --core) {  // ready_ is taken from the back
      if (!program.core_work(core).empty()) {
        ready_.push_back(static_cast<uint32_t>(core));
      } else {
        remaining_.fetch_sub(program.core_instructions(core), std::memory_order_relaxed);
      }
    }
    WakeLocked(ready_.size());
    if (remaining_.load(std::memory_order_relaxed) == 0) done_.notify_all();
    lock.unlock();
    MLASERVE_TSAN_BOOKKEEPING_END();
    return;
  }
  std::vector<uint32_t> roots;
  for (uint32_t i = 0; i < in_degree.size(); ++i) {
    if (in_degree[i] == 0) roots.push_back(i);
  }
  std::vector<uint32_t> stack;
  for (uint32_t i : roots) {  // collected first: completing one releases others
    if (program.payload(program.instructions()[i]) == nullptr) {
      bool all_done = false;
      const int64_t next = Complete(i, stack, ready_, all_done);
      if (next >= 0) ready_.push_back(static_cast<uint32_t>(next));
    } else {
      ready_.push_back(i);
    }
  }
  WakeLocked(ready_.size());
  lock.unlock();
  MLASERVE_TSAN_BOOKKEEPING_END();
}

void HostExecutor::Wait() {
  MLASERVE_TSAN_BOOKKEEPING_BEGIN();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return remaining_.load(std::memory_order_acquire) == 0; });
  program_ = nullptr;
  lock.unlock();
  MLASERVE_TSAN_BOOKKEEPING_END();
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(&tsan_all_done_);  // the caller reads what every instruction wrote
#endif
}

void HostExecutor::Execute(const Program& program, uint32_t id) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(&tsan_launch_);
  __tsan_acquire(&tsan_sync_[id]);
#endif
  const Instruction& ins = program.instructions()[id];
  const Payload* payload = program.payload(ins);
  if (payload == nullptr) return;
#if defined(__SANITIZE_THREAD__)
  struct Publish {
    HostExecutor* self;
    uint32_t id;
    ~Publish() {
      for (uint32_t to : self->tsan_successors_[id]) __tsan_release(&self->tsan_sync_[to]);
      __tsan_release(&self->tsan_all_done_);
    }
  } publish{this, id};
#endif
  if (ins.atomic != AtomicMode::kNone) {
    const GmRegion region{ins.gm_addr, ins.gm_rows, ins.gm_row_bytes, ins.gm_stride};
    GlobalMemory::AtomicGuard guard(*gm_, region.addr, region.span());
    (*payload)();
  } else {
    (*payload)();
  }
}

void HostExecutor::QueueSpawned(std::vector<uint32_t>& spawned) {
  if (spawned.empty()) return;
  std::lock_guard<std::mutex> guard(mu_);
  ready_.insert(ready_.end(), spawned.begin(), spawned.end());
  WakeLocked(spawned.size());
  spawned.clear();
}

bool HostExecutor::RunCore(const Program& program, int core, int index,
                           std::vector<uint32_t>& spawned) {
  const std::span<const uint32_t> work = program.core_work(core);
  size_t& next = core_next_[static_cast<size_t>(core)];
  while (next < work.size()) {
    const uint32_t id = work[next];  // the executor's own arrays: read as bookkeeping
    MLASERVE_TSAN_BOOKKEEPING_END();
    Execute(program, id);
    MLASERVE_TSAN_BOOKKEEPING_BEGIN();
    ++next;
    if (next < work.size() && index >= parallelism_.load(std::memory_order_relaxed)) {
      spawned.push_back(static_cast<uint32_t>(core));  // held back: the rest for the others
      return false;
    }
  }
  const int64_t count = program.core_instructions(core);
  return remaining_.fetch_sub(count, std::memory_order_acq_rel) == count;
}

int64_t HostExecutor::Complete(uint32_t id, std::vector<uint32_t>& stack,
                               std::vector<uint32_t>& spawned, bool& all_done) {
  const auto& offsets = program_->edge_offsets();
  const auto& edges = program_->edges();
  const std::vector<uint8_t>& has_payload = program_->has_payload();
  int64_t next = -1;
  int64_t finished_count = 0;
  stack.push_back(id);
  while (!stack.empty()) {
    const uint32_t finished = stack.back();
    stack.pop_back();
    ++finished_count;
    for (uint32_t e = offsets[finished]; e < offsets[finished + 1]; ++e) {
      const uint32_t to = edges[e].to;
      if (pending_[to].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      if (!has_payload[to]) {
        stack.push_back(to);
      } else if (next < 0) {
        next = to;
      } else {
        spawned.push_back(to);
      }
    }
  }
  all_done = remaining_.fetch_sub(finished_count, std::memory_order_acq_rel) == finished_count;
  return next;
}

void HostExecutor::WorkerLoop(int index) {
  MLASERVE_TSAN_BOOKKEEPING_BEGIN();
  std::vector<uint32_t> stack;
  std::vector<uint32_t> spawned;
  std::unique_lock<std::mutex> lock(mu_);
  // Worker `index` takes work while index < parallelism_: the same workers always (their
  // scratch and caches warm), never one then another.
  while (true) {
    waiting_[index] = 1;
    wake_[index]->wait(lock,
                       [&] { return stopping_ || (!ready_.empty() && index < parallelism_); });
    waiting_[index] = 0;
    if (ready_.empty()) {  // stopping
      lock.unlock();
      MLASERVE_TSAN_BOOKKEEPING_END();
      return;
    }
    if (index >= parallelism_) continue;  // stopping, with work for the others to finish
    int64_t id = ready_.back();
    ready_.pop_back();
    const Program& program = *program_;
    const bool by_core = by_core_;
    lock.unlock();
    bool all_done = false;
    if (by_core) {
      all_done = RunCore(program, static_cast<int>(id), index, spawned);
      id = -1;
      QueueSpawned(spawned);
    }
    while (id >= 0) {  // keep going down a chain without a queue round trip
      MLASERVE_TSAN_BOOKKEEPING_END();
      Execute(program, static_cast<uint32_t>(id));
      MLASERVE_TSAN_BOOKKEEPING_BEGIN();
      id = Complete(static_cast<uint32_t>(id), stack, spawned, all_done);
      if (id >= 0 && index >= parallelism_.load(std::memory_order_relaxed)) {
        // The CPU this worker ran on was taken back (SetParallelism): the rest of its chain
        // goes to the workers still allowed.
        spawned.push_back(static_cast<uint32_t>(id));
        id = -1;
      }
      QueueSpawned(spawned);
    }
    lock.lock();
    // Held back now (the parallelism fell while this chain ran): the work it leaves is for
    // the workers still allowed, who may all be asleep.
    if (index >= parallelism_) WakeLocked(ready_.size());
    if (all_done) done_.notify_all();  // under mu_: Run cannot miss it
  }
}

}  // namespace mlaserve::npu
