#ifndef MLASERVE_SERVER_STATE_KV_STATE_KEEPER_H_
#define MLASERVE_SERVER_STATE_KV_STATE_KEEPER_H_

#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/state/kv_state_file.h"

namespace mlaserve::state {

// Keeps an engine's KV store in `state_dir`/kv-state.mlakv across restarts: loads it once at
// start, saves it on demand (the drain) and, optionally, every `interval` while serving, so
// a kill -9 loses at most that much. Each outcome is one log line.
class KvStateKeeper {
 public:
  static constexpr char kFileName[] = "kv-state.mlakv";

  KvStateKeeper(engine::Engine& engine, std::string state_dir, std::string instance_id,
                std::string model_name);
  KvStateKeeper(const KvStateKeeper&) = delete;
  KvStateKeeper& operator=(const KvStateKeeper&) = delete;
  // Stops the periodic saves (without a last one: Save() is the drain's).
  ~KvStateKeeper();

  std::string path() const { return state_dir_ + "/" + kFileName; }

  // Loads the saved state into the engine, whose store must be empty and not yet serving.
  // The state from what file, or nullopt when the engine starts empty: no file, or one that
  // cannot be loaded (truncated, corrupt, another version or model, over the budget), which
  // is logged in one line and kept aside as kv-state.mlakv.bad for a post-mortem; it never
  // stops the start. A leftover temporary file of a save cut short is removed.
  std::optional<KvStateFileInfo> Restore();

  // Writes the store's current state (a checkpoint, then the file, atomically). Saves never
  // overlap.
  absl::StatusOr<KvStateFileInfo> Save();

  // Saves every `interval` on a thread of its own until destruction (a failed save is logged
  // and retried at the next tick).
  void StartPeriodicSaves(absl::Duration interval);

 private:
  void PeriodicSaves(absl::Duration interval);

  engine::Engine& engine_;
  const std::string state_dir_;
  const std::string instance_id_;
  const std::string model_name_;
  absl::Mutex save_mu_;  // one save at a time
  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread periodic_;
};

}  // namespace mlaserve::state

#endif  // MLASERVE_SERVER_STATE_KV_STATE_KEEPER_H_
