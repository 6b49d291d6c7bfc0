#include "server/dataplane/shm_data_plane.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shm_layout.h"
#include "common/unix_socket.h"
#include "spdlog/spdlog.h"

namespace mlaserve::dataplane {
namespace {

// A hello is a ticket and a version; a doorbell is a few bytes.
constexpr size_t kMaxSocketMessage = 4096;
// A client that connects and says nothing is closed after this (it holds one of max_clients).
constexpr absl::Duration kHelloTimeout = absl::Seconds(10);

}  // namespace

absl::StatusOr<std::unique_ptr<ShmDataPlane>> ShmDataPlane::Start(
    ShmDataPlaneOptions options, service::DecodeDispatcher& dispatcher,
    service::DataPlaneTickets& tickets, service::ServiceMetrics& metrics,
    const engine::ModelConfig& model) {
  absl::StatusOr<int> listener = ListenUnix(options.address);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("--data_plane_socket: ", listener.status().message()));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return std::unique_ptr<ShmDataPlane>(
      new ShmDataPlane(std::move(options), *listener, wake, dispatcher, tickets, metrics, model));
}

ShmDataPlane::ShmDataPlane(ShmDataPlaneOptions options, int listener, int wake,
                           service::DecodeDispatcher& dispatcher,
                           service::DataPlaneTickets& tickets, service::ServiceMetrics& metrics,
                           const engine::ModelConfig& model)
    : options_(std::move(options)),
      listener_(listener),
      wake_(wake),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      dispatcher_(dispatcher),
      tickets_(tickets),
      metrics_(metrics),
      model_(model),
      budget_(std::make_shared<ByteBudget>(options_.caps, kRegionWording)) {
  for (const int fd : {listener_, wake_}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event);
  }
  poller_ = std::thread([this] { Poll(); });
}

ShmDataPlane::~ShmDataPlane() {
  stopping_.store(true);
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
  poller_.join();
  for (auto& [fd, connection] : by_fd_) connection->MarkGone();
  by_fd_.clear();
  ready_.clear();
  close(listener_);
  if (!options_.address.empty() && options_.address[0] != '@') unlink(options_.address.c_str());
  close(epoll_);
  close(wake_);
}

v1::DataPlane ShmDataPlane::Advertised() const {
  v1::DataPlane plane;
  plane.set_kind("shm");
  plane.set_address(options_.address);
  plane.set_version(shm::kShmVersion);
  plane.set_host_id(options_.host_id);
  return plane;
}

void ShmDataPlane::Drain() {
  absl::MutexLock lock(&handing_mu_);  // waits for a call being handed to the engine
  draining_ = true;
}

int64_t ShmDataPlane::refused_doorbells() const { return refused_doorbells_.load(); }

void ShmDataPlane::Poll() {
  absl::flat_hash_map<int, absl::Time> hello_by;  // unregistered clients' deadlines
  epoll_event events[64];
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (ScanRegions()) {
      last_activity_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
      continue;
    }
    // The poller spins for a window after the last call arrived or was answered, but only
    // while no call is running: a running call's device wants the CPUs. Past the window it
    // sleeps on the sockets, and clients that see it asleep ring theirs after publishing.
    const int64_t since =
        absl::GetCurrentTimeNanos() - last_activity_ns_.load(std::memory_order_relaxed);
    const bool spinning = options_.poll > absl::ZeroDuration() &&
                          calls_in_flight_.load(std::memory_order_relaxed) == 0 &&
                          since < absl::ToInt64Nanoseconds(options_.poll);
    if (!spinning) {
      SetSleeping(true);
      poller_asleep_.store(true);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (ScanRegions()) {  // published before the clients could see the poller asleep
        poller_asleep_.store(false);
        SetSleeping(false);
        last_activity_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
        continue;
      }
    }
    const int n = epoll_wait(epoll_, events, 64, spinning ? 0 : 1000);
    if (!spinning) {
      poller_asleep_.store(false);
      SetSleeping(false);
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_) {
        uint64_t count;
        (void)!read(wake_, &count, sizeof(count));
        continue;
      }
      if (fd == listener_) {
        Accept();
        continue;
      }
      auto it = by_fd_.find(fd);
      if (it == by_fd_.end()) continue;
      std::shared_ptr<ShmConnection> connection = it->second;
      ReadSocket(connection);
      if ((events[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) Close(fd);
    }
    CloseSilentClients(hello_by);
  }
}

void ShmDataPlane::CloseSilentClients(absl::flat_hash_map<int, absl::Time>& hello_by) {
  const absl::Time now = absl::Now();
  for (auto& [fd, connection] : by_fd_) {
    if (!connection->registered()) hello_by.try_emplace(fd, now + kHelloTimeout);
  }
  std::vector<int> late;
  for (auto it = hello_by.begin(); it != hello_by.end();) {
    auto connection = by_fd_.find(it->first);
    if (connection == by_fd_.end() || connection->second->registered()) {
      hello_by.erase(it++);
    } else if (it->second < now) {
      late.push_back(it->first);
      hello_by.erase(it++);
    } else {
      ++it;
    }
  }
  for (const int fd : late) {
    spdlog::info("data plane: closing a client that sent no hello within {}",
                 absl::FormatDuration(kHelloTimeout));
    Close(fd);
  }
}

void ShmDataPlane::CallEnded() {
  last_activity_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  // The last running call: a poller asleep may spin again for the next one (its wake-up is
  // off every client's path: the answer is already out).
  if (calls_in_flight_.fetch_sub(1) == 1 && options_.poll > absl::ZeroDuration() &&
      poller_asleep_.load()) {
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
  }
}

bool ShmDataPlane::ScanRegions() {
  bool found = false;
  for (size_t c = 0; c < ready_.size(); ++c) {
    const std::shared_ptr<ShmConnection> connection = ready_[c];
    const uint32_t slots = connection->region().slot_count();
    for (uint32_t slot = 0; slot < slots; ++slot) {
      if (connection->Claim(slot)) {
        RunCall(connection, slot);
        found = true;
      }
    }
  }
  return found;
}

void ShmDataPlane::RunCall(const std::shared_ptr<ShmConnection>& connection, uint32_t slot) {
  const absl::Time start = absl::Now();
  service::ServiceMetrics& metrics = metrics_;
  // A call is either refused here or handed to the engine before Drain returns: the engine's
  // own drain, which follows, then waits for it instead of refusing it.
  absl::MutexLock handing(&handing_mu_);
  absl::StatusOr<ShmConnection::TakenCall> taken =
      draining_ ? absl::UnavailableError("the server is shutting down; call another replica")
                : connection->Take(slot, model_);
  if (!taken.ok()) {
    connection->Answer(slot, taken.status(), nullptr, [&](const absl::Status& status) {
      metrics.RecordRpc("Decode", status.code(), absl::Now() - start, "shm");
    });
    return;
  }
  calls_in_flight_.fetch_add(1);
  auto held = std::make_shared<ShmConnection::TakenCall>(*std::move(taken));
  std::unique_ptr<service::ParsedDecode> call = std::move(held->call);
  dispatcher_.Dispatch(
      std::move(call), connection->tenant(), held->deadline,
      [connection, slot] { return connection->Cancelled(slot); },
      [this, connection, slot, held, start,
       &metrics](absl::StatusOr<service::AnsweredDecode> answered) {
        connection->Answer(slot, answered, held.get(), [&](const absl::Status& status) {
          metrics.RecordRpc("Decode", status.code(), absl::Now() - start, "shm");
        });
        CallEnded();
      });
}

void ShmDataPlane::SetSleeping(bool sleeping) {
  for (const std::shared_ptr<ShmConnection>& connection : ready_) {
    connection->region().header().server_sleeping.store(sleeping ? 1 : 0,
                                                        std::memory_order_relaxed);
  }
}

void ShmDataPlane::Accept() {
  for (;;) {
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (static_cast<int>(by_fd_.size()) >= options_.max_clients) {
      spdlog::warn("data plane: refusing a client: {} clients already (the most it takes)",
                   by_fd_.size());
      close(fd);
      continue;
    }
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.fd = fd;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event);
    by_fd_[fd] = std::make_shared<ShmConnection>(fd, PeerOf(fd), budget_, refused_doorbells_);
  }
}

void ShmDataPlane::ReadSocket(const std::shared_ptr<ShmConnection>& connection) {
  for (;;) {
    UnixReceive received = ReceiveUnixMessage(connection->fd(), kMaxSocketMessage);
    if (received.would_block) return;
    if (!received.message.has_value()) {
      Close(connection->fd());
      return;
    }
    if (connection->registered()) {
      // A doorbell: its calls are found by the scan. Anything passed with it is closed.
      if (received.message->fd >= 0) close(received.message->fd);
      continue;
    }
    const absl::Status registered = connection->Register(
        *std::move(received.message), tickets_, options_.instance_id, options_.map_for_devices);
    const PeerCredentials& peer = connection->peer();
    if (!registered.ok()) {
      spdlog::info("data plane: refused a client (pid {}, uid {}): {}", peer.pid, peer.uid,
                   registered.ToString());
      Close(connection->fd());
      return;
    }
    ready_.push_back(connection);
    clients_.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("data plane: client pid {} uid {} registered {} bytes, {} slots", peer.pid,
                  peer.uid, connection->registered_bytes(), connection->region().slot_count());
  }
}

void ShmDataPlane::Close(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  const std::shared_ptr<ShmConnection> connection = it->second;
  connection->MarkGone();
  epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  by_fd_.erase(it);
  auto ready = std::find(ready_.begin(), ready_.end(), connection);
  if (ready != ready_.end()) {
    ready_.erase(ready);
    clients_.fetch_sub(1, std::memory_order_relaxed);
  }
  // Its region stays mapped until its calls in flight have answered.
}

}  // namespace mlaserve::dataplane
