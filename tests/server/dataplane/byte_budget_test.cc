#include "server/dataplane/byte_budget.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::dataplane {
namespace {

using ::testing::HasSubstr;

TEST(ByteBudgetTest, EachCapRefusesByItsFlagAndTakesNothing) {
  ByteBudget budget({.item_bytes = 100, .tenant_bytes = 150, .total_bytes = 250}, kRegionWording);
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

// The UCX plane's calls in flight speak of calls and their own flags, and say what to do.
TEST(ByteBudgetTest, TheUcxPlanesCallsNameItsFlags) {
  ByteBudget budget({.item_bytes = 100, .tenant_bytes = 150, .total_bytes = 250}, kUcxCallWording);
  service::Tenant alpha;
  alpha.name = "alpha";
  EXPECT_THAT(std::string(budget.Take(&alpha, 101).message()),
              HasSubstr("call: 101 bytes exceed the 100 one call may take "
                        "(--data_plane_ucx_call_mb)"));
  ASSERT_TRUE(budget.Take(&alpha, 100).ok());
  EXPECT_THAT(std::string(budget.Take(&alpha, 60).message()),
              HasSubstr("call: tenant 'alpha' holds 100 bytes of calls in flight; 60 more pass "
                        "its 150 (--data_plane_ucx_tenant_mb); retry after the answers"));
  EXPECT_EQ(budget.total(), 100u);
}

}  // namespace
}  // namespace mlaserve::dataplane
