#include "bench/peer_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace mlaserve::bench {

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Start(
    std::vector<std::string> argv, std::map<std::string, std::string> env) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  // Everything exec needs is built before fork: the child only dups and execs.
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (!env.contains(name)) envs.push_back(entry);
  }
  for (const auto& [name, value] : env) {
    if (!value.empty()) envs.push_back(absl::StrCat(name, "=", value));
  }
  std::vector<char*> c_argv, c_env;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  for (std::string& e : envs) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    // The PATH search of a shell: `--peer_python=python3` names a virtual environment's.
    execvpe(c_argv[0], c_argv.data(), c_env.data());
    _exit(127);
  }
  // A peer that could not start (or died) makes the next write fail with EPIPE, reported as
  // "the peer process is gone", instead of SIGPIPE ending the bench without a word.
  signal(SIGPIPE, SIG_IGN);
  close(in[0]);
  close(out[1]);
  return std::unique_ptr<PeerProcess>(
      new PeerProcess(pid, fdopen(in[1], "w"), fdopen(out[0], "r")));
}

PeerProcess::~PeerProcess() {
  std::fputs("{\"op\":\"quit\"}\n", to_);
  std::fclose(to_);
  std::fclose(from_);
  int status = 0;
  waitpid(pid_, &status, 0);
}

absl::StatusOr<nlohmann::json> PeerProcess::Call(const nlohmann::json& request) {
  const std::string line = request.dump() + "\n";
  if (std::fputs(line.c_str(), to_) < 0 || std::fflush(to_) != 0) {
    return absl::UnavailableError("the peer process is gone");
  }
  std::string reply;
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), from_) != nullptr) {
    reply += buffer;
    if (!reply.empty() && reply.back() == '\n') break;
  }
  if (reply.empty()) return absl::UnavailableError("the peer process ended without a reply");
  nlohmann::json parsed = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InternalError(absl::StrCat("the peer replied '", reply, "'"));
  if (parsed.contains("error"))
    return absl::InternalError(absl::StrCat("peer: ", parsed["error"].dump()));
  return parsed;
}

}  // namespace mlaserve::bench
