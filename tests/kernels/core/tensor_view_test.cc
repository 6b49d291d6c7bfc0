#include "kernels/core/tensor_view.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

TEST(TensorViewTest, RowMajorIndexing) {
  std::vector<int> data(24);
  for (int i = 0; i < 24; ++i) data[i] = i;
  auto view = TensorView<int, 3>::Create(std::span<int>(data), {2, 3, 4});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ((*view)(1, 2, 3), 23);
  EXPECT_EQ((*view)(1, 0, 1), 13);
  EXPECT_EQ(view->row(1, 1)[2], 18);
  EXPECT_EQ(view->size(), 24);
  TensorView<const int, 3> read_only = *view;
  EXPECT_EQ(read_only(0, 1, 0), 4);
}

TEST(TensorViewTest, RejectsShapeThatDoesNotMatchStorage) {
  std::vector<float> data(10);
  auto view = TensorView<float, 2>::Create(std::span<float>(data), {3, 4}, "q");
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find("q"), std::string::npos);
}

TEST(TensorViewTest, RejectsNegativeDimensionsAndOverflow) {
  std::vector<float> data(4);
  EXPECT_FALSE((TensorView<float, 2>::Create(std::span<float>(data), {-1, -4})).ok());
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_FALSE((TensorView<float, 2>::Create(std::span<float>(data), {huge, 4})).ok());
}

TEST(TensorViewTest, StridedViewMustStayInsideItsBuffer) {
  std::vector<float> data(100);
  // 4 rows of 8 with a row stride of 16: reaches element 3 * 16 + 7 = 55.
  EXPECT_TRUE((TensorView<float, 2>::CreateStrided(data.data(), 56, {4, 8}, {16, 1})).ok());
  EXPECT_FALSE((TensorView<float, 2>::CreateStrided(data.data(), 55, {4, 8}, {16, 1})).ok());
  EXPECT_FALSE((TensorView<float, 2>::CreateStrided(data.data(), 100, {4, 8}, {-16, 1})).ok());
}

TEST(TensorViewTest, EmptyViewsAreValid) {
  std::vector<float> data;
  auto view = TensorView<float, 2>::Create(std::span<float>(data), {0, 576});
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->empty());
}

}  // namespace
}  // namespace mlaserve
