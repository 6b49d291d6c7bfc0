#ifndef MLASERVE_CLIENT_LOADGEN_GRPC_LOAD_TARGET_H_
#define MLASERVE_CLIENT_LOADGEN_GRPC_LOAD_TARGET_H_

#include <memory>
#include <string>

#include "client/loadgen/load_target.h"
#include "client/mlaserve_client.h"
#include "client/serving_client.h"

namespace mlaserve::loadgen {

// A server over gRPC, or a cluster of them, through the C++ client (MlaServeClient or
// ClusterClient): what a serving framework does, wire encoding and all.
class GrpcLoadTarget final : public LoadTarget {
 public:
  // Asks the server for its model once; every tensor the target sends is shaped by it.
  // `packed`: each step's queries go as one packed call (ServingClient::DecodeBatch: gRPC's
  // packed form, or the data plane the client's options choose) instead of the list form.
  static absl::StatusOr<std::unique_ptr<GrpcLoadTarget>> Create(
      std::unique_ptr<client::ServingClient> client, bool packed = false);

  absl::StatusOr<TargetModel> Model() override { return model_; }
  absl::Status RegisterPrefix(const std::string& id, std::span<const Bf16> latent, int tokens,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleasePrefix(const std::string& id) override;
  absl::Status CreateSequence(const std::string& id, const std::string& prefix_id,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleaseSequence(const std::string& id) override;
  absl::Status AppendKv(const std::string& id, int layer, int64_t position,
                        std::span<const Bf16> rows) override;
  absl::StatusOr<std::vector<LoadAnswer>> Decode(const std::vector<LoadQuery>& queries) override;

 private:
  GrpcLoadTarget(std::unique_ptr<client::ServingClient> client, TargetModel model, bool packed)
      : client_(std::move(client)), model_(std::move(model)), packed_(packed) {}

  std::unique_ptr<client::ServingClient> client_;
  const TargetModel model_;
  const bool packed_;
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_GRPC_LOAD_TARGET_H_
