#ifndef MLASERVE_CLIENT_SERVING_CLIENT_H_
#define MLASERVE_CLIENT_SERVING_CLIENT_H_

#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/decode_batch.h"
#include "mlaserve/v1/mlaserve.grpc.pb.h"

namespace mlaserve::client {

struct KvAppend;

// The calls a serving framework makes of mlaserve, whether one server answers them
// (MlaServeClient) or a cluster of them (ClusterClient, which routes each sequence to its
// server). Code written against this interface runs on either. Implementations are
// thread-safe.
class ServingClient {
 public:
  virtual ~ServingClient() = default;

  // A server's description (for a cluster: one member's; every member serves one model).
  virtual absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo() = 0;
  virtual absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                      const v1::Tensor& latent,
                                      v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED) = 0;
  virtual absl::Status ReleasePrefix(absl::string_view prefix_id) = 0;
  virtual absl::StatusOr<v1::Sequence> CreateSequence(
      absl::string_view sequence_id, absl::string_view prefix_id = "",
      v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED) = 0;
  virtual absl::Status ReleaseSequence(absl::string_view sequence_id) = 0;
  virtual absl::Status AppendKv(std::span<const KvAppend> appends) = 0;
  // One result per query, in request order.
  virtual absl::StatusOr<v1::DecodeResponse> DecodeRaw(const v1::DecodeRequest& request) = 0;
  // One layer's queries of B sequences as stacked tensors, answered into the caller's memory
  // (decode_batch.h). The client check's INVALID_ARGUMENT naming the argument, or the call's
  // status. This default sends the list form through DecodeRaw (a cluster routes each
  // query); a single server's client sends the packed form, or uses a data plane.
  virtual absl::Status DecodeBatch(const DecodeBatchRequest& request, DecodeBatchOutput& output);
  // Memory to build DecodeBatch's tensors and answers in (decode_batch.h's SharedArray): on
  // the same-host data plane a block of the registered region, which calls neither copy in
  // nor out; here (and wherever there is no such plane) ordinary memory.
  virtual SharedArray AllocateArray(uint64_t bytes) { return HeapArray(bytes); }
};

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_SERVING_CLIENT_H_
