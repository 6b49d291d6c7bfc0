#include "server/state/kv_state_keeper.h"

#include <cstdio>
#include <utility>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace mlaserve::state {
namespace {

double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

KvStateKeeper::KvStateKeeper(engine::Engine& engine, std::string state_dir, std::string instance_id,
                             std::string model_name)
    : engine_(engine),
      state_dir_(std::move(state_dir)),
      instance_id_(std::move(instance_id)),
      model_name_(std::move(model_name)) {}

KvStateKeeper::~KvStateKeeper() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  if (periodic_.joinable()) periodic_.join();
}

std::optional<KvStateFileInfo> KvStateKeeper::Restore() {
  const std::string file = path();
  // A save cut short (kill -9, power) leaves only its temporary file; the previous state is
  // the one to load.
  std::remove((file + ".tmp").c_str());
  const absl::Time start = absl::Now();
  absl::StatusOr<KvStateFileInfo> loaded = LoadKvStateFile(file, engine_);
  if (absl::IsNotFound(loaded.status())) {
    spdlog::info("state: no saved KV state in {}; starting empty", state_dir_);
    return std::nullopt;
  }
  if (!loaded.ok()) {
    const std::string bad = file + ".bad";
    const bool kept = std::rename(file.c_str(), bad.c_str()) == 0;
    spdlog::warn("state: cannot restore the KV state ({}); starting empty{}",
                 std::string(loaded.status().message()), kept ? ", the file kept as " + bad : "");
    return std::nullopt;
  }
  spdlog::info(
      "state: restored {} sequence(s), {} prefix(es), {} tokens ({:.1f} MiB) from {} in {:.2f} "
      "s, saved by instance {} at {}",
      loaded->sequences, loaded->prefixes, loaded->tokens, Mib(loaded->bytes), file,
      absl::ToDoubleSeconds(absl::Now() - start), loaded->instance_id,
      absl::FormatTime(loaded->written, absl::UTCTimeZone()));
  return *std::move(loaded);
}

absl::StatusOr<KvStateFileInfo> KvStateKeeper::Save() {
  absl::MutexLock lock(&save_mu_);
  const engine::KvCheckpoint checkpoint = engine_.CheckpointKv();
  return WriteKvStateFile(path(), checkpoint, instance_id_, model_name_);
}

void KvStateKeeper::StartPeriodicSaves(absl::Duration interval) {
  periodic_ = std::thread([this, interval] { PeriodicSaves(interval); });
}

void KvStateKeeper::PeriodicSaves(absl::Duration interval) {
  for (;;) {
    {
      absl::MutexLock lock(&stop_mu_);
      if (stop_mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<KvStateFileInfo> saved = Save();
    if (saved.ok()) {
      spdlog::debug("state: saved {} sequence(s), {} tokens ({:.1f} MiB) in {:.2f} s",
                    saved->sequences, saved->tokens, Mib(saved->bytes),
                    absl::ToDoubleSeconds(absl::Now() - start));
    } else {
      spdlog::warn("state: periodic save failed: {}", std::string(saved.status().message()));
    }
  }
}

}  // namespace mlaserve::state
