#ifndef MLASERVE_BENCH_PEER_PROCESS_H_
#define MLASERVE_BENCH_PEER_PROCESS_H_

#include <sys/types.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace mlaserve::bench {

// A peer implementation in a child process (bench/peers/*.py) that answers one JSON request
// line with one JSON reply line, so the benchmark can alternate between its own kernel and
// the peer's in one process tree without paying the peer's start-up per measurement.
class PeerProcess {
 public:
  // Starts `argv` with `env` added to (or, for an empty value, removed from) this process's
  // environment.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(std::vector<std::string> argv,
                                                            std::map<std::string, std::string> env);
  ~PeerProcess();  // asks the peer to quit, then reaps it
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // One request and its reply; a reply {"error": ...} becomes INTERNAL with its text.
  absl::StatusOr<nlohmann::json> Call(const nlohmann::json& request);

 private:
  PeerProcess(pid_t pid, FILE* to, FILE* from) : pid_(pid), to_(to), from_(from) {}

  pid_t pid_;
  FILE* to_;    // the peer's stdin
  FILE* from_;  // the peer's stdout
};

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_PEER_PROCESS_H_
