// A UCX data-plane client in a process of its own, for ucx_plane_test and ucx_netns_test
// (the latter runs it in a second network namespace with `ip netns exec`). Prints what it
// found; exits 0 when every check passed.
//
//   ucx_peer die ADDRESS TICKET_HEX LAYER HEADS ID...   a latent call, then SIGKILL mid-call
//   ucx_peer dies TARGET                                the same, its sequences made here
//   ucx_peer check TARGET                               answers over UCX bit for bit gRPC's,
//                                                       two tenants kept apart, bad input named
//   ucx_peer drain TARGET METRICS                       a call the server drains: answered
//   ucx_peer idle METRICS                               the server's UCX plane empty (10 s)

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/dataplane/ucx_channel.h"
#include "client/loadgen/http_get.h"
#include "client/loadgen/prometheus_text.h"
#include "client/transport_hint.h"
#include "kernels/core/bfloat16.h"
#include "server/engine/model/model_config.h"
#include "tests/integration/batch_scenario.h"

namespace mlaserve::integration {
namespace {

using Plane = client::ClientOptions::DataPlane;
int failures = 0;

void Check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok   " : "FAIL ") << what << std::endl;
  if (!ok) ++failures;
}

[[noreturn]] void CallAndDie(client::UcxChannel& channel, client::DecodeBatchRequest request,
                             int64_t heads) {
  const int64_t b = request.sequences();
  std::vector<Bf16> q(static_cast<size_t>(b * heads * 576), Bf16::FromFloat(0.5f));
  request.latent = {v1::DTYPE_BF16, {b, 1, heads, 576}, q.data()};
  static client::DecodeBatchBuffers buffers(request, 512);
  std::thread call(
      [&] { channel.Decode(request, buffers.output, absl::Seconds(30)).IgnoreError(); });
  call.detach();
  absl::SleepFor(absl::Milliseconds(20));  // the call is out; the process dies under it
  raise(SIGKILL);
  std::abort();
}

int Die(int argc, char** argv) {
  if (argc < 7) return 2;
  v1::OpenDataPlaneResponse opened;
  opened.mutable_plane()->set_kind("ucx");
  opened.mutable_plane()->set_address(argv[2]);
  opened.set_ticket(absl::HexStringToBytes(argv[3]));
  auto channel = client::UcxChannel::Open(opened, "127.0.0.1");
  if (!channel.ok()) {
    std::cerr << channel.status() << "\n";
    return 1;
  }
  client::DecodeBatchRequest request;
  request.layer = std::atoi(argv[4]);
  for (int i = 6; i < argc; ++i) request.sequence_ids.push_back(argv[i]);
  CallAndDie(**channel, std::move(request), std::atoi(argv[5]));
}

std::unique_ptr<client::MlaServeClient> Connect(const std::string& target, Plane plane,
                                                const std::string& token) {
  client::ClientOptions options;
  options.data_plane = plane;
  options.bearer_token = token;
  options.timeout = absl::Seconds(20);
  auto client = client::MlaServeClient::Connect(target, options);
  if (!client::WaitForServer(*client, absl::Seconds(20), false).ok()) return nullptr;
  return client;
}

int Dies(const std::string& target) {
  absl::StatusOr<engine::ModelConfig> model =
      engine::PresetModelConfig("deepseek-v3", {.layers = 2});
  auto grpc = Connect(target, Plane::kGrpc, "alpha-token");
  if (!model.ok() || grpc == nullptr) return 1;
  Rng rng(std::random_device{}());
  BatchScenario scenario(*grpc, *model, "dies", 32, engine::QuerySpace::kLatent, 1, 0, rng);
  absl::StatusOr<v1::OpenDataPlaneResponse> ticket = grpc->OpenDataPlane("ucx", ucx::kUcxVersion);
  if (!ticket.ok()) return 1;
  auto channel = client::UcxChannel::Open(*ticket, client::HostOfTarget(target));
  if (!channel.ok()) return 1;
  client::DecodeBatchRequest request;
  request.sequence_ids = scenario.request().sequence_ids;
  CallAndDie(**channel, std::move(request), model->heads);
}

int CheckAll(const std::string& target) {
  absl::StatusOr<engine::ModelConfig> model =
      engine::PresetModelConfig("deepseek-v3", {.layers = 2});
  auto grpc = Connect(target, Plane::kGrpc, "alpha-token");
  auto ucx = Connect(target, Plane::kUcx, "alpha-token");
  if (!model.ok() || grpc == nullptr || ucx == nullptr) {
    std::cerr << "cannot reach the server at " << target << "\n";
    return 1;
  }
  Rng rng(std::random_device{}());
  for (const engine::QuerySpace space : {engine::QuerySpace::kHead, engine::QuerySpace::kLatent}) {
    const std::string tag = space == engine::QuerySpace::kHead ? "h" : "l";
    BatchScenario scenario(*grpc, *model, tag, 4, space, 1, 1, rng);
    const client::DecodeBatchRequest fp32 = scenario.WithOutput(v1::DTYPE_FP32);
    client::DecodeBatchBuffers over_ucx(fp32, scenario.width());
    const absl::Status status = ucx->DecodeBatch(fp32, over_ucx.output);
    Check(status.ok(), "a " + tag + " call over UCX: " + status.ToString());
    client::DecodeBatchBuffers over_grpc(fp32, scenario.width());
    Check(grpc->DecodeBatch(fp32, over_grpc.output).ok(), "the same call over gRPC");
    Check(over_ucx.out == over_grpc.out && over_ucx.lse == over_grpc.lse,
          "its answers bit for bit gRPC's");
  }
  // Tenants: beta's client over UCX reaches none of alpha's sequences.
  BatchScenario alphas(*grpc, *model, "t", 2, engine::QuerySpace::kLatent, 1, 0, rng);
  auto beta = Connect(target, Plane::kUcx, "beta-token");
  client::DecodeBatchBuffers buffers(alphas.request(), alphas.width());
  absl::Status status = beta->DecodeBatch(alphas.request(), buffers.output);
  Check(status.code() == absl::StatusCode::kNotFound &&
            status.message() == "packed.sequence_ids[0]: 't/0' is not a sequence",
        "another tenant's ids over UCX: " + status.ToString());
  Check(ucx->DecodeBatch(alphas.request(), buffers.output).ok(), "its own tenant's: served");
  // Bad input, named.
  absl::StatusOr<v1::OpenDataPlaneResponse> ticket = grpc->OpenDataPlane("ucx", ucx::kUcxVersion);
  Check(ticket.ok(), "a ticket");
  if (!ticket.ok()) return 1;
  const std::string host = client::HostOfTarget(target);
  client::UcxChannelOptions other;
  other.version = 9;
  auto refused = client::UcxChannel::Open(*ticket, host, other);
  Check(
      refused.status().code() == absl::StatusCode::kFailedPrecondition &&
          absl::StrContains(refused.status().message(), "version 9; this server speaks version 1"),
      "another version: " + refused.status().ToString());
  // The version is checked before the ticket is spent: the same ticket opens the plane once.
  auto channel = client::UcxChannel::Open(*ticket, host);
  Check(channel.ok(), "a fresh ticket: " + channel.status().ToString());
  if (!channel.ok()) return 1;
  auto again = client::UcxChannel::Open(*ticket, host);
  Check(again.status().code() == absl::StatusCode::kUnauthenticated,
        "a spent ticket: " + again.status().ToString());
  unsigned char header[ucx::kCallIdBytes];
  ucx::WriteCallId(5, header);
  absl::StatusOr<v1::DataPlaneAnswer> answer = (*channel)->CallRaw(
      std::string(reinterpret_cast<char*>(header), sizeof(header)), "\xff\xfe", absl::Seconds(10));
  Check(answer.ok() && answer->call_id() == 5 &&
            absl::StartsWith(answer->status().message(), "call: 2 bytes that are not"),
        "a malformed call: " + (answer.ok() ? answer->status().message() : "no answer"));
  const std::string huge((size_t{9} << 20), '\0');  // past the test's --data_plane_ucx_call_mb=8
  answer = (*channel)->CallRaw(std::string(reinterpret_cast<char*>(header), sizeof(header)), huge,
                               absl::Seconds(20));
  Check(answer.ok() && absl::StrContains(answer->status().message(), "--data_plane_ucx_call_mb"),
        "an oversize call: " + (answer.ok() ? answer->status().message() : "no answer"));
  return failures == 0 ? 0 : 1;
}

double Sample(const std::string& metrics, const std::string& name) {
  absl::StatusOr<std::string> body = loadgen::HttpGet(metrics, "/metrics", absl::Seconds(2));
  if (!body.ok()) return -1;
  absl::StatusOr<std::vector<loadgen::PrometheusSample>> samples =
      loadgen::ParsePrometheusText(*body);
  if (!samples.ok()) return -1;
  for (const auto& s : *samples) {
    if (s.name == name && s.labels == "plane=\"ucx\"") return s.value;
  }
  return -1;
}

int Drain(const std::string& target, const std::string& metrics) {
  absl::StatusOr<engine::ModelConfig> model =
      engine::PresetModelConfig("deepseek-v3", {.layers = 2});
  auto grpc = Connect(target, Plane::kGrpc, "alpha-token");
  auto ucx = Connect(target, Plane::kUcx, "alpha-token");
  if (!model.ok() || grpc == nullptr || ucx == nullptr || !ucx->UcxPlane().ok()) return 1;
  Rng rng(std::random_device{}());
  BatchScenario scenario(*grpc, *model, "drain", 48, engine::QuerySpace::kHead, 1, 0, rng);
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  absl::Status in_flight = absl::UnknownError("not run");
  std::thread call([&] { in_flight = ucx->DecodeBatch(scenario.request(), buffers.output); });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Sample(metrics, "mlaserve_data_plane_calls_in_flight") < 1 && absl::Now() < deadline) {
  }
  std::cout << "taken" << std::endl;  // the test sends SIGTERM now
  call.join();
  Check(in_flight.ok(), "the call in flight answered through the drain: " + in_flight.ToString());
  return failures == 0 ? 0 : 1;
}

int Idle(const std::string& metrics) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  double clients = -1, calls = -1, bytes = -1;
  while (absl::Now() < deadline) {
    clients = Sample(metrics, "mlaserve_data_plane_clients");
    calls = Sample(metrics, "mlaserve_data_plane_calls_in_flight");
    bytes = Sample(metrics, "mlaserve_data_plane_registered_bytes");
    if (clients == 0 && calls == 0 && bytes == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  Check(clients == 0 && calls == 0 && bytes == 0,
        absl::StrCat("the UCX plane empty: ", clients, " clients, ", calls, " calls, ", bytes,
                     " bytes in flight"));
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace mlaserve::integration

int main(int argc, char** argv) {
  using namespace mlaserve::integration;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "die") return Die(argc, argv);
  if (mode == "dies" && argc == 3) return Dies(argv[2]);
  if (mode == "check" && argc == 3) return CheckAll(argv[2]);
  if (mode == "drain" && argc == 4) return Drain(argv[2], argv[3]);
  if (mode == "idle" && argc == 3) return Idle(argv[2]);
  std::cerr << "usage: ucx_peer die|check|drain|idle ...\n";
  return 2;
}
