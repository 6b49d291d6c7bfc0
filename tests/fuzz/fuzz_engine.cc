#include "tests/fuzz/fuzz_engine.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::fuzz {
namespace {

engine::EngineOptions SmallEngine() {
  engine::EngineOptions options;
  options.model.name = "fuzz";
  // Small dims: the edge's validation is the same code at any size, and every decode the
  // fuzzer reaches costs a fraction of DeepSeek's 16 x 576 (a million executions in under an
  // hour instead of several; the kernels at full size are the accuracy tests' business).
  options.model.heads = 4;
  options.model.dn = 32;
  options.model.dr = 16;
  options.model.dl = 64;
  options.model.dv = 32;
  options.model.layers = 2;
  options.model.softmax_scale = 0.1352338f;
  options.weights.seed = 5;
  options.profile = "host";
  options.devices = 1;
  options.kv.budget_bytes = int64_t{64} << 20;
  options.kv.page_size = 16;
  options.max_batch = 8;
  options.max_sq = 2;
  options.max_wait = absl::ZeroDuration();
  return options;
}

// Deterministic, varied rows of `n` tokens (small values: no overflow anywhere).
std::vector<Bf16> Rows(int64_t n, int width) {
  std::vector<Bf16> rows(static_cast<size_t>(n) * width);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = Bf16::FromFloat(static_cast<float>(static_cast<int>(i * 7919 % 61) - 30) / 64);
  }
  return rows;
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    // The fixture itself failing is a bug in the harness or the engine: stop loudly.
    std::fprintf(stderr, "fuzz fixture: %s: %s\n", what, status.ToString().c_str());
    std::abort();
  }
}

}  // namespace

FuzzEngine& FuzzEngine::Get() {
  static FuzzEngine* const instance = new FuzzEngine();
  return *instance;
}

FuzzEngine::FuzzEngine() {
  metrics_ = std::make_unique<service::ServiceMetrics>();
  auto created = engine::CreateEngine(SmallEngine());
  Check(created.status(), "CreateEngine");
  engine_ = *std::move(created);
  dispatcher_ = std::make_unique<service::DecodeDispatcher>(*engine_, moved_, *metrics_);
  Populate();
}

void FuzzEngine::Populate() {
  const engine::ModelConfig& m = engine_->Info().model;
  const int width = m.dk_latent();
  const std::vector<Bf16> prefix = Rows(int64_t{m.layers} * 20, width);
  Check(engine_->RegisterPrefix(
            "p", "", *TensorView<const Bf16, 3>::Create(prefix, {m.layers, 20, width}, "prefix")),
        "RegisterPrefix");
  Check(engine_->CreateSequence("s", "p", std::nullopt), "CreateSequence s");
  Check(engine_->CreateSequence("f", "", KvDtype::kFp8), "CreateSequence f");
  for (int layer = 0; layer < m.layers; ++layer) {
    const std::vector<Bf16> own = Rows(12, width);
    Check(engine_->AppendKv("s", layer, 20,
                            *TensorView<const Bf16, 2>::Create(own, {12, width}, "s")),
          "AppendKv s");
    const std::vector<Bf16> fp8 = Rows(30, width);
    Check(
        engine_->AppendKv("f", layer, 0, *TensorView<const Bf16, 2>::Create(fp8, {30, width}, "f")),
        "AppendKv f");
  }
}

void FuzzEngine::Reset() {
  // Whatever an input created, appended or released goes; the fixture's state comes back.
  for (const std::string& id : {std::string("s"), std::string("f")}) {
    engine_->ReleaseSequence(id).IgnoreError();
  }
  engine_->ReleasePrefix("p").IgnoreError();
  Populate();
}

}  // namespace mlaserve::fuzz
