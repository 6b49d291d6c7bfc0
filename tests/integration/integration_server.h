#ifndef MLASERVE_TESTS_INTEGRATION_INTEGRATION_SERVER_H_
#define MLASERVE_TESTS_INTEGRATION_INTEGRATION_SERVER_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/mlaserve_client.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/random_fill.h"
#include "kernels/reference/golden_attention.h"
#include "server/engine/engine.h"
#include "server/service/mla_server.h"
#include "tests/testing/attention_checks.h"

namespace mlaserve::integration {

inline constexpr uint64_t kWeightsSeed = 20240611;

// The GPU the GPU cases run on: the fake GPU (host memory, host kernels), unless
// MLASERVE_TEST_GPU names another (cuda:0 on a GPU machine: docs/testing.md, "On a GPU").
inline std::string TestGpu() {
  const char* gpu = std::getenv("MLASERVE_TEST_GPU");
  return gpu != nullptr && *gpu != '\0' ? gpu : "fake-gpu";
}

// A small custom model, fast on two cores: DeepSeek's head dims, 16 heads, 2 layers.
engine::ModelConfig TinyModel();

// Engine options for `model` on one emulated device, seeded weights, a small page size so
// sequences span several pages.
engine::EngineOptions SmallEngineOptions(const engine::ModelConfig& model);

// The real engine (CreateEngine) behind the real server on a free loopback port, warmed up
// and SERVING, with a client connected to it.
class IntegrationServer {
 public:
  // `server_options` apart from its addresses (a loopback port, `metrics_address`).
  // `port` 0: a free one (a restart passes the port it had).
  explicit IntegrationServer(engine::EngineOptions options, std::string metrics_address = "",
                             service::ServerOptions server_options = {}, int port = 0);
  ~IntegrationServer();

  service::MlaServer& server() { return *server_; }
  client::MlaServeClient& client() { return *client_; }
  std::string target() const;
  const engine::ModelConfig& model() const { return model_; }
  // A client of its own (for concurrency tests).
  std::unique_ptr<client::MlaServeClient> NewClient(client::ClientOptions options = {}) const;

 private:
  engine::ModelConfig model_;
  std::unique_ptr<service::MlaServer> server_;
  std::unique_ptr<client::MlaServeClient> client_;
};

std::vector<Bf16> RandomBf16(size_t count, double sigma, Rng& rng);
v1::Tensor Tensor2(const std::vector<Bf16>& values, int64_t rows, int64_t width);
v1::Tensor Tensor3(const std::vector<Bf16>& values, int64_t a, int64_t b, int64_t c);

// fp64 golden answers of one query against one sequence's whole latent rows [L][dl + dr]
// (prefix rows included), with the model's scale and the causal MTP mask.
GoldenOutput GoldenLatent(const engine::ModelConfig& model, const std::vector<Bf16>& rows,
                          const std::vector<Bf16>& q_latent, int sq);
GoldenOutput GoldenHeadSpace(const engine::ModelConfig& model, const UpProjection& weights,
                             const std::vector<Bf16>& rows, const std::vector<Bf16>& q_nope,
                             const std::vector<Bf16>& q_pe, int sq);

// Tolerances. Latent answers meet FlashMLA's (scaled to unit-sigma data). Head-space answers
// pass through extra bf16 casts (the absorbed q and latent output; in the hybrid form also the
// prefix's expanded K/V), each moving a unit-sigma output element by ~1.8e-3 rms (see
// tests/kernels/mla/absorb_naive_test.cc). The kernels' fixed-seed tests hold them to
// FlashMLA's 8e-3, about 4.5 sigma; these tests draw fresh data every run over thousands of
// elements, where a 4.5-sigma element is a matter of time, so the absolute bound is doubled
// (as the engine's hybrid-vs-absorb pair check does) and the cosine bound, which catches any
// systematic error (wrong weights, rows or mask), stays tight. A head-space LSE is a score
// moved by the bf16 cast of the absorbed query; against a lone key (a one-row sequence) no
// softmax averages it, and with the seeded model weights it was measured at 2.5e-3 rms (180
// fresh draws of 16 heads, worst 8.5e-3), so the kernels' 1e-2 (4 sigma) failed about once in
// a few hundred runs; 2e-2 is 8 sigma, and a wrong row or weight moves an LSE by O(1).
inline constexpr testing::Tolerance kLatentOutTolerance = testing::FlashMlaOutTolerance(1.0);
// FlashMLA's LSE bound (1e-6 nats) belongs to its keys of sigma 0.1; these tests' keys and
// queries are of sigma 1, so a score, and the fp32 rounding of its 576-term sum, is 10 times
// as large: against a one-row sequence (whose LSE is that one score) a GPU's summation order
// was 3.1e-6 off on a fresh draw. The bound scales as the output's does (FlashMlaOutTolerance).
inline constexpr testing::Tolerance kLatentLseTolerance{
    10 * testing::kFlashMlaLseTolerance.abs_tol, testing::kFlashMlaLseTolerance.rel_tol, 0.0};
inline constexpr testing::Tolerance kHeadSpaceOutTolerance{
    2 * testing::FlashMlaOutTolerance(1.0).abs_tol, 2.01 / 128, 4e-5};
inline constexpr testing::Tolerance kHeadSpaceLseTolerance{2e-2, 8.01 / 65536, 0.0};

}  // namespace mlaserve::integration

#endif  // MLASERVE_TESTS_INTEGRATION_INTEGRATION_SERVER_H_
