#ifndef MLASERVE_CLIENT_MLASERVE_CLIENT_H_
#define MLASERVE_CLIENT_MLASERVE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/dataplane/shm_channel.h"
#include "client/dataplane/ucx_channel.h"
#include "client/serving_client.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "mlaserve/v1/mlaserve.grpc.pb.h"

namespace mlaserve::client {

// TLS to the server, as PEM text. Empty ca_pem: plaintext. cert_pem and key_pem (both or
// neither): the client's certificate, for servers that require one (mutual TLS).
struct ClientTls {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // The name the server's certificate must carry when it differs from the target's host.
  std::string server_name;

  bool enabled() const { return !ca_pem.empty(); }
};

// Reads the PEM files of a ClientTls; `cert_file` and `key_file` may both be empty.
// INVALID_ARGUMENT naming the file that cannot be read or the one missing from a pair.
absl::StatusOr<ClientTls> LoadClientTls(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file);

struct ClientOptions {
  // Budget of one call, all retries included.
  absl::Duration timeout = absl::Seconds(30);
  // Attempts per call when the server answers UNAVAILABLE (draining, queue full, not yet
  // listening), with exponential backoff and jitter between them. Every call of this API
  // is idempotent (client-chosen ids; a Decode's append through its position), so all retry.
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(25);
  absl::Duration max_backoff = absl::Seconds(1);
  // AppendKv splits rows into chunks of at most this many bytes (at least one row each),
  // far below gRPC's default 4 MiB receive limit.
  int64_t append_chunk_bytes = int64_t{1} << 20;
  // Decode splits its queries into consecutive calls whose queries (q and appended rows)
  // stay within this many bytes (at least one query each): half the server's default 64 MiB
  // message limit, the other half for the framing and retries' growth. 0: never split.
  int64_t decode_call_bytes = int64_t{32} << 20;
  ClientTls tls;
  // The tenant's bearer token, sent as `authorization: Bearer TOKEN` on every call, for a
  // server with --auth_tokens_file (docs/api.md, "Tenants"); empty: none. Over plaintext it
  // travels in the clear: use it with TLS.
  std::string bearer_token;
  // Where DecodeBatch goes (docs/api.md, "Data planes"): kAuto takes the server's same-host
  // data plane when it offers one on this host, else its UCX plane when it offers one and
  // this client reaches it, and falls back to gRPC otherwise (and for a call too large for a
  // slot, or refused UNAVAILABLE, which gRPC's retries then wait out); kGrpc stays on gRPC;
  // kShm and kUcx need their plane (calls fail when it cannot be opened).
  enum class DataPlane { kAuto, kGrpc, kShm, kUcx };
  DataPlane data_plane = DataPlane::kAuto;
  ShmChannelOptions shm;
  UcxChannelOptions ucx;
};

// One KV append: rows [n][dl + dr] for one layer of one sequence, starting at
// start_position.
struct KvAppend {
  std::string sequence_id;
  int layer = 0;
  int64_t start_position = 0;
  v1::Tensor rows;
  // Instead of `rows` (when count > 0): rows already in the FP8 form, for an FP8 sequence
  // (QuantizeFp8Rows makes them).
  v1::Fp8Rows fp8_rows;
};

// One decode query's answer as fp32 host arrays.
struct DecodeOutput {
  std::vector<float> out;          // [sq][heads][width]
  std::vector<int64_t> out_shape;  // {sq, heads, width}
  std::vector<float> lse;          // [sq][heads], natural log; -inf where no key was seen
  v1::DecodePlan plan;
};

// Builders for the two kinds of query.
v1::DecodeQuery HeadSpaceQuery(std::string sequence_id, int layer, int sq, v1::Tensor q_nope,
                               v1::Tensor q_pe);
v1::DecodeQuery LatentQuery(std::string sequence_id, int layer, int sq, v1::Tensor q_latent);
// Makes `query` append `rows` at `position` before attending.
void AppendBeforeDecode(v1::DecodeQuery& query, v1::Tensor rows, int64_t position);

// A DecodeStream: requests go out with ids, answers come back in completion order. One
// thread may Send while another Receives.
class DecodeStream {
 public:
  DecodeStream(std::unique_ptr<grpc::ClientContext> context, v1::MlaServe::Stub& stub);

  // False if the stream is broken (then Receive and Finish tell why).
  bool Send(uint64_t request_id, const v1::DecodeRequest& request, uint64_t timeout_us = 0);
  // Tells the server no more requests follow; it ends the stream after the last answer.
  bool WritesDone();
  // The next answer; nullopt once the stream has ended (then call Finish).
  std::optional<v1::DecodeStreamResponse> Receive();
  // The stream's final status, once Receive returned nullopt.
  absl::Status Finish();
  // Abandons the stream (in-flight requests are cancelled on the server).
  void Cancel() { context_->TryCancel(); }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeStreamRequest, v1::DecodeStreamResponse>>
      stream_;
};

// A typed, retrying client of mlaserve.v1.MlaServe. Thread-safe; reuse one per process (it
// holds one channel).
class MlaServeClient final : public ServingClient {
 public:
  // A channel to `target` ("127.0.0.1:50051"), plaintext or with options.tls, that accepts
  // answers of any size.
  static std::unique_ptr<MlaServeClient> Connect(const std::string& target,
                                                 ClientOptions options = {});
  MlaServeClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // Waits until the channel is connected (or `timeout` passes).
  // The channel, for other services on the same server (grpc.health.v1: health_check.h).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  bool WaitForConnected(absl::Duration timeout);

  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo() override;

  // `latent` [layers][tokens][dl + dr]; parent_id empty for a root prefix. `kv_dtype` unset:
  // the parent's format, or the server's default.
  absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                              const v1::Tensor& latent,
                              v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED) override;
  absl::Status ReleasePrefix(absl::string_view prefix_id) override;

  absl::StatusOr<v1::Sequence> CreateSequence(
      absl::string_view sequence_id, absl::string_view prefix_id = "",
      v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED) override;
  absl::StatusOr<v1::Sequence> ForkSequence(absl::string_view source_id, absl::string_view new_id);
  absl::Status ReleaseSequence(absl::string_view sequence_id) override;
  absl::StatusOr<v1::Sequence> GetSequence(absl::string_view sequence_id);
  // Admin listings, one page each (admin.proto): `page_size` 0 asks for the server's
  // default; pass the answer's next_page_token back for the next page.
  absl::StatusOr<v1::ListPrefixesResponse> ListPrefixes(int page_size,
                                                        const std::string& page_token = "");
  absl::StatusOr<v1::ListSequencesResponse> ListSequences(int page_size,
                                                          const std::string& page_token = "",
                                                          const std::string& prefix_id = "");
  // Every page of ListSequences, in id order (for tools; a listing is a pass over the store).
  absl::StatusOr<std::vector<v1::SequenceSummary>> ListAllSequences(
      const std::string& prefix_id = "");
  absl::StatusOr<v1::GetStatsResponse> GetStats();
  // Moves sequences from this server to another (admin.proto); never retried (a move is not
  // idempotent: what moved is gone here), bounded by `timeout`.
  absl::StatusOr<v1::MigrateSequencesResponse> MigrateSequences(
      const v1::MigrateSequencesRequest& request, absl::Duration timeout);

  // Streams the appends in chunks of at most options.append_chunk_bytes. On UNAVAILABLE the
  // whole stream is retried (rows already appended are skipped by the server).
  absl::Status AppendKv(std::span<const KvAppend> appends) override;
  absl::Status AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                        const v1::Tensor& rows);
  absl::Status AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                        const v1::Fp8Rows& fp8_rows);

  // The queries' answers as fp32 host arrays in query order: one Decode call, or several in
  // order when the queries' bytes exceed options.decode_call_bytes (the first error stops it;
  // the calls before it are answered and their appends applied, and a retry repeats them
  // without effect, as appends are idempotent by position).
  absl::StatusOr<std::vector<DecodeOutput>> Decode(std::vector<v1::DecodeQuery> queries,
                                                   v1::DType output_dtype = v1::DTYPE_BF16);
  // The packed form, in consecutive calls of at most options.decode_call_bytes of queries
  // and rows (at least one sequence each), answered into the caller's memory.
  absl::Status DecodeBatch(const DecodeBatchRequest& request, DecodeBatchOutput& output) override;
  // A block of the same-host plane's region where that plane is the client's (kShm, or kAuto
  // on the server's host) and its array area has room (ShmChannelOptions::array_bytes);
  // ordinary memory otherwise.
  SharedArray AllocateArray(uint64_t bytes) override;
  // The call as it is on the wire, for callers that build requests themselves.
  absl::StatusOr<v1::DecodeResponse> DecodeRaw(const v1::DecodeRequest& request) override;
  // Same, with a deadline of its own instead of options.timeout.
  absl::StatusOr<v1::DecodeResponse> DecodeRaw(const v1::DecodeRequest& request,
                                               absl::Duration timeout);

  // A stream whose whole life is bounded by `timeout` (infinite by default: a worker's
  // stream lives as long as the worker).
  std::unique_ptr<DecodeStream> OpenDecodeStream(absl::Duration timeout = absl::InfiniteDuration());

  // A ticket for a data plane of `kind` (FAILED_PRECONDITION if the server has none).
  absl::StatusOr<v1::OpenDataPlaneResponse> OpenDataPlane(absl::string_view kind, uint32_t version);
  // The same-host plane DecodeBatch uses, opened on first use (and again after a restart);
  // FAILED_PRECONDITION when the server offers none on this host.
  absl::StatusOr<std::shared_ptr<ShmChannel>> SharedMemoryPlane();
  // The cross-host plane DecodeBatch uses, opened on first use (and again after a restart);
  // FAILED_PRECONDITION when the server offers none, UNAVAILABLE when it cannot be reached.
  absl::StatusOr<std::shared_ptr<UcxChannel>> UcxPlane();

  v1::MlaServe::Stub& stub() { return *stub_; }

 private:
  // DecodeBatch over gRPC's packed form.
  absl::Status DecodeBatchOverGrpc(const DecodeBatchRequest& request, DecodeBatchOutput& output);
  // DecodeBatch over a data plane: its status, or nothing when the call should go over gRPC
  // instead (no plane, or one that failed, and the plane not `required`).
  std::optional<absl::Status> DecodeOverShm(const DecodeBatchRequest& request,
                                            DecodeBatchOutput& output, bool required);
  std::optional<absl::Status> DecodeOverUcx(const DecodeBatchRequest& request,
                                            DecodeBatchOutput& output, bool required);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::MlaServe::Stub> stub_;
  const ClientOptions options_;
  std::mutex plane_mu_;
  std::shared_ptr<ShmChannel> shm_;                     // guarded by plane_mu_
  absl::Time open_plane_after_ = absl::InfinitePast();  // guarded by plane_mu_
  std::shared_ptr<UcxChannel> ucx_;                     // guarded by plane_mu_
  absl::Time open_ucx_after_ = absl::InfinitePast();    // guarded by plane_mu_
  std::string open_ucx_why_;                            // guarded by plane_mu_
  // The host of the target Connect was given, for a plane advertised on a wildcard address.
  std::string server_host_ = "127.0.0.1";
};

// The host of a gRPC target ("10.0.0.1:50051", "[::1]:50051", "dns:///name:50051").
std::string HostOfTarget(const std::string& target);

// The client's one grpc::Status -> absl::Status conversion (same code numbers).
absl::Status FromGrpcStatus(const grpc::Status& status);

// Answers of a wire DecodeResponse as fp32 host arrays.
absl::StatusOr<std::vector<DecodeOutput>> ToDecodeOutputs(const v1::DecodeResponse& response);

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_MLASERVE_CLIENT_H_
