// The gRPC edge over a mocked engine, through a real loopback server and the C++ client:
// what reaches the engine, what it answers, and how that arrives on the wire.

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/health_check.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/service/mla_serve_service_fixture.h"

namespace mlaserve::service {
namespace {

using ::testing::_;
using testing::Answer;
using testing::Answers;
using testing::ExpectedAnswer;
using ::testing::HasSubstr;
using testing::MlaServeServiceTest;
using testing::OneLatentToken;
using ::testing::Return;
using ::testing::StartsWith;
using testing::Values;

TEST_F(MlaServeServiceTest, ServerInfoDescribesTheEnginesModelDevicesThresholdsAndLimits) {
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model().name(), "tiny");
  EXPECT_EQ(info->model().heads(), 4);
  EXPECT_EQ(info->model().layers(), 3);
  EXPECT_EQ(info->model().kv_row_width(), 576);
  EXPECT_FLOAT_EQ(info->model().softmax_scale(), 0.125f);
  EXPECT_EQ(info->page_size(), 16);
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).profile(), "ascend910-die");
  ASSERT_EQ(info->naive_thresholds_size(), 2);
  EXPECT_EQ(info->naive_thresholds(1).sq(), 2);
  EXPECT_EQ(info->naive_thresholds(1).b_theta(), 6.25);
  EXPECT_EQ(info->limits().max_batch(), 8);
  EXPECT_EQ(info->limits().max_wait_us(), 200);
  EXPECT_EQ(info->limits().max_message_bytes(), 8 << 20);
  EXPECT_TRUE(info->batch_invariant());  // SmallEngineInfo's default
}

// DecodeCallOptions.batch_invariant reaches the engine as the call's choice; unset, the
// engine's default applies (nullopt).
TEST_F(MlaServeServiceTest, TheBatchInvariantOptionReachesTheEngine) {
  std::vector<std::optional<bool>> seen;
  EXPECT_CALL(*engine_, Decode(_, _, _))
      .Times(3)
      .WillRepeatedly([&](std::vector<engine::DecodeQuery> queries, engine::DecodeOptions options,
                          engine::DecodeCallback done) {
        seen.push_back(options.batch_invariant);
        auto answers = Answers(queries, info_);
        std::move(done)(answers->span());
      });
  v1::DecodeRequest request;
  const std::vector<Bf16> nope = Values(4 * 128, 0.5f);
  const std::vector<Bf16> pe = Values(4 * 64, 0.25f);
  *request.add_queries() =
      client::HeadSpaceQuery("seq", 0, 1, client::Bf16Tensor(nope, std::vector<int64_t>{1, 4, 128}),
                             client::Bf16Tensor(pe, std::vector<int64_t>{1, 4, 64}));
  request.mutable_options()->set_output_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(client_->DecodeRaw(request).ok());
  request.mutable_options()->set_batch_invariant(true);
  ASSERT_TRUE(client_->DecodeRaw(request).ok());
  request.mutable_options()->set_batch_invariant(false);
  ASSERT_TRUE(client_->DecodeRaw(request).ok());
  EXPECT_EQ(seen, (std::vector<std::optional<bool>>{std::nullopt, true, false}));
}

TEST_F(MlaServeServiceTest, HealthIsNotServingUntilTheServerIsMarkedServing) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                     grpc::InsecureChannelCredentials());
  EXPECT_EQ(*mlaserve::client::CheckHealth(channel, ""),
            mlaserve::client::ServingStatus::kNotServing);
  server_->SetServing(true);
  EXPECT_EQ(*mlaserve::client::CheckHealth(channel, ""), mlaserve::client::ServingStatus::kServing);
  EXPECT_EQ(*mlaserve::client::CheckHealth(channel, "mlaserve.v1.MlaServe"),
            mlaserve::client::ServingStatus::kServing);
  EXPECT_EQ(mlaserve::client::CheckHealth(channel, "no.such.Service").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(MlaServeServiceTest, DecodeAnswersArriveInQueryOrderInTheRequestedDtype) {
  std::vector<v1::DecodeQuery> queries{Latent("a"), Latent("b")};
  auto fp32 = client_->Decode(queries, v1::DTYPE_FP32);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  ASSERT_EQ(fp32->size(), 2u);
  for (int q = 0; q < 2; ++q) {
    const ExpectedAnswer expected = Answer(OneLatentToken(), info_, q);
    EXPECT_EQ((*fp32)[q].out, expected.out);
    EXPECT_EQ((*fp32)[q].lse, expected.lse);
    EXPECT_THAT((*fp32)[q].out_shape, ::testing::ElementsAre(1, 4, 512));
  }
  auto bf16 = client_->Decode({Latent("a")});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const ExpectedAnswer expected = Answer(OneLatentToken(), info_, 0);
  for (size_t i = 0; i < expected.out.size(); ++i) {
    ASSERT_EQ((*bf16)[0].out[i], RoundToBf16(expected.out[i])) << i;
  }
}

TEST_F(MlaServeServiceTest, TheEngineReceivesExactlyTheQueriesBitsAndAppends) {
  // What the engine saw, copied out of the request's bytes it views.
  struct Seen {
    engine::DecodeQuery query;
    std::vector<Bf16> q_nope, q_pe, append_rows;
  };
  std::vector<Seen> seen;
  auto copy = [](const auto& view) {
    return std::vector<Bf16>(view.data(), view.data() + view.size());
  };
  EXPECT_CALL(*engine_, Decode(_, _, _))
      .WillOnce([&](std::vector<engine::DecodeQuery> queries, engine::DecodeOptions,
                    engine::DecodeCallback done) {
        for (const auto& q : queries)
          seen.push_back({q, copy(q.q_nope), copy(q.q_pe), copy(q.append_rows)});
        auto answers = Answers(queries, info_);
        std::move(done)(answers->span());
      });
  const std::vector<Bf16> nope = Values(2 * 4 * 128, 0.5f);
  const std::vector<Bf16> pe = Values(2 * 4 * 64, 0.25f);
  const std::vector<Bf16> rows = Values(2 * 576, 0.75f);
  v1::DecodeQuery query =
      client::HeadSpaceQuery("seq", 2, 2, client::Bf16Tensor(nope, std::vector<int64_t>{2, 4, 128}),
                             client::Bf16Tensor(pe, std::vector<int64_t>{2, 4, 64}));
  client::AppendBeforeDecode(query, client::Bf16Tensor(rows, std::vector<int64_t>{2, 576}), 9);
  ASSERT_TRUE(client_->Decode({query}).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].query.sequence_id, "seq");
  EXPECT_EQ(seen[0].query.layer, 2);
  EXPECT_EQ(seen[0].query.sq, 2);
  EXPECT_EQ(seen[0].query.space, engine::QuerySpace::kHead);
  EXPECT_EQ(seen[0].query.q_nope.shape(), (std::array<int64_t, 3>{2, 4, 128}));
  EXPECT_EQ(seen[0].q_nope, nope);
  EXPECT_EQ(seen[0].q_pe, pe);
  EXPECT_EQ(seen[0].append_rows, rows);
  EXPECT_EQ(seen[0].query.append_position, 9);
}

// Every request the wire cannot carry is refused at the edge with INVALID_ARGUMENT naming
// the field, and the engine never sees it. (What a well-formed request may ask is the
// engine's to check: tests/server/engine/decode_validation_test.cc, and through the real
// engine tests/integration/wire_errors_test.cc.)
TEST_F(MlaServeServiceTest, MalformedDecodesNeverReachTheEngine) {
  EXPECT_CALL(*engine_, Decode(_, _, _)).Times(0);
  struct Case {
    std::string name;
    std::function<void(v1::DecodeRequest&)> spoil;
    std::string message_prefix;
  };
  const std::vector<Case> cases{
      {"wrong dtype",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->set_dtype(v1::DTYPE_UNSPECIFIED);
       },
       "queries[0].latent: dtype"},
      {"wrong rank",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->mutable_shape()->RemoveLast();
       },
       "queries[0].latent: shape [1,4] has 2 dimensions, not 3"},
      {"byte length",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->mutable_data()->append("xx");
       },
       "queries[0].latent: 4610 bytes != 2304 elements"},
      {"no q", [](v1::DecodeRequest& r) { r.mutable_queries(0)->clear_latent(); },
       "queries[0].q: neither head nor latent is set"},
      {"missing q_pe",
       [](v1::DecodeRequest& r) {
         *r.mutable_queries(0)->mutable_head()->mutable_q_nope() =
             client::Bf16Tensor(Values(4 * 128, 1), std::vector<int64_t>{1, 4, 128});
       },
       "queries[0].head.q_pe: missing"},
      {"bad output dtype",
       [](v1::DecodeRequest& r) { r.set_output_dtype(static_cast<v1::DType>(5)); },
       "output_dtype: 5"},
  };
  for (const Case& c : cases) {
    v1::DecodeRequest request;
    *request.add_queries() = Latent("s");
    c.spoil(request);
    const auto response = client_->DecodeRaw(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(response.status().message()), StartsWith(c.message_prefix)) << c.name;
  }
  EXPECT_EQ(
      CounterValue("mlaserve_requests_total", {{"rpc", "Decode"}, {"code", "INVALID_ARGUMENT"}}),
      static_cast<double>(cases.size()));
}

TEST_F(MlaServeServiceTest, AMalformedPrefixNeverReachesTheEngine) {
  EXPECT_CALL(*engine_, RegisterPrefix(_, _, _, _)).Times(0);
  const auto status = client_->RegisterPrefix(
      "p", "", client::Bf16Tensor(Values(2 * 5 * 576, 1), std::vector<int64_t>{2, 5, 576}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "latent: shape [2,5,576] != [3,n,576]");
}

TEST_F(MlaServeServiceTest, APrefixReachesTheEngineAsItsRows) {
  const std::vector<Bf16> rows = Values(3 * 2 * 576, 0.5f);
  EXPECT_CALL(*engine_, RegisterPrefix(absl::string_view("child"), absl::string_view("root"), _, _))
      .WillOnce([&](absl::string_view, absl::string_view, TensorView<const Bf16, 3> latent,
                    std::optional<KvDtype>) {
        EXPECT_EQ(latent.dim(0), 3);
        EXPECT_EQ(latent.dim(1), 2);
        EXPECT_TRUE(std::equal(rows.begin(), rows.end(), latent.data()));
        return absl::OkStatus();
      });
  EXPECT_TRUE(client_
                  ->RegisterPrefix("child", "root",
                                   client::Bf16Tensor(rows, std::vector<int64_t>{3, 2, 576}))
                  .ok());
}

TEST_F(MlaServeServiceTest, EngineErrorsSurfaceWithTheirCodeAndMessage) {
  EXPECT_CALL(*engine_, CreateSequence(absl::string_view("s"), absl::string_view("other"), _))
      .WillOnce(Return(absl::AlreadyExistsError("sequence_id s exists on another prefix")));
  EXPECT_CALL(*engine_, GetSequence(absl::string_view("ghost")))
      .WillOnce(Return(absl::NotFoundError("sequence_id ghost is unknown")));
  EXPECT_CALL(*engine_, ForkSequence(_, _))
      .WillOnce(Return(absl::NotFoundError("source_id a is unknown")));
  EXPECT_CALL(*engine_, ReleasePrefix(_)).WillOnce(Return(absl::InternalError("bug")));
  const auto created = client_->CreateSequence("s", "other");
  EXPECT_EQ(created.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(created.status().message(), "sequence_id s exists on another prefix");
  EXPECT_EQ(client_->GetSequence("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->ForkSequence("a", "b").status().message(), "source_id a is unknown");
  EXPECT_EQ(client_->ReleasePrefix("p").code(), absl::StatusCode::kInternal);
}

TEST_F(MlaServeServiceTest, ASequenceIsDescribedAfterCreateAndFork) {
  EXPECT_CALL(*engine_, CreateSequence(_, _, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(*engine_, GetSequence(absl::string_view("s")))
      .WillOnce(Return(engine::SequenceInfo{"s", "sys", {7, 7, 5}}));
  auto sequence = client_->CreateSequence("s", "sys");
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_EQ(sequence->sequence_id(), "s");
  EXPECT_EQ(sequence->prefix_id(), "sys");
  EXPECT_THAT(sequence->layer_lengths(), ::testing::ElementsAre(7, 7, 5));
}

TEST_F(MlaServeServiceTest, AppendKvIsChunkedAndEachChunkLandsWhereItBelongs) {
  const std::vector<Bf16> rows = Values(8 * 576, 0.25f);
  std::vector<Bf16> landed;
  std::vector<int64_t> starts;
  EXPECT_CALL(*engine_, AppendKv(absl::string_view("s"), 1, _, _))
      .Times(3)  // 8 rows, 3 per chunk
      .WillRepeatedly([&](absl::string_view, int, int64_t start, TensorView<const Bf16, 2> view) {
        starts.push_back(start);
        landed.insert(landed.end(), view.data(), view.data() + view.size());
        return absl::OkStatus();
      });
  ASSERT_TRUE(
      client_->AppendKv("s", 1, 40, client::Bf16Tensor(rows, std::vector<int64_t>{8, 576})).ok());
  EXPECT_THAT(starts, ::testing::ElementsAre(40, 43, 46));
  EXPECT_EQ(landed, rows);
}

TEST_F(MlaServeServiceTest, AFailingChunkEndsAppendKvNamingTheChunk) {
  EXPECT_CALL(*engine_, AppendKv(_, _, _, _))
      .WillOnce(Return(absl::OkStatus()))
      .WillOnce(Return(absl::ResourceExhaustedError("KV budget: 2 pages do not fit")));
  const auto status = client_->AppendKv(
      "s", 0, 0, client::Bf16Tensor(Values(9 * 576, 1), std::vector<int64_t>{9, 576}));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "chunks[1]: KV budget: 2 pages do not fit");

  v1::AppendKvChunk bad;
  const auto invalid = client_->AppendKv(
      "s", 7, 0, client::Bf16Tensor(Values(576, 1), std::vector<int64_t>{1, 576}));
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(invalid.message(), "chunks[0].layer: 7 is outside [0, 3)");
}

TEST_F(MlaServeServiceTest, AFullQueueIsUnavailableButAFullKvCacheStaysResourceExhausted) {
  // The engine's queue refusal reaches the client as is: retryable.
  EXPECT_CALL(*engine_, Decode(_, _, _))
      .WillOnce(
          [](std::vector<engine::DecodeQuery>, engine::DecodeOptions, engine::DecodeCallback done) {
            std::move(done)(absl::UnavailableError("decode queue full: 64 queries waiting"));
          })
      // An append in the batch that did not fit: not retryable as is.
      .WillOnce([this](std::vector<engine::DecodeQuery>, engine::DecodeOptions,
                       engine::DecodeCallback done) {
        AnswerLater([done = std::move(done)]() mutable {
          std::move(done)(absl::ResourceExhaustedError("KV budget exhausted"));
        });
      });
  const auto queue = client_->Decode({Latent("s")});
  EXPECT_EQ(queue.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(queue.status().message()), HasSubstr("decode queue full"));
  const auto memory = client_->Decode({Latent("s")});
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(memory.status().message(), "KV budget exhausted");
}

TEST_F(MlaServeServiceTest, ADeviceFailureFailsOnlyItsOwnCall) {
  ON_CALL(*engine_, Decode(_, _, _))
      .WillByDefault([this](std::vector<engine::DecodeQuery> queries, engine::DecodeOptions,
                            engine::DecodeCallback done) {
        AnswerLater([this, queries = std::move(queries), done = std::move(done)]() mutable {
          if (queries[0].sequence_id == "on-broken-device") {
            std::move(done)(absl::InternalError("device 1: kernel fault"));
            return;
          }
          auto answers = Answers({queries[0]}, info_);
          std::move(done)(answers->span());
        });
      });
  auto broken =
      std::async(std::launch::async, [&] { return client_->Decode({Latent("on-broken-device")}); });
  auto healthy = std::async(std::launch::async, [&] { return client_->Decode({Latent("fine")}); });
  const auto broken_result = broken.get();
  const auto healthy_result = healthy.get();
  EXPECT_EQ(broken_result.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(broken_result.status().message(), "device 1: kernel fault");
  ASSERT_TRUE(healthy_result.ok()) << healthy_result.status();
  EXPECT_EQ((*healthy_result)[0].lse.size(), 4u);
}

TEST_F(MlaServeServiceTest, TheCallersDeadlineAndCancellationReachTheEngine) {
  std::promise<std::pair<engine::DecodeOptions, engine::DecodeCallback>> held;
  EXPECT_CALL(*engine_, Decode(_, _, _))
      .WillOnce([&](std::vector<engine::DecodeQuery>, engine::DecodeOptions options,
                    engine::DecodeCallback done) {
        held.set_value({std::move(options), std::move(done)});
      });
  v1::DecodeRequest request;
  *request.add_queries() = Latent("s");
  const absl::Time before = absl::Now();
  const auto response = client_->DecodeRaw(request, absl::Milliseconds(300));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded);
  auto [options, done] = held.get_future().get();
  EXPECT_GT(options.deadline, before);
  EXPECT_LE(options.deadline, before + absl::Milliseconds(300) + absl::Milliseconds(50));
  // The call is gone: the engine's cancellation poll says so.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (!options.cancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(options.cancelled());
  std::move(done)(absl::CancelledError("abandoned"));
}

}  // namespace
}  // namespace mlaserve::service
