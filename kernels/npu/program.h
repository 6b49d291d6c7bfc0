#ifndef MLASERVE_KERNELS_NPU_PROGRAM_H_
#define MLASERVE_KERNELS_NPU_PROGRAM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/npu/device_profile.h"
#include "kernels/npu/global_memory.h"
#include "kernels/npu/instruction.h"
#include "kernels/npu/local_memory.h"
#include "kernels/npu/pipe.h"

namespace mlaserve::npu {

class Program;

// Host work attached to an instruction; runs when the launch executes for real.
//
// Used like the std::function<void()> it replaced (empty or null, callable, copyable), but a
// callable of up to kInlineBytes lives inside it: a launch records a payload per
// instruction, and std::function put every kernel lambda (they capture 24 to 96 bytes) on
// the heap, to be freed again when the launch ends. Larger callables still go there.
class Payload {
 public:
  static constexpr size_t kInlineBytes = 96;

  Payload() noexcept = default;
  Payload(std::nullptr_t) noexcept {}  // NOLINT: converts like std::function's
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, Payload> &&
           !std::is_same_v<std::remove_cvref_t<F>, std::nullptr_t> &&
           std::is_invocable_v<std::decay_t<F>&> && std::is_copy_constructible_v<std::decay_t<F>>)
      Payload(F&& f) {  // NOLINT: converts like std::function's
    using T = std::decay_t<F>;
    if constexpr (kFitsInline<T>) {
      new (storage_) T(std::forward<F>(f));
    } else {
      *reinterpret_cast<T**>(storage_) = new T(std::forward<F>(f));
    }
    ops_ = &kOps<T>;
  }
  Payload(const Payload& other) : ops_(other.ops_) {
    if (ops_ != nullptr) ops_->copy(other.storage_, storage_);
  }
  Payload(Payload&& other) noexcept : ops_(other.ops_) {
    if (ops_ != nullptr) ops_->relocate(other.storage_, storage_);
    other.ops_ = nullptr;
  }
  Payload& operator=(const Payload& other) {
    if (this != &other) *this = Payload(other);
    return *this;
  }
  Payload& operator=(Payload&& other) noexcept {
    if (this != &other) {
      Reset();
      ops_ = other.ops_;
      if (ops_ != nullptr) ops_->relocate(other.storage_, storage_);
      other.ops_ = nullptr;
    }
    return *this;
  }
  Payload& operator=(std::nullptr_t) noexcept {
    Reset();
    return *this;
  }
  ~Payload() { Reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }
  friend bool operator==(const Payload& payload, std::nullptr_t) noexcept { return !payload; }
  // Like std::function, calls its target as a non-const object.
  void operator()() const { ops_->invoke(storage_); }

 private:
  struct Ops {
    void (*invoke)(void* target);
    void (*copy)(const void* from, void* to);
    void (*relocate)(void* from, void* to) noexcept;  // moves, then destroys the source
    void (*destroy)(void* target) noexcept;
  };
  template <typename T>
  static constexpr bool kFitsInline =
      sizeof(T) <= kInlineBytes &&
      alignof(T) <= alignof(std::max_align_t) && std::is_nothrow_move_constructible_v<T>;
  template <typename T>
  static T& Target(void* storage) {
    if constexpr (kFitsInline<T>) {
      return *std::launder(reinterpret_cast<T*>(storage));
    } else {
      return **reinterpret_cast<T**>(storage);
    }
  }
  template <typename T>
  static constexpr Ops kOps = {
      [](void* target) { Target<T>(target)(); },
      [](const void* from, void* to) {
        const T& source = Target<T>(const_cast<void*>(from));
        if constexpr (kFitsInline<T>) {
          new (to) T(source);
        } else {
          *reinterpret_cast<T**>(to) = new T(source);
        }
      },
      [](void* from, void* to) noexcept {
        if constexpr (kFitsInline<T>) {
          new (to) T(std::move(Target<T>(from)));
          Target<T>(from).~T();
        } else {
          *reinterpret_cast<T**>(to) = *reinterpret_cast<T**>(from);
        }
      },
      [](void* target) noexcept {
        if constexpr (kFitsInline<T>) {
          Target<T>(target).~T();
        } else {
          delete &Target<T>(target);
        }
      },
  };
  void Reset() noexcept {
    if (ops_ != nullptr) ops_->destroy(storage_);
    ops_ = nullptr;
  }

  alignas(std::max_align_t) mutable std::byte storage_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

// Vector instruction classes and their cost (cycles per 256-byte repeat in the profile).
enum class VecClass : uint8_t { kUnary, kBinary, kExp, kReduce, kDiv };

struct VecOp {
  VecClass cls;
  int64_t elements;
  int element_bytes = 4;
};

// Flag ids and limits of the A2/A3 generation.
inline constexpr int kMaxEventId = 7;           // SetFlag/WaitFlag event ids 0..7
inline constexpr int kMaxCrossCoreFlagId = 10;  // CrossCoreSetFlag ids 0..10
inline constexpr int kMaxOutstandingCrossCoreSets = 16;

// Records the instruction stream of one core, the way an Ascend C kernel body issues it.
// Program order here is the core's scalar issue order; each instruction then waits in its
// pipe's in-order queue. Recording never blocks or computes: the timing model and the host
// executor consume the finished Program.
class CoreRecorder {
 public:
  CoreKind kind() const { return kind_; }
  int block() const { return block_; }
  int sub_block() const { return sub_block_; }
  int core_id() const { return core_id_; }
  bool executes() const;

  // Carves a buffer out of this core's local memory (L1/L0A/L0B/L0C on an AIC, UB on an
  // AIV). Fails with the buffer's name when the space is full.
  absl::StatusOr<LocalTensor> Alloc(Space space, int64_t bytes, absl::string_view what);

  // Intra-core synchronisation between two pipes of this core (HardEvent src_dst, id).
  void SetFlag(Pipe src, Pipe dst, int event);
  void WaitFlag(Pipe src, Pipe dst, int event);

  // Mode-2 cross-core flags between an AIC and its two AIVs. An AIC set increments both
  // AIVs' counter `flag`; the AIC's counter increments once both AIVs have set it. The set
  // is issued on `pipe` (fires after that pipe's earlier work); the wait stalls issue.
  void CrossCoreSetFlag(int flag, Pipe pipe);
  void CrossCoreWaitFlag(int flag);

  // MTE2: copy the GM region `src` into local memory.
  void ReadGm(const GmRegion& src, Payload payload, const char* label);
  // FIX (AIC) or MTE3 (AIV): copy into the GM region `dst`, optionally as an atomic add.
  void WriteGm(const GmRegion& dst, AtomicMode atomic, Payload payload, const char* label);
  // MTE1: stage a tile of `bytes` (bf16 on the device) from L1 into L0A or L0B.
  void LoadL0(Space dst, int64_t bytes, Payload payload, const char* label);
  // M: C[m][n] (+)= A[m][k] B[k][n] on the cube, in 16x16x16 fractals; the first `fp8_k` of
  // the k depth are e4m3 operands, multiplied at the FP8 rate in 16x32x16 fractals (only on a
  // part that has one).
  void Mmad(int m, int n, int k, Payload payload, const char* label, int fp8_k = 0);
  // V: a sequence of vector API calls costed together, with one host payload.
  void Vector(std::initializer_list<VecOp> ops, Payload payload, const char* label);

 private:
  friend class Program;
  CoreRecorder(Program* program, CoreKind kind, int block, int sub_block, int core_id);

  uint32_t Record(Pipe pipe, OpKind kind, int64_t cycles, int64_t latency, Payload payload,
                  const char* label);
  bool CheckPipe(Pipe pipe, absl::string_view what);

  Program* program_;
  CoreKind kind_;
  int block_;
  int sub_block_;
  int core_id_;
  std::array<std::optional<LocalArena>, 5> arenas_;  // by Space; empty where the core has none
  int64_t last_barrier_ = -1;
  std::array<int64_t, kNumPipes> pipe_last_{};     // last instruction per pipe, -1 if none
  std::array<int64_t, kNumPipes> pipe_barrier_{};  // barrier already ordered before the pipe
};

// A dependency of the program's graph (CSR by source): the edge either follows its source's
// occupancy (next instruction of the same pipe) or its completion (flags, issue barriers).
struct ProgramEdge {
  uint32_t to;
  bool after_completion;
};

// Matched (set, wait) pairs of flags, grouped by flag (in order of their keys): group g is
// pairs[offsets[g]] .. pairs[offsets[g + 1] - 1], its k-th set with its k-th wait.
struct FlagPairs {
  std::vector<uint32_t> offsets;
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  size_t groups() const { return offsets.empty() ? 0 : offsets.size() - 1; }
};

// The arrays a Program grows while recording and finalizing. A device keeps one set and
// lends it to each launch's Program, which returns it emptied but with its capacity, so a
// launch records into the memory of the previous one instead of growing (and page-faulting)
// fresh arrays.
class ProgramBuffers {
 private:
  friend class Program;
  friend class CoreRecorder;

  // Every set and wait of one flag, in program order.
  struct FlagQueue {
    std::vector<uint32_t> sets[2];  // cross-core: one queue per sender, in core order
    std::vector<uint32_t> waits;
  };
  // Flags by key (dense: intra-core (core, src, dst, event), cross-core (receiver, flag))
  // -> index into the queues, or -1; and the keys in use, to reset them afterwards.
  struct FlagTable {
    FlagQueue& Queue(uint32_t key);  // creates it on first use
    std::vector<int32_t> slot;
    std::vector<uint32_t> keys;
    std::vector<FlagQueue> queues;  // the first keys.size() are in use
  };

  void Clear();

  std::vector<Instruction> instructions;
  std::vector<uint8_t> has_payload;  // per instruction: 1 if it has host work
  std::vector<Payload> payloads;
  struct RawEdge {
    uint32_t from, to;
    bool after_completion;
  };
  std::vector<RawEdge> raw_edges;
  FlagTable intra, cross;
  std::vector<uint32_t> edge_offsets;
  std::vector<ProgramEdge> edges;
  std::vector<uint32_t> fill;   // Finalize's scratch
  std::vector<uint32_t> order;  // Finalize's scratch (the cycle check's ready list)
  std::vector<uint32_t> in_degree;
  FlagPairs flag_pairs, cross_pairs;
  // Per core (CSR), its instructions with host work in program order; and how many
  // instructions each core has in all.
  std::vector<uint32_t> core_work_offsets;
  std::vector<uint32_t> core_work;
  std::vector<uint32_t> core_sizes;
  bool core_local = false;
};

// Everything one kernel launch issues, over `block_dim` groups of one AIC and two AIVs.
class Program {
 public:
  // `storage` gives local buffers their host memory; null means the launch only models time.
  // `recycled`, if given, lends the program its arrays until it is destroyed.
  Program(const DeviceProfile& profile, int block_dim, const LocalMemoryStorage* storage,
          ProgramBuffers* recycled = nullptr);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  const DeviceProfile& profile() const { return profile_; }
  int block_dim() const { return block_dim_; }
  bool executes() const { return storage_ != nullptr; }

  CoreRecorder& Cube(int block) { return *cores_[block]; }
  CoreRecorder& Vector(int block, int sub_block) {
    return *cores_[block_dim_ + 2 * block + sub_block];
  }
  int num_cores() const { return static_cast<int>(cores_.size()); }

  // The first recording error (bad pipe, bad flag id, ...), or OK.
  const absl::Status& status() const { return status_; }

  // Pairs every wait with its set and builds the dependency graph. Unpaired waits, and waits
  // in a cycle, are reported as the deadlock they would be on the device; leftover sets as
  // the protocol violation they are.
  absl::Status Finalize();

  // The finished graph (valid after Finalize).
  const std::vector<Instruction>& instructions() const { return b_.instructions; }
  using Edge = ProgramEdge;
  const std::vector<uint32_t>& edge_offsets() const { return b_.edge_offsets; }  // CSR by source
  const std::vector<Edge>& edges() const { return b_.edges; }
  const std::vector<uint32_t>& in_degree() const { return b_.in_degree; }
  const Payload* payload(const Instruction& ins) const {
    return ins.payload < 0 ? nullptr : &b_.payloads[ins.payload];
  }
  // Per instruction, 1 if it has host work: what the executor asks of every instruction it
  // releases, a byte instead of a read of the whole record.
  const std::vector<uint8_t>& has_payload() const { return b_.has_payload; }
  // Whether no dependency crosses cores and every one points forward in program order: then
  // each core's program order is a valid order for its host work, and the executor may run a
  // core's work as one item (HostExecutor), the cores side by side.
  bool core_local() const { return b_.core_local; }
  // Core `core`'s instructions with host work, in program order, and its instructions in all.
  std::span<const uint32_t> core_work(int core) const {
    return {b_.core_work.data() + b_.core_work_offsets[core],
            b_.core_work_offsets[core + 1] - b_.core_work_offsets[core]};
  }
  uint32_t core_instructions(int core) const { return b_.core_sizes[core]; }
  // Matched (set, wait) pairs of each intra-core flag, for the outstanding-set check.
  const FlagPairs& flag_pairs() const { return b_.flag_pairs; }
  // Matched (set, wait) pairs of each cross-core counter and sender, for the 16-outstanding
  // check.
  const FlagPairs& cross_pairs() const { return b_.cross_pairs; }
  std::string Describe(uint32_t instruction) const;

  // Every (m, n, k) the cube issued, with multiplicity: what a fair host SGEMM baseline runs.
  std::map<std::tuple<int, int, int>, int64_t> mmad_shapes() const;

 private:
  absl::Status CheckAcyclic();  // Finalize's last step
  void IndexCoreWork();         // Finalize's: core_work, core_local
  friend class CoreRecorder;
  void Fail(absl::Status status);
  void AddEdge(uint32_t from, uint32_t to, bool after_completion) {
    b_.raw_edges.push_back({from, to, after_completion});
  }
  // The queue of an intra-core flag key or a cross-core (receiver, flag) key.
  ProgramBuffers::FlagQueue& IntraFlag(int core, Pipe src, Pipe dst, int event);
  ProgramBuffers::FlagQueue& CrossFlag(int receiver, int flag);
  void CountMmad(int m, int n, int k);

  const DeviceProfile& profile_;
  int block_dim_;
  const LocalMemoryStorage* storage_;
  ProgramBuffers* recycled_;
  absl::Status status_;
  std::vector<std::unique_ptr<CoreRecorder>> cores_;
  ProgramBuffers b_;
  // MMAD shapes with multiplicity; a launch issues a handful, so a vector searched from
  // the last one found beats a map.
  struct MmadShape {
    int m, n, k;
    int64_t count;
  };
  std::vector<MmadShape> mmad_shapes_;
  size_t last_mmad_ = 0;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAM_H_
