#ifndef MLASERVE_SERVER_DATAPLANE_SHM_DATA_PLANE_H_
#define MLASERVE_SERVER_DATAPLANE_SHM_DATA_PLANE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "server/dataplane/byte_budget.h"
#include "server/dataplane/shm_connection.h"
#include "server/service/data_plane_tickets.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/service_metrics.h"

namespace mlaserve::dataplane {

struct ShmDataPlaneOptions {
  // The unix socket: a path (under the unit's RuntimeDirectory=) or "@name" (abstract).
  std::string address;
  ByteBudget::Caps caps = kDefaultRegionCaps;
  // How long the poller keeps scanning the regions after a call arrived or was answered
  // before it sleeps on the sockets (clients then ring them). It never spins while a call
  // runs (the devices then want the CPUs); 0: it never spins.
  absl::Duration poll = absl::ZeroDuration();
  int max_clients = 256;
  std::string instance_id;
  std::string host_id;  // common/host_id.h
  // Maps each registered region into the devices (engine::Engine::MapHostMemory), whose
  // uploads then read its queries in place; empty: queries are copied out as rows are.
  DeviceMapper map_for_devices;
};

// The server's side of the same-host data plane (docs/architecture.md, "A call over the
// data plane"): a unix socket where clients register a region, and one poller thread that
// finds the calls they publish in it, copies and checks each, and hands it to the same
// DecodeDispatcher gRPC calls go through; the engine's callback writes the answers into the
// region and wakes the client. No thread per call, no copy of an answer but its encoding.
class ShmDataPlane {
 public:
  static absl::StatusOr<std::unique_ptr<ShmDataPlane>> Start(ShmDataPlaneOptions options,
                                                             service::DecodeDispatcher& dispatcher,
                                                             service::DataPlaneTickets& tickets,
                                                             service::ServiceMetrics& metrics,
                                                             const engine::ModelConfig& model);
  // Stops the poller and closes every client (their calls in flight end with the engine).
  ~ShmDataPlane();

  v1::DataPlane Advertised() const;
  // New calls are answered UNAVAILABLE from now on; calls in flight run on. Every call taken
  // before it is in the engine when it returns, so the engine's drain waits for them.
  void Drain();
  int clients() const { return clients_.load(std::memory_order_relaxed); }
  // Calls taken and not yet answered.
  int calls_in_flight() const { return calls_in_flight_.load(std::memory_order_relaxed); }
  uint64_t registered_bytes() const { return budget_->total(); }
  uint64_t registered_bytes_limit() const { return budget_->caps().total_bytes; }
  // Doorbells for a slot already running a call, over all clients so far.
  int64_t refused_doorbells() const;

 private:
  ShmDataPlane(ShmDataPlaneOptions options, int listener, int wake,
               service::DecodeDispatcher& dispatcher, service::DataPlaneTickets& tickets,
               service::ServiceMetrics& metrics, const engine::ModelConfig& model);
  void Poll();
  // Claims and runs every call published in the clients' regions; true if it found one.
  bool ScanRegions();
  void RunCall(const std::shared_ptr<ShmConnection>& connection, uint32_t slot);
  void SetSleeping(bool sleeping);
  // A call's answer is out (from an engine thread).
  void CallEnded();
  // Closes clients that sent no hello within kHelloTimeout.
  void CloseSilentClients(absl::flat_hash_map<int, absl::Time>& hello_by);
  void Accept();
  void ReadSocket(const std::shared_ptr<ShmConnection>& connection);
  void Close(int fd);

  const ShmDataPlaneOptions options_;
  const int listener_;
  const int wake_;  // eventfd that ends the poller
  const int epoll_;
  service::DecodeDispatcher& dispatcher_;
  service::DataPlaneTickets& tickets_;
  service::ServiceMetrics& metrics_;
  const engine::ModelConfig model_;
  // Shared with the connections: an engine thread may drop a call's last reference to its
  // connection (which gives its region's bytes back) after the plane has gone.
  const std::shared_ptr<ByteBudget> budget_;
  std::atomic<bool> stopping_{false};
  // Held while the poller takes a call and hands it to the engine, and by Drain.
  absl::Mutex handing_mu_;
  bool draining_ ABSL_GUARDED_BY(handing_mu_) = false;
  std::atomic<int> clients_{0};
  std::atomic<int> calls_in_flight_{0};
  std::atomic<int64_t> last_activity_ns_{0};  // a call's arrival or answer
  std::atomic<bool> poller_asleep_{false};
  // The poller's alone; registered clients are also in `ready_` for the scan.
  absl::flat_hash_map<int, std::shared_ptr<ShmConnection>> by_fd_;
  std::vector<std::shared_ptr<ShmConnection>> ready_;
  std::atomic<int64_t> refused_doorbells_{0};  // every client's, counted by its connection
  std::thread poller_;
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_SHM_DATA_PLANE_H_
