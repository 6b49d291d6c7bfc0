// The packed form of a Decode call (decode.proto's PackedQueries): its parsing into the
// engine's per-query views, and the names its errors carry.

#include <array>
#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/decode_codec.h"
#include "tests/server/service/wire_tensors.h"

namespace mlaserve::service {
namespace {

using testing::Bf16Zeros;
using ::testing::StartsWith;

// Three sequences of a head-space call with 2 query tokens and 4 heads, appending 2 rows.
v1::DecodeRequest HeadBatch() {
  v1::DecodeRequest request;
  v1::PackedQueries& packed = *request.mutable_packed();
  for (const char* id : {"a", "b", "c"}) packed.add_sequence_ids(id);
  packed.set_layer(2);
  *packed.mutable_head()->mutable_q_nope() = Bf16Zeros({3, 2, 4, 128});
  *packed.mutable_head()->mutable_q_pe() = Bf16Zeros({3, 2, 4, 64});
  packed.mutable_head()->set_first_head(4);
  *packed.mutable_append_rows() = Bf16Zeros({3, 2, 576});
  for (const int64_t position : {10, 20, 30}) packed.add_append_positions(position);
  return request;
}

std::string Problem(const v1::DecodeRequest& request) {
  absl::StatusOr<std::unique_ptr<ParsedDecode>> parsed = ParseDecodeRequest(request);
  EXPECT_FALSE(parsed.ok());
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(PackedDecodeTest, EachSequenceViewsItsSliceOfTheStackedTensors) {
  const v1::DecodeRequest request = HeadBatch();
  absl::StatusOr<std::unique_ptr<ParsedDecode>> parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->form, DecodeForm::kPacked);
  ASSERT_EQ((*parsed)->queries.size(), 3u);
  const char* nope = request.packed().head().q_nope().data().data();
  const char* rows = request.packed().append_rows().data().data();
  for (int b = 0; b < 3; ++b) {
    const engine::DecodeQuery& query = (*parsed)->queries[b];
    EXPECT_EQ(query.sequence_id, request.packed().sequence_ids(b));
    EXPECT_EQ(query.layer, 2);
    EXPECT_EQ(query.sq, 2);
    EXPECT_EQ(query.space, engine::QuerySpace::kHead);
    EXPECT_EQ(query.first_head, 4);
    EXPECT_EQ(query.q_nope.shape(), (std::array<int64_t, 3>{2, 4, 128}));
    EXPECT_EQ(query.q_pe.shape(), (std::array<int64_t, 3>{2, 4, 64}));
    // Views of the request's own bytes, slice b of each: nothing copied.
    EXPECT_EQ(static_cast<const void*>(query.q_nope.data()), nope + b * 2 * 4 * 128 * 2);
    EXPECT_EQ(static_cast<const void*>(query.append_rows.data()), rows + b * 2 * 576 * 2);
    EXPECT_EQ(query.append_rows.shape(), (std::array<int64_t, 2>{2, 576}));
    EXPECT_EQ(query.append_position, 10 * (b + 1));
  }
  EXPECT_TRUE((*parsed)->converted.empty());
}

TEST(PackedDecodeTest, LatentQueriesWithoutAppendsAndFp32Inputs) {
  v1::DecodeRequest request;
  v1::PackedQueries& packed = *request.mutable_packed();
  packed.add_sequence_ids("x");
  packed.add_sequence_ids("y");
  v1::Tensor& latent = *packed.mutable_latent();
  latent.set_dtype(v1::DTYPE_FP32);
  for (const int64_t d : {2, 1, 3, 576}) latent.add_shape(d);
  std::vector<float> values(2 * 3 * 576);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) / 64;
  latent.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  request.mutable_options()->set_output_dtype(v1::DTYPE_FP32);
  request.mutable_options()->set_softmax_scale(0.125f);
  absl::StatusOr<std::unique_ptr<ParsedDecode>> parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->output_dtype, v1::DTYPE_FP32);
  EXPECT_EQ((*parsed)->softmax_scale, 0.125f);
  const engine::DecodeQuery& y = (*parsed)->queries[1];
  EXPECT_EQ(y.space, engine::QuerySpace::kLatent);
  EXPECT_EQ(y.sq, 1);
  EXPECT_EQ(y.output, ElementType::kFp32);
  EXPECT_EQ(y.q_latent.shape(), (std::array<int64_t, 3>{1, 3, 576}));
  EXPECT_EQ(y.q_latent.data()[5], Bf16::FromFloat(values[3 * 576 + 5]));  // slice 1, element 5
  EXPECT_TRUE(y.append_rows.empty());
  EXPECT_EQ(y.append_position, -1);
}

TEST(PackedDecodeTest, EveryMalformedBatchIsRefusedNamingItsField) {
  v1::DecodeRequest request = HeadBatch();
  request.mutable_packed()->clear_sequence_ids();
  EXPECT_THAT(Problem(request), StartsWith("packed.sequence_ids: empty"));

  request = HeadBatch();
  request.mutable_packed()->clear_head();
  EXPECT_EQ(Problem(request), "packed.q: neither head nor latent is set");

  request = HeadBatch();
  request.mutable_packed()->mutable_head()->clear_q_pe();
  EXPECT_EQ(Problem(request), "packed.head.q_pe: missing");

  request = HeadBatch();
  *request.mutable_packed()->mutable_head()->mutable_q_nope() = Bf16Zeros({3, 4, 128});
  EXPECT_EQ(Problem(request), "packed.head.q_nope: shape [3,4,128] has 3 dimensions, not 4");

  request = HeadBatch();
  *request.mutable_packed()->mutable_head()->mutable_q_pe() = Bf16Zeros({2, 2, 4, 64});
  EXPECT_EQ(Problem(request),
            "packed.head.q_pe: shape [2,2,4,64] holds 2 sequences; sequence_ids has 3");

  request = HeadBatch();
  request.mutable_packed()->mutable_head()->mutable_q_nope()->mutable_data()->pop_back();
  EXPECT_THAT(Problem(request), StartsWith("packed.head.q_nope: 6143 bytes != 3072 elements"));

  request = HeadBatch();
  request.mutable_packed()->mutable_append_rows()->set_region_offset(0);
  EXPECT_THAT(Problem(request), StartsWith("packed.append_rows.region_offset: only the same-host"));

  request = HeadBatch();
  request.mutable_packed()->mutable_append_positions()->RemoveLast();
  EXPECT_THAT(Problem(request), StartsWith("packed.append_positions: 2 positions"));

  request = HeadBatch();
  request.mutable_packed()->clear_append_rows();
  EXPECT_EQ(Problem(request), "packed.append_rows: missing; append_positions is set");

  request = HeadBatch();
  request.add_queries()->set_sequence_id("d");
  EXPECT_THAT(Problem(request), StartsWith("packed: set beside queries"));

  request = HeadBatch();
  request.mutable_options();
  request.set_softmax_scale(0.5f);
  EXPECT_THAT(Problem(request), StartsWith("options: set beside the top-level"));

  request = HeadBatch();
  request.mutable_options()->set_output_dtype(static_cast<v1::DType>(7));
  EXPECT_THAT(Problem(request), StartsWith("options.output_dtype: 7 is not one of"));
}

TEST(PackedDecodeTest, TheEnginesNamesForAQueryBecomeThePackedFields) {
  const std::pair<const char*, const char*> kRenamed[] = {
      {"queries[3].head.q_nope: element 7 is NaN", "packed.head.q_nope[3]: element 7 is NaN"},
      {"queries[0].head.q_pe: shape [1,4,32] != [1,4,64]",
       "packed.head.q_pe[0]: shape [1,4,32] != [1,4,64]"},
      {"queries[12].sequence_id: 'x' is not a sequence",
       "packed.sequence_ids[12]: 'x' is not a sequence"},
      {"queries[1].layer: 9 is outside [0, 4)", "packed.layer: 9 is outside [0, 4)"},
      {"queries[1].head.first_head: 200 is outside [0, 128)",
       "packed.head.first_head: 200 is outside [0, 128)"},
      {"queries[2].latent: element 0 is infinite", "packed.latent[2]: element 0 is infinite"},
      {"queries[2].append_rows: shape [1,500] != [*,576]",
       "packed.append_rows[2]: shape [1,500] != [*,576]"},
      {"queries[4].append_position: -3 is negative", "packed.append_positions[4]: -3 is negative"},
      {"queries[0].append: tenant 'acme' has no write right",
       "packed.append_rows: tenant 'acme' has no write right"},
      {"queries[5]: sequence 'q' layer 0 appears twice in one call",
       "packed.sequence_ids[5]: sequence 'q' layer 0 appears twice in one call"},
      {"queries: 300 queries exceed limits.max_batch = 256",
       "packed.sequence_ids: 300 queries exceed limits.max_batch = 256"},
      {"the engine is draining", "the engine is draining"},
  };
  for (const auto& [engine, packed] : kRenamed) {
    const absl::Status renamed = NamePackedFields(absl::InvalidArgumentError(engine));
    EXPECT_EQ(renamed.message(), packed);
    EXPECT_EQ(renamed.code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace mlaserve::service
