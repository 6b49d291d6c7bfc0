#include "server/service/kv_request_codec.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/service/wire_tensors.h"

namespace mlaserve::service {
namespace {

using testing::Bf16Zeros;
using ::testing::StartsWith;

engine::ModelConfig Model() {
  engine::ModelConfig model;
  model.name = "tiny";
  model.heads = 4;
  model.layers = 2;
  model.softmax_scale = 0.1f;
  return model;
}

TEST(KvRequestCodecTest, APrefixNeedsEveryLayerOfTheModel) {
  v1::RegisterPrefixRequest request;
  request.set_prefix_id("p");
  *request.mutable_latent() = Bf16Zeros({2, 5, 576});
  auto parsed = ParsePrefixLatent(request, Model());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape, (std::vector<int64_t>{2, 5, 576}));

  *request.mutable_latent() = Bf16Zeros({1, 5, 576});
  EXPECT_EQ(ParsePrefixLatent(request, Model()).status().message(),
            "latent: shape [1,5,576] != [2,n,576]");
  request.clear_latent();
  EXPECT_THAT(std::string(ParsePrefixLatent(request, Model()).status().message()),
              StartsWith("latent: missing"));
}

TEST(KvRequestCodecTest, AChunkIsCheckedFieldByFieldNamingTheChunk) {
  v1::AppendKvChunk chunk;
  chunk.set_sequence_id("s");
  chunk.set_layer(1);
  chunk.set_start_position(4);
  *chunk.mutable_rows() = Bf16Zeros({3, 576});
  auto parsed = ParseAppendChunk(chunk, Model(), "chunks[5]");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape, (std::vector<int64_t>{3, 576}));

  v1::AppendKvChunk bad = chunk;
  bad.set_layer(2);
  auto layer = ParseAppendChunk(bad, Model(), "chunks[5]");
  EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(layer.status().message(), "chunks[5].layer: 2 is outside [0, 2)");

  bad = chunk;
  bad.set_start_position(-1);
  EXPECT_EQ(ParseAppendChunk(bad, Model(), "chunks[5]").status().message(),
            "chunks[5].start_position: -1 is negative");

  bad = chunk;
  bad.clear_sequence_id();
  EXPECT_EQ(ParseAppendChunk(bad, Model(), "chunks[5]").status().message(),
            "chunks[5].sequence_id: empty");

  bad = chunk;
  *bad.mutable_rows() = Bf16Zeros({3, 575});
  EXPECT_EQ(ParseAppendChunk(bad, Model(), "chunks[5]").status().message(),
            "chunks[5].rows: shape [3,575] != [n,576]");

  bad = chunk;
  bad.clear_rows();
  EXPECT_THAT(std::string(ParseAppendChunk(bad, Model(), "chunks[5]").status().message()),
              StartsWith("chunks[5].rows: missing"));
}

}  // namespace
}  // namespace mlaserve::service
