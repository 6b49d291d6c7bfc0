#ifndef MLASERVE_CLIENT_CTL_DRAIN_H_
#define MLASERVE_CLIENT_CTL_DRAIN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/mlaserve_client.h"
#include "cluster/member_record.h"

namespace mlaserve::ctl {

// A sequence of the server being drained, as ListSequences shows it.
struct DrainedSequence {
  std::string id;
  std::string prefix_id;
  int64_t bytes = 0;  // its rows as the server holds them
};

// Which server each sequence goes to: a prefix's sequences together (TyphoonMLA's groups
// stay whole), each group to the member with the most free bytes once the groups placed
// before it are counted, largest groups first. Keyed by target address.
// RESOURCE_EXHAUSTED when a group fits no member, FAILED_PRECONDITION without members.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> PlanDrain(
    const std::vector<DrainedSequence>& sequences,
    const std::vector<cluster::MemberRecord>& targets);

struct DrainStep {
  std::string target;
  v1::MigrateSequencesResponse moved;
};

// mlaserve-ctl drain: the server behind `source` leaves the cluster with the first move, its
// sequences go to `targets` (the other members) by PlanDrain, any created before clients saw
// it leave go to the first target with the last move, and it stops. The first failing move
// ends it with that status (the server keeps what did not move and keeps running, out of the
// cluster). FAILED_PRECONDITION without targets.
absl::StatusOr<std::vector<DrainStep>> DrainServer(
    client::MlaServeClient& source, const std::vector<cluster::MemberRecord>& targets,
    absl::Duration move_timeout);

}  // namespace mlaserve::ctl

#endif  // MLASERVE_CLIENT_CTL_DRAIN_H_
