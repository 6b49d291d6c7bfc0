#ifndef MLASERVE_CLIENT_LOADGEN_DEFAULT_RANKS_H_
#define MLASERVE_CLIENT_LOADGEN_DEFAULT_RANKS_H_

#include "mlaserve/v1/server_info.pb.h"

namespace mlaserve::loadgen {

// The ranks (closed-loop callers) mlaserve-loadgen runs against a server when --workers is
// auto, from its GetServerInfo: one per emulated NPU or host device (a rank's 72 sequences
// make a batch, and a pool serves make demo's workload best with a batch on every device),
// kRanksPerGpu per GPU (what served it best on an H100: docs/performance.md, section 10.2),
// and never fewer than kMinRanks, so a call's RPC overlaps another's batch.
inline constexpr int kRanksPerGpu = 8;
inline constexpr int kMinRanks = 2;
int DefaultRanks(const v1::GetServerInfoResponse& info);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_DEFAULT_RANKS_H_
