#include "server/service/sequence_migration.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "client/mlaserve_client.h"
#include "common/status_macros.h"
#include "server/engine/kv/kv_checkpoint.h"
#include "spdlog/spdlog.h"

namespace mlaserve::service {
namespace {

// Page records read once per checkpoint, by manifest page index.
class PageRecords {
 public:
  PageRecords(const engine::KvCheckpoint& checkpoint, int dl, int dr)
      : checkpoint_(checkpoint), dl_(dl), dr_(dr) {}

  int64_t RecordBytes(KvDtype dtype) const { return engine::KvStateRecordBytes(dtype, dl_, dr_); }

  // Records [from, to) of one layer's page list (each page but the last holds `capacity(page)`
  // tokens), concatenated.
  std::string Read(const std::vector<int32_t>& pages, int64_t from, int64_t to,
                   int bf16_page_tokens, int fp8_page_tokens) {
    std::string out;
    int64_t position = 0;
    for (int32_t index : pages) {
      if (position >= to) break;
      const engine::KvStateManifest::Page& page = checkpoint_.manifest().pages[index];
      const int64_t capacity = page.kv_dtype == KvDtype::kFp8 ? fp8_page_tokens : bf16_page_tokens;
      const int64_t record = RecordBytes(page.kv_dtype);
      const int64_t begin = std::max(from, position);
      const int64_t end = std::min({to, position + capacity, position + page.tokens});
      if (end > begin) {
        const std::string& data = Page(index);
        out.append(data, (begin - position) * record, (end - begin) * record);
      }
      position += capacity;
    }
    return out;
  }

 private:
  const std::string& Page(int32_t index) {
    auto [it, added] = pages_.try_emplace(index);
    if (added) {
      const engine::KvStateManifest::Page& page = checkpoint_.manifest().pages[index];
      it->second.resize(page.tokens * RecordBytes(page.kv_dtype));
      checkpoint_.ReadPage(index,
                           std::as_writable_bytes(std::span(it->second.data(), it->second.size())));
    }
    return it->second;
  }

  const engine::KvCheckpoint& checkpoint_;
  const int dl_;
  const int dr_;
  absl::flat_hash_map<int32_t, std::string> pages_;
};

v1::KvDtype ToWire(KvDtype dtype) {
  return dtype == KvDtype::kFp8 ? v1::KV_DTYPE_FP8 : v1::KV_DTYPE_BF16;
}

// A layer's rows [from, to) as the append that rebuilds them: bf16 rows as a tensor, FP8
// records as they are.
client::KvAppend AppendOf(const std::string& sequence_id, int layer, int64_t from, int64_t to,
                          std::string records, KvDtype dtype, int dk) {
  client::KvAppend append;
  append.sequence_id = sequence_id;
  append.layer = layer;
  append.start_position = from;
  if (dtype == KvDtype::kFp8) {
    append.fp8_rows.set_count(to - from);
    append.fp8_rows.set_data(std::move(records));
    return append;
  }
  append.rows.set_dtype(v1::DTYPE_BF16);
  append.rows.add_shape(static_cast<int64_t>(records.size()) / (2 * dk));
  append.rows.add_shape(dk);
  append.rows.set_data(std::move(records));
  return append;
}

class Migration {
 public:
  Migration(engine::Engine& engine, MovedSequences& moved, client::ServingClient& target,
            std::string target_address, std::string instance_id)
      : instance_id_(std::move(instance_id)),
        engine_(engine),
        moved_(moved),
        target_(target),
        target_address_(std::move(target_address)),
        info_(engine.Info()),
        dk_(info_.model.dl + info_.model.dr) {}

  absl::StatusOr<MigrationResult> Run(std::vector<std::string> ids) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(CheckTarget());
    engine::KvCheckpoint first = engine_.CheckpointKv();
    const engine::KvStateManifest& manifest = first.manifest();
    ASSIGN_OR_RETURN(std::vector<int> chosen, Choose(manifest, ids));
    for (int s : chosen) ids_.push_back(manifest.sequences[s].id);
    PageRecords records(first, info_.model.dl, info_.model.dr);
    absl::Status copied = absl::OkStatus();
    for (int s : chosen) {
      copied = CopySequence(manifest, manifest.sequences[s], records);
      if (!copied.ok()) break;
    }
    if (!copied.ok()) return Undo(copied, false);

    // The last rows: calls naming the sequences wait while what was appended meanwhile
    // follows (appends in flight finish within the grace).
    const absl::Time hold = absl::Now();
    moved_.MarkMoving(ids_, target_address_);
    absl::SleepFor(absl::Milliseconds(20));
    engine::KvCheckpoint last = engine_.CheckpointKv();
    PageRecords last_records(last, info_.model.dl, info_.model.dr);
    absl::flat_hash_map<std::string, int> now;
    for (size_t s = 0; s < last.manifest().sequences.size(); ++s) {
      now.emplace(last.manifest().sequences[s].id, static_cast<int>(s));
    }
    std::vector<std::string> gone;  // released by their clients during the copy
    for (const std::string& id : ids_) {
      auto it = now.find(id);
      if (it == now.end()) {
        gone.push_back(id);
        continue;
      }
      copied = CopyRows(last.manifest().sequences[it->second], last_records);
      if (!copied.ok()) return Undo(copied, true);
    }
    for (const std::string& id : gone) target_.ReleaseSequence(id).IgnoreError();
    moved_.MarkMoved(ids_, target_address_);
    for (const std::string& id : ids_) engine_.ReleaseSequence(id).IgnoreError();
    result_.held = absl::Now() - hold;
    for (const std::string& id : private_prefixes_) target_.ReleasePrefix(id).IgnoreError();
    result_.sequences = static_cast<int>(ids_.size() - gone.size());
    result_.took = absl::Now() - start;
    return result_;
  }

 private:
  absl::Status CheckTarget() {
    absl::StatusOr<v1::GetServerInfoResponse> info = target_.GetServerInfo();
    if (!info.ok()) {
      return absl::Status(info.status().code(), absl::StrCat("target: server ", target_address_,
                                                             ": ", info.status().message()));
    }
    if (info->model().name() != info_.model.name || info->model().layers() != info_.model.layers ||
        info->model().kv_row_width() != dk_) {
      return absl::FailedPreconditionError(
          absl::StrCat("target: server ", target_address_, " serves ", info->model().name(), " (",
                       info->model().layers(), " layers), this one ", info_.model.name, " (",
                       info_.model.layers, " layers)"));
    }
    if (info->state().instance_id() == instance_id_) {
      return absl::InvalidArgumentError("target: is this server");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int>> Choose(const engine::KvStateManifest& manifest,
                                          const std::vector<std::string>& ids) {
    std::vector<int> chosen;
    if (ids.empty()) {
      for (size_t s = 0; s < manifest.sequences.size(); ++s) chosen.push_back(static_cast<int>(s));
      return chosen;
    }
    absl::flat_hash_map<std::string, int> by_id;
    for (size_t s = 0; s < manifest.sequences.size(); ++s) {
      by_id.emplace(manifest.sequences[s].id, static_cast<int>(s));
    }
    absl::flat_hash_set<std::string> seen;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = by_id.find(ids[i]);
      if (it == by_id.end()) {
        return absl::NotFoundError(
            absl::StrCat("sequence_ids[", i, "]: no sequence '", ids[i], "' here"));
      }
      if (seen.insert(ids[i]).second) chosen.push_back(it->second);
    }
    return chosen;
  }

  // The prefix chain of `prefix` (an index) registered on the target, root first; the name
  // each prefix has there.
  absl::StatusOr<std::string> EnsurePrefix(const engine::KvStateManifest& manifest, int prefix,
                                           PageRecords& records) {
    if (auto it = prefix_names_.find(prefix); it != prefix_names_.end()) return it->second;
    const engine::KvStateManifest::Prefix& p = manifest.prefixes[prefix];
    std::string parent_name;
    if (p.parent >= 0) {
      ASSIGN_OR_RETURN(parent_name, EnsurePrefix(manifest, p.parent, records));
    }
    if (p.kv_dtype == KvDtype::kFp8) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence_ids: a sequence sits on FP8 prefix '", p.id,
          "', which RegisterPrefix would requantise: moving FP8 prefixes is not supported"));
    }
    // A released prefix lives on through its sequences only: a private name on the target,
    // released there once its sequences exist.
    const std::string name = p.registered ? p.id : absl::StrCat(p.id, "~moved-from-", instance_id_);
    std::string latent;
    for (int layer = 0; layer < info_.model.layers; ++layer) {
      latent +=
          records.Read(p.pages[layer], p.begin, p.end, info_.page_size, info_.fp8_page_tokens);
    }
    v1::Tensor tensor;
    tensor.set_dtype(v1::DTYPE_BF16);
    tensor.add_shape(info_.model.layers);
    tensor.add_shape(p.end - p.begin);
    tensor.add_shape(dk_);
    result_.bytes += static_cast<int64_t>(latent.size());
    result_.tokens += p.end - p.begin;
    tensor.set_data(std::move(latent));
    absl::Status registered = target_.RegisterPrefix(name, parent_name, tensor, v1::KV_DTYPE_BF16);
    if (!registered.ok()) return Named(registered);
    if (!p.registered) private_prefixes_.push_back(name);
    registered_.push_back(name);
    ++result_.prefixes;
    prefix_names_.emplace(prefix, name);
    return name;
  }

  absl::Status CopySequence(const engine::KvStateManifest& manifest,
                            const engine::KvStateManifest::Sequence& sequence,
                            PageRecords& records) {
    std::string prefix_name;
    if (sequence.prefix >= 0) {
      ASSIGN_OR_RETURN(prefix_name, EnsurePrefix(manifest, sequence.prefix, records));
    }
    absl::StatusOr<v1::Sequence> created =
        target_.CreateSequence(sequence.id, prefix_name, ToWire(sequence.kv_dtype));
    if (!created.ok()) return Named(created.status());
    created_.push_back(sequence.id);
    const int64_t prefix_end = sequence.prefix >= 0 ? manifest.prefixes[sequence.prefix].end : 0;
    pushed_[sequence.id].assign(sequence.lengths.size(), prefix_end);
    return CopyRows(sequence, records);
  }

  // Rows past what the target already has, for every layer.
  absl::Status CopyRows(const engine::KvStateManifest::Sequence& sequence, PageRecords& records) {
    std::vector<int64_t>& pushed = pushed_[sequence.id];
    std::vector<client::KvAppend> appends;
    for (size_t layer = 0; layer < sequence.lengths.size(); ++layer) {
      const int64_t from = pushed[layer], to = sequence.lengths[layer];
      if (to <= from) continue;
      std::string rows =
          records.Read(sequence.pages[layer], from, to, info_.page_size, info_.fp8_page_tokens);
      result_.bytes += static_cast<int64_t>(rows.size());
      result_.tokens += to - from;
      appends.push_back(AppendOf(sequence.id, static_cast<int>(layer), from, to, std::move(rows),
                                 sequence.kv_dtype, dk_));
      pushed[layer] = to;
    }
    if (appends.empty()) return absl::OkStatus();
    return Named(target_.AppendKv(appends));
  }

  absl::Status Named(const absl::Status& status) const {
    if (status.ok()) return status;
    return absl::Status(status.code(),
                        absl::StrCat("target: server ", target_address_, ": ", status.message()));
  }

  // After a failure: nothing moved. The target forgets what it got.
  absl::Status Undo(const absl::Status& failure, bool marked) {
    if (marked) moved_.Forget(ids_);
    for (const std::string& id : created_) target_.ReleaseSequence(id).IgnoreError();
    for (const std::string& name : registered_) target_.ReleasePrefix(name).IgnoreError();
    spdlog::warn("migration to {} failed, nothing moved: {}", target_address_,
                 std::string(failure.message()));
    return failure;
  }

  const std::string instance_id_;
  engine::Engine& engine_;
  MovedSequences& moved_;
  client::ServingClient& target_;
  const std::string target_address_;
  const engine::EngineInfo info_;
  const int dk_;
  std::vector<std::string> ids_;
  std::vector<std::string> created_;
  std::vector<std::string> registered_;
  std::vector<std::string> private_prefixes_;
  absl::flat_hash_map<int, std::string> prefix_names_;
  absl::flat_hash_map<std::string, std::vector<int64_t>> pushed_;
  MigrationResult result_;
};

}  // namespace

absl::StatusOr<MigrationResult> MigrateSequences(engine::Engine& engine, MovedSequences& moved,
                                                 client::ServingClient& target,
                                                 const std::string& target_address,
                                                 const std::string& instance_id,
                                                 std::vector<std::string> sequence_ids) {
  Migration migration(engine, moved, target, target_address, instance_id);
  return migration.Run(std::move(sequence_ids));
}

}  // namespace mlaserve::service
