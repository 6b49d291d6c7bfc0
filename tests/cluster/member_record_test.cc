#include "cluster/member_record.h"

#include <string>

#include "cluster/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/cluster/advertise_address.h"

namespace mlaserve::cluster {
namespace {

using ::testing::HasSubstr;

MemberRecord Example() {
  MemberRecord record;
  record.instance_id = "0123abcd";
  record.address = "10.1.2.3:50051";
  record.version = "0.1.0";
  record.model = "deepseek-v3";
  record.layers = 61;
  record.heads = 128;
  record.kv_formats = {"bf16", "fp8"};
  record.default_kv_format = "bf16";
  record.devices = 2;
  record.device_profile = "ascend910-die";
  record.kv_budget_bytes = int64_t{8} << 30;
  record.kv_used_bytes = 123456789;
  record.sequences = 72;
  record.prefixes = 1;
  record.queued_queries = 5;
  record.queries_per_s = 1234.5;
  record.updated_unix_ms = 1764100000000;
  return record;
}

TEST(MemberRecordTest, RoundTripsThroughJson) {
  const MemberRecord record = Example();
  absl::StatusOr<MemberRecord> parsed = ParseMemberRecord(record.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, record);
}

TEST(MemberRecordTest, ReadersIgnoreFieldsTheyDoNotKnow) {
  nlohmann::json json = nlohmann::json::parse(Example().ToJson());
  json["added_later"] = {{"x", 1}};
  json["load"]["gpu_seconds"] = 3;
  absl::StatusOr<MemberRecord> parsed = ParseMemberRecord(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, Example());
}

TEST(MemberRecordTest, ABadValueIsInvalidNamingTheField) {
  const std::string good = Example().ToJson();
  struct Case {
    const char* path;
    nlohmann::json value;
  };
  for (const auto& [path, value] : std::vector<Case>{{"/address", 5},
                                                     {"/model/layers", "many"},
                                                     {"/load/queries_per_s", "fast"},
                                                     {"/kv_formats", {"bf16", 8}},
                                                     {"/devices", 2}}) {
    nlohmann::json json = nlohmann::json::parse(good);
    json[nlohmann::json::json_pointer(path)] = value;
    const absl::Status status = ParseMemberRecord(json.dump()).status();
    std::string field = std::string(path).substr(1);
    for (char& c : field) c = c == '/' ? '.' : c;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(status.message(), HasSubstr(field)) << path;
  }
  EXPECT_EQ(ParseMemberRecord("not json").status().code(), absl::StatusCode::kInvalidArgument);
  nlohmann::json no_address = nlohmann::json::parse(good);
  no_address["address"] = "";
  EXPECT_THAT(ParseMemberRecord(no_address.dump()).status().message(),
              HasSubstr("address is empty"));
}

TEST(MemberRecordTest, KeysLiveUnderTheClustersPrefix) {
  EXPECT_EQ(MemberKey("prod", "abc"), "/mlaserve/prod/servers/abc");
  EXPECT_EQ(MemberKey("prod", "abc").rfind(MembersPrefix("prod"), 0), 0u);
  // Another cluster whose name extends this one's is not under its prefix.
  EXPECT_NE(MemberKey("prod2", "abc").rfind(MembersPrefix("prod"), 0), 0u);
}

TEST(PrefixRangeEndTest, IsThePrefixWithItsLastByteRaised) {
  EXPECT_EQ(PrefixRangeEnd("/mlaserve/a/"), "/mlaserve/a0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(AdvertiseAddressTest, ClientsGetAnAddressTheyCanDial) {
  EXPECT_EQ(*AdvertiseAddress("edge.example:7000", "0.0.0.0:50051", 50051), "edge.example:7000");
  EXPECT_EQ(*AdvertiseAddress("", "127.0.0.1:0", 41234), "127.0.0.1:41234");
  EXPECT_EQ(*AdvertiseAddress("", "[::1]:50051", 50051), "[::1]:50051");
  absl::StatusOr<std::string> wildcard = AdvertiseAddress("", "0.0.0.0:50051", 50051);
  ASSERT_TRUE(wildcard.ok()) << wildcard.status();
  EXPECT_THAT(*wildcard, ::testing::EndsWith(":50051"));
  EXPECT_EQ(wildcard->find("0.0.0.0"), std::string::npos);
  EXPECT_FALSE(AdvertiseAddress("", "no-port", 1).ok());
}

}  // namespace
}  // namespace mlaserve::cluster
