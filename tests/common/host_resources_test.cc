#include "common/host_resources.h"

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A host laid out as procfs and sysfs lay it out, in a directory of the test's own.
class FakeHost {
 public:
  FakeHost() : dir_("host_resources_test"), root_(dir_.Path("root")) {}

  const fs::path& root() const { return root_; }

  FakeHost& File(const std::string& path, const std::string& text) {
    const fs::path file = root_ / path;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return *this;
  }
  FakeHost& Cpus(const std::string& online, const std::string& allowed) {
    File("sys/devices/system/cpu/online", online + "\n");
    return File("proc/self/status",
                "Name:\tmlaserve-server\nCpus_allowed:\tff\nCpus_allowed_list:\t" + allowed +
                    "\nMems_allowed_list:\t0\n");
  }

 private:
  testing::ScratchDir dir_;
  fs::path root_;
};

TEST(ParseCpuListTest, ReadsTheKernelsListFormat) {
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuList("5"), ElementsAre(5));
  EXPECT_THAT(*ParseCpuList(" 2-3 , 0 "), ElementsAre(0, 2, 3));
  EXPECT_TRUE(ParseCpuList("")->empty());
  for (const char* bad : {"a", "3-1", "-2", "1-", "0-3,x"}) {
    EXPECT_EQ(ParseCpuList(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({}), "");
}

// A cgroup v2 container: the limit of an ancestor applies, the smallest wins.
TEST(ReadHostResourcesTest, ACgroupV2QuotaCutsTheAffinityMask) {
  FakeHost host;
  host.Cpus("0-15", "0-7")
      .File("proc/self/cgroup", "0::/serving.slice/mlaserve.service\n")
      .File("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
      .File("sys/fs/cgroup/cpu.max", "max 100000\n")
      .File("sys/fs/cgroup/serving.slice/cpu.max", "250000 100000\n")
      .File("sys/fs/cgroup/serving.slice/mlaserve.service/cpu.max", "max 100000\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->online_cpus, 16);
  EXPECT_EQ(r->allowed_cpus.size(), 8u);
  EXPECT_DOUBLE_EQ(r->cpu_quota, 2.5);
  EXPECT_THAT(r->cpu_quota_source, HasSubstr("serving.slice/cpu.max"));
  EXPECT_EQ(r->UsableCpus(), 2);  // 2.5 CPUs of time keep 2 busy without throttling
  EXPECT_THAT(r->Describe(), HasSubstr("8 CPUs (0-7 of 16 online), a CPU quota of 2.50"));
}

TEST(ReadHostResourcesTest, AQuotaBelowOneCpuStillLeavesOne) {
  FakeHost host;
  host.Cpus("0-3", "0-3")
      .File("proc/self/cgroup", "0::/\n")
      .File("sys/fs/cgroup/cgroup.controllers", "cpu\n")
      .File("sys/fs/cgroup/cpu.max", "50000 100000\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->cpu_quota, 0.5);
  EXPECT_EQ(r->UsableCpus(), 1);
}

// cgroup v1's cpu controller (also where a v2 hierarchy is mounted beside it without one).
TEST(ReadHostResourcesTest, ACgroupV1QuotaIsReadFromTheCpuController) {
  FakeHost host;
  host.Cpus("0-31", "0-31")
      .File("proc/self/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
      .File("sys/fs/cgroup/unified/cgroup.procs", "1\n")
      .File("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
      .File("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
      .File("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "600000\n")
      .File("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->cpu_quota, 6.0);
  EXPECT_EQ(r->UsableCpus(), 6);
}

// A container whose cgroup namespace shows the host's path while its own cgroup is mounted
// as the root: the mount's limit is the container's.
TEST(ReadHostResourcesTest, ACgroupPathThatIsNotMountedReadsTheMountsRoot) {
  FakeHost host;
  host.Cpus("0-7", "0-7")
      .File("proc/self/cgroup", "1:cpu:/kubepods/pod1/c1\n")
      .File("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "400000\n")
      .File("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->cpu_quota, 4.0);
  EXPECT_EQ(r->UsableCpus(), 4);
}

TEST(ReadHostResourcesTest, NoQuotaLeavesTheAffinityMask) {
  FakeHost host;
  host.Cpus("0-15", "0-3,8-11").File("proc/self/cgroup", "0::/user.slice\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cpu_quota, 0);
  EXPECT_EQ(r->UsableCpus(), 8);
  EXPECT_THAT(r->Describe(), HasSubstr("no CPU quota, 1 NUMA node"));
}

// NUMA nodes as the process sees them: each node's allowed CPUs, nodes it may not use left out.
TEST(ReadHostResourcesTest, NumaNodesAndCachesAreThoseOfTheAllowedCpus) {
  FakeHost host;
  host.Cpus("0-23", "0-3,8-11")
      .File("sys/devices/system/node/node0/cpulist", "0-7\n")
      .File("sys/devices/system/node/node1/cpulist", "8-15\n")
      .File("sys/devices/system/node/node2/cpulist", "16-23\n")
      .File("sys/devices/system/node/possible", "0-2\n")
      .File("sys/devices/system/cpu/cpu0/cache/index0/level", "1\n")
      .File("sys/devices/system/cpu/cpu0/cache/index0/size", "48K\n")
      .File("sys/devices/system/cpu/cpu0/cache/index2/level", "2\n")
      .File("sys/devices/system/cpu/cpu0/cache/index2/size", "2048K\n")
      .File("sys/devices/system/cpu/cpu0/cache/index3/level", "3\n")
      .File("sys/devices/system/cpu/cpu0/cache/index3/size", "105M\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->numa_nodes.size(), 2u);
  EXPECT_THAT(r->numa_nodes[0], ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(r->numa_nodes[1], ElementsAre(8, 9, 10, 11));
  EXPECT_EQ(r->l2_bytes, int64_t{2} << 20);
  EXPECT_EQ(r->l3_bytes, int64_t{105} << 20);
  EXPECT_THAT(r->Describe(), HasSubstr("2 NUMA nodes, L2 2 MiB, L3 105 MiB"));
}

TEST(ReadHostResourcesTest, AFileThatCannotBeParsedIsNamed) {
  FakeHost host;
  host.Cpus("0-3", "0-3")
      .File("proc/self/cgroup", "0::/\n")
      .File("sys/fs/cgroup/cgroup.controllers", "cpu\n")
      .File("sys/fs/cgroup/cpu.max", "lots\n");
  absl::StatusOr<HostResources> r = ReadHostResources(host.root());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("cpu.max"));

  FakeHost garbled;
  garbled.Cpus("0-3", "zero to three");
  EXPECT_THAT(std::string(ReadHostResources(garbled.root()).status().message()),
              HasSubstr("proc/self/status"));

  FakeHost empty;
  empty.File("proc/self/cgroup", "0::/\n");
  EXPECT_THAT(std::string(ReadHostResources(empty.root()).status().message()),
              HasSubstr("no CPU found"));
}

// The live machine, against the kernel's own answer for the affinity mask.
TEST(ReadHostResourcesTest, TheLiveHostMatchesSchedGetaffinity) {
  absl::StatusOr<HostResources> r = ReadHostResources();
  ASSERT_TRUE(r.ok()) << r.status();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(static_cast<int>(r->allowed_cpus.size()), CPU_COUNT(&set));
  for (int cpu : r->allowed_cpus) EXPECT_TRUE(CPU_ISSET(cpu, &set)) << cpu;
  EXPECT_GE(r->UsableCpus(), 1);
  EXPECT_LE(r->UsableCpus(), CPU_COUNT(&set));
  EXPECT_FALSE(r->numa_nodes.empty());
}

}  // namespace
}  // namespace mlaserve
