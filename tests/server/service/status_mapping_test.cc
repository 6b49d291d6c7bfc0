#include "server/service/status_mapping.h"

#include "gtest/gtest.h"

namespace mlaserve::service {
namespace {

TEST(StatusMappingTest, EveryCodeKeepsItsNumberAndMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "queries[3].layer: 9");
    const grpc::Status mapped = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(mapped.error_code()), code);
    EXPECT_EQ(mapped.error_message(), "queries[3].layer: 9");
  }
}

TEST(StatusMappingTest, OkIsOkWithoutAMessage) {
  const grpc::Status mapped = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(mapped.ok());
  EXPECT_EQ(mapped.error_message(), "");
}

TEST(StatusMappingTest, ACodeOutsideGrpcsRangeBecomesUnknown) {
  const grpc::Status mapped = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(40), "odd"));
  EXPECT_EQ(mapped.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(mapped.error_message(), "odd");
}

}  // namespace
}  // namespace mlaserve::service
