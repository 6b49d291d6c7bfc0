#include "tests/integration/integration_server.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/tensor_helpers.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"
#include "kernels/core/head_space_decode.h"
#include "kernels/core/latent_decode.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::integration {

engine::ModelConfig TinyModel() {
  engine::ModelConfig model;
  model.name = "tiny";
  model.heads = 16;
  model.layers = 2;
  model.softmax_scale = 0.1352338f;
  return model;
}

engine::EngineOptions SmallEngineOptions(const engine::ModelConfig& model) {
  engine::EngineOptions options;
  options.model = model;
  options.weights.seed = kWeightsSeed;
  options.kv.budget_bytes = int64_t{256} << 20;
  options.kv.page_size = 32;
  options.devices = 1;
  options.max_batch = 64;
  options.max_wait = absl::Microseconds(200);
  options.max_sq = 2;
  // The rates of the TyphoonMLA paper's device (B_theta = 61 for sq = 1), so a small group is
  // below the threshold; tests that want the naive form lower it.
  options.matrix_tflops = 376;
  options.hbm_tbps = 1.8;
  return options;
}

IntegrationServer::IntegrationServer(engine::EngineOptions options, std::string metrics_address,
                                     service::ServerOptions server_options, int port)
    : model_(options.model) {
  // gRPC stays initialised for the test process: otherwise the last server and client of a
  // test shut the library down (grpc_shutdown), whose executor threads were seen to take 10 s
  // to end, and the next test starts it again.
  static const bool kGrpcKept = (grpc_init(), true);
  (void)kGrpcKept;
  server_options.listen_address = absl::StrCat("127.0.0.1:", port);
  server_options.metrics_address = std::move(metrics_address);
  auto server = service::MlaServer::Start(engine::CreateEngine, std::move(options), server_options);
  if (!server.ok()) {
    ADD_FAILURE() << "cannot start the server: " << server.status();
    return;
  }
  server_ = *std::move(server);
  if (const absl::Status warm = server_->WarmUp(); !warm.ok()) {
    ADD_FAILURE() << "warm-up: " << warm;
  }
  server_->SetServing(true);
  client_ = NewClient();
}

IntegrationServer::~IntegrationServer() {
  client_.reset();
  if (server_ != nullptr) server_->Shutdown(absl::Seconds(5)).IgnoreError();
}

std::string IntegrationServer::target() const {
  return absl::StrCat("127.0.0.1:", server_->port());
}

std::unique_ptr<client::MlaServeClient> IntegrationServer::NewClient(
    client::ClientOptions options) const {
  return client::MlaServeClient::Connect(target(), options);
}

std::vector<Bf16> RandomBf16(size_t count, double sigma, Rng& rng) {
  std::vector<Bf16> values(count);
  FillNormal(values, sigma, rng);
  return values;
}

v1::Tensor Tensor2(const std::vector<Bf16>& values, int64_t rows, int64_t width) {
  return client::Bf16Tensor(values, std::vector<int64_t>{rows, width});
}

v1::Tensor Tensor3(const std::vector<Bf16>& values, int64_t a, int64_t b, int64_t c) {
  return client::Bf16Tensor(values, std::vector<int64_t>{a, b, c});
}

namespace {

// One sequence as a one-page paged cache: the golden reads it through a block table like
// any kernel does.
struct OnePageSequence {
  explicit OnePageSequence(const engine::ModelConfig& model, const std::vector<Bf16>& rows)
      : length(static_cast<int32_t>(rows.size() / model.dk_latent())),
        pages(*TensorView<const Bf16, 3>::Create(rows, {1, length, model.dk_latent()})),
        table(*TensorView<const int32_t, 2>::Create(table_storage, {1, 1})) {}

  int32_t length;
  std::vector<int32_t> table_storage{0};
  std::vector<int32_t> seqlens{length};
  TensorView<const Bf16, 3> pages;
  TensorView<const int32_t, 2> table;
};

}  // namespace

GoldenOutput GoldenLatent(const engine::ModelConfig& model, const std::vector<Bf16>& rows,
                          const std::vector<Bf16>& q_latent, int sq) {
  const OnePageSequence sequence(model, rows);
  LatentDecodeProblem problem;
  problem.q = *TensorView<const Bf16, 4>::Create(q_latent, {1, sq, model.heads, model.dk_latent()});
  problem.cache = PagedKvCache{sequence.pages};
  problem.seqs = PagedSequences{sequence.table, sequence.seqlens};
  problem.dv = model.dl;
  problem.softmax_scale = model.softmax_scale;
  problem.causal = true;
  absl::StatusOr<GoldenOutput> golden = GoldenLatentDecode(problem);
  EXPECT_TRUE(golden.ok()) << golden.status();
  return golden.ok() ? *std::move(golden) : GoldenOutput{};
}

GoldenOutput GoldenHeadSpace(const engine::ModelConfig& model, const UpProjection& weights,
                             const std::vector<Bf16>& rows, const std::vector<Bf16>& q_nope,
                             const std::vector<Bf16>& q_pe, int sq) {
  const OnePageSequence sequence(model, rows);
  HeadSpaceDecodeProblem problem;
  problem.q_nope = *TensorView<const Bf16, 4>::Create(q_nope, {1, sq, model.heads, model.dn});
  problem.q_pe = *TensorView<const Bf16, 4>::Create(q_pe, {1, sq, model.heads, model.dr});
  problem.weights = weights;
  problem.cache = PagedKvCache{sequence.pages};
  problem.seqs = PagedSequences{sequence.table, sequence.seqlens};
  problem.softmax_scale = model.softmax_scale;
  problem.causal = true;
  absl::StatusOr<GoldenOutput> golden = GoldenHeadSpaceDecode(problem);
  EXPECT_TRUE(golden.ok()) << golden.status();
  return golden.ok() ? *std::move(golden) : GoldenOutput{};
}

}  // namespace mlaserve::integration
