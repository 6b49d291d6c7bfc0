#ifndef MLASERVE_SERVER_DATAPLANE_UCX_DATA_PLANE_H_
#define MLASERVE_SERVER_DATAPLANE_UCX_DATA_PLANE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/ucx_worker.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "server/dataplane/byte_budget.h"
#include "server/dataplane/ucx_connection.h"
#include "server/service/data_plane_tickets.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/service_metrics.h"

namespace mlaserve::dataplane {

struct UcxDataPlaneOptions {
  // Where UCX's listener takes connections (a TCP sockaddr; port 0: any free one).
  std::string host = "0.0.0.0";
  int port = 0;
  ByteBudget::Caps caps = kDefaultUcxCallCaps;
  int max_clients = 256;
  std::string instance_id;
  std::string host_id;  // common/host_id.h
};

// The server's side of the cross-host data plane (docs/architecture.md, "The UCX hop"): a UCX
// worker with a listener, driven by one progress thread. A client connects an endpoint,
// presents its OpenDataPlane ticket (a UcxHello), then sends DataPlaneCalls as active
// messages; each is parsed and handed to the same DecodeDispatcher gRPC calls go through,
// and the engine's callback writes the DataPlaneAnswer into a buffer the progress thread
// sends back. Wire contract: docs/api.md, "The UCX plane".
class UcxDataPlane {
 public:
  static absl::StatusOr<std::unique_ptr<UcxDataPlane>> Start(UcxDataPlaneOptions options,
                                                             service::DecodeDispatcher& dispatcher,
                                                             service::DataPlaneTickets& tickets,
                                                             service::ServiceMetrics& metrics);
  // Sends the answers already written (at most a few seconds), closes every endpoint, stops.
  ~UcxDataPlane();

  v1::DataPlane Advertised() const;
  int port() const { return port_; }
  // New calls are answered UNAVAILABLE from now on; calls in flight run on. Every call taken
  // before it (its bytes perhaps still arriving: it waits for them, up to 5 s) is in the
  // engine when it returns, so the engine's drain waits for them.
  void Drain();
  // Clients whose hello was accepted and whose endpoint is open.
  int clients() const { return clients_.load(std::memory_order_relaxed); }
  // Calls received (or being received) and not yet answered.
  int calls_in_flight() const { return calls_in_flight_.load(std::memory_order_relaxed); }
  uint64_t in_flight_bytes() const { return budget_.total(); }
  uint64_t in_flight_bytes_limit() const { return budget_.caps().total_bytes; }

  // A rendezvous call whose data UCX holds until the progress loop receives it.
  struct PendingReceive {
    std::shared_ptr<UcxConnection> connection;
    uint64_t call_id;
    void* descriptor;
    size_t length;
    absl::Time start;
  };

 private:
  UcxDataPlane(UcxDataPlaneOptions options, std::unique_ptr<ucx::UcxWorker> worker,
               service::DecodeDispatcher& dispatcher, service::DataPlaneTickets& tickets,
               service::ServiceMetrics& metrics);
  absl::Status Listen();
  void Run();
  // Sends what the engine threads queued; whether there was any.
  bool SendQueued();
  void CloseFinished();

  // UCX's callbacks (the progress thread's).
  static void OnConnection(ucp_conn_request_h request, void* arg);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnHello(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnCall(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static void OnReceived(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnSent(void* request, ucs_status_t status, void* user_data);

  std::shared_ptr<UcxConnection> ConnectionOf(const ucp_am_recv_param_t* param) const;
  void Hello(const std::shared_ptr<UcxConnection>& connection, const void* data, size_t length);
  // A call's bytes are here (eager, or received): parsed and handed to the engine.
  void RunCall(const std::shared_ptr<UcxConnection>& connection, uint64_t call_id, const void* data,
               size_t length, uint64_t taken, absl::Time start);
  // The call's answer (or refusal) is queued for the progress thread.
  void Refuse(const std::shared_ptr<UcxConnection>& connection, uint64_t call_id,
              const absl::Status& status, absl::Time start);
  void Queue(const std::shared_ptr<UcxConnection>& connection, unsigned id, uint64_t call_id,
             std::shared_ptr<std::string> bytes, size_t size);
  void Close(const std::shared_ptr<UcxConnection>& connection, bool force);
  // A taken call ended before reaching the engine (its bytes failed, or its client left).
  void Abandon(const std::shared_ptr<UcxConnection>& connection, size_t bytes);

  const UcxDataPlaneOptions options_;
  std::unique_ptr<ucx::UcxWorker> worker_;
  ucp_listener_h listener_ = nullptr;
  int port_ = 0;
  const int wake_;  // eventfd: answers queued, or stop
  service::DecodeDispatcher& dispatcher_;
  service::DataPlaneTickets& tickets_;
  service::ServiceMetrics& metrics_;
  ByteBudget budget_;
  std::atomic<bool> stopping_{false};
  // Held while a call is handed to the engine, and by Drain.
  absl::Mutex handing_mu_;
  bool draining_ ABSL_GUARDED_BY(handing_mu_) = false;
  // Calls taken whose bytes are still arriving (not yet handed to the engine).
  int receiving_ ABSL_GUARDED_BY(handing_mu_) = 0;
  std::atomic<int> clients_{0};
  std::atomic<int> calls_in_flight_{0};

  // Answers written by engine threads, for the progress thread to send.
  struct Outgoing {
    std::shared_ptr<UcxConnection> connection;
    unsigned id;
    uint64_t call_id;
    std::shared_ptr<std::string> bytes;
    size_t size;
  };
  std::mutex queue_mu_;
  std::vector<Outgoing> queue_;  // guarded by queue_mu_

  // The progress thread's alone.
  absl::flat_hash_map<ucp_ep_h, std::shared_ptr<UcxConnection>> by_ep_;
  std::vector<std::shared_ptr<UcxConnection>> failed_;  // endpoints to close
  std::vector<void*> closing_;                          // their close requests
  std::vector<PendingReceive> pending_;
  int sends_in_flight_ = 0;
  std::thread progress_;
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_UCX_DATA_PLANE_H_
