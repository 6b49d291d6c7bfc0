// The UCX data plane across two network namespaces joined by a veth pair, over UCX's TCP
// transport (UCX_TLS=tcp, UCX_NET_DEVICES=the veth): the server binary in one, ucx_peer in
// the other. Answers bit for bit gRPC's, two tenants kept apart, bad input named, a client
// killed mid-call leaving nothing behind, a drain answering the call in flight. Needs root
// and iproute2 (CI runs as root); skipped with the reason otherwise. Everything it makes
// (namespaces, the veth pair, a tokens file) goes at the end, pass or fail.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/service/tenancy.h"

namespace mlaserve::integration {
namespace {

// Spawns `argv` with `env` added to this process's environment; its output to `out_fd`
// (-1: this process's own, -2: /dev/null). The pid, or -1.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
            int out_fd = -1) {
  std::vector<std::string> environment = env;
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (out_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  } else if (out_fd == -2) {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = -1;
  if (posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// The exit code of `pid` within `timeout` (killed and -1 past it; 128 + signal if signalled).
int Wait(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int Run(const std::vector<std::string>& argv) {
  return Wait(Spawn(argv, {}, -2), absl::Seconds(10));
}

// Two namespaces and a veth pair on a private /30, removed by the destructor.
class NetnsPair {
 public:
  NetnsPair() {
    const std::string tag = std::to_string(getpid() % 100000);
    server_ns = "mlaserve-ucx-s" + tag;
    client_ns = "mlaserve-ucx-c" + tag;
    server_dev = "mlus" + tag;
    client_dev = "mluc" + tag;
    const std::string net = absl::StrCat("10.254.", getpid() % 250 + 1, ".");
    server_ip = net + "1";
    client_ip = net + "2";
  }
  // Empty, or why the namespaces cannot be made here.
  std::string Create() {
    if (geteuid() != 0) return "needs root to create network namespaces (ip netns add)";
    if (Run({"ip", "-V"}) != 0) return "needs iproute2's ip to create network namespaces";
    if (Run({"ip", "netns", "add", server_ns}) != 0) {
      return "ip netns add failed (no CAP_SYS_ADMIN in this container?)";
    }
    made_ = true;
    const std::vector<std::vector<std::string>> steps = {
        {"ip", "netns", "add", client_ns},
        {"ip", "link", "add", server_dev, "type", "veth", "peer", "name", client_dev},
        {"ip", "link", "set", server_dev, "netns", server_ns},
        {"ip", "link", "set", client_dev, "netns", client_ns},
        {"ip", "-n", server_ns, "addr", "add", server_ip + "/30", "dev", server_dev},
        {"ip", "-n", client_ns, "addr", "add", client_ip + "/30", "dev", client_dev},
        {"ip", "-n", server_ns, "link", "set", server_dev, "up"},
        {"ip", "-n", client_ns, "link", "set", client_dev, "up"},
        {"ip", "-n", server_ns, "link", "set", "lo", "up"},
        {"ip", "-n", client_ns, "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      if (Run(step) != 0) return "cannot set up the veth pair: " + absl::StrJoin(step, " ");
    }
    return "";
  }
  ~NetnsPair() {
    if (!made_) return;
    // The veth pair goes with its namespaces; a link left in the root one (a failed move)
    // is removed by name.
    Run({"ip", "netns", "del", server_ns});
    Run({"ip", "netns", "del", client_ns});
    Run({"ip", "link", "del", server_dev});
  }

  std::string server_ns, client_ns, server_dev, client_dev, server_ip, client_ip;

 private:
  bool made_ = false;
};

class UcxNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = net_.Create(); !why.empty()) GTEST_SKIP() << why;
    char dir[] = "/tmp/mlaserve-ucx-netns-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    std::ofstream(dir_ + "/tokens.json")
        << R"({"tenants": [{"name": "alpha", "token_sha256": ")"
        << service::TokenHash("alpha-token") << R"("}, {"name": "beta", "token_sha256": ")"
        << service::TokenHash("beta-token") << R"("}]})";
    server_ = Spawn(
        {"ip", "netns", "exec", net_.server_ns, MLASERVE_SERVER_BINARY,
         "--listen=" + net_.server_ip + ":50051", "--metrics_listen=" + net_.server_ip + ":9464",
         "--data_plane_ucx=" + net_.server_ip + ":50052", "--data_plane_ucx_call_mb=8",
         "--data_plane_socket=none", "--layers=2", "--auth_tokens_file=" + dir_ + "/tokens.json",
         "--drain_timeout_s=20"},
        {"UCX_TLS=tcp", "UCX_NET_DEVICES=" + net_.server_dev});
    ASSERT_GT(server_, 0);
  }
  void TearDown() override {
    if (server_ > 0) {
      kill(server_, SIGKILL);
      waitpid(server_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // ucx_peer in the client namespace over its veth; its exit code within `timeout`.
  pid_t Peer(std::vector<std::string> args, int out_fd = -1) {
    std::vector<std::string> argv = {"ip", "netns", "exec", net_.client_ns, MLASERVE_UCX_PEER};
    argv.insert(argv.end(), args.begin(), args.end());
    return Spawn(argv, {"UCX_TLS=tcp", "UCX_NET_DEVICES=" + net_.client_dev}, out_fd);
  }
  std::string target() const { return net_.server_ip + ":50051"; }
  std::string metrics() const { return net_.server_ip + ":9464"; }

  NetnsPair net_;
  std::string dir_;
  pid_t server_ = -1;
};

TEST_F(UcxNetnsTest, AcrossTwoNamespacesOverTcp) {
  // Answers, tenants, bad input (the peer prints each check; its exit code is theirs).
  EXPECT_EQ(Wait(Peer({"check", target()}), absl::Seconds(90)), 0);
  // A client killed with a call in flight: the server's plane is empty again.
  EXPECT_EQ(Wait(Peer({"dies", target()}), absl::Seconds(60)), 128 + SIGKILL);
  EXPECT_EQ(Wait(Peer({"idle", metrics()}), absl::Seconds(30)), 0);
  // A drain answers the call in flight, then the server exits 0.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t drain = Peer({"drain", target(), metrics()}, pipe_fds[1]);
  close(pipe_fds[1]);
  FILE* out = fdopen(pipe_fds[0], "r");
  char line[64] = {};
  const bool taken = fgets(line, sizeof(line), out) != nullptr;  // "taken"
  EXPECT_TRUE(taken && std::string(line) == "taken\n") << line;
  kill(server_, SIGTERM);
  std::string rest;  // the peer's verdict on its call, read to its end (no SIGPIPE for it)
  for (char more[256]; fgets(more, sizeof(more), out) != nullptr;) rest += more;
  fclose(out);
  EXPECT_EQ(Wait(drain, absl::Seconds(60)), 0) << rest;
  EXPECT_NE(rest.find("ok   the call in flight answered through the drain"), std::string::npos)
      << rest;
  EXPECT_EQ(Wait(server_, absl::Seconds(30)), 0);
  server_ = -1;
}

}  // namespace
}  // namespace mlaserve::integration
