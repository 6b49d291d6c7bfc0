#include "common/host_port.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve {
namespace {

using ::testing::HasSubstr;

TEST(ParseHostPortTest, ReadsNamesIpv4AndBracketedIpv6) {
  absl::StatusOr<HostPort> name = ParseHostPort("localhost:9464", "--flag");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->host, "localhost");
  EXPECT_EQ(name->port, 9464);
  absl::StatusOr<HostPort> any = ParseHostPort("0.0.0.0:0", "--flag");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->host, "0.0.0.0");
  EXPECT_EQ(any->port, 0);
  absl::StatusOr<HostPort> v6 = ParseHostPort("[::1]:65535", "--flag");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 65535);
}

TEST(ParseHostPortTest, RefusesWhatIsNotHostColonPortNamingTheFlag) {
  for (const char* text : {"", "9464", ":9464", "host:", "host:http", "host:65536", "host:-1",
                           "::1:9464", "[::1:9464", "[]:1"}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(text, "--metrics_listen");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("--metrics_listen")) << text;
  }
}

}  // namespace
}  // namespace mlaserve
