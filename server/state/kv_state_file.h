#ifndef MLASERVE_SERVER_STATE_KV_STATE_FILE_H_
#define MLASERVE_SERVER_STATE_KV_STATE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"

namespace mlaserve::state {

// The KV state file (proto/mlaserve/v1/kv_state.proto has the layout): what a restart
// brings back, so `systemctl restart` costs the framework no prefill.

// Who wrote a file, and what it holds.
struct KvStateFileInfo {
  std::string instance_id;
  std::string server_version;
  absl::Time written = absl::InfinitePast();
  int64_t prefixes = 0;
  int64_t sequences = 0;
  int64_t pages = 0;
  int64_t tokens = 0;  // page records
  int64_t bytes = 0;   // the file's size
};

// Writes `checkpoint` to `path` atomically: into `path`.tmp, fsync, rename over `path`, fsync
// of the directory. A crash (kill -9, power) at any point leaves the previous file whole.
// The error names the path and the system call that failed.
absl::StatusOr<KvStateFileInfo> WriteKvStateFile(const std::string& path,
                                                 const engine::KvCheckpoint& checkpoint,
                                                 const std::string& instance_id,
                                                 const std::string& model_name);

// Loads `path` into `engine`, whose store must be empty. The whole file is checked (size,
// magic, version, checksum, manifest) before anything is loaded, so a bad file loads nothing:
//   NOT_FOUND          no file (a first start);
//   DATA_LOSS          truncated, corrupt (checksum), or a manifest that does not parse;
//   FAILED_PRECONDITION another format version;
//   INVALID_ARGUMENT   a manifest of another model or page size, or one that does not hold
//                      together (KvStore::Restore);
//   RESOURCE_EXHAUSTED it does not fit this server's KV budget.
absl::StatusOr<KvStateFileInfo> LoadKvStateFile(const std::string& path, engine::Engine& engine);

}  // namespace mlaserve::state

#endif  // MLASERVE_SERVER_STATE_KV_STATE_FILE_H_
