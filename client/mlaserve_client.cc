#include "client/mlaserve_client.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tensor_helpers.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace mlaserve::client {
namespace {

void Authorize(const ClientOptions& options, grpc::ClientContext& context) {
  if (!options.bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options.bearer_token);
  }
}

// Runs `attempt(context)` until it is not UNAVAILABLE, attempts run out, or the next
// backoff would pass the call's deadline. Each attempt gets the remaining time.
template <typename Attempt>
absl::Status CallWithRetry(const ClientOptions& options, absl::Duration timeout, Attempt attempt) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::BitGen jitter;
  absl::Duration backoff = options.initial_backoff;
  for (int attempts = 1;; ++attempts) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    Authorize(options, context);
    const grpc::Status status = attempt(context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempts >= options.max_attempts) {
      return FromGrpcStatus(status);
    }
    // "Full jitter" halved: clients that failed together do not retry together.
    const absl::Duration sleep = backoff * absl::Uniform(jitter, 0.5, 1.0);
    if (absl::Now() + sleep >= deadline) return FromGrpcStatus(status);
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, options.max_backoff);
  }
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::DecodeQuery HeadSpaceQuery(std::string sequence_id, int layer, int sq, v1::Tensor q_nope,
                               v1::Tensor q_pe) {
  v1::DecodeQuery query;
  query.set_sequence_id(std::move(sequence_id));
  query.set_layer(layer);
  query.set_sq(sq);
  *query.mutable_head()->mutable_q_nope() = std::move(q_nope);
  *query.mutable_head()->mutable_q_pe() = std::move(q_pe);
  return query;
}

v1::DecodeQuery LatentQuery(std::string sequence_id, int layer, int sq, v1::Tensor q_latent) {
  v1::DecodeQuery query;
  query.set_sequence_id(std::move(sequence_id));
  query.set_layer(layer);
  query.set_sq(sq);
  *query.mutable_latent() = std::move(q_latent);
  return query;
}

void AppendBeforeDecode(v1::DecodeQuery& query, v1::Tensor rows, int64_t position) {
  *query.mutable_append_rows() = std::move(rows);
  query.set_append_position(position);
}

absl::StatusOr<std::vector<DecodeOutput>> ToDecodeOutputs(const v1::DecodeResponse& response) {
  std::vector<DecodeOutput> outputs;
  outputs.reserve(response.results_size());
  for (const v1::DecodeResult& result : response.results()) {
    DecodeOutput output;
    ASSIGN_OR_RETURN(output.out, TensorToFloats(result.out()));
    output.out_shape.assign(result.out().shape().begin(), result.out().shape().end());
    ASSIGN_OR_RETURN(output.lse, TensorToFloats(result.lse()));
    output.plan = result.plan();
    outputs.push_back(std::move(output));
  }
  return outputs;
}

// --- DecodeStream -------------------------------------------------------------------------

DecodeStream::DecodeStream(std::unique_ptr<grpc::ClientContext> context, v1::MlaServe::Stub& stub)
    : context_(std::move(context)), stream_(stub.DecodeStream(context_.get())) {}

bool DecodeStream::Send(uint64_t request_id, const v1::DecodeRequest& request,
                        uint64_t timeout_us) {
  v1::DecodeStreamRequest message;
  message.set_request_id(request_id);
  *message.mutable_request() = request;
  message.set_timeout_us(timeout_us);
  return stream_->Write(message);
}

bool DecodeStream::WritesDone() { return stream_->WritesDone(); }

std::optional<v1::DecodeStreamResponse> DecodeStream::Receive() {
  v1::DecodeStreamResponse response;
  if (!stream_->Read(&response)) return std::nullopt;
  return response;
}

absl::Status DecodeStream::Finish() { return FromGrpcStatus(stream_->Finish()); }

// --- MlaServeClient -----------------------------------------------------------------------

absl::StatusOr<ClientTls> LoadClientTls(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file) {
  auto read = [](absl::string_view what, const std::string& path) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS ", what, " file '", path, "' cannot be read"));
    }
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
  };
  if (ca_file.empty()) return absl::InvalidArgumentError("TLS needs a CA file");
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS client certificate and key go together: give both files or neither");
  }
  ClientTls tls;
  ASSIGN_OR_RETURN(tls.ca_pem, read("CA", ca_file));
  if (!cert_file.empty()) {
    ASSIGN_OR_RETURN(tls.cert_pem, read("certificate", cert_file));
    ASSIGN_OR_RETURN(tls.key_pem, read("key", key_file));
  }
  return tls;
}

std::unique_ptr<MlaServeClient> MlaServeClient::Connect(const std::string& target,
                                                        ClientOptions options) {
  grpc::ChannelArguments arguments;
  // A Decode answer for a large batch exceeds gRPC's default 4 MiB receive limit; the server
  // is trusted to bound what it sends.
  arguments.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.enabled()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls.ca_pem;
    ssl.pem_cert_chain = options.tls.cert_pem;
    ssl.pem_private_key = options.tls.key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls.server_name.empty()) {
      arguments.SetSslTargetNameOverride(options.tls.server_name);
    }
  }
  auto client = std::make_unique<MlaServeClient>(
      grpc::CreateCustomChannel(target, credentials, arguments), options);
  client->server_host_ = HostOfTarget(target);
  return client;
}

MlaServeClient::MlaServeClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)), stub_(v1::MlaServe::NewStub(channel_)), options_(options) {}

bool MlaServeClient::WaitForConnected(absl::Duration timeout) {
  return channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<v1::GetServerInfoResponse> MlaServeClient::GetServerInfo() {
  v1::GetServerInfoResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  }));
  return response;
}

absl::Status MlaServeClient::RegisterPrefix(absl::string_view prefix_id,
                                            absl::string_view parent_id, const v1::Tensor& latent,
                                            v1::KvDtype kv_dtype) {
  v1::RegisterPrefixRequest request;
  request.set_prefix_id(std::string(prefix_id));
  request.set_parent_id(std::string(parent_id));
  *request.mutable_latent() = latent;
  request.set_kv_dtype(kv_dtype);
  v1::RegisterPrefixResponse response;
  return CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->RegisterPrefix(&context, request, &response);
  });
}

absl::Status MlaServeClient::ReleasePrefix(absl::string_view prefix_id) {
  v1::ReleasePrefixRequest request;
  request.set_prefix_id(std::string(prefix_id));
  v1::ReleasePrefixResponse response;
  return CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->ReleasePrefix(&context, request, &response);
  });
}

absl::StatusOr<v1::Sequence> MlaServeClient::CreateSequence(absl::string_view sequence_id,
                                                            absl::string_view prefix_id,
                                                            v1::KvDtype kv_dtype) {
  v1::CreateSequenceRequest request;
  request.set_sequence_id(std::string(sequence_id));
  request.set_prefix_id(std::string(prefix_id));
  request.set_kv_dtype(kv_dtype);
  v1::CreateSequenceResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->CreateSequence(&context, request, &response);
  }));
  return response.sequence();
}

absl::StatusOr<v1::Sequence> MlaServeClient::ForkSequence(absl::string_view source_id,
                                                          absl::string_view new_id) {
  v1::ForkSequenceRequest request;
  request.set_source_sequence_id(std::string(source_id));
  request.set_new_sequence_id(std::string(new_id));
  v1::ForkSequenceResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->ForkSequence(&context, request, &response);
  }));
  return response.sequence();
}

absl::Status MlaServeClient::ReleaseSequence(absl::string_view sequence_id) {
  v1::ReleaseSequenceRequest request;
  request.set_sequence_id(std::string(sequence_id));
  v1::ReleaseSequenceResponse response;
  return CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->ReleaseSequence(&context, request, &response);
  });
}

absl::StatusOr<v1::Sequence> MlaServeClient::GetSequence(absl::string_view sequence_id) {
  v1::GetSequenceRequest request;
  request.set_sequence_id(std::string(sequence_id));
  v1::GetSequenceResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->GetSequence(&context, request, &response);
  }));
  return response.sequence();
}

absl::StatusOr<v1::ListPrefixesResponse> MlaServeClient::ListPrefixes(
    int page_size, const std::string& page_token) {
  v1::ListPrefixesRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  v1::ListPrefixesResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->ListPrefixes(&context, request, &response);
  }));
  return response;
}

absl::StatusOr<v1::ListSequencesResponse> MlaServeClient::ListSequences(
    int page_size, const std::string& page_token, const std::string& prefix_id) {
  v1::ListSequencesRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  request.set_prefix_id(prefix_id);
  v1::ListSequencesResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->ListSequences(&context, request, &response);
  }));
  return response;
}

absl::StatusOr<std::vector<v1::SequenceSummary>> MlaServeClient::ListAllSequences(
    const std::string& prefix_id) {
  std::vector<v1::SequenceSummary> sequences;
  std::string token;
  do {
    ASSIGN_OR_RETURN(v1::ListSequencesResponse page, ListSequences(1000, token, prefix_id));
    for (v1::SequenceSummary& summary : *page.mutable_sequences()) {
      sequences.push_back(std::move(summary));
    }
    token = page.next_page_token();
  } while (!token.empty());
  return sequences;
}

absl::StatusOr<v1::GetStatsResponse> MlaServeClient::GetStats() {
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    return stub_->GetStats(&context, request, &response);
  }));
  return response;
}

absl::StatusOr<v1::MigrateSequencesResponse> MlaServeClient::MigrateSequences(
    const v1::MigrateSequencesRequest& request, absl::Duration timeout) {
  ClientOptions once = options_;
  once.max_attempts = 1;
  v1::MigrateSequencesResponse response;
  RETURN_IF_ERROR(CallWithRetry(once, timeout, [&](grpc::ClientContext& context) {
    return stub_->MigrateSequences(&context, request, &response);
  }));
  return response;
}

absl::Status MlaServeClient::AppendKv(std::span<const KvAppend> appends) {
  // Chunk once; every attempt streams the same chunks.
  std::vector<v1::AppendKvChunk> chunks;
  for (const KvAppend& append : appends) {
    if (append.fp8_rows.count() > 0) {
      // Whole FP8 rows per chunk; a malformed payload goes whole for the server to name.
      const int64_t count = append.fp8_rows.count();
      const int64_t bytes = static_cast<int64_t>(append.fp8_rows.data().size());
      const int64_t row_bytes = bytes % count == 0 ? bytes / count : 0;
      const int64_t per_chunk =
          row_bytes == 0 ? count : std::max<int64_t>(1, options_.append_chunk_bytes / row_bytes);
      for (int64_t first = 0; first < count; first += per_chunk) {
        const int64_t n = std::min(per_chunk, count - first);
        v1::AppendKvChunk& chunk = chunks.emplace_back();
        chunk.set_sequence_id(append.sequence_id);
        chunk.set_layer(append.layer);
        chunk.set_start_position(append.start_position + first);
        v1::Fp8Rows* piece = chunk.mutable_fp8_rows();
        piece->set_count(n);
        piece->set_data(row_bytes == 0
                            ? append.fp8_rows.data()
                            : append.fp8_rows.data().substr(first * row_bytes, n * row_bytes));
      }
      continue;
    }
    const int64_t rows = append.rows.shape_size() > 0 ? append.rows.shape(0) : 0;
    const int64_t row_bytes = rows > 0 ? static_cast<int64_t>(append.rows.data().size()) / rows : 0;
    if (rows == 0 || row_bytes == 0 ||
        row_bytes * rows != static_cast<int64_t>(append.rows.data().size())) {
      // Not splittable: send it whole and let the server name what is wrong.
      v1::AppendKvChunk& chunk = chunks.emplace_back();
      chunk.set_sequence_id(append.sequence_id);
      chunk.set_layer(append.layer);
      chunk.set_start_position(append.start_position);
      *chunk.mutable_rows() = append.rows;
      continue;
    }
    const int64_t rows_per_chunk = std::max<int64_t>(1, options_.append_chunk_bytes / row_bytes);
    for (int64_t first = 0; first < rows; first += rows_per_chunk) {
      const int64_t count = std::min(rows_per_chunk, rows - first);
      v1::AppendKvChunk& chunk = chunks.emplace_back();
      chunk.set_sequence_id(append.sequence_id);
      chunk.set_layer(append.layer);
      chunk.set_start_position(append.start_position + first);
      v1::Tensor* piece = chunk.mutable_rows();
      piece->set_dtype(append.rows.dtype());
      piece->mutable_shape()->CopyFrom(append.rows.shape());
      piece->set_shape(0, count);
      piece->set_data(append.rows.data().substr(first * row_bytes, count * row_bytes));
    }
  }
  v1::AppendKvResponse response;
  return CallWithRetry(options_, options_.timeout, [&](grpc::ClientContext& context) {
    std::unique_ptr<grpc::ClientWriter<v1::AppendKvChunk>> writer =
        stub_->AppendKv(&context, &response);
    for (const v1::AppendKvChunk& chunk : chunks) {
      if (!writer->Write(chunk)) break;  // the server ended the call; Finish says why
    }
    writer->WritesDone();
    return writer->Finish();
  });
}

absl::Status MlaServeClient::AppendKv(absl::string_view sequence_id, int layer,
                                      int64_t start_position, const v1::Tensor& rows) {
  const KvAppend append{std::string(sequence_id), layer, start_position, rows, {}};
  return AppendKv(std::span<const KvAppend>(&append, 1));
}

absl::Status MlaServeClient::AppendKv(absl::string_view sequence_id, int layer,
                                      int64_t start_position, const v1::Fp8Rows& fp8_rows) {
  const KvAppend append{std::string(sequence_id), layer, start_position, {}, fp8_rows};
  return AppendKv(std::span<const KvAppend>(&append, 1));
}

absl::StatusOr<std::vector<DecodeOutput>> MlaServeClient::Decode(
    std::vector<v1::DecodeQuery> queries, v1::DType output_dtype) {
  std::vector<DecodeOutput> outputs;
  outputs.reserve(queries.size());
  v1::DecodeRequest request;
  request.set_output_dtype(output_dtype);
  int64_t request_bytes = 0;
  auto call = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(v1::DecodeResponse response, DecodeRaw(request));
    ASSIGN_OR_RETURN(std::vector<DecodeOutput> answered, ToDecodeOutputs(response));
    for (DecodeOutput& output : answered) outputs.push_back(std::move(output));
    request.clear_queries();
    request_bytes = 0;
    return absl::OkStatus();
  };
  const bool split = options_.decode_call_bytes > 0;
  for (v1::DecodeQuery& query : queries) {
    // Sized only when a limit applies: the serialization sizes every query again.
    const int64_t bytes = split ? static_cast<int64_t>(query.ByteSizeLong()) : 0;
    if (split && request.queries_size() > 0 && request_bytes + bytes > options_.decode_call_bytes) {
      RETURN_IF_ERROR(call());
    }
    *request.add_queries() = std::move(query);
    request_bytes += bytes;
  }
  if (request.queries_size() > 0 || outputs.empty()) RETURN_IF_ERROR(call());
  return outputs;
}

absl::Status MlaServeClient::DecodeBatchOverGrpc(const DecodeBatchRequest& request,
                                                 DecodeBatchOutput& output) {
  output.plans.clear();
  const int64_t sequences = request.sequences();
  const size_t per_sequence = BatchBytes(request, 0, 1);
  int64_t per_call = sequences;
  if (options_.decode_call_bytes > 0 && per_sequence > 0) {
    per_call = std::clamp<int64_t>(options_.decode_call_bytes / static_cast<int64_t>(per_sequence),
                                   1, sequences);
  }
  for (int64_t first = 0; first < sequences; first += per_call) {
    const int64_t count = std::min(per_call, sequences - first);
    ASSIGN_OR_RETURN(v1::DecodeResponse response,
                     DecodeRaw(PackedDecodeRequest(request, first, count)));
    RETURN_IF_ERROR(ReadBatchAnswers(request, response, first, count, output));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DecodeResponse> MlaServeClient::DecodeRaw(const v1::DecodeRequest& request) {
  return DecodeRaw(request, options_.timeout);
}

absl::StatusOr<v1::DecodeResponse> MlaServeClient::DecodeRaw(const v1::DecodeRequest& request,
                                                             absl::Duration timeout) {
  v1::DecodeResponse response;
  RETURN_IF_ERROR(CallWithRetry(options_, timeout, [&](grpc::ClientContext& context) {
    response.Clear();
    return stub_->Decode(&context, request, &response);
  }));
  return response;
}

std::unique_ptr<DecodeStream> MlaServeClient::OpenDecodeStream(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  Authorize(options_, *context);
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return std::make_unique<DecodeStream>(std::move(context), *stub_);
}

}  // namespace mlaserve::client
