#ifndef MLASERVE_SERVER_DATAPLANE_UCX_CONNECTION_H_
#define MLASERVE_SERVER_DATAPLANE_UCX_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/reuse_pool.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "server/service/tenancy.h"
#include "ucp/api/ucp.h"

namespace mlaserve::dataplane {

// One client of the UCX plane: its endpoint, its tenant once its hello is accepted, and what
// it reuses. The endpoint is the progress thread's alone; engine threads read `gone` (a call's
// cancellation) and take answer buffers.
struct UcxConnection {
  explicit UcxConnection(ucp_ep_h endpoint, absl::Time hello_deadline)
      : ep(endpoint), hello_by(hello_deadline) {}

  ucp_ep_h ep;
  const absl::Time hello_by;  // closed if still without a hello then
  bool registered = false;
  service::Tenant* tenant = nullptr;
  // The endpoint failed or closed: its calls in flight are cancelled, their answers dropped.
  std::atomic<bool> gone{false};
  std::atomic<int> in_flight{0};
  // Sent something after the drain began: its endpoint is flushed when the plane closes.
  bool answered_in_drain = false;
  // Four of each: calls a client keeps in flight at once, as a framework's micro-batches do.
  std::shared_ptr<ReusePool<std::string>> buffers = ReusePool<std::string>::Create(4);
  std::shared_ptr<ReusePool<v1::DataPlaneCall>> messages = ReusePool<v1::DataPlaneCall>::Create(4);
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_UCX_CONNECTION_H_
