#ifndef MLASERVE_SERVER_SERVICE_SERVER_INFO_H_
#define MLASERVE_SERVER_SERVICE_SERVER_INFO_H_

#include <cstdint>

#include "mlaserve/v1/server_info.pb.h"
#include "server/engine/engine.h"

namespace mlaserve::service {

// GetServerInfo's answer: the engine's model, devices, thresholds and limits, plus the
// edge's own message size limit.
v1::GetServerInfoResponse MakeServerInfo(const engine::EngineInfo& info, int64_t max_message_bytes);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_SERVER_INFO_H_
