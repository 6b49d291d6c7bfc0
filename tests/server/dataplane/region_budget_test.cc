#include "server/dataplane/region_budget.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::dataplane {
namespace {

using ::testing::HasSubstr;

TEST(RegionBudgetTest, EachCapRefusesByItsFlagAndTakesNothing) {
  RegionBudget budget({.region_bytes = 100, .tenant_bytes = 150, .total_bytes = 250});
  service::Tenant alpha, beta, carol;
  alpha.name = "alpha";
  beta.name = "beta";
  carol.name = "carol";
  const absl::Status too_large = budget.Take(&alpha, 101);
  EXPECT_TRUE(absl::IsResourceExhausted(too_large));
  EXPECT_THAT(std::string(too_large.message()), HasSubstr("--data_plane_region_mb"));
  ASSERT_TRUE(budget.Take(&alpha, 100).ok());
  const absl::Status tenant = budget.Take(&alpha, 60);
  EXPECT_THAT(std::string(tenant.message()), HasSubstr("tenant 'alpha'"));
  EXPECT_THAT(std::string(tenant.message()), HasSubstr("--data_plane_tenant_mb"));
  ASSERT_TRUE(budget.Take(&beta, 100).ok());
  ASSERT_TRUE(budget.Take(&beta, 40).ok());
  const absl::Status total = budget.Take(&carol, 20);
  EXPECT_THAT(std::string(total.message()), HasSubstr("--data_plane_memory_mb"));
  EXPECT_EQ(budget.total(), 240u);  // the refusals took nothing
  budget.Give(&alpha, 100);
  EXPECT_EQ(budget.total(), 140u);
  EXPECT_TRUE(budget.Take(&carol, 20).ok());
  budget.Give(&carol, 20);
  // Single-tenant clients (no tenant) count only against the region and total caps.
  EXPECT_TRUE(budget.Take(nullptr, 100).ok());
  EXPECT_TRUE(budget.Take(nullptr, 10).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(budget.Take(nullptr, 1)));
}

}  // namespace
}  // namespace mlaserve::dataplane
