// MlaServeClient's data planes (docs/api.md, "Data planes"): which one a DecodeBatch takes,
// and opening them through the gRPC control plane.

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/mlaserve_client.h"
#include "common/host_id.h"
#include "common/shm_layout.h"
#include "common/status_macros.h"
#include "common/ucx_wire.h"

namespace mlaserve::client {
namespace {

using Plane = ClientOptions::DataPlane;

// A server without a plane is asked again after this (it may come back with it).
constexpr absl::Duration kAskAgain = absl::Seconds(10);

}  // namespace

std::string HostOfTarget(const std::string& target) {
  std::string host = target;
  if (const size_t scheme = host.find(":///"); scheme != std::string::npos) {
    host = host.substr(scheme + 4);
  }
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    return close == std::string::npos ? host : host.substr(1, close - 1);
  }
  const size_t colon = host.rfind(':');
  return colon == std::string::npos ? host : host.substr(0, colon);
}

absl::Status MlaServeClient::DecodeBatch(const DecodeBatchRequest& request,
                                         DecodeBatchOutput& output) {
  RETURN_IF_ERROR(CheckDecodeBatch(request));
  const Plane chosen = options_.data_plane;
  if (chosen == Plane::kGrpc) return DecodeBatchOverGrpc(request, output);
  // kAuto: shared memory on the server's host, else UCX where the server offers it and this
  // client reaches it, else gRPC; a plane that fails is left for gRPC.
  if (chosen == Plane::kShm || chosen == Plane::kAuto) {
    if (std::optional<absl::Status> done = DecodeOverShm(request, output, chosen == Plane::kShm)) {
      return *done;
    }
  }
  if (chosen == Plane::kUcx || chosen == Plane::kAuto) {
    if (std::optional<absl::Status> done = DecodeOverUcx(request, output, chosen == Plane::kUcx)) {
      return *done;
    }
  }
  return DecodeBatchOverGrpc(request, output);
}

SharedArray MlaServeClient::AllocateArray(uint64_t bytes) {
  if (options_.data_plane == Plane::kShm || options_.data_plane == Plane::kAuto) {
    if (absl::StatusOr<std::shared_ptr<ShmChannel>> plane = SharedMemoryPlane(); plane.ok()) {
      if (std::optional<SharedArray> array = (*plane)->AllocateArray(bytes)) return *array;
    }
  }
  return HeapArray(bytes);
}

std::optional<absl::Status> MlaServeClient::DecodeOverShm(const DecodeBatchRequest& request,
                                                          DecodeBatchOutput& output,
                                                          bool required) {
  // A second attempt opens the plane again after a server restart closed it.
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::shared_ptr<ShmChannel>> plane = SharedMemoryPlane();
    if (!plane.ok()) {
      if (required) return plane.status();
      return std::nullopt;
    }
    if (!(*plane)->Fits(request, output)) {
      if (required) {
        return absl::FailedPreconditionError(
            absl::StrCat("data plane: the call does not fit one of its slots (",
                         (*plane)->slot_bytes(), " bytes; raise ShmChannelOptions::region_bytes)"));
      }
      return std::nullopt;
    }
    absl::Status status = (*plane)->Decode(request, output, options_.timeout);
    if (absl::IsUnavailable(status) && (*plane)->broken()) continue;
    if (absl::IsUnavailable(status) && !required) return std::nullopt;  // gRPC's retries wait
    return status;
  }
  return std::nullopt;
}

std::optional<absl::Status> MlaServeClient::DecodeOverUcx(const DecodeBatchRequest& request,
                                                          DecodeBatchOutput& output,
                                                          bool required) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::shared_ptr<UcxChannel>> plane = UcxPlane();
    if (!plane.ok()) {
      if (required) return plane.status();
      return std::nullopt;
    }
    absl::Status status = (*plane)->Decode(request, output, options_.timeout);
    if (absl::IsUnavailable(status) && (*plane)->broken()) continue;  // a restart: open again
    if (absl::IsUnavailable(status) && !required) return std::nullopt;
    return status;
  }
  return std::nullopt;
}

absl::StatusOr<v1::OpenDataPlaneResponse> MlaServeClient::OpenDataPlane(absl::string_view kind,
                                                                        uint32_t version) {
  v1::OpenDataPlaneRequest request;
  request.set_kind(std::string(kind));
  request.set_version(version);
  v1::OpenDataPlaneResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->OpenDataPlane(&context, request, &response);
  }));
  return response;
}

absl::StatusOr<std::shared_ptr<ShmChannel>> MlaServeClient::SharedMemoryPlane() {
  std::lock_guard lock(plane_mu_);
  if (shm_ != nullptr && !shm_->broken()) return shm_;
  shm_.reset();
  if (absl::Now() < open_plane_after_) {
    return absl::FailedPreconditionError("data plane: not offered (asked again shortly)");
  }
  absl::StatusOr<std::shared_ptr<ShmChannel>> opened =
      [&]() -> absl::StatusOr<std::shared_ptr<ShmChannel>> {
    ASSIGN_OR_RETURN(v1::GetServerInfoResponse info, GetServerInfo());
    const std::string host = HostId();
    const auto plane = std::find_if(
        info.data_planes().begin(), info.data_planes().end(),
        [&](const v1::DataPlane& p) { return p.kind() == "shm" && p.host_id() == host; });
    if (plane == info.data_planes().end()) {
      return absl::FailedPreconditionError(
          "data plane: the server offers no shared-memory plane on this host");
    }
    ASSIGN_OR_RETURN(v1::OpenDataPlaneResponse ticket, OpenDataPlane("shm", shm::kShmVersion));
    ASSIGN_OR_RETURN(std::unique_ptr<ShmChannel> channel, ShmChannel::Open(ticket, options_.shm));
    return std::shared_ptr<ShmChannel>(std::move(channel));
  }();
  if (!opened.ok()) {
    open_plane_after_ = absl::Now() + kAskAgain;
    return opened.status();
  }
  shm_ = *opened;
  return shm_;
}

absl::StatusOr<std::shared_ptr<UcxChannel>> MlaServeClient::UcxPlane() {
  std::lock_guard lock(plane_mu_);
  if (ucx_ != nullptr && !ucx_->broken()) return ucx_;
  ucx_.reset();
  if (absl::Now() < open_ucx_after_) {
    return absl::FailedPreconditionError(absl::StrCat("data plane: no UCX plane the last time (",
                                                      open_ucx_why_, "); asked again shortly"));
  }
  absl::StatusOr<std::shared_ptr<UcxChannel>> opened =
      [&]() -> absl::StatusOr<std::shared_ptr<UcxChannel>> {
    ASSIGN_OR_RETURN(v1::GetServerInfoResponse info, GetServerInfo());
    const bool offered = std::any_of(info.data_planes().begin(), info.data_planes().end(),
                                     [](const v1::DataPlane& p) { return p.kind() == "ucx"; });
    if (!offered) {
      return absl::FailedPreconditionError("data plane: the server offers no UCX plane");
    }
    ASSIGN_OR_RETURN(v1::OpenDataPlaneResponse ticket, OpenDataPlane("ucx", ucx::kUcxVersion));
    ASSIGN_OR_RETURN(std::unique_ptr<UcxChannel> channel,
                     UcxChannel::Open(ticket, server_host_, options_.ucx));
    return std::shared_ptr<UcxChannel>(std::move(channel));
  }();
  if (!opened.ok()) {
    open_ucx_after_ = absl::Now() + kAskAgain;
    open_ucx_why_ = std::string(opened.status().message());
    return opened.status();
  }
  ucx_ = *opened;
  return ucx_;
}

}  // namespace mlaserve::client
