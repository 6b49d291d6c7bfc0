#include "cluster/membership_view.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "spdlog/spdlog.h"

namespace mlaserve::cluster {

absl::StatusOr<std::unique_ptr<MembershipView>> MembershipView::Start(
    std::unique_ptr<EtcdClient> etcd, std::string cluster, absl::Duration first_read_timeout) {
  std::unique_ptr<MembershipView> view(new MembershipView(std::move(etcd), std::move(cluster)));
  const absl::Time deadline = absl::Now() + first_read_timeout;
  absl::Status read = view->ReadAll();
  while (!read.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    read = view->ReadAll();
  }
  if (!read.ok()) {
    return absl::UnavailableError(absl::StrCat("cluster '", view->cluster_,
                                               "': cannot read the membership from etcd at ",
                                               view->etcd_->target(), ": ", read.message()));
  }
  view->thread_ = std::thread([raw = view.get()] { raw->Run(); });
  return view;
}

MembershipView::MembershipView(std::unique_ptr<EtcdClient> etcd, std::string cluster)
    : etcd_(std::move(etcd)), cluster_(std::move(cluster)), prefix_(MembersPrefix(cluster_)) {}

MembershipView::~MembershipView() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status MembershipView::ReadAll() {
  absl::StatusOr<EtcdClient::PrefixRead> read = etcd_->ReadPrefix(prefix_);
  if (!read.ok()) return read.status();
  absl::flat_hash_map<std::string, MemberRecord> members;
  for (const auto& [key, value] : read->pairs) {
    absl::StatusOr<MemberRecord> record = ParseMemberRecord(value);
    if (!record.ok()) {
      spdlog::warn("cluster '{}': skipping {}: {}", cluster_, key,
                   std::string(record.status().message()));
      continue;
    }
    members.emplace(key, *std::move(record));
  }
  absl::MutexLock lock(&mu_);
  members_ = std::move(members);
  revision_ = read->revision;
  ++changes_;
  return absl::OkStatus();
}

void MembershipView::Apply(const EtcdClient::WatchEvent& event) {
  if (event.deleted) {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(event.key);
    if (it != members_.end()) {
      const bool moving_out = it->second.state == kMemberMovingOut;
      spdlog::info("cluster '{}': {} left{}", cluster_, event.key.substr(prefix_.size()),
                   moving_out ? ", moving its sequences out" : "");
      if (moving_out) {
        moved_out_.push_back(it->second.instance_id);
        if (moved_out_.size() > 64) moved_out_.pop_front();
      }
      members_.erase(it);
    }
    ++changes_;
    return;
  }
  absl::StatusOr<MemberRecord> record = ParseMemberRecord(event.value);
  if (!record.ok()) {
    spdlog::warn("cluster '{}': skipping {}: {}", cluster_, event.key,
                 std::string(record.status().message()));
    return;
  }
  absl::MutexLock lock(&mu_);
  members_.insert_or_assign(event.key, *std::move(record));
  ++changes_;
}

void MembershipView::Run() {
  absl::Duration backoff = absl::Milliseconds(200);
  bool need_read = false;
  while (true) {
    if (need_read) {
      if (absl::Status read = ReadAll(); !read.ok()) {
        absl::MutexLock lock(&mu_);
        if (!stale_) {
          spdlog::warn(
              "cluster '{}': etcd unreachable ({}); placing on the last membership seen "
              "({} members) until it answers",
              cluster_, std::string(read.message()), members_.size());
        }
        stale_ = true;
        const absl::Time wake = absl::Now() + backoff;
        backoff = std::min(backoff * 2, absl::Seconds(2));
        auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
        mu_.AwaitWithDeadline(absl::Condition(&stopping), wake);
        if (stopping_) return;
        continue;
      }
      backoff = absl::Milliseconds(200);
      absl::MutexLock lock(&mu_);
      if (stale_) spdlog::info("cluster '{}': etcd answers again", cluster_);
      stale_ = false;
    }
    grpc::ClientContext context;
    int64_t from = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      watch_context_ = &context;
      from = revision_ + 1;
    }
    const absl::Status ended = etcd_->WatchPrefix(
        prefix_, from, context, [this](const EtcdClient::WatchEvent& event) { Apply(event); });
    absl::MutexLock lock(&mu_);
    watch_context_ = nullptr;
    if (stopping_) return;
    spdlog::debug("cluster '{}': watch ended: {}", cluster_, std::string(ended.message()));
    need_read = true;
  }
}

std::vector<MemberRecord> MembershipView::Members() const {
  std::vector<MemberRecord> members;
  {
    absl::MutexLock lock(&mu_);
    members.reserve(members_.size());
    for (const auto& [key, record] : members_) members.push_back(record);
  }
  std::sort(members.begin(), members.end(), [](const MemberRecord& a, const MemberRecord& b) {
    return a.instance_id < b.instance_id;
  });
  return members;
}

std::optional<MemberRecord> MembershipView::Find(const std::string& instance_id) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(MemberKey(cluster_, instance_id));
  if (it == members_.end()) return std::nullopt;
  return it->second;
}

bool MembershipView::Contains(const std::string& instance_id) const {
  absl::MutexLock lock(&mu_);
  return members_.contains(MemberKey(cluster_, instance_id));
}

bool MembershipView::MovedOut(const std::string& instance_id) const {
  absl::MutexLock lock(&mu_);
  return std::find(moved_out_.begin(), moved_out_.end(), instance_id) != moved_out_.end();
}

bool MembershipView::stale() const {
  absl::MutexLock lock(&mu_);
  return stale_;
}

int64_t MembershipView::changes() const {
  absl::MutexLock lock(&mu_);
  return changes_;
}

}  // namespace mlaserve::cluster
