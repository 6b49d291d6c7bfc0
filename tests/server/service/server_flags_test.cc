#include "server/server_flags.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "common/command_line.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_host.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve {
namespace {

using ::testing::ElementsAre;
using ::testing::StartsWith;

HostResources Host(int cpus, double quota = 0) { return mlaserve::testing::FakeHost(cpus, quota); }

// Flags are process-wide: every parse starts from and restores the defaults. The pool is
// sized for a 16-CPU host unless a test names another.
class ServerFlagsTest : public ::testing::Test {
 protected:
  absl::StatusOr<ServerConfig> Parse(std::vector<std::string> args,
                                     const HostResources& host = Host(16)) {
    const absl::FlagSaver saver;
    args.insert(args.begin(), "mlaserve-server");
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    absl::StatusOr<ServerConfig> config =
        ParseServerCommandLine(static_cast<int>(argv.size()), argv.data(), host);
    return config;
  }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    static const ::mlaserve::testing::ScratchDir dir("server_flags_test");
    const std::string path = dir.Path(name);
    std::ofstream(path) << contents;
    return path;
  }
};

TEST_F(ServerFlagsTest, DefaultsServeASmallDeepSeekDemoOnLoopback) {
  auto config = Parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.listen_address, "127.0.0.1:50051");
  EXPECT_EQ(config->server.metrics_address, "127.0.0.1:9464");
  EXPECT_EQ(config->engine.model.name, "deepseek-v3");
  EXPECT_EQ(config->engine.model.layers, 4);
  EXPECT_EQ(config->engine.model.heads, 128);
  EXPECT_FLOAT_EQ(config->engine.model.softmax_scale, 0.1352338f);
  EXPECT_EQ(config->engine.kv.budget_bytes, 0);  // auto: 2 GiB on the CPU devices
  EXPECT_EQ(config->engine.devices, 16);         // auto: a device per usable CPU
  EXPECT_EQ(config->engine.host_threads_per_device, 1);
  EXPECT_EQ(config->engine.profile, "ascend910-die");
  EXPECT_EQ(config->engine.gpu, "");
  EXPECT_EQ(config->engine.kv.page_size, 128);
  EXPECT_EQ(config->server.max_message_bytes, int64_t{64} << 20);
  EXPECT_EQ(config->log_level, spdlog::level::info);
  EXPECT_EQ(config->drain_timeout, absl::Seconds(30));
  EXPECT_EQ(config->server.heap_release_interval, absl::Seconds(60));
}

TEST_F(ServerFlagsTest, DashesAndUnderscoresAreTheSameFlag) {
  auto config = Parse({"--max-batch=16", "--max_queue=99", "--kv-budget", "512MiB",
                       "--model=kimi-k2", "--layers=0", "--metrics-listen=", "--log-level=warn",
                       "--drain-timeout-s=5", "--max-wait-us=250", "--matrix-tflops=376",
                       "--hbm_tbps=1.8", "--preload=1", "--batch-invariant"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.max_batch, 16);
  EXPECT_EQ(config->engine.max_queue, 99);
  EXPECT_EQ(config->engine.kv.budget_bytes, int64_t{512} << 20);
  EXPECT_EQ(config->engine.model.name, "kimi-k2");
  EXPECT_EQ(config->engine.model.layers, 61);  // 0: the whole preset
  EXPECT_EQ(config->server.metrics_address, "");
  EXPECT_EQ(config->log_level, spdlog::level::warn);
  EXPECT_EQ(config->drain_timeout, absl::Seconds(5));
  EXPECT_EQ(config->engine.max_wait, absl::Microseconds(250));
  EXPECT_EQ(config->engine.matrix_tflops, 376);
  EXPECT_EQ(config->engine.hbm_tbps, 1.8);
  EXPECT_EQ(config->engine.preload, 1);
  EXPECT_TRUE(config->engine.batch_invariant);
}

TEST_F(ServerFlagsTest, AFlagfileIsReadWithEitherSpellingAndCommandLineFlagsAfterItWin) {
  const std::string inner = WriteFile("inner.flags", "--page-size=64\n");
  const std::string outer = WriteFile(
      "outer.flags", absl::StrCat("# demo settings\n\n--devices=3\n  --host-threads=2  \n",
                                  "--flagfile=", inner, "\n--max_batch=32\n"));
  auto config = Parse({"--flagfile", outer, "--max-batch=48"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.devices, 3);
  EXPECT_EQ(config->engine.host_threads_per_device, 2);
  EXPECT_EQ(config->engine.kv.page_size, 64);
  EXPECT_EQ(config->engine.max_batch, 48);
}

// --devices names the pool: a number of emulated NPUs, the host, or one GPU.
TEST_F(ServerFlagsTest, DevicesNameEmulatedNpusTheHostOrAGpu) {
  auto config = Parse({"--devices=6", "--kv_budget=auto"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.devices, 6);
  EXPECT_EQ(config->engine.host_threads_per_device, 2);  // 16 CPUs shared out
  EXPECT_EQ(config->engine.gpu, "");
  EXPECT_EQ(config->engine.kv.budget_bytes, 0);
  config = Parse({"--devices=host", "--host_threads=4"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.profile, "host");
  EXPECT_EQ(config->engine.devices, 1);
  EXPECT_EQ(config->engine.host_threads_per_device, 4);
  config = Parse({"--devices=cuda:1"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.gpu, "cuda:1");
  for (const char* bad : {"--devices=gpu", "--devices=-1", "--devices=0", "--devices="}) {
    EXPECT_THAT(std::string(Parse({bad}).status().message()), StartsWith("--devices: ")) << bad;
  }
  for (const char* bad : {"--host_threads=0", "--host_threads=many", "--host_threads="}) {
    EXPECT_THAT(std::string(Parse({bad}).status().message()), StartsWith("--host_threads: "))
        << bad;
  }
}

// --devices=auto (the default) sizes the pool from the host's usable CPUs, its cgroup quota
// included, and the engine reports how (GetServerInfo, the start-up line).
TEST_F(ServerFlagsTest, TheDefaultPoolIsSizedFromTheHostAndSaysHow) {
  auto config = Parse({}, Host(8, /*quota=*/3.5));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.devices, 3);
  EXPECT_EQ(config->engine.host_threads_per_device, 1);
  EXPECT_EQ(config->engine.sizing.usable_cpus, 3);
  EXPECT_DOUBLE_EQ(config->engine.sizing.cpu_quota, 3.5);
  EXPECT_EQ(config->engine.sizing.numa_nodes, 1);
  EXPECT_THAT(config->engine.sizing.rule, StartsWith("auto: "));
  EXPECT_FALSE(config->engine.sizing.oversubscribed);

  config = Parse({"--host_threads=4"}, Host(8));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine.devices, 2);
  EXPECT_EQ(config->engine.host_threads_per_device, 4);

  config = Parse({"--devices=4", "--host_threads=4"}, Host(8));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->engine.sizing.oversubscribed);  // as asked, and said so at start
  EXPECT_THAT(config->engine.sizing.rule, StartsWith("as given: "));
}

TEST_F(ServerFlagsTest, BadValuesNameTheirFlag) {
  EXPECT_THAT(std::string(Parse({"--model=llama"}).status().message()), StartsWith("--model: "));
  EXPECT_THAT(std::string(Parse({"--kv_budget=2 parsecs"}).status().message()),
              StartsWith("--kv_budget: "));
  EXPECT_THAT(std::string(Parse({"--max_batch=0"}).status().message()),
              StartsWith("--max_batch: 0"));
  EXPECT_THAT(std::string(Parse({"--log_level=loud"}).status().message()),
              StartsWith("--log_level: "));
  EXPECT_THAT(std::string(Parse({"--max_message_mb=4096"}).status().message()),
              StartsWith("--max_message_mb: "));
  EXPECT_THAT(std::string(Parse({"--layers=-2"}).status().message()), StartsWith("--layers: "));
  EXPECT_THAT(std::string(Parse({"--preload=3"}).status().message()), StartsWith("--preload: 3"));
  EXPECT_THAT(std::string(Parse({"--layers=62"}).status().message()),
              StartsWith("--layers: 62 exceeds"));
  EXPECT_EQ(Parse({"--flagfile=/nonexistent/x.flags"}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(Parse({"stray"}).status().message()), StartsWith("unexpected argument"));
  EXPECT_THAT(std::string(Parse({"--heap_release_interval_s=-1"}).status().message()),
              StartsWith("--heap_release_interval_s: -1 is outside"));
}

TEST_F(ServerFlagsTest, HeapReleasesCanBeSpacedOrTurnedOff) {
  auto config = Parse({"--heap-release-interval-s=5"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.heap_release_interval, absl::Seconds(5));
  config = Parse({"--heap_release_interval_s=0"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.heap_release_interval, absl::ZeroDuration());
}

TEST_F(ServerFlagsTest, ConnectionLimitsAreSetAndCheckedByFlag) {
  auto config = Parse({"--grpc_memory=512MiB", "--max_streams_per_connection=32",
                       "--max_streams_per_client=100", "--keepalive_s=5", "--keepalive_timeout_s=2",
                       "--max_connection_idle_s=0", "--max_connection_age_s=600",
                       "--max_connection_age_grace_s=10"});
  ASSERT_TRUE(config.ok()) << config.status();
  const service::ServerOptions& server = config->server;
  EXPECT_EQ(server.grpc_memory_bytes, int64_t{512} << 20);
  EXPECT_EQ(server.max_streams_per_connection, 32);
  EXPECT_EQ(server.max_streams_per_client, 100);
  EXPECT_EQ(server.keepalive_time, absl::Seconds(5));
  EXPECT_EQ(server.keepalive_timeout, absl::Seconds(2));
  EXPECT_EQ(server.max_connection_idle, absl::InfiniteDuration());
  EXPECT_EQ(server.max_connection_age, absl::Seconds(600));
  EXPECT_EQ(server.max_connection_age_grace, absl::Seconds(10));

  EXPECT_THAT(std::string(Parse({"--grpc_memory=100MiB"}).status().message()),
              StartsWith("--grpc_memory: 104857600 bytes is less than twice --max_message_mb"));
  EXPECT_THAT(std::string(Parse({"--grpc_memory=lots"}).status().message()),
              StartsWith("--grpc_memory: "));
  EXPECT_THAT(std::string(Parse({"--max_streams_per_connection=0"}).status().message()),
              StartsWith("--max_streams_per_connection: 0 is outside"));
  EXPECT_THAT(std::string(Parse({"--max_streams_per_client=-1"}).status().message()),
              StartsWith("--max_streams_per_client: -1 is outside"));
  EXPECT_THAT(std::string(Parse({"--keepalive_s=0"}).status().message()),
              StartsWith("--keepalive_s: 0 is outside [1, 86400]"));
  EXPECT_THAT(std::string(Parse({"--max_connection_age_s=-1"}).status().message()),
              StartsWith("--max_connection_age_s: -1 is outside"));
}

TEST(NormalizeFlagArgumentsTest, KeepsValuesPositionalsAndEverythingAfterDoubleDash) {
  auto args = NormalizeFlagArguments(
      {"prog", "-max-batch=3", "--seed", "-1", "pos-arg", "--", "--not-a-flag"});
  ASSERT_TRUE(args.ok());
  EXPECT_THAT(
      *args, ElementsAre("prog", "--max_batch=3", "--seed", "-1", "pos-arg", "--", "--not-a-flag"));
}

TEST(ParseByteSizeTest, BinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1.5gib"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("64KiB"), 65536);
  EXPECT_EQ(*ParseByteSize("1GB"), 1000000000);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize(" 10 MiB "), 10 << 20);
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("3 furlongs").ok());
  EXPECT_FALSE(ParseByteSize("99999999TiB").ok());
}

}  // namespace
}  // namespace mlaserve
