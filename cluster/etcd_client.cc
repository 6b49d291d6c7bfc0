#include "cluster/etcd_client.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/host_port.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace mlaserve::cluster {
namespace {

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("etcd ", what, ": ", status.error_message()));
}

// True for "a.b.c.d:port", which gRPC's ipv4: scheme can list several of.
bool IsIpv4HostPort(const std::string& endpoint) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(endpoint, "--etcd_endpoints");
  in_addr address{};
  return parsed.ok() && inet_pton(AF_INET, parsed->host.c_str(), &address) == 1;
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  if (in) contents << in.rdbuf();
  if (!in || contents.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' cannot be read or holds no PEM block"));
  }
  return contents.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd_cert, etcd_key: a client certificate and its key go together");
  }
  if (ca_file.empty()) {
    if (!cert_file.empty()) {
      return absl::InvalidArgumentError("etcd_cert: needs --etcd_ca (TLS towards etcd)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem("etcd_ca", ca_file);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("etcd_cert", cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("etcd_key", key_file);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const std::vector<std::string>& endpoints,
    std::shared_ptr<grpc::ChannelCredentials> credentials, absl::Duration call_timeout) {
  if (endpoints.empty()) return absl::InvalidArgumentError("etcd_endpoints: none given");
  for (const std::string& endpoint : endpoints) {
    if (endpoint.empty() || endpoint.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd_endpoints: '", endpoint, "' is not host:port"));
    }
  }
  bool all_ipv4 = true;
  for (const std::string& endpoint : endpoints) all_ipv4 &= IsIpv4HostPort(endpoint);
  const std::string target = all_ipv4 ? absl::StrCat("ipv4:", absl::StrJoin(endpoints, ","))
                                      : absl::StrCat("dns:///", endpoints.front());
  grpc::ChannelArguments args;
  // A call to a member that went away fails fast and the next one tries the others.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // A watch has no deadline; pings find an etcd that went silent (etcd permits one every
  // 5 s by default, --grpc-keepalive-min-time).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  auto channel = grpc::CreateCustomChannel(target, std::move(credentials), args);
  return std::unique_ptr<EtcdClient>(new EtcdClient(target, std::move(channel), call_timeout));
}

EtcdClient::EtcdClient(std::string target, std::shared_ptr<grpc::Channel> channel,
                       absl::Duration call_timeout)
    : target_(std::move(target)),
      channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      watch_(etcdserverpb::Watch::NewStub(channel_)),
      call_timeout_(call_timeout) {}

void EtcdClient::Prepare(grpc::ClientContext& context) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  grpc::ClientContext context;
  Prepare(context);
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
  etcdserverpb::LeaseGrantResponse response;
  if (absl::Status status =
          FromGrpc(lease_->LeaseGrant(&context, request, &response), "LeaseGrant");
      !status.ok()) {
    return status;
  }
  if (!response.error().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd LeaseGrant: ", response.error()));
  }
  return response.id();
}

absl::Status EtcdClient::KeepAlive(int64_t lease) {
  grpc::ClientContext context;
  Prepare(context);
  auto stream = lease_->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool answered = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  context.TryCancel();
  const grpc::Status finished = stream->Finish();
  if (!answered) {
    return finished.ok() ? absl::UnavailableError("etcd LeaseKeepAlive: no answer")
                         : FromGrpc(finished, "LeaseKeepAlive");
  }
  // etcd answers a lease it does not know (expired, revoked) with TTL 0.
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  grpc::ClientContext context;
  Prepare(context);
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return FromGrpc(lease_->LeaseRevoke(&context, request, &response), "LeaseRevoke");
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  grpc::ClientContext context;
  Prepare(context);
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  return FromGrpc(kv_->Put(&context, request, &response), "Put");
}

absl::Status EtcdClient::Delete(const std::string& key) {
  grpc::ClientContext context;
  Prepare(context);
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  etcdserverpb::DeleteRangeResponse response;
  return FromGrpc(kv_->DeleteRange(&context, request, &response), "DeleteRange");
}

absl::StatusOr<bool> EtcdClient::PutIfUnchangedSince(
    const std::string& guard, int64_t revision,
    const std::vector<std::pair<std::string, std::string>>& puts, int64_t lease) {
  grpc::ClientContext context;
  Prepare(context);
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare& compare = *request.add_compare();
  compare.set_key(guard);
  compare.set_target(etcdserverpb::Compare::MOD);
  compare.set_result(etcdserverpb::Compare::LESS);
  // An absent key's mod revision is 0, which is less than any revision + 1.
  compare.set_mod_revision(revision + 1);
  auto put = [&request](const std::string& key, const std::string& value, int64_t on_lease) {
    etcdserverpb::PutRequest& p = *request.add_success()->mutable_request_put();
    p.set_key(key);
    p.set_value(value);
    p.set_lease(on_lease);
  };
  for (const auto& [key, value] : puts) put(key, value, lease);
  put(guard, absl::StrCat(revision), 0);
  etcdserverpb::TxnResponse response;
  if (absl::Status status = FromGrpc(kv_->Txn(&context, request, &response), "Txn"); !status.ok()) {
    return status;
  }
  return response.succeeded();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> EtcdClient::GetPrefix(
    const std::string& prefix) {
  absl::StatusOr<PrefixRead> read = ReadPrefix(prefix);
  if (!read.ok()) return read.status();
  return std::move(read->pairs);
}

absl::StatusOr<EtcdClient::PrefixRead> EtcdClient::ReadPrefix(const std::string& prefix) {
  grpc::ClientContext context;
  Prepare(context);
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  request.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  request.set_sort_target(etcdserverpb::RangeRequest::KEY);
  etcdserverpb::RangeResponse response;
  if (absl::Status status = FromGrpc(kv_->Range(&context, request, &response), "Range");
      !status.ok()) {
    return status;
  }
  PrefixRead read;
  read.revision = response.header().revision();
  read.pairs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) read.pairs.emplace_back(kv.key(), kv.value());
  return read;
}

absl::Status EtcdClient::WatchPrefix(const std::string& prefix, int64_t start_revision,
                                     grpc::ClientContext& context,
                                     const std::function<void(const WatchEvent&)>& on_event) {
  auto stream = watch_->Watch(&context);
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest& create = *request.mutable_create_request();
  create.set_key(prefix);
  create.set_range_end(PrefixRangeEnd(prefix));
  create.set_start_revision(start_revision);
  if (!stream->Write(request)) return FromGrpc(stream->Finish(), "Watch");
  etcdserverpb::WatchResponse response;
  while (stream->Read(&response)) {
    // A compacted start revision or a cancel from etcd ends this watch; the caller reads the
    // prefix again.
    if (response.compact_revision() != 0 || response.canceled()) {
      context.TryCancel();
      stream->Finish();
      return absl::AbortedError(absl::StrCat(
          "etcd Watch ended by etcd: ",
          response.cancel_reason().empty() ? "revision compacted" : response.cancel_reason()));
    }
    for (const mvccpb::Event& event : response.events()) {
      on_event({event.type() == mvccpb::Event::DELETE, event.kv().key(), event.kv().value()});
    }
  }
  return FromGrpc(stream->Finish(), "Watch");
}

}  // namespace mlaserve::cluster
