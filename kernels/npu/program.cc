#include "kernels/npu/program.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/core/tiling.h"

namespace mlaserve::npu {
namespace {

int64_t TransferCycles(int64_t bytes, double bytes_per_cycle) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / bytes_per_cycle));
}

void SetRegion(Instruction& ins, const GmRegion& region) {
  ins.gm_bytes = region.bytes();
  ins.gm_addr = region.addr;
  ins.gm_rows = region.rows;
  ins.gm_row_bytes = region.row_bytes;
  ins.gm_stride = region.stride;
}

std::string CoreName(const Program& program, int core) {
  if (core < program.block_dim()) return absl::StrCat("AIC ", core);
  const int v = core - program.block_dim();
  return absl::StrCat("AIV ", v / 2, ".", v % 2);
}

}  // namespace

CoreRecorder::CoreRecorder(Program* program, CoreKind kind, int block, int sub_block, int core_id)
    : program_(program), kind_(kind), block_(block), sub_block_(sub_block), core_id_(core_id) {
  pipe_last_.fill(-1);
  pipe_barrier_.fill(-1);
  const DeviceProfile& p = program->profile();
  // Host storage is indexed by the device-wide core number: AICs first, then AIVs.
  const int storage_core = kind == CoreKind::kCube ? block : p.cube_cores + 2 * block + sub_block;
  auto make = [&](Space space, int64_t capacity, int64_t alignment) {
    std::byte* base =
        program->storage_ == nullptr ? nullptr : program->storage_->Base(storage_core, space);
    arenas_[static_cast<int>(space)].emplace(space, capacity, alignment, base);
  };
  if (kind == CoreKind::kCube) {
    make(Space::kL1, p.l1_bytes, p.l1_alignment);
    make(Space::kL0A, p.l0a_bytes, p.l0ab_alignment);
    make(Space::kL0B, p.l0b_bytes, p.l0ab_alignment);
    make(Space::kL0C, p.l0c_bytes, p.l0c_alignment);
  } else {
    make(Space::kUb, p.ub_bytes, p.ub_alignment);
  }
}

bool CoreRecorder::executes() const { return program_->executes(); }

absl::StatusOr<LocalTensor> CoreRecorder::Alloc(Space space, int64_t bytes,
                                                absl::string_view what) {
  std::optional<LocalArena>& arena = arenas_[static_cast<int>(space)];
  if (!arena) {
    return absl::InvalidArgumentError(
        absl::StrCat(CoreKindName(kind_), " has no ", SpaceName(space), " (buffer '", what, "')"));
  }
  absl::StatusOr<LocalTensor> t = arena->Allocate(bytes, what);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat(CoreName(*program_, core_id_), ": ", t.status().message()));
  }
  return t;
}

bool CoreRecorder::CheckPipe(Pipe pipe, absl::string_view what) {
  if (PipeExistsOn(kind_, pipe)) return true;
  program_->Fail(absl::InvalidArgumentError(absl::StrCat(CoreName(*program_, core_id_), ": ", what,
                                                         " on pipe ", PipeName(pipe), ", which an ",
                                                         CoreKindName(kind_), " does not have")));
  return false;
}

uint32_t CoreRecorder::Record(Pipe pipe, OpKind kind, int64_t cycles, int64_t latency,
                              Payload payload, const char* label) {
  Instruction ins;
  ins.core = core_id_;
  ins.pipe = static_cast<int8_t>(pipe);
  ins.kind = kind;
  ins.vector_core = kind_ == CoreKind::kVector;
  ins.cycles = cycles;
  ins.latency = latency;
  ins.label = label;
  std::vector<Payload>& payloads = program_->b_.payloads;
  if (payload && program_->executes()) {
    ins.payload = static_cast<int32_t>(payloads.size());
    payloads.push_back(std::move(payload));
  }
  std::vector<Instruction>& instructions = program_->b_.instructions;
  const auto id = static_cast<uint32_t>(instructions.size());
  instructions.push_back(ins);
  program_->b_.has_payload.push_back(ins.payload >= 0);
  const int p = static_cast<int>(pipe);
  if (pipe_last_[p] >= 0) program_->AddEdge(static_cast<uint32_t>(pipe_last_[p]), id, false);
  if (last_barrier_ >= 0 && pipe_barrier_[p] != last_barrier_) {
    program_->AddEdge(static_cast<uint32_t>(last_barrier_), id, true);
    pipe_barrier_[p] = last_barrier_;
  }
  pipe_last_[p] = id;
  return id;
}

void CoreRecorder::SetFlag(Pipe src, Pipe dst, int event) {
  if (!CheckPipe(src, "SetFlag") || !CheckPipe(dst, "SetFlag")) return;
  if (event < 0 || event > kMaxEventId || src == dst) {
    program_->Fail(absl::InvalidArgumentError(
        absl::StrCat(CoreName(*program_, core_id_), ": SetFlag ", PipeName(src), "->",
                     PipeName(dst), " event ", event, " is not a valid event")));
    return;
  }
  const uint32_t id = Record(src, OpKind::kSetFlag, 0, program_->profile().flag_latency_cycles,
                             nullptr, "set_flag");
  program_->IntraFlag(core_id_, src, dst, event).sets[0].push_back(id);
}

void CoreRecorder::WaitFlag(Pipe src, Pipe dst, int event) {
  if (!CheckPipe(src, "WaitFlag") || !CheckPipe(dst, "WaitFlag")) return;
  if (event < 0 || event > kMaxEventId || src == dst) {
    program_->Fail(absl::InvalidArgumentError(
        absl::StrCat(CoreName(*program_, core_id_), ": WaitFlag ", PipeName(src), "->",
                     PipeName(dst), " event ", event, " is not a valid event")));
    return;
  }
  const uint32_t id = Record(dst, OpKind::kWaitFlag, 0, 0, nullptr, "wait_flag");
  program_->IntraFlag(core_id_, src, dst, event).waits.push_back(id);
}

void CoreRecorder::CrossCoreSetFlag(int flag, Pipe pipe) {
  if (!CheckPipe(pipe, "CrossCoreSetFlag")) return;
  if (flag < 0 || flag > kMaxCrossCoreFlagId) {
    program_->Fail(absl::InvalidArgumentError(
        absl::StrCat(CoreName(*program_, core_id_), ": cross-core flag id ", flag,
                     " is outside 0..", kMaxCrossCoreFlagId)));
    return;
  }
  const uint32_t id =
      Record(pipe, OpKind::kCrossCoreSet, 0, program_->profile().cross_core_flag_latency_cycles,
             nullptr, "cross_core_set");
  // Each receiver's senders in core order: an AIV hears only its AIC, an AIC its two AIVs.
  if (kind_ == CoreKind::kCube) {
    for (int s = 0; s < 2; ++s) {
      program_->CrossFlag(program_->block_dim_ + 2 * block_ + s, flag).sets[0].push_back(id);
    }
  } else {
    program_->CrossFlag(block_, flag).sets[sub_block_].push_back(id);
  }
}

void CoreRecorder::CrossCoreWaitFlag(int flag) {
  if (flag < 0 || flag > kMaxCrossCoreFlagId) {
    program_->Fail(absl::InvalidArgumentError(
        absl::StrCat(CoreName(*program_, core_id_), ": cross-core flag id ", flag,
                     " is outside 0..", kMaxCrossCoreFlagId)));
    return;
  }
  Instruction ins;
  ins.core = core_id_;
  ins.pipe = kIssueBarrier;
  ins.kind = OpKind::kCrossCoreWait;
  ins.vector_core = kind_ == CoreKind::kVector;
  ins.label = "cross_core_wait";
  std::vector<Instruction>& instructions = program_->b_.instructions;
  const auto id = static_cast<uint32_t>(instructions.size());
  instructions.push_back(ins);
  program_->b_.has_payload.push_back(0);
  if (last_barrier_ >= 0) program_->AddEdge(static_cast<uint32_t>(last_barrier_), id, true);
  last_barrier_ = id;
  program_->CrossFlag(core_id_, flag).waits.push_back(id);
}

void CoreRecorder::ReadGm(const GmRegion& src, Payload payload, const char* label) {
  if (!CheckPipe(Pipe::kMte2, "ReadGm")) return;
  const DeviceProfile& p = program_->profile();
  const double rate =
      kind_ == CoreKind::kCube ? p.cube_mte2_bytes_per_cycle : p.vector_mte2_bytes_per_cycle;
  const uint32_t id = Record(Pipe::kMte2, OpKind::kGmRead, TransferCycles(src.bytes(), rate),
                             p.gm_read_head_cycles, std::move(payload), label);
  SetRegion(program_->b_.instructions[id], src);
}

void CoreRecorder::WriteGm(const GmRegion& dst, AtomicMode atomic, Payload payload,
                           const char* label) {
  const DeviceProfile& p = program_->profile();
  const bool cube = kind_ == CoreKind::kCube;
  const Pipe pipe = cube ? Pipe::kFix : Pipe::kMte3;
  const uint32_t id =
      Record(pipe, OpKind::kGmWrite,
             TransferCycles(dst.bytes(), cube ? p.fix_bytes_per_cycle : p.mte3_bytes_per_cycle),
             cube ? p.fix_head_cycles : p.gm_write_head_cycles, std::move(payload), label);
  Instruction& ins = program_->b_.instructions[id];
  SetRegion(ins, dst);
  ins.atomic = atomic;
}

void CoreRecorder::LoadL0(Space dst, int64_t bytes, Payload payload, const char* label) {
  if (!CheckPipe(Pipe::kMte1, "LoadL0")) return;
  if (dst != Space::kL0A && dst != Space::kL0B) {
    program_->Fail(absl::InvalidArgumentError(
        absl::StrCat(CoreName(*program_, core_id_), ": MTE1 loads only into L0A or L0B")));
    return;
  }
  const DeviceProfile& p = program_->profile();
  const double rate = dst == Space::kL0A ? p.mte1_l0a_bytes_per_cycle : p.mte1_l0b_bytes_per_cycle;
  Record(Pipe::kMte1, OpKind::kLoadL0, TransferCycles(bytes, rate), p.mte1_head_cycles,
         std::move(payload), label);
}

void CoreRecorder::Mmad(int m, int n, int k, Payload payload, const char* label, int fp8_k) {
  if (!CheckPipe(Pipe::kM, "Mmad")) return;
  const DeviceProfile& p = program_->profile();
  if (fp8_k < 0 || fp8_k > k || (fp8_k > 0 && !p.HasFp8Matrix())) {
    program_->Fail(absl::InvalidArgumentError(
        absl::StrCat(CoreName(*program_, core_id_), ": an FP8 MMAD (", fp8_k, " of ", k,
                     " deep) on a part without an FP8 matrix rate")));
    return;
  }
  // One 16x16x16 fractal is 4096 MACs; a part with another MAC rate scales the count. An
  // e4m3 fractal is 16x32x16 (8192 MACs) at the FP8 rate.
  const int64_t tiles = CeilDiv(m, 16) * CeilDiv(n, 16);
  int64_t cycles = CeilDiv(tiles * CeilDiv(k - fp8_k, 16) * 4096, p.cube_macs_per_cycle);
  if (fp8_k > 0) cycles += CeilDiv(tiles * CeilDiv(fp8_k, 32) * 8192, p.cube_fp8_macs_per_cycle);
  Record(Pipe::kM, OpKind::kMmad, cycles, p.mmad_head_cycles, std::move(payload), label);
  program_->CountMmad(m, n, k);
}

void CoreRecorder::Vector(std::initializer_list<VecOp> ops, Payload payload, const char* label) {
  if (!CheckPipe(Pipe::kV, "Vector")) return;
  const DeviceProfile& p = program_->profile();
  int64_t cycles = 0;
  for (const VecOp& op : ops) {
    int64_t per_repeat = 0;
    switch (op.cls) {
      case VecClass::kUnary:
        per_repeat = p.vector_unary_cycles_per_repeat;
        break;
      case VecClass::kBinary:
        per_repeat = p.vector_binary_cycles_per_repeat;
        break;
      case VecClass::kExp:
        per_repeat = p.vector_exp_cycles_per_repeat;
        break;
      case VecClass::kReduce:
        per_repeat = p.vector_reduce_cycles_per_repeat;
        break;
      case VecClass::kDiv:
        per_repeat = p.vector_div_cycles_per_repeat;
        break;
    }
    const int64_t repeats = CeilDiv(op.elements * op.element_bytes, 256);
    cycles += p.vector_head_cycles + repeats * per_repeat;
  }
  Record(Pipe::kV, OpKind::kVector, cycles, 0, std::move(payload), label);
}

void ProgramBuffers::Clear() {
  instructions.clear();
  has_payload.clear();
  payloads.clear();  // the payloads' captures die with the launch, not with the next one
  raw_edges.clear();
  for (FlagTable* table : {&intra, &cross}) {
    for (uint32_t key : table->keys) table->slot[key] = -1;
    for (size_t i = 0; i < table->keys.size(); ++i) {
      FlagQueue& queue = table->queues[i];
      queue.sets[0].clear();
      queue.sets[1].clear();
      queue.waits.clear();
    }
    table->keys.clear();
  }
  edge_offsets.clear();
  edges.clear();
  fill.clear();
  in_degree.clear();
  for (FlagPairs* pairs : {&flag_pairs, &cross_pairs}) {
    pairs->offsets.clear();
    pairs->pairs.clear();
  }
  core_work_offsets.clear();
  core_work.clear();
  core_sizes.clear();
  core_local = false;
}

namespace {

// Keys of the flag tables: dense, and ordered like the tuples they encode.
constexpr int kIntraKeysPerCore = kNumPipes * kNumPipes * (kMaxEventId + 1);
constexpr int kCrossKeysPerCore = kMaxCrossCoreFlagId + 1;

}  // namespace

ProgramBuffers::FlagQueue& ProgramBuffers::FlagTable::Queue(uint32_t key) {
  int32_t& index = slot[key];
  if (index < 0) {
    index = static_cast<int32_t>(keys.size());
    keys.push_back(key);
    if (queues.size() < keys.size()) queues.emplace_back();
  }
  return queues[index];
}

Program::Program(const DeviceProfile& profile, int block_dim, const LocalMemoryStorage* storage,
                 ProgramBuffers* recycled)
    : profile_(profile), block_dim_(block_dim), storage_(storage), recycled_(recycled) {
  if (block_dim <= 0 || block_dim > profile.cube_cores) {
    status_ = absl::InvalidArgumentError(absl::StrCat("block_dim ", block_dim, " is outside 1..",
                                                      profile.cube_cores, " (AIC count of ",
                                                      profile.name, ")"));
    block_dim_ = std::clamp(block_dim, 1, profile.cube_cores);
  }
  if (recycled_ != nullptr) b_ = std::move(*recycled_);  // emptied when it was returned
  const int cores = 3 * block_dim_;
  cores_.reserve(cores);
  for (int b = 0; b < block_dim_; ++b) {
    cores_.push_back(
        std::unique_ptr<CoreRecorder>(new CoreRecorder(this, CoreKind::kCube, b, 0, b)));
  }
  for (int b = 0; b < block_dim_; ++b) {
    for (int s = 0; s < 2; ++s) {
      cores_.push_back(std::unique_ptr<CoreRecorder>(
          new CoreRecorder(this, CoreKind::kVector, b, s, block_dim_ + 2 * b + s)));
    }
  }
  const auto grow = [](std::vector<int32_t>& slot, size_t size) {
    if (slot.size() < size) slot.resize(size, -1);
  };
  grow(b_.intra.slot, static_cast<size_t>(cores) * kIntraKeysPerCore);
  grow(b_.cross.slot, static_cast<size_t>(cores) * kCrossKeysPerCore);
}

Program::~Program() {
  if (recycled_ != nullptr) {
    b_.Clear();
    *recycled_ = std::move(b_);
  }
}

void Program::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

ProgramBuffers::FlagQueue& Program::IntraFlag(int core, Pipe src, Pipe dst, int event) {
  const int key = ((core * kNumPipes + static_cast<int>(src)) * kNumPipes + static_cast<int>(dst)) *
                      (kMaxEventId + 1) +
                  event;
  return b_.intra.Queue(static_cast<uint32_t>(key));
}

ProgramBuffers::FlagQueue& Program::CrossFlag(int receiver, int flag) {
  return b_.cross.Queue(static_cast<uint32_t>(receiver * kCrossKeysPerCore + flag));
}

void Program::CountMmad(int m, int n, int k) {
  auto is = [&](const MmadShape& s) { return s.m == m && s.n == n && s.k == k; };
  if (last_mmad_ < mmad_shapes_.size() && is(mmad_shapes_[last_mmad_])) {
    ++mmad_shapes_[last_mmad_].count;
    return;
  }
  for (size_t i = 0; i < mmad_shapes_.size(); ++i) {
    if (is(mmad_shapes_[i])) {
      ++mmad_shapes_[i].count;
      last_mmad_ = i;
      return;
    }
  }
  last_mmad_ = mmad_shapes_.size();
  mmad_shapes_.push_back({m, n, k, 1});
}

std::map<std::tuple<int, int, int>, int64_t> Program::mmad_shapes() const {
  std::map<std::tuple<int, int, int>, int64_t> shapes;
  for (const MmadShape& s : mmad_shapes_) shapes[{s.m, s.n, s.k}] = s.count;
  return shapes;
}

std::string Program::Describe(uint32_t id) const {
  const Instruction& ins = b_.instructions[id];
  return absl::StrCat(CoreName(*this, ins.core), " ",
                      ins.pipe == kIssueBarrier ? "issue" : PipeName(static_cast<Pipe>(ins.pipe)),
                      " '", ins.label, "' (#", id, ")");
}

absl::Status Program::Finalize() {
  if (!status_.ok()) return status_;
  // Intra-core flags: the k-th wait on (core, src, dst, event) consumes the k-th set. Keys
  // are visited in (core, src, dst, event) order, so errors and edges come in a fixed order.
  ProgramBuffers::FlagTable& intra = b_.intra;
  std::sort(intra.keys.begin(), intra.keys.end());
  auto key_name = [&](uint32_t key) {
    const int event = static_cast<int>(key % (kMaxEventId + 1));
    const int dst = static_cast<int>(key / (kMaxEventId + 1) % kNumPipes);
    const int src = static_cast<int>(key / (kMaxEventId + 1) / kNumPipes % kNumPipes);
    const int core = static_cast<int>(key / kIntraKeysPerCore);
    return absl::StrCat(CoreName(*this, core), " ", PipeName(static_cast<Pipe>(src)), "->",
                        PipeName(static_cast<Pipe>(dst)), " event ", event);
  };
  for (uint32_t key : intra.keys) {
    const ProgramBuffers::FlagQueue& q = intra.queues[intra.slot[key]];
    const size_t sets = q.sets[0].size();
    if (q.waits.size() > sets) {
      return absl::FailedPreconditionError(absl::StrCat(
          "deadlock: ", key_name(key), " is waited for ", q.waits.size(), " times but set only ",
          sets, " times; ", Describe(q.waits[sets]), " would wait forever"));
    }
  }
  FlagPairs& flag_pairs = b_.flag_pairs;
  flag_pairs.offsets.push_back(0);
  for (uint32_t key : intra.keys) {
    const ProgramBuffers::FlagQueue& q = intra.queues[intra.slot[key]];
    const std::vector<uint32_t>& sets = q.sets[0];
    if (sets.empty()) continue;
    if (sets.size() != q.waits.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("flag protocol: ", key_name(key), " is set ", sets.size(),
                       " times but waited for ", q.waits.size(), " times (every set is consumed)"));
    }
    for (size_t k = 0; k < sets.size(); ++k) {
      AddEdge(sets[k], q.waits[k], true);
      flag_pairs.pairs.emplace_back(sets[k], q.waits[k]);
    }
    flag_pairs.offsets.push_back(static_cast<uint32_t>(flag_pairs.pairs.size()));
  }

  // Cross-core counters: an AIV's k-th wait needs its AIC's k-th set; an AIC's k-th wait
  // needs the k-th set of both of its AIVs. Keys in (receiver, flag) order, senders in core
  // order.
  ProgramBuffers::FlagTable& cross = b_.cross;
  std::sort(cross.keys.begin(), cross.keys.end());
  auto senders_of = [&](int receiver) -> std::pair<int, int> {  // first sender, how many
    if (receiver < block_dim_) return {block_dim_ + 2 * receiver, 2};
    return {(receiver - block_dim_) / 2, 1};
  };
  FlagPairs& cross_pairs = b_.cross_pairs;
  cross_pairs.offsets.push_back(0);
  for (uint32_t key : cross.keys) {
    const ProgramBuffers::FlagQueue& q = cross.queues[cross.slot[key]];
    const std::vector<uint32_t>& waits = q.waits;
    if (waits.empty()) continue;
    const int receiver = static_cast<int>(key / kCrossKeysPerCore);
    const int flag = static_cast<int>(key % kCrossKeysPerCore);
    const auto [first_sender, senders] = senders_of(receiver);
    for (int j = 0; j < senders; ++j) {
      const std::vector<uint32_t>& sets = q.sets[j];
      if (sets.size() < waits.size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "deadlock: ", CoreName(*this, receiver), " waits on cross-core flag ", flag, " ",
            waits.size(), " times but ", CoreName(*this, first_sender + j), " sets it only ",
            sets.size(), " times; ", Describe(waits[sets.size()]), " would wait forever"));
      }
      for (size_t k = 0; k < waits.size(); ++k) {
        AddEdge(sets[k], waits[k], true);
        cross_pairs.pairs.emplace_back(sets[k], waits[k]);
      }
      cross_pairs.offsets.push_back(static_cast<uint32_t>(cross_pairs.pairs.size()));
    }
  }
  for (uint32_t key : cross.keys) {
    const ProgramBuffers::FlagQueue& q = cross.queues[cross.slot[key]];
    const int receiver = static_cast<int>(key / kCrossKeysPerCore);
    const int flag = static_cast<int>(key % kCrossKeysPerCore);
    const auto [first_sender, senders] = senders_of(receiver);
    for (int j = 0; j < senders; ++j) {
      const std::vector<uint32_t>& sets = q.sets[j];
      if (!sets.empty() && sets.size() != q.waits.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("flag protocol: ", CoreName(*this, first_sender + j),
                         " sets cross-core flag ", flag, " of ", CoreName(*this, receiver), " ",
                         sets.size(), " times but it is waited for ", q.waits.size(), " times"));
      }
    }
  }

  // Compressed adjacency by source.
  const size_t n = b_.instructions.size();
  std::vector<uint32_t>& offsets = b_.edge_offsets;
  offsets.assign(n + 1, 0);
  b_.in_degree.assign(n, 0);
  for (const ProgramBuffers::RawEdge& e : b_.raw_edges) {
    ++offsets[e.from + 1];
    ++b_.in_degree[e.to];
  }
  for (size_t i = 0; i < n; ++i) offsets[i + 1] += offsets[i];
  b_.edges.resize(b_.raw_edges.size());
  b_.fill.assign(offsets.begin(), offsets.end() - 1);
  for (const ProgramBuffers::RawEdge& e : b_.raw_edges) {
    b_.edges[b_.fill[e.from]++] = Edge{e.to, e.after_completion};
  }
  IndexCoreWork();
  b_.raw_edges.clear();
  return CheckAcyclic();
}

void Program::IndexCoreWork() {
  const std::vector<Instruction>& ins = b_.instructions;
  b_.core_local = true;
  for (const ProgramBuffers::RawEdge& e : b_.raw_edges) {
    if (e.from >= e.to || ins[e.from].core != ins[e.to].core) {
      b_.core_local = false;
      break;
    }
  }
  const size_t cores = cores_.size();
  b_.core_work_offsets.assign(cores + 1, 0);
  b_.core_sizes.assign(cores, 0);
  for (const Instruction& i : ins) {
    ++b_.core_sizes[i.core];
    if (i.payload >= 0) ++b_.core_work_offsets[i.core + 1];
  }
  for (size_t c = 0; c < cores; ++c) b_.core_work_offsets[c + 1] += b_.core_work_offsets[c];
  b_.core_work.resize(b_.core_work_offsets[cores]);
  b_.fill.assign(b_.core_work_offsets.begin(), b_.core_work_offsets.end() - 1);
  for (uint32_t id = 0; id < ins.size(); ++id) {
    if (ins[id].payload >= 0) b_.core_work[b_.fill[ins[id].core]++] = id;
  }
}

// Every instruction must be reachable in a dependency order: a cycle (a wait on a flag set
// only after it) is a deadlock on the device, and would leave the host executor waiting
// forever. Counted as a topological order (Kahn), in Finalize's scratch.
absl::Status Program::CheckAcyclic() {
  std::vector<uint32_t>& pending = b_.fill;
  std::vector<uint32_t>& ready = b_.order;
  pending = b_.in_degree;
  ready.clear();
  for (uint32_t i = 0; i < pending.size(); ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  size_t reached = 0;
  while (!ready.empty()) {
    const uint32_t x = ready.back();
    ready.pop_back();
    ++reached;
    for (uint32_t e = b_.edge_offsets[x]; e < b_.edge_offsets[x + 1]; ++e) {
      if (--pending[b_.edges[e].to] == 0) ready.push_back(b_.edges[e].to);
    }
  }
  const size_t n = b_.instructions.size();
  if (reached == n) return absl::OkStatus();
  for (uint32_t i = 0; i < n; ++i) {
    const OpKind kind = b_.instructions[i].kind;
    if (pending[i] != 0 && (kind == OpKind::kWaitFlag || kind == OpKind::kCrossCoreWait)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "deadlock: ", n - reached, " instructions can never issue; e.g. ", Describe(i),
          " waits on a flag that is only set after it (a cycle in the flag protocol)"));
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("deadlock: ", n - reached, " instructions can never issue"));
}

}  // namespace mlaserve::npu
