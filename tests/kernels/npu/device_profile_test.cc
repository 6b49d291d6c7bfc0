// Device profiles: the shipped ones load with an origin for every number, and loading
// validates every parameter.
#include "kernels/npu/device_profile.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mlaserve::npu {
namespace {

using ::testing::HasSubstr;

// A shipped profile's text, to break one field at a time.
nlohmann::json ShippedProfile() {
  std::ifstream in(std::string(MLASERVE_TEST_PROFILE_DIR) + "/ascend910-die.json");
  return nlohmann::json::parse(in);
}

TEST(DeviceProfileTest, ShippedProfilesLoadWithAnOriginForEveryNumber) {
  for (const char* name : {"ascend910", "ascend910-die"}) {
    auto p = LoadDeviceProfile(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_GT(p->PeakFlops(), 0);
    for (const auto& [key, origin] : p->origins) EXPECT_FALSE(origin.empty()) << key;
  }
  auto dual = LoadDeviceProfile("ascend910");
  auto die = LoadDeviceProfile("ascend910-die");
  EXPECT_EQ(dual->cube_cores, 2 * die->cube_cores);
  EXPECT_DOUBLE_EQ(dual->HbmBytesPerSecond(), 2 * die->HbmBytesPerSecond());
}

TEST(DeviceProfileTest, LoadingValidatesEveryParameter) {
  const nlohmann::json good = ShippedProfile();
  ASSERT_TRUE(ParseDeviceProfile(good.dump()).ok());
  const std::string some_key = good["parameters"].begin().key();
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[&](nlohmann::json& d) { d["parameters"].erase(some_key); }, "is missing"},
      {[&](nlohmann::json& d) { d["parameters"][some_key].erase("origin"); }, "needs an 'origin'"},
      {[&](nlohmann::json& d) { d["parameters"][some_key]["value"] = "fast"; },
       "needs a numeric 'value'"},
      {[](nlohmann::json& d) { d["parameters"]["cube_cores"]["value"] = 0; }, "is outside"},
      {[](nlohmann::json& d) {
         d["parameters"]["warp_size"] = {{"value", 32}, {"origin", "x"}};
       },
       "unknown parameter 'warp_size'"},
      {[](nlohmann::json& d) { d["parameters"]["ub_alignment"]["value"] = 48; }, "powers of two"},
      {[](nlohmann::json& d) { d.erase("name"); }, "'name'"},
  };
  for (const Case& c : cases) {
    nlohmann::json doc = good;
    c.edit(doc);
    const auto parsed = ParseDeviceProfile(doc.dump());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message));
  }
  EXPECT_EQ(ParseDeviceProfile("{ not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDeviceProfile("no-such-npu").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mlaserve::npu
