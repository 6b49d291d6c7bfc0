#ifndef MLASERVE_CLIENT_DATAPLANE_UCX_CHANNEL_H_
#define MLASERVE_CLIENT_DATAPLANE_UCX_CHANNEL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/decode_batch.h"
#include "common/reuse_pool.h"
#include "common/ucx_wire.h"
#include "common/ucx_worker.h"
#include "mlaserve/v1/data_plane.pb.h"

namespace mlaserve::client {

struct UcxChannelOptions {
  // How long connecting and the hello may take before the plane counts as unreachable.
  absl::Duration connect_timeout = absl::Seconds(5);
  // The version the hello claims (tests claim another to see the refusal).
  uint32_t version = ucx::kUcxVersion;
};

// The client's side of the cross-host data plane: a UCX endpoint to the server's listener,
// the OpenDataPlane ticket presented once, then each packed Decode sent as one active
// message and answered by one (docs/api.md, "The UCX plane"). Thread-safe: any number of
// calls at once on the one endpoint; whichever caller is waiting drives the worker for all.
class UcxChannel {
 public:
  // Connects to the plane OpenDataPlane answered with (its ticket spent here); a wildcard
  // host in its address (0.0.0.0, ::) means `server_host`, the host gRPC reaches. The
  // server's refusal as it gives it (FAILED_PRECONDITION for another version,
  // UNAUTHENTICATED for a spent ticket); UNAVAILABLE when the listener cannot be reached.
  static absl::StatusOr<std::unique_ptr<UcxChannel>> Open(const v1::OpenDataPlaneResponse& opened,
                                                          const std::string& server_host,
                                                          UcxChannelOptions options = {});
  ~UcxChannel();
  UcxChannel(const UcxChannel&) = delete;
  UcxChannel& operator=(const UcxChannel&) = delete;

  // One packed call within `timeout`, answered into `output` (CheckDecodeBatch's and the
  // server's statuses as over gRPC). UNAVAILABLE once the endpoint has failed (the server
  // stopped or restarted: open another).
  absl::Status Decode(const DecodeBatchRequest& request, DecodeBatchOutput& output,
                      absl::Duration timeout);
  // A call's bytes as they are, under a header of `header` bytes (8: the call id), and the
  // answer's: for tests of what the server does with malformed calls.
  absl::StatusOr<v1::DataPlaneAnswer> CallRaw(const std::string& header, const std::string& data,
                                              absl::Duration timeout);

  bool broken() const;
  const std::string& instance_id() const { return instance_id_; }

 private:
  // One call's state, shared with UCX's callbacks: a call that times out leaves it to them.
  struct Pending {
    bool answered = false;
    bool sent = false;
    absl::Status status;  // a transport failure (the endpoint's)
    std::shared_ptr<std::string> request_bytes;
    std::shared_ptr<std::string> answer_bytes;  // a rendezvous answer lands here
    size_t answer_length = 0;
    std::shared_ptr<v1::DataPlaneAnswer> answer;
  };
  struct DeferredReceive {
    std::shared_ptr<Pending> pending;
    void* descriptor;
    size_t length;
  };

  explicit UcxChannel(std::unique_ptr<ucx::UcxWorker> worker);
  absl::Status Connect(const sockaddr_storage& address, const std::string& ticket,
                       const UcxChannelOptions& options);
  // Sends `bytes` as active message `id` under `header`; the pending call gets `sent`.
  void Send(unsigned id, const std::string& header, std::shared_ptr<Pending> pending, size_t size);
  // Drives the worker (or waits for whoever does) until `done` or the deadline; false on the
  // deadline. Called with mu_ held.
  template <typename Done>
  bool WaitFor(std::unique_lock<std::mutex>& lock, absl::Time deadline, Done done);
  absl::StatusOr<v1::DataPlaneAnswer*> Exchange(const std::string& header,
                                                std::shared_ptr<Pending> pending, size_t size,
                                                uint64_t call_id, absl::Time deadline);
  void Fail(const absl::Status& status);
  void Wake();

  static ucs_status_t OnWelcome(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnAnswer(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  std::unique_ptr<ucx::UcxWorker> worker_;  // used under mu_ only
  ucp_ep_h ep_ = nullptr;
  const int wake_;  // eventfd: a caller posted a send while another waits in poll
  std::string instance_id_;
  mutable std::mutex mu_;
  std::condition_variable progressed_;
  bool progressing_ = false;               // guarded by mu_: a caller drives the worker
  absl::Status broken_;                    // guarded by mu_
  std::optional<v1::UcxWelcome> welcome_;  // guarded by mu_
  uint64_t next_call_id_ = 1;              // guarded by mu_
  absl::flat_hash_map<uint64_t, std::shared_ptr<Pending>> calls_;  // guarded by mu_
  std::vector<DeferredReceive> deferred_;                          // guarded by mu_
  std::shared_ptr<ReusePool<std::string>> buffers_ = ReusePool<std::string>::Create(8);
  std::shared_ptr<ReusePool<v1::DataPlaneAnswer>> answers_ =
      ReusePool<v1::DataPlaneAnswer>::Create(8);
};

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_DATAPLANE_UCX_CHANNEL_H_
