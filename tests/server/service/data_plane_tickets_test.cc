#include "server/service/data_plane_tickets.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mlaserve::service {
namespace {

TEST(DataPlaneTicketsTest, ATicketCarriesItsTenantOnceAndNotPastItsTime) {
  DataPlaneTickets tickets(absl::Milliseconds(200));
  Tenant alpha;
  alpha.name = "alpha";
  const std::string first = tickets.Issue(&alpha);
  const std::string second = tickets.Issue(nullptr);
  EXPECT_EQ(first.size(), 16u);
  EXPECT_NE(first, second);
  absl::StatusOr<Tenant*> redeemed = tickets.Redeem(first);
  ASSERT_TRUE(redeemed.ok());
  EXPECT_EQ(*redeemed, &alpha);
  EXPECT_TRUE(absl::IsUnauthenticated(tickets.Redeem(first).status()));  // spent
  EXPECT_TRUE(absl::IsUnauthenticated(tickets.Redeem("not a ticket").status()));
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_TRUE(absl::IsUnauthenticated(tickets.Redeem(second).status()));  // expired
}

}  // namespace
}  // namespace mlaserve::service
