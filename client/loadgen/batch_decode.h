#ifndef MLASERVE_CLIENT_LOADGEN_BATCH_DECODE_H_
#define MLASERVE_CLIENT_LOADGEN_BATCH_DECODE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "client/loadgen/load_target.h"
#include "client/serving_client.h"

namespace mlaserve::loadgen {

// A load step's queries as one packed call (ServingClient::DecodeBatch: gRPC's packed form or
// the same-host data plane, as the client's options say), the way a framework sends a layer:
// the queries' spans gathered into stacked tensors first. The queries must share their layer,
// sq, space and appended rows' count (a load step's do); INVALID_ARGUMENT otherwise.
absl::StatusOr<std::vector<LoadAnswer>> DecodeAsBatch(client::ServingClient& client,
                                                      const TargetModel& model,
                                                      const std::vector<LoadQuery>& queries);

// The answers' plans as the load generator keeps them.
LoadAnswer ToLoadAnswer(const v1::DecodePlan& plan);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_BATCH_DECODE_H_
