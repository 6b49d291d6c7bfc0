#include "tests/integration/batch_scenario.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::integration {
namespace {

constexpr int kLayer = 1;
constexpr int kPrefixTokens = 40;

client::BatchTensor Stacked(const std::vector<Bf16>& values, std::vector<int64_t> shape) {
  return client::BatchTensor{v1::DTYPE_BF16, std::move(shape), values.data()};
}

}  // namespace

BatchScenario::BatchScenario(client::ServingClient& client, const engine::ModelConfig& model,
                             const std::string& tag, int sequences, engine::QuerySpace space,
                             int sq, int append_rows, Rng& rng)
    : model_(model), space_(space), sq_(sq), append_(append_rows) {
  const int width = model.dk_latent();
  const std::string prefix = absl::StrCat(tag, "/prefix");
  const std::vector<Bf16> latent =
      RandomBf16(static_cast<size_t>(model.layers) * kPrefixTokens * width, 1.0, rng);
  EXPECT_TRUE(
      client.RegisterPrefix(prefix, "", Tensor3(latent, model.layers, kPrefixTokens, width)).ok());
  const auto layer_rows = latent.begin() + static_cast<ptrdiff_t>(kLayer) * kPrefixTokens * width;
  for (int b = 0; b < sequences; ++b) {
    const std::string id = absl::StrCat(tag, "/", b);
    EXPECT_TRUE(client.CreateSequence(id, prefix).ok());
    const int own = 1 + 7 * b;
    std::vector<Bf16> suffix = RandomBf16(static_cast<size_t>(own) * width, 1.0, rng);
    const client::KvAppend append{id, kLayer, kPrefixTokens, Tensor2(suffix, own, width), {}};
    EXPECT_TRUE(client.AppendKv(std::span<const client::KvAppend>(&append, 1)).ok());
    std::vector<Bf16>& rows = rows_.emplace_back(layer_rows, layer_rows + kPrefixTokens * width);
    rows.insert(rows.end(), suffix.begin(), suffix.end());
    request_.sequence_ids.push_back(id);
  }
  request_.layer = kLayer;
  NextStep(rng);
}

void BatchScenario::NextStep(Rng& rng) {
  const int64_t b = static_cast<int64_t>(rows_.size());
  const int64_t heads = model_.heads;
  const int width = model_.dk_latent();
  request_.q_nope = request_.q_pe = request_.latent = {};
  if (space_ == engine::QuerySpace::kHead) {
    q_nope_ = RandomBf16(static_cast<size_t>(b * sq_ * heads * model_.dn), 1.0, rng);
    q_pe_ = RandomBf16(static_cast<size_t>(b * sq_ * heads * model_.dr), 1.0, rng);
    request_.q_nope = Stacked(q_nope_, {b, sq_, heads, model_.dn});
    request_.q_pe = Stacked(q_pe_, {b, sq_, heads, model_.dr});
  } else {
    latent_ = RandomBf16(static_cast<size_t>(b * sq_ * heads * width), 1.0, rng);
    request_.latent = Stacked(latent_, {b, sq_, heads, width});
  }
  request_.append_rows = {};
  request_.append_positions.clear();
  if (append_ > 0) {
    appended_ = RandomBf16(static_cast<size_t>(b * append_ * width), 1.0, rng);
    request_.append_rows = Stacked(appended_, {b, append_, width});
    for (std::vector<Bf16>& rows : rows_) {
      request_.append_positions.push_back(static_cast<int64_t>(rows.size()) / width);
      const size_t at = (&rows - rows_.data()) * static_cast<size_t>(append_ * width);
      rows.insert(rows.end(), appended_.begin() + static_cast<ptrdiff_t>(at),
                  appended_.begin() + static_cast<ptrdiff_t>(at + append_ * width));
    }
  }
}

int BatchScenario::width() const {
  return space_ == engine::QuerySpace::kHead ? model_.dv : model_.dl;
}

client::DecodeBatchRequest BatchScenario::WithOutput(v1::DType output_dtype) const {
  client::DecodeBatchRequest request = request_;
  request.output_dtype = output_dtype;
  return request;
}

void BatchScenario::ExpectGolden(const std::vector<std::byte>& out,
                                 const std::vector<float>& lse) const {
  absl::StatusOr<engine::ModelWeights> weights =
      engine::ModelWeights::FromSeed(model_, kWeightsSeed);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const size_t rows = static_cast<size_t>(sq_) * model_.heads;
  const size_t per_out = rows * static_cast<size_t>(width());
  ASSERT_EQ(out.size(), rows_.size() * per_out * sizeof(float));
  ASSERT_EQ(lse.size(), rows_.size() * rows);
  const bool head = space_ == engine::QuerySpace::kHead;
  for (size_t b = 0; b < rows_.size(); ++b) {
    SCOPED_TRACE(absl::StrCat("sequence ", b, head ? " (head space)" : " (latent)"));
    GoldenOutput golden;
    if (head) {
      const auto slice = [&](const std::vector<Bf16>& all, int d) {
        const size_t n = rows * static_cast<size_t>(d);
        return std::vector<Bf16>(all.begin() + static_cast<ptrdiff_t>(b * n),
                                 all.begin() + static_cast<ptrdiff_t>((b + 1) * n));
      };
      golden = GoldenHeadSpace(model_, weights->Layer(kLayer), rows_[b], slice(q_nope_, model_.dn),
                               slice(q_pe_, model_.dr), sq_);
    } else {
      const size_t n = rows * static_cast<size_t>(model_.dk_latent());
      golden =
          GoldenLatent(model_, rows_[b],
                       std::vector<Bf16>(latent_.begin() + static_cast<ptrdiff_t>(b * n),
                                         latent_.begin() + static_cast<ptrdiff_t>((b + 1) * n)),
                       sq_);
    }
    std::vector<float> answer(per_out);
    std::memcpy(answer.data(), out.data() + b * per_out * sizeof(float), per_out * sizeof(float));
    EXPECT_TRUE(testing::AllClose(answer, golden.out,
                                  head ? kHeadSpaceOutTolerance : kLatentOutTolerance, true));
    const std::vector<float> answer_lse(lse.begin() + static_cast<ptrdiff_t>(b * rows),
                                        lse.begin() + static_cast<ptrdiff_t>((b + 1) * rows));
    EXPECT_TRUE(testing::AllClose(answer_lse, golden.lse,
                                  head ? kHeadSpaceLseTolerance : kLatentLseTolerance, false));
  }
}

std::vector<int64_t> BatchScenario::Lengths(client::MlaServeClient& client) const {
  std::vector<int64_t> lengths;
  for (const std::string& id : request_.sequence_ids) {
    absl::StatusOr<v1::Sequence> sequence = client.GetSequence(id);
    EXPECT_TRUE(sequence.ok()) << sequence.status();
    lengths.push_back(sequence.ok() ? sequence->layer_lengths(kLayer) : -1);
  }
  return lengths;
}

}  // namespace mlaserve::integration
