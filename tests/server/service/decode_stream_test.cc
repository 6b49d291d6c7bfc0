// DecodeStream at the edge over a mocked engine: ids echoed, errors in band, deadlines from
// each request, and what a shutdown answers.

#include <future>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/service/mla_serve_service_fixture.h"

namespace mlaserve::service {
namespace {

using ::testing::_;
using testing::Answers;
using testing::MlaServeServiceTest;
using ::testing::Return;
using ::testing::StartsWith;

TEST_F(MlaServeServiceTest, AStreamEchoesIdsAnswersErrorsInBandAndStaysOpen) {
  auto stream = client_->OpenDecodeStream(absl::Seconds(10));
  v1::DecodeRequest good;
  *good.add_queries() = Latent("s");
  v1::DecodeRequest bad = good;
  bad.mutable_queries(0)->mutable_latent()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ASSERT_TRUE(stream->Send(101, good));
  ASSERT_TRUE(stream->Send(102, bad));
  ASSERT_TRUE(stream->Send(103, good));
  ASSERT_TRUE(stream->WritesDone());
  std::map<uint64_t, v1::DecodeStreamResponse> answers;
  while (auto answer = stream->Receive()) answers[answer->request_id()] = *answer;
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[101].status().code(), 0);
  EXPECT_EQ(answers[101].response().results_size(), 1);
  EXPECT_EQ(answers[102].status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answers[102].status().message(), StartsWith("queries[0].latent: dtype"));
  EXPECT_FALSE(answers[102].has_response());
  EXPECT_EQ(answers[103].status().code(), 0);
}

TEST_F(MlaServeServiceTest, AStreamRequestTimeoutBecomesItsDeadline) {
  std::promise<absl::Time> deadline;
  EXPECT_CALL(*engine_, Decode(_, _, _))
      .WillOnce([&](std::vector<engine::DecodeQuery> queries, engine::DecodeOptions options,
                    engine::DecodeCallback done) {
        deadline.set_value(options.deadline);
        auto answers = Answers({queries[0]}, info_);
        std::move(done)(answers->span());
      });
  auto stream = client_->OpenDecodeStream();
  v1::DecodeRequest request;
  *request.add_queries() = Latent("s");
  const absl::Time before = absl::Now();
  ASSERT_TRUE(stream->Send(1, request, /*timeout_us=*/250000));
  const absl::Time engine_deadline = deadline.get_future().get();
  EXPECT_GT(engine_deadline, before + absl::Milliseconds(200));
  EXPECT_LT(engine_deadline, absl::Now() + absl::Milliseconds(250));
  ASSERT_TRUE(stream->Receive().has_value());
  stream->WritesDone();
  EXPECT_FALSE(stream->Receive().has_value());
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(MlaServeServiceTest, ShutdownAnswersWhatAStreamSentThenEndsItUnavailable) {
  std::promise<engine::DecodeCallback> held;
  std::vector<engine::DecodeQuery> held_queries;
  EXPECT_CALL(*engine_, Decode(_, _, _))
      .WillOnce([&](std::vector<engine::DecodeQuery> queries, engine::DecodeOptions,
                    engine::DecodeCallback done) {
        held_queries = std::move(queries);
        held.set_value(std::move(done));
      });
  EXPECT_CALL(*engine_, Drain(_)).WillOnce(Return(absl::OkStatus()));
  auto stream = client_->OpenDecodeStream();
  v1::DecodeRequest request;
  *request.add_queries() = Latent("s");
  ASSERT_TRUE(stream->Send(7, request));
  engine::DecodeCallback done = held.get_future().get();
  absl::Notification stopped;
  std::thread shutdown([&] {
    EXPECT_TRUE(server_->Shutdown(absl::Seconds(10)).ok());
    stopped.Notify();
  });
  // The stream waits for its request in flight; so does the shutdown.
  EXPECT_FALSE(stopped.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  auto answers = Answers({held_queries[0]}, info_);
  std::move(done)(answers->span());
  auto answer = stream->Receive();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->request_id(), 7u);
  EXPECT_EQ(answer->status().code(), 0);
  EXPECT_FALSE(stream->Receive().has_value());
  const absl::Status finished = stream->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kUnavailable);
  shutdown.join();
  EXPECT_TRUE(stopped.HasBeenNotified());
}

}  // namespace
}  // namespace mlaserve::service
