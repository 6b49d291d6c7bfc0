// What a hostile or careless client tried on the landed server (issue 13's outside client),
// each held to a test: corrupt messages, a reader that never reads, oversized ids, a second
// server on a served port, idle streams at shutdown.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
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
      : channel_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())), stub_(channel_) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    call_ = stub_.PrepareCall(&context_, method, &queue_);
    call_->StartCall(Tag());
    started_ = Wait();
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
    call_->Write(message, Tag());
    return Wait(timeout);
  }
  bool WritesDone() {
    call_->WritesDone(Tag());
    return Wait();
  }
  std::optional<grpc::ByteBuffer> Read() {
    grpc::ByteBuffer message;
    call_->Read(&message, Tag());
    if (!Wait()) return std::nullopt;
    return message;
  }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, Tag());
    Wait();
    return status;
  }

 private:
  void* Tag() { return reinterpret_cast<void*>(++tags_); }
  bool Wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    void* tag;
    bool ok = false;
    // An operation still pending at the timeout completes later; the caller stops using the
    // call then (the destructor cancels it and drains the queue).
    if (pending_ > 0) return false;
    const auto deadline = std::chrono::system_clock::now() + timeout;
    if (queue_.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) {
      ++pending_;
      return false;
    }
    return ok;
  }

  std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  intptr_t tags_ = 0;
  int pending_ = 0;
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

}  // namespace
}  // namespace mlaserve::integration
