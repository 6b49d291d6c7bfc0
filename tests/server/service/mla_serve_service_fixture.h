#ifndef MLASERVE_TESTS_SERVER_SERVICE_MLA_SERVE_SERVICE_FIXTURE_H_
#define MLASERVE_TESTS_SERVER_SERVICE_MLA_SERVE_SERVICE_FIXTURE_H_

// The gRPC edge over a mocked engine, through a real loopback server and the C++ client: the
// fixture its test files share (mla_serve_service_test.cc, decode_stream_test.cc,
// service_metrics_test.cc).

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/mlaserve_client.h"
#include "client/tensor_helpers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "server/service/mla_server.h"
#include "tests/server/service/mock_engine.h"

namespace mlaserve::service::testing {

using ::testing::_;
using ::testing::NiceMock;
using ::testing::Return;
using ::testing::ReturnRef;

// A query's answer with recognisable values: out[i] = base + i / 1024, lse[r] = base + r.
struct ExpectedAnswer {
  std::vector<float> out;
  std::vector<float> lse;
};
inline ExpectedAnswer Answer(const engine::DecodeQuery& query, const engine::EngineInfo& info,
                             float base) {
  const int width = query.space == engine::QuerySpace::kHead ? info.model.dv : info.model.dl;
  const size_t rows = static_cast<size_t>(query.sq) * info.model.heads;
  ExpectedAnswer answer;
  answer.out.resize(rows * width);
  for (size_t i = 0; i < answer.out.size(); ++i)
    answer.out[i] = base + static_cast<float>(i % 1024) / 1024;
  answer.lse.resize(rows);
  for (size_t r = 0; r < rows; ++r) answer.lse[r] = base + static_cast<float>(r);
  return answer;
}

// The engine's answers to `queries` (the i-th with base i + `offset`) and the memory they
// view, as an engine hands them to its callback.
struct FakeAnswers {
  std::vector<ExpectedAnswer> values;
  std::vector<engine::DecodeAnswer> answers;
  std::span<const engine::DecodeAnswer> span() const { return answers; }
};
inline std::shared_ptr<FakeAnswers> Answers(const std::vector<engine::DecodeQuery>& queries,
                                            const engine::EngineInfo& info, float offset = 0) {
  auto fake = std::make_shared<FakeAnswers>();
  for (size_t i = 0; i < queries.size(); ++i)
    fake->values.push_back(Answer(queries[i], info, offset + i));
  for (const ExpectedAnswer& v : fake->values) {
    engine::DecodeAnswer a;
    a.out_type = ElementType::kFp32;
    a.out = v.out.data();
    a.out_elements = static_cast<int64_t>(v.out.size());
    a.lse = v.lse;
    a.plan.device = 0;
    a.plan.batch_size = 1;
    fake->answers.push_back(a);
  }
  return fake;
}

inline engine::DecodeQuery OneLatentToken() {
  engine::DecodeQuery query;
  query.space = engine::QuerySpace::kLatent;
  return query;
}

inline std::vector<Bf16> Values(size_t n, float scale) {
  std::vector<Bf16> values(n);
  for (size_t i = 0; i < n; ++i)
    values[i] = Bf16::FromFloat(scale * static_cast<float>(i % 13) - 1);
  return values;
}

class MlaServeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto mock = std::make_unique<NiceMock<MockEngine>>();
    engine_ = mock.get();
    ON_CALL(*engine_, Info()).WillByDefault(ReturnRef(info_));
    ON_CALL(*engine_, Stats()).WillByDefault(Return(engine::EngineStats{}));
    ON_CALL(*engine_, Drain(_)).WillByDefault(Return(absl::OkStatus()));
    // By default every query is answered at once with values derived from its index.
    ON_CALL(*engine_, Decode(_, _, _))
        .WillByDefault([this](std::vector<engine::DecodeQuery> queries, engine::DecodeOptions,
                              engine::DecodeCallback done) {
          auto answers = Answers(queries, info_);
          std::move(done)(answers->span());
        });
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "";
    options.max_message_bytes = 8 << 20;
    auto server = MlaServer::Start(
        [mock = std::move(mock), this](engine::EngineOptions engine_options) mutable
        -> absl::StatusOr<std::unique_ptr<engine::Engine>> {
          on_batch_ = std::move(engine_options.on_batch);
          return std::unique_ptr<engine::Engine>(std::move(mock));
        },
        engine::EngineOptions{}, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client::ClientOptions client_options;
    client_options.timeout = absl::Seconds(10);
    client_options.max_attempts = 1;                  // these tests look at single answers
    client_options.append_chunk_bytes = 3 * 576 * 2;  // three rows per chunk
    client_ = client::MlaServeClient::Connect(absl::StrCat("127.0.0.1:", server_->port()),
                                              client_options);
  }

  void TearDown() override {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(threads_mu_);
      threads.swap(threads_);
    }
    for (std::thread& thread : threads) thread.join();
    server_.reset();
  }

  // Answers the engine's callback on a thread of its own, as devices do. Calls in flight at
  // once reach the mock from several gRPC threads, hence the lock (ASan caught the race).
  template <typename Work>
  void AnswerLater(Work work) {
    std::lock_guard lock(threads_mu_);
    threads_.emplace_back(std::move(work));
  }

  v1::Tensor LatentQ(int sq = 1) const {
    const std::vector<int64_t> shape{sq, info_.model.heads, info_.model.dk_latent()};
    return client::Bf16Tensor(Values(static_cast<size_t>(sq) * 4 * 576, 0.125f), shape);
  }
  v1::DecodeQuery Latent(const std::string& sequence_id) const {
    return client::LatentQuery(sequence_id, 0, 1, LatentQ());
  }
  double CounterValue(const std::string& name,
                      const std::vector<std::pair<std::string, std::string>>& labels) const {
    for (const prometheus::MetricFamily& family : server_->metrics().registry()->Collect()) {
      if (family.name != name) continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        bool match = true;
        for (const auto& [key, value] : labels) {
          bool found = false;
          for (const auto& label : metric.label) found |= label.name == key && label.value == value;
          match &= found;
        }
        if (match) return metric.counter.value;
      }
    }
    return -1;
  }

  engine::EngineInfo info_ = SmallEngineInfo();
  NiceMock<MockEngine>* engine_ = nullptr;
  std::function<void(const engine::BatchReport&)> on_batch_;
  std::unique_ptr<MlaServer> server_;
  std::unique_ptr<client::MlaServeClient> client_;
  std::mutex threads_mu_;
  std::vector<std::thread> threads_;
};

}  // namespace mlaserve::service::testing

#endif  // MLASERVE_TESTS_SERVER_SERVICE_MLA_SERVE_SERVICE_FIXTURE_H_
