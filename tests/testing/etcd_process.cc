#include "tests/testing/etcd_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/security/credentials.h"

namespace mlaserve::testing {

namespace {

bool PortAccepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool accepted = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return accepted;
}

}  // namespace

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

EtcdProcess::EtcdProcess(std::string binary)
    : binary_(std::move(binary)), client_port_(FreeLoopbackPort()), peer_port_(FreeLoopbackPort()) {
  Start();
}

EtcdProcess::~EtcdProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string EtcdProcess::endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

std::unique_ptr<cluster::EtcdClient> EtcdProcess::Client() const {
  absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> client = cluster::EtcdClient::Connect(
      {endpoint()}, grpc::InsecureChannelCredentials(), absl::Seconds(2));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

void EtcdProcess::Start() {
  const std::string url = absl::StrCat("http://127.0.0.1:", client_port_);
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> args = {binary_,
                                   "--name=test",
                                   "--data-dir=" + dir_.Path("data"),
                                   "--listen-client-urls=" + url,
                                   "--advertise-client-urls=" + url,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=test=" + peer,
                                   "--log-level=error"};
  const std::string log = dir_.Path("etcd.log");
  // Everything the child needs is made before fork: a child of a threaded process may only
  // make async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ASSERT_GT(pid_, 0) << "fork";
  // The port first: a gRPC channel whose first connection was refused waits out its
  // reconnect backoff.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!PortAccepts(client_port_) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::unique_ptr<cluster::EtcdClient> client = Client();
  absl::Status last = absl::UnknownError("no client");
  while (absl::Now() < deadline) {
    if (client != nullptr) last = client->GetPrefix("/").status();
    if (last.ok()) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "etcd did not answer on " << endpoint() << " within 30 s: " << last;
}

void EtcdProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace mlaserve::testing
