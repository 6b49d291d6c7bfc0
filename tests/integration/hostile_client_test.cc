// What a hostile or careless client tried on the landed server (issue 13's outside client),
// each held to a test: corrupt messages, a reader that never reads, oversized ids, a second
// server on a served port, idle streams at shutdown.

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/message.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;

constexpr int kWidth = 576;
constexpr int kHeads = 16;

// Bytes that are no protobuf message: field 1, length-delimited, with a varint length that
// never ends.
const std::string kGarbage("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11);

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

template <typename Message>
grpc::ByteBuffer ToBuffer(const Message& message) {
  return ToBuffer(message.SerializeAsString());
}

// One call of any method with raw bytes on the wire, driven synchronously: what a client
// with its own (or a broken) serializer sends.
class RawCall {
 public:
  RawCall(const std::string& target, const std::string& method)
      : RawCall(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()), method) {}
  RawCall(std::shared_ptr<grpc::Channel> channel, const std::string& method)
      : channel_(std::move(channel)), stub_(channel_) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    call_ = stub_.PrepareCall(&context_, method, &queue_);
    void* tag = Tag();
    call_->StartCall(tag);
    started_ = Wait(tag);
  }
  ~RawCall() {
    context_.TryCancel();
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }

  bool started() const { return started_; }
  // False if the write did not complete within `timeout` (flow control holds it) or failed.
  bool Write(const grpc::ByteBuffer& message,
             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    void* tag = Tag();
    call_->Write(message, tag);
    return Wait(tag, timeout);
  }
  bool Read(google::protobuf::Message* message) {
    std::optional<grpc::ByteBuffer> bytes = Read();
    std::vector<grpc::Slice> slices;
    if (!bytes || !bytes->Dump(&slices).ok()) return false;
    std::string joined;
    for (const grpc::Slice& slice : slices) joined.append(slice.begin(), slice.end());
    return message->ParseFromString(joined);
  }
  bool WritesDone() {
    void* tag = Tag();
    call_->WritesDone(tag);
    return Wait(tag);
  }
  std::optional<grpc::ByteBuffer> Read() {
    void* tag = Tag();
    call_->Read(&read_buffer_, tag);
    if (!Wait(tag)) return std::nullopt;
    return std::move(read_buffer_);
  }
  // The call's status, or nullopt if the server has not ended the call within `timeout`; a
  // later Finish waits for the same answer.
  std::optional<grpc::Status> TryFinish(std::chrono::milliseconds timeout) {
    if (finish_tag_ == nullptr) {
      finish_tag_ = Tag();
      call_->Finish(&status_, finish_tag_);
    }
    if (!Wait(finish_tag_, timeout)) return std::nullopt;
    return status_;
  }
  grpc::Status Finish() {
    return TryFinish(std::chrono::seconds(10))
        .value_or(grpc::Status(grpc::StatusCode::UNKNOWN, "the call did not finish in 10 s"));
  }

 private:
  void* Tag() { return reinterpret_cast<void*>(++tags_); }
  // Waits for the operation `tag`, keeping the results of others that complete meanwhile (an
  // operation that timed out completes later; its buffers are members, so that is safe). False
  // if it failed or did not complete within `timeout`.
  bool Wait(void* tag, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::system_clock::now() + timeout;
    while (true) {
      if (auto it = completed_.find(tag); it != completed_.end()) return it->second;
      void* got;
      bool ok = false;
      if (queue_.AsyncNext(&got, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) return false;
      completed_[got] = ok;
    }
  }

  std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  intptr_t tags_ = 0;
  std::map<void*, bool> completed_;
  grpc::ByteBuffer read_buffer_;
  grpc::Status status_;
  void* finish_tag_ = nullptr;
  bool started_ = false;
};

class HostileClientTest : public ::testing::Test {
 protected:
  explicit HostileClientTest(service::ServerOptions options = {})
      : server_(SmallEngineOptions(TinyModel()), "", options), rng_(std::random_device{}()) {}

  void SetUp() override {
    ASSERT_TRUE(client().CreateSequence("s").ok());
    rows_ = RandomBf16(10 * kWidth, 1.0, rng_);
    ASSERT_TRUE(client().AppendKv("s", 0, 0, Tensor2(rows_, 10, kWidth)).ok());
  }

  client::MlaServeClient& client() { return server_.client(); }
  int32_t Length(const std::string& id, int layer) {
    auto sequence = client().GetSequence(id);
    EXPECT_TRUE(sequence.ok()) << sequence.status();
    return sequence.ok() ? sequence->layer_lengths(layer) : -1;
  }
  v1::AppendKvChunk Chunk(int64_t position, int rows) {
    v1::AppendKvChunk chunk;
    chunk.set_sequence_id("s");
    chunk.set_layer(0);
    chunk.set_start_position(position);
    *chunk.mutable_rows() =
        Tensor2(RandomBf16(static_cast<size_t>(rows) * kWidth, 1.0, rng_), rows, kWidth);
    return chunk;
  }
  v1::DecodeQuery LatentQuery(const std::string& id = "s") {
    return client::LatentQuery(id, 0, 1,
                               Tensor3(RandomBf16(kHeads * kWidth, 1.0, rng_), 1, kHeads, kWidth));
  }
  v1::DecodeRequest LatentDecode() {
    v1::DecodeRequest request;
    *request.add_queries() = LatentQuery();
    return request;
  }
  v1::DecodeStreamRequest StreamRequest(uint64_t id) {
    v1::DecodeStreamRequest request;
    request.set_request_id(id);
    *request.mutable_request() = LatentDecode();
    return request;
  }

  IntegrationServer server_;
  Rng rng_;
  std::vector<Bf16> rows_;
};

TEST_F(HostileClientTest, ACorruptAppendChunkEndsTheStreamNamingItsIndex) {
  RawCall call(server_.target(), "/mlaserve.v1.MlaServe/AppendKv");
  ASSERT_TRUE(call.started());
  ASSERT_TRUE(call.Write(ToBuffer(Chunk(10, 2))));
  ASSERT_TRUE(call.Write(ToBuffer(kGarbage)));
  call.Write(ToBuffer(Chunk(12, 2)));  // may already be refused
  call.WritesDone();
  const grpc::Status status = call.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("chunks[1]: 11 bytes that are not a valid mlaserve.v1.AppendKvChunk"));
  EXPECT_EQ(Length("s", 0), 12);  // the chunk before it applied, none after
}

TEST_F(HostileClientTest, ACorruptDecodeStreamMessageEndsTheStreamAfterTheEarlierAnswers) {
  RawCall call(server_.target(), "/mlaserve.v1.MlaServe/DecodeStream");
  ASSERT_TRUE(call.started());
  ASSERT_TRUE(call.Write(ToBuffer(StreamRequest(7))));
  ASSERT_TRUE(call.Write(ToBuffer(kGarbage)));
  std::optional<grpc::ByteBuffer> answer = call.Read();
  ASSERT_TRUE(answer.has_value());
  v1::DecodeStreamResponse response;
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(answer->Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) bytes.append(slice.begin(), slice.end());
  ASSERT_TRUE(response.ParseFromString(bytes));
  EXPECT_EQ(response.request_id(), 7u);
  EXPECT_EQ(response.status().code(), 0) << response.status().message();
  EXPECT_FALSE(call.Read().has_value());
  const grpc::Status status = call.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("requests[1]: 11 bytes that are not a valid "
                                                "mlaserve.v1.DecodeStreamRequest"));
}

TEST_F(HostileClientTest, AnUnparseableUnaryRequestIsInvalidWithAReason) {
  for (const char* method : {"Decode", "CreateSequence", "RegisterPrefix", "GetServerInfo"}) {
    RawCall call(server_.target(), absl::StrCat("/mlaserve.v1.MlaServe/", method));
    ASSERT_TRUE(call.started());
    call.Write(ToBuffer(kGarbage));
    call.WritesDone();
    const grpc::Status status = call.Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("request: 11 bytes that are not a valid "
                                                  "mlaserve.v1."))
        << method;
  }
  EXPECT_EQ(Length("s", 0), 10);
}

TEST_F(HostileClientTest, IdsOverTheLimitAreInvalidInDecodesAndErrorsQuoteThemShortened) {
  const std::string long_id(1025, 'x');
  auto decoded = client().Decode({LatentQuery(long_id)});
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded.status().message(), "queries[0].sequence_id is 1025 bytes; the limit is 1024");
  auto missing = client().Decode({LatentQuery(std::string(1000, 'y'))});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(missing.status().message().size(), 200u) << missing.status().message();
  // A 16 MiB id is refused by its length, not looked up.
  const auto start = std::chrono::steady_clock::now();
  auto huge = client().Decode({LatentQuery(std::string(16 << 20, 'z'))});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(HostileClientTest, ForkErrorsNameTheWireFields) {
  auto forked = client().ForkSequence("", "t");
  EXPECT_EQ(forked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(forked.status().message(), HasSubstr("source_sequence_id"));
  forked = client().ForkSequence("s", "");
  EXPECT_THAT(forked.status().message(), HasSubstr("new_sequence_id"));
}

TEST_F(HostileClientTest, ASecondServerCannotStartOnAServedPort) {
  service::ServerOptions options;
  options.listen_address = server_.target();
  options.metrics_address = "";
  auto second =
      service::MlaServer::Start(engine::CreateEngine, SmallEngineOptions(TinyModel()), options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(server_.target()));
}

// A DecodeStream client that writes requests and never reads its answers: answers fill the
// client's HTTP/2 window, then the server holds at most max_in_flight requests and unsent
// answers and stops reading the stream, so the client's own writes stall (its requests wait
// in flow control) instead of the server's memory growing with every request, and other
// clients are served meanwhile.
class UnreadStreamTest : public HostileClientTest {
 protected:
  static service::ServerOptions Options() {
    service::ServerOptions options;
    options.stream_max_in_flight = 4;
    return options;
  }
  UnreadStreamTest() : HostileClientTest(Options()) {}
};

TEST_F(UnreadStreamTest, AStreamWhoseAnswersAreNeverReadStopsBeingRead) {
  constexpr int kRequests = 1500;  // ~27 MB of requests, far past both HTTP/2 windows
  const int64_t before = server_.server().engine().Stats().queries;
  RawCall call(server_.target(), "/mlaserve.v1.MlaServe/DecodeStream");
  ASSERT_TRUE(call.started());
  int written = 0;
  for (int i = 0; i < kRequests; ++i) {
    if (!call.Write(ToBuffer(StreamRequest(i)), std::chrono::milliseconds(1000))) break;
    ++written;
  }
  EXPECT_LT(written, kRequests) << "the server kept reading a stream whose answers pile up";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t decoded = server_.server().engine().Stats().queries - before;
  EXPECT_LE(decoded, written);
  // Stalled: nothing more is decoded while the client does not read.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(server_.server().engine().Stats().queries - before, decoded);
  auto other = client().Decode({LatentQuery()});
  EXPECT_TRUE(other.ok()) << other.status();
}

// Idle streams and connections do not hold a shutdown: an idle DecodeStream and an idle
// AppendKv end at once with UNAVAILABLE, and the server stops well within its drain timeout.
TEST_F(HostileClientTest, IdleStreamsEndAtOnceWhenTheServerDrains) {
  RawCall decode(server_.target(), "/mlaserve.v1.MlaServe/DecodeStream");
  RawCall append(server_.target(), "/mlaserve.v1.MlaServe/AppendKv");
  ASSERT_TRUE(decode.started());
  ASSERT_TRUE(append.started());
  ASSERT_TRUE(append.Write(ToBuffer(Chunk(10, 1))));
  auto idle = server_.NewClient();
  ASSERT_TRUE(idle->GetServerInfo().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(server_.server().Shutdown(absl::Seconds(20)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  const grpc::Status decode_status = decode.Finish();
  EXPECT_EQ(decode_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << decode_status.error_message();
  const grpc::Status append_status = append.Finish();
  EXPECT_EQ(append_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(append_status.error_message(), HasSubstr("after applying 1 chunk"));
}

// A channel with a connection of its own (gRPC shares one per target between channels by
// default, and one connection carries at most --max_streams_per_connection streams).
std::shared_ptr<grpc::Channel> OwnConnection(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// Hundreds of idle streams cost the server a registration each, no thread: a client that
// opens 300 DecodeStreams and 300 AppendKv streams over six connections and sends nothing
// does not delay another client's Decode, and its streams stay usable.
TEST_F(HostileClientTest, HundredsOfIdleStreamsLeaveAFreshDecodePrompt) {
  constexpr int kConnections = 6;
  constexpr int kStreamsEach = 100;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < kConnections; ++i) channels.push_back(OwnConnection(server_.target()));
  std::vector<std::unique_ptr<RawCall>> idle;
  for (int i = 0; i < kConnections * kStreamsEach; ++i) {
    idle.push_back(std::make_unique<RawCall>(
        channels[i % kConnections],
        i % 2 == 0 ? "/mlaserve.v1.MlaServe/DecodeStream" : "/mlaserve.v1.MlaServe/AppendKv"));
    ASSERT_TRUE(idle.back()->started()) << "stream " << i;
  }
  // Every stream reached the server's handler: each DecodeStream answers a request (and is
  // idle again), the last AppendKv applies a chunk.
  for (int i = 0; i < kConnections * kStreamsEach; i += 2) {
    ASSERT_TRUE(idle[i]->Write(ToBuffer(StreamRequest(i))));
  }
  for (int i = 0; i < kConnections * kStreamsEach; i += 2) {
    v1::DecodeStreamResponse response;
    ASSERT_TRUE(idle[i]->Read(&response)) << "stream " << i;
    ASSERT_EQ(response.status().code(), 0) << response.status().message();
  }
  ASSERT_TRUE(idle.back()->Write(ToBuffer(Chunk(10, 1))));
  for (int wait = 0; wait < 500 && Length("s", 0) != 11; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Length("s", 0), 11);

  auto fresh = server_.NewClient();
  const auto start = std::chrono::steady_clock::now();
  auto answer = fresh->Decode({LatentQuery()});
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_LT(took, std::chrono::seconds(2))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";

  // The idle DecodeStreams still answer.
  RawCall& stream = *idle[0];
  ASSERT_TRUE(stream.Write(ToBuffer(StreamRequest(7))));
  v1::DecodeStreamResponse response;
  ASSERT_TRUE(stream.Read(&response));
  EXPECT_EQ(response.request_id(), 7u);
  EXPECT_EQ(response.status().code(), 0) << response.status().message();
}

// One client may hold --max_streams_per_client open streams over all its connections; the
// next ends at once with RESOURCE_EXHAUSTED naming the flag, and a stream that ends gives
// its place back.
class StreamsPerClientTest : public HostileClientTest {
 protected:
  static service::ServerOptions Options() {
    service::ServerOptions options;
    options.max_streams_per_client = 4;
    return options;
  }
  StreamsPerClientTest() : HostileClientTest(Options()) {}
};

TEST_F(StreamsPerClientTest, AStreamOverTheClientsLimitIsRefusedNamingTheFlag) {
  std::vector<std::unique_ptr<RawCall>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(std::make_unique<RawCall>(OwnConnection(server_.target()),
                                             "/mlaserve.v1.MlaServe/DecodeStream"));
    ASSERT_TRUE(open.back()->started());
  }
  // The streams above are registered once they answer.
  for (auto& stream : open) {
    ASSERT_TRUE(stream->Write(ToBuffer(StreamRequest(1))));
    v1::DecodeStreamResponse response;
    ASSERT_TRUE(stream->Read(&response));
  }
  RawCall over(OwnConnection(server_.target()), "/mlaserve.v1.MlaServe/AppendKv");
  ASSERT_TRUE(over.started());
  const grpc::Status refused = over.Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("max_streams_per_client"));
  EXPECT_EQ(Length("s", 0), 10);
  // Unary calls are not streams: the same client still decodes.
  auto answer = client().Decode({LatentQuery()});
  EXPECT_TRUE(answer.ok()) << answer.status();

  ASSERT_TRUE(open.front()->WritesDone());
  EXPECT_TRUE(open.front()->Finish().ok());
  open.erase(open.begin());
  // The server removes an ended stream once gRPC is done with it; a new one then fits: it is
  // not ended at once, and takes a chunk.
  bool fitted = false;
  for (int attempt = 0; attempt < 100 && !fitted; ++attempt) {
    RawCall again(server_.target(), "/mlaserve.v1.MlaServe/AppendKv");
    ASSERT_TRUE(again.started());
    const std::optional<grpc::Status> refused_again =
        again.TryFinish(std::chrono::milliseconds(300));
    if (refused_again) {
      ASSERT_EQ(refused_again->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << refused_again->error_message();
      continue;
    }
    fitted = true;
    ASSERT_TRUE(again.Write(ToBuffer(Chunk(10, 1))));
    ASSERT_TRUE(again.WritesDone());
    ASSERT_TRUE(again.Read().has_value());  // the AppendKv answer comes before the status
    const grpc::Status applied = again.Finish();
    EXPECT_TRUE(applied.ok()) << applied.error_code() << " " << applied.error_message();
  }
  ASSERT_TRUE(fitted);
  EXPECT_EQ(Length("s", 0), 11);
}

}  // namespace
}  // namespace mlaserve::integration
