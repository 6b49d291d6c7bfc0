#include "server/service/tensor_codec.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/float16.h"

namespace mlaserve::service {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

template <typename T>
v1::Tensor Raw(v1::DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  for (int64_t d : shape) tensor.add_shape(d);
  tensor.set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return tensor;
}

constexpr std::array<int64_t, 2> kRowsShape{kAnyExtent, 3};

TEST(TensorCodecTest, DecodesEachDtypeToBf16WithNearestEvenRounding) {
  // 1 + 2^-8 is a tie between bf16 1 and 1 + 2^-7: nearest even is 1.
  const std::vector<float> floats{1.0f, 1.00390625f, -2.5f, 1.01171875f, 0.0f, 65504.0f};
  auto fp32 = DecodeToBf16(Raw(v1::DTYPE_FP32, {2, 3}, floats), kRowsShape, "x");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->shape, (std::vector<int64_t>{2, 3}));
  const std::vector<float> expected{1.0f, 1.0f, -2.5f, 1.015625f, 0.0f, 65536.0f};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(fp32->values[i].ToFloat(), expected[i]);

  std::vector<uint16_t> bf16_bits;
  for (float f : floats) bf16_bits.push_back(Bf16::FromFloat(f).bits);
  auto bf16 = DecodeToBf16(Raw(v1::DTYPE_BF16, {2, 3}, bf16_bits), kRowsShape, "x");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  for (size_t i = 0; i < floats.size(); ++i) EXPECT_EQ(bf16->values[i].bits, bf16_bits[i]);

  std::vector<uint16_t> fp16_bits;
  for (float f : floats) fp16_bits.push_back(Fp16::FromFloat(f).bits);
  auto fp16 = DecodeToBf16(Raw(v1::DTYPE_FP16, {2, 3}, fp16_bits), kRowsShape, "x");
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(fp16->values[i].ToFloat(), expected[i]);
}

// The fuzzer's find: a zero-row tensor once reached memcpy with a null pointer (undefined even
// for zero bytes); UBSan runs this test.
TEST(TensorCodecTest, AZeroRowTensorInEachDtypeViewsAsNonNullEmptyData) {
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_FP16, v1::DTYPE_FP32}) {
    std::vector<std::vector<Bf16>> storage;
    auto view =
        ViewAsBf16(Raw(dtype, {0, 3}, std::vector<float>()), 2, "queries[0].latent", storage);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_NE(view->data, nullptr) << v1::DType_Name(dtype);
    EXPECT_EQ(view->shape, (std::vector<int64_t>{0, 3}));
    auto decoded =
        DecodeToBf16(Raw(dtype, {0, 3}, std::vector<float>()), std::array<int64_t, 2>{0, 3}, "x");
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(decoded->values.empty());
  }
}

TEST(TensorCodecTest, RefusesAnUnspecifiedOrUnknownDtype) {
  for (int dtype : {0, 7}) {
    auto decoded = DecodeToBf16(Raw(static_cast<v1::DType>(dtype), {1, 3}, std::vector<float>(3)),
                                kRowsShape, "queries[2].latent");
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(decoded.status().message()), StartsWith("queries[2].latent: dtype "));
  }
}

TEST(TensorCodecTest, RefusesAWrongRankOrExtentNamingBothShapes) {
  const std::array<int64_t, 3> expected{1, 128, 128};
  auto decoded = DecodeToBf16(Raw(v1::DTYPE_BF16, {1, 128, 64}, std::vector<uint16_t>(128 * 64)),
                              expected, "queries[3].head.q_nope");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded.status().message(), "queries[3].head.q_nope: shape [1,128,64] != [1,128,128]");

  auto rank = DecodeToBf16(Raw(v1::DTYPE_BF16, {128, 128}, std::vector<uint16_t>(128 * 128)),
                           expected, "q");
  EXPECT_EQ(rank.status().message(), "q: shape [128,128] != [1,128,128]");
}

TEST(TensorCodecTest, AFreeExtentMustHoldAtLeastOneRow) {
  auto empty =
      DecodeToBf16(Raw(v1::DTYPE_BF16, {0, 3}, std::vector<uint16_t>()), kRowsShape, "append_rows");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "append_rows: shape [0,3] != [n,3]");
  auto negative = DecodeToBf16(Raw(v1::DTYPE_BF16, {-2, 3}, std::vector<uint16_t>(6)), kRowsShape,
                               "append_rows");
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, RefusesAByteLengthThatDoesNotMatchTheShape) {
  auto short_data =
      DecodeToBf16(Raw(v1::DTYPE_BF16, {2, 3}, std::vector<uint16_t>(5)), kRowsShape, "rows");
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_data.status().message(), "rows: 10 bytes != 6 elements of DTYPE_BF16 (12 bytes)");

  auto long_data =
      DecodeToBf16(Raw(v1::DTYPE_FP32, {2, 3}, std::vector<float>(7)), kRowsShape, "rows");
  EXPECT_EQ(long_data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(long_data.status().message(), "rows: 28 bytes != 6 elements of DTYPE_FP32 (24 bytes)");
}

TEST(TensorCodecTest, AShapeWhoseProductOverflowsIsRefusedNotWrapped) {
  const std::array<int64_t, 3> expected{kAnyExtent, kAnyExtent, 3};
  const int64_t huge = int64_t{1} << 62;
  auto decoded =
      DecodeToBf16(Raw(v1::DTYPE_BF16, {huge, 4, 3}, std::vector<uint16_t>(6)), expected, "latent");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded.status().message(), "latent: shape [4611686018427387904,4,3] overflows int64");
}

TEST(TensorCodecTest, RefusesNanAndInfinityInEveryDtypeNamingTheElement) {
  std::vector<float> floats(6, 0.5f);
  floats[4] = std::numeric_limits<float>::quiet_NaN();
  auto nan32 = DecodeToBf16(Raw(v1::DTYPE_FP32, {2, 3}, floats), kRowsShape, "q");
  EXPECT_EQ(nan32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nan32.status().message(), "q: element 4 is NaN; inputs must be finite");

  floats[4] = -std::numeric_limits<float>::infinity();
  auto inf32 = DecodeToBf16(Raw(v1::DTYPE_FP32, {2, 3}, floats), kRowsShape, "q");
  EXPECT_EQ(inf32.status().message(), "q: element 4 is infinite; inputs must be finite");

  std::vector<uint16_t> bf16(6, Bf16::FromFloat(0.5f).bits);
  bf16[1] = 0x7f80;  // +inf
  EXPECT_EQ(DecodeToBf16(Raw(v1::DTYPE_BF16, {2, 3}, bf16), kRowsShape, "q").status().message(),
            "q: element 1 is infinite; inputs must be finite");
  bf16[1] = 0xffc1;  // a negative NaN
  EXPECT_EQ(DecodeToBf16(Raw(v1::DTYPE_BF16, {2, 3}, bf16), kRowsShape, "q").status().message(),
            "q: element 1 is NaN; inputs must be finite");

  std::vector<uint16_t> fp16(6, Fp16::FromFloat(0.5f).bits);
  fp16[5] = 0x7e00;  // NaN
  EXPECT_EQ(DecodeToBf16(Raw(v1::DTYPE_FP16, {2, 3}, fp16), kRowsShape, "q").status().message(),
            "q: element 5 is NaN; inputs must be finite");
}

TEST(TensorCodecTest, RefusesFp32ValuesThatOverflowBf16) {
  std::vector<float> floats(3, 1.0f);
  floats[2] = std::numeric_limits<float>::max();  // rounds past bf16's largest finite value
  auto decoded = DecodeToBf16(Raw(v1::DTYPE_FP32, {1, 3}, floats), kRowsShape, "q");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(decoded.status().message()), StartsWith("q: element 2 ("));
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("overflows bf16"));
}

TEST(TensorCodecTest, EncodesFloatsInTheRequestedDtypeLittleEndian) {
  const std::vector<float> values{1.0f, -0.5f, 1.00390625f,
                                  -std::numeric_limits<float>::infinity()};
  const std::array<int64_t, 2> shape{2, 2};
  v1::Tensor bf16;
  EncodeFloats(values, shape, v1::DTYPE_BF16, &bf16);
  EXPECT_EQ(bf16.dtype(), v1::DTYPE_BF16);
  EXPECT_THAT(bf16.shape(), ::testing::ElementsAre(2, 2));
  ASSERT_EQ(bf16.data().size(), 8u);
  EXPECT_EQ(static_cast<uint8_t>(bf16.data()[0]), 0x80);  // 0x3f80, low byte first
  EXPECT_EQ(static_cast<uint8_t>(bf16.data()[1]), 0x3f);
  uint16_t third;
  std::memcpy(&third, bf16.data().data() + 4, 2);
  EXPECT_EQ(third, Bf16::FromFloat(1.0f).bits);  // the tie rounds to even

  v1::Tensor fp32;
  EncodeFloats(values, shape, v1::DTYPE_FP32, &fp32);
  ASSERT_EQ(fp32.data().size(), 16u);
  float last;
  std::memcpy(&last, fp32.data().data() + 12, 4);
  EXPECT_TRUE(std::isinf(last) && last < 0);

  v1::Tensor fp16;
  EncodeFloats(values, shape, v1::DTYPE_FP16, &fp16);
  uint16_t second;
  std::memcpy(&second, fp16.data().data() + 2, 2);
  EXPECT_EQ(second, Fp16::FromFloat(-0.5f).bits);
}

}  // namespace
}  // namespace mlaserve::service
