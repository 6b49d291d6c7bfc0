#include "kernels/npu/program.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace mlaserve::npu {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
  const int storage_core =
      kind == CoreKind::kCube ? block : p.cube_cores + 2 * block + sub_block;
  auto make = [&](Space space, int64_t capacity, int64_t alignment) {
    std::byte* base = program->storage_ == nullptr ? nullptr
                                                   : program->storage_->Base(storage_core, space);
    owned_arenas_.push_back(std::make_unique<LocalArena>(space, capacity, alignment, base));
    arenas_[static_cast<int>(space)] = owned_arenas_.back().get();
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

absl::StatusOr<LocalTensor> CoreRecorder::Alloc(Space space, int64_t bytes, absl::string_view what) {
  LocalArena* arena = arenas_[static_cast<int>(space)];
  if (arena == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(CoreKindName(kind_), " has no ",
                                                   SpaceName(space), " (buffer '", what, "')"));
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
                                                         " on pipe ", PipeName(pipe),
                                                         ", which an ", CoreKindName(kind_),
                                                         " does not have")));
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
  if (payload && program_->executes()) {
    ins.payload = static_cast<int32_t>(program_->payloads_.size());
    program_->payloads_.push_back(std::move(payload));
  }
  const auto id = static_cast<uint32_t>(program_->instructions_.size());
  program_->instructions_.push_back(ins);
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
  program_->intra_sets_[{core_id_, static_cast<int>(src), static_cast<int>(dst), event}].push_back(id);
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
  program_->intra_waits_[{core_id_, static_cast<int>(src), static_cast<int>(dst), event}].push_back(id);
}

void CoreRecorder::CrossCoreSetFlag(int flag, Pipe pipe) {
  if (!CheckPipe(pipe, "CrossCoreSetFlag")) return;
  if (flag < 0 || flag > kMaxCrossCoreFlagId) {
    program_->Fail(absl::InvalidArgumentError(absl::StrCat(
        CoreName(*program_, core_id_), ": cross-core flag id ", flag, " is outside 0..",
        kMaxCrossCoreFlagId)));
    return;
  }
  const uint32_t id = Record(pipe, OpKind::kCrossCoreSet, 0,
                             program_->profile().cross_core_flag_latency_cycles, nullptr,
                             "cross_core_set");
  if (kind_ == CoreKind::kCube) {
    for (int s = 0; s < 2; ++s) {
      program_->cross_sets_[{program_->block_dim_ + 2 * block_ + s, flag, core_id_}].push_back(id);
    }
  } else {
    program_->cross_sets_[{block_, flag, core_id_}].push_back(id);
  }
}

void CoreRecorder::CrossCoreWaitFlag(int flag) {
  if (flag < 0 || flag > kMaxCrossCoreFlagId) {
    program_->Fail(absl::InvalidArgumentError(absl::StrCat(
        CoreName(*program_, core_id_), ": cross-core flag id ", flag, " is outside 0..",
        kMaxCrossCoreFlagId)));
    return;
  }
  Instruction ins;
  ins.core = core_id_;
  ins.pipe = kIssueBarrier;
  ins.kind = OpKind::kCrossCoreWait;
  ins.vector_core = kind_ == CoreKind::kVector;
  ins.label = "cross_core_wait";
  const auto id = static_cast<uint32_t>(program_->instructions_.size());
  program_->instructions_.push_back(ins);
  if (last_barrier_ >= 0) program_->AddEdge(static_cast<uint32_t>(last_barrier_), id, true);
  last_barrier_ = id;
  program_->cross_waits_[{core_id_, flag}].push_back(id);
}

void CoreRecorder::ReadGm(const GmRegion& src, Payload payload, const char* label) {
  if (!CheckPipe(Pipe::kMte2, "ReadGm")) return;
  const DeviceProfile& p = program_->profile();
  const double rate = kind_ == CoreKind::kCube ? p.cube_mte2_bytes_per_cycle : p.vector_mte2_bytes_per_cycle;
  const uint32_t id = Record(Pipe::kMte2, OpKind::kGmRead, TransferCycles(src.bytes(), rate),
                             p.gm_read_head_cycles, std::move(payload), label);
  SetRegion(program_->instructions_[id], src);
}

void CoreRecorder::WriteGm(const GmRegion& dst, AtomicMode atomic, Payload payload, const char* label) {
  const DeviceProfile& p = program_->profile();
  const bool cube = kind_ == CoreKind::kCube;
  const Pipe pipe = cube ? Pipe::kFix : Pipe::kMte3;
  const uint32_t id =
      Record(pipe, OpKind::kGmWrite,
             TransferCycles(dst.bytes(), cube ? p.fix_bytes_per_cycle : p.mte3_bytes_per_cycle),
             cube ? p.fix_head_cycles : p.gm_write_head_cycles, std::move(payload), label);
  SetRegion(program_->instructions_[id], dst);
  program_->instructions_[id].atomic = atomic;
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

void CoreRecorder::Mmad(int m, int n, int k, Payload payload, const char* label) {
  if (!CheckPipe(Pipe::kM, "Mmad")) return;
  const DeviceProfile& p = program_->profile();
  // One 16x16x16 fractal is 4096 MACs; a part with another MAC rate scales the count.
  const int64_t fractals = CeilDiv(m, 16) * CeilDiv(n, 16) * CeilDiv(k, 16);
  const int64_t cycles = CeilDiv(fractals * 4096, p.cube_macs_per_cycle);
  Record(Pipe::kM, OpKind::kMmad, cycles, p.mmad_head_cycles, std::move(payload), label);
  ++program_->mmad_shapes_[{m, n, k}];
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

Program::Program(const DeviceProfile& profile, int block_dim, const LocalMemoryStorage* storage)
    : profile_(profile), block_dim_(block_dim), storage_(storage) {
  if (block_dim <= 0 || block_dim > profile.cube_cores) {
    status_ = absl::InvalidArgumentError(absl::StrCat("block_dim ", block_dim, " is outside 1..",
                                                      profile.cube_cores, " (AIC count of ",
                                                      profile.name, ")"));
    block_dim_ = std::clamp(block_dim, 1, profile.cube_cores);
  }
  for (int b = 0; b < block_dim_; ++b) {
    cores_.push_back(std::unique_ptr<CoreRecorder>(new CoreRecorder(this, CoreKind::kCube, b, 0, b)));
  }
  for (int b = 0; b < block_dim_; ++b) {
    for (int s = 0; s < 2; ++s) {
      cores_.push_back(std::unique_ptr<CoreRecorder>(
          new CoreRecorder(this, CoreKind::kVector, b, s, block_dim_ + 2 * b + s)));
    }
  }
}

void Program::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

void Program::AddEdge(uint32_t from, uint32_t to, bool after_completion) {
  raw_edges_.emplace_back(from, to, after_completion);
}

std::string Program::Describe(uint32_t id) const {
  const Instruction& ins = instructions_[id];
  return absl::StrCat(CoreName(*this, ins.core), " ",
                      ins.pipe == kIssueBarrier ? "issue" : PipeName(static_cast<Pipe>(ins.pipe)),
                      " '", ins.label, "' (#", id, ")");
}

absl::Status Program::Finalize() {
  if (!status_.ok()) return status_;
  // Intra-core flags: the k-th wait on (core, src, dst, event) consumes the k-th set.
  auto key_name = [&](const std::tuple<int, int, int, int>& key) {
    return absl::StrCat(CoreName(*this, std::get<0>(key)), " ",
                        PipeName(static_cast<Pipe>(std::get<1>(key))), "->",
                        PipeName(static_cast<Pipe>(std::get<2>(key))), " event ", std::get<3>(key));
  };
  for (const auto& [key, waits] : intra_waits_) {
    const auto sets_it = intra_sets_.find(key);
    const size_t sets = sets_it == intra_sets_.end() ? 0 : sets_it->second.size();
    if (waits.size() > sets) {
      return absl::FailedPreconditionError(absl::StrCat(
          "deadlock: ", key_name(key), " is waited for ", waits.size(), " times but set only ",
          sets, " times; ", Describe(waits[sets]), " would wait forever"));
    }
  }
  for (const auto& [key, sets] : intra_sets_) {
    const auto waits_it = intra_waits_.find(key);
    const size_t waits = waits_it == intra_waits_.end() ? 0 : waits_it->second.size();
    if (sets.size() != waits) {
      return absl::FailedPreconditionError(absl::StrCat("flag protocol: ", key_name(key), " is set ",
                                                        sets.size(), " times but waited for ",
                                                        waits, " times (every set is consumed)"));
    }
    std::vector<std::pair<uint32_t, uint32_t>> pairs;
    for (size_t k = 0; k < sets.size(); ++k) {
      AddEdge(sets[k], waits_it->second[k], true);
      pairs.emplace_back(sets[k], waits_it->second[k]);
    }
    flag_pairs_.push_back(std::move(pairs));
  }

  // Cross-core counters: an AIV's k-th wait needs its AIC's k-th set; an AIC's k-th wait
  // needs the k-th set of both of its AIVs.
  for (const auto& [key, waits] : cross_waits_) {
    const auto [receiver, flag] = key;
    std::vector<int> senders;
    if (receiver < block_dim_) {
      senders = {block_dim_ + 2 * receiver, block_dim_ + 2 * receiver + 1};
    } else {
      senders = {(receiver - block_dim_) / 2};
    }
    for (int sender : senders) {
      const auto it = cross_sets_.find({receiver, flag, sender});
      const size_t sets = it == cross_sets_.end() ? 0 : it->second.size();
      if (sets < waits.size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "deadlock: ", CoreName(*this, receiver), " waits on cross-core flag ", flag, " ",
            waits.size(), " times but ", CoreName(*this, sender), " sets it only ", sets,
            " times; ", Describe(waits[sets]), " would wait forever"));
      }
      std::vector<std::pair<uint32_t, uint32_t>> pairs;
      for (size_t k = 0; k < waits.size(); ++k) {
        AddEdge(it->second[k], waits[k], true);
        pairs.emplace_back(it->second[k], waits[k]);
      }
      cross_pairs_.push_back(std::move(pairs));
    }
  }
  for (const auto& [key, sets] : cross_sets_) {
    const auto [receiver, flag, sender] = key;
    const auto it = cross_waits_.find({receiver, flag});
    const size_t waits = it == cross_waits_.end() ? 0 : it->second.size();
    if (sets.size() != waits) {
      return absl::FailedPreconditionError(absl::StrCat(
          "flag protocol: ", CoreName(*this, sender), " sets cross-core flag ", flag, " of ",
          CoreName(*this, receiver), " ", sets.size(), " times but it is waited for ", waits,
          " times"));
    }
  }

  // Compressed adjacency by source.
  const size_t n = instructions_.size();
  edge_offsets_.assign(n + 1, 0);
  in_degree_.assign(n, 0);
  for (const auto& [from, to, after] : raw_edges_) {
    ++edge_offsets_[from + 1];
    ++in_degree_[to];
  }
  for (size_t i = 0; i < n; ++i) edge_offsets_[i + 1] += edge_offsets_[i];
  edges_.resize(raw_edges_.size());
  std::vector<uint32_t> fill(edge_offsets_.begin(), edge_offsets_.end() - 1);
  for (const auto& [from, to, after] : raw_edges_) edges_[fill[from]++] = Edge{to, after};
  raw_edges_.clear();
  raw_edges_.shrink_to_fit();
  return absl::OkStatus();
}

}  // namespace mlaserve::npu
