#ifndef MLASERVE_TESTS_INTEGRATION_BATCH_SCENARIO_H_
#define MLASERVE_TESTS_INTEGRATION_BATCH_SCENARIO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/decode_batch.h"
#include "client/serving_client.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/random_fill.h"
#include "server/engine/model/model_config.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {

// B sequences of mixed lengths on a shared prefix, and one layer's stacked queries for them
// (fresh random data), each appending `append_rows` rows first: what every transport's batch
// test sends, with the fp64 golden of each answer.
class BatchScenario {
 public:
  // Registers the prefix and creates the sequences through `client` (ids under `tag`).
  BatchScenario(client::ServingClient& client, const engine::ModelConfig& model,
                const std::string& tag, int sequences, engine::QuerySpace space, int sq,
                int append_rows, Rng& rng);

  // Fresh queries and appended rows for the next step (positions after the last step's).
  void NextStep(Rng& rng);

  const client::DecodeBatchRequest& request() const { return request_; }
  int width() const;  // of an answer: dv or dl
  // The request with `output_dtype`.
  client::DecodeBatchRequest WithOutput(v1::DType output_dtype) const;

  // Holds fp32 answers of the current step to the golden (the appended rows included).
  void ExpectGolden(const std::vector<std::byte>& out, const std::vector<float>& lse) const;

  // Every sequence's length at the layer, read from the server.
  std::vector<int64_t> Lengths(client::MlaServeClient& client) const;

 private:
  const engine::ModelConfig model_;
  const engine::QuerySpace space_;
  const int sq_;
  const int append_;
  std::vector<std::vector<Bf16>> rows_;  // each sequence's layer rows so far (prefix first)
  std::vector<Bf16> q_nope_, q_pe_, latent_, appended_;
  client::DecodeBatchRequest request_;
};

}  // namespace mlaserve::integration

#endif  // MLASERVE_TESTS_INTEGRATION_BATCH_SCENARIO_H_
