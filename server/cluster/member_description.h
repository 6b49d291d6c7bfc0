#ifndef MLASERVE_SERVER_CLUSTER_MEMBER_DESCRIPTION_H_
#define MLASERVE_SERVER_CLUSTER_MEMBER_DESCRIPTION_H_

#include <functional>
#include <string>

#include "cluster/member_record.h"
#include "server/service/mla_server.h"

namespace mlaserve::cluster {

// What ClusterMembership writes for `server` (which must outlive the function): its model,
// formats, devices and budget as of now, and at every call its load from the engine's
// statistics, queries/s over the time since the previous call.
std::function<MemberRecord()> DescribeServer(service::MlaServer& server, std::string address,
                                             std::string version);

}  // namespace mlaserve::cluster

#endif  // MLASERVE_SERVER_CLUSTER_MEMBER_DESCRIPTION_H_
