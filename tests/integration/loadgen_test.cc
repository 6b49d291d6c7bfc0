// The load generator against the real server: a short workload runs, creates what it needs in
// the format asked for, and releases everything.

#include "absl/time/time.h"
#include "client/loadgen/grpc_load_target.h"
#include "client/loadgen/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

TEST(LoadgenTest, AShortRunInTheFormatAskedForLeavesNothingBehind) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  for (const KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    auto target = loadgen::GrpcLoadTarget::Create(server.NewClient());
    ASSERT_TRUE(target.ok()) << target.status();
    loadgen::WorkloadOptions o;
    o.workers = 2;
    o.sequences = 3;
    o.prefix_tokens = 40;
    o.context_tokens = 9;
    o.duration = absl::Milliseconds(300);
    o.kv_dtype = dtype;
    o.run_id = KvDtypeName(dtype);
    absl::StatusOr<loadgen::LoadResult> result = loadgen::RunWorkload(**target, o);
    ASSERT_TRUE(result.ok()) << result.status();
    int answers = 0;
    for (const loadgen::CallRecord& call : result->calls) {
      EXPECT_EQ(call.code, absl::StatusCode::kOk);
      for (const loadgen::LoadAnswer& a : call.answers) {
        EXPECT_EQ(a.fp8, dtype == KvDtype::kFp8);
        ++answers;
      }
    }
    EXPECT_GT(answers, 0);
    // Everything the run made is gone: the sequences' ids are free again.
    EXPECT_EQ(
        server.client().GetSequence(std::string(KvDtypeName(dtype)) + "/w0/s0").status().code(),
        absl::StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace mlaserve::integration
