#include "services/buffer/buffer_core.h"

#include <optional>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::buffer {
namespace {

constexpr uint64_t kDefaultCapacity = 1ull << 30;
constexpr int64_t kDefaultLeaseTtlMs = 60000;
constexpr uint64_t kHistogramBuckets = 8;

uint64_t OldestVersion(const v1::Experience& e) {
  if (e.token_policy_versions().empty()) return 0;
  return *std::min_element(e.token_policy_versions().begin(), e.token_policy_versions().end());
}

// Empty if valid, else the reason naming the field.
std::string Invalid(const v1::Experience& e, uint32_t group_size) {
  if (absl::Status s = common::ValidateId("experience_id", e.experience_id().value()); !s.ok()) {
    return std::string(s.message());
  }
  if (group_size > 1 && e.group_id().empty()) return "group_id: required when group_size > 1";
  if (e.response_token_ids().empty()) return "response_token_ids: empty";
  const int n = e.response_token_ids_size();
  if (!e.response_logprobs().empty() && e.response_logprobs_size() != n) {
    return absl::StrCat("response_logprobs: ", e.response_logprobs_size(), " entries, want ", n);
  }
  if (!e.token_policy_versions().empty() && e.token_policy_versions_size() != n) {
    return absl::StrCat("token_policy_versions: ", e.token_policy_versions_size(), " entries, want ", n);
  }
  if (e.has_reward() && !std::isfinite(e.reward())) return "reward: not finite";
  return "";
}

void Reject(v1::PutExperiencesResponse* response, uint32_t index, const v1::Experience& e,
            v1::RejectReason reason, std::string message) {
  v1::Rejection* r = response->add_rejections();
  r->set_index(index);
  *r->mutable_experience_id() = e.experience_id();
  r->set_reason(reason);
  r->set_message(std::move(message));
}

}  // namespace

BufferCore::BufferCore(common::Clock* clock, BufferStore* store) : clock_(clock), store_(store) {
  config_.set_group_size(1);
  config_.set_capacity_bytes(kDefaultCapacity);
  config_.set_filter_zero_variance(true);
  config_.set_zero_variance_epsilon(1e-6f);
  config_.set_default_lease_ttl_ms(kDefaultLeaseTtlMs);
}

std::string BufferCore::FetchPayload(const v1::Experience& sent, absl::Time deadline, v1::Experience* out) {
  if (fetcher_ == nullptr) return "this buffer fetches no payloads (no fetcher)";
  absl::StatusOr<std::string> bytes = fetcher_->Fetch(sent.remote_payload(), deadline);
  if (!bytes.ok()) return std::string(bytes.status().ToString());
  v1::Experience fetched;
  if (!fetched.ParseFromString(*bytes)) return "the fetched bytes are not a serialized Experience";
  if (fetched.experience_id().value() != sent.experience_id().value()) {
    return absl::StrCat("the fetched experience is `", fetched.experience_id().value(), "`, not `",
                        sent.experience_id().value(), "`");
  }
  if (fetched.has_remote_payload()) return "the fetched experience has a remote_payload of its own";
  *out = std::move(fetched);
  return "";
}

void BufferCore::AddLocked(const v1::Experience& e, uint64_t bytes) {
  const uint32_t group_size = config_.group_size();
  const std::string group_id = group_size > 1 ? e.group_id() : e.experience_id().value();
  Group& g = filling_[group_id];
  g.prompt_id = e.prompt_id();
  g.bytes += bytes;
  g.members.push_back(e);
  bytes_ += bytes;
  seen_.insert(e.experience_id().value());
  for (uint64_t v : e.token_policy_versions()) current_version_ = std::max(current_version_, v);
  if (g.members.size() == group_size) {
    ready_.emplace_back(group_id, std::move(g));
    filling_.erase(group_id);
  }
}

absl::Status BufferCore::Recover() {
  if (store_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(BufferSnapshot snapshot, store_->Load());
  absl::MutexLock lock(&mu_);
  for (std::string& id : snapshot.seen_ids) seen_.insert(std::move(id));
  for (const v1::Experience& e : snapshot.experiences) AddLocked(e, e.ByteSizeLong());
  auto counter = [&](const char* name) { return snapshot.counters[name]; };
  accepted_total_ = counter("accepted_total");
  consumed_total_ = counter("consumed_total");
  dropped_.set_stale(counter("dropped_stale"));
  dropped_.set_zero_variance(counter("dropped_zero_variance"));
  dropped_.set_duplicate(counter("dropped_duplicate"));
  dropped_.set_rejected(counter("dropped_rejected"));
  return absl::OkStatus();
}

absl::Status BufferCore::Configure(const v1::ConfigureRequest& request,
                                   v1::ConfigureResponse* response) {
  if (request.group_size() < 1 || request.group_size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("group_size ", request.group_size(), " is outside 1..1024"));
  }
  if (request.capacity_bytes() != 0 && request.capacity_bytes() < kMinCapacityBytes) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_bytes ", request.capacity_bytes(),
                                                   " is below 1 MiB"));
  }
  if (request.default_lease_ttl_ms() < 0) {
    return absl::InvalidArgumentError("default_lease_ttl_ms is negative");
  }
  absl::MutexLock lock(&mu_);
  if (request.group_size() != config_.group_size() &&
      (!filling_.empty() || !ready_.empty() || !leases_.empty() || !reserved_ids_.empty())) {
    return absl::FailedPreconditionError("group_size cannot change while experiences are held");
  }
  v1::ConfigureRequest next = request;
  if (next.capacity_bytes() == 0) next.set_capacity_bytes(kDefaultCapacity);
  if (!next.has_filter_zero_variance()) next.set_filter_zero_variance(true);
  if (next.zero_variance_epsilon() <= 0) next.set_zero_variance_epsilon(1e-6f);
  if (next.default_lease_ttl_ms() == 0) next.set_default_lease_ttl_ms(kDefaultLeaseTtlMs);
  config_ = next;
  *response->mutable_config() = config_;
  return absl::OkStatus();
}

bool BufferCore::TooStaleLocked(uint64_t oldest_version, uint64_t current) const {
  return config_.has_max_staleness() && current > oldest_version &&
         current - oldest_version > config_.max_staleness();
}

absl::Status BufferCore::Put(const v1::PutExperiencesRequest& original,
                             v1::PutExperiencesResponse* response) {
  if (original.experiences_size() == 0) return absl::InvalidArgumentError("experiences is empty");
  if (original.experiences_size() > kMaxExperiencesPerPut) {
    return absl::InvalidArgumentError(absl::StrCat("experiences has ", original.experiences_size(),
                                                   " entries; the limit is ", kMaxExperiencesPerPut));
  }
  // Experiences sent by descriptor are fetched first, without the lock; one that cannot
  // be fetched is rejected (and the others go on).
  // One deadline for all of a request's fetches; ids already taken are not fetched
  // (they are duplicates).
  std::optional<v1::PutExperiencesRequest> resolved;
  std::map<int, std::string> unfetched;  // index -> why
  const absl::Time deadline = absl::Now() + (fetcher_ ? fetcher_->options().timeout : absl::ZeroDuration());
  for (int i = 0; i < original.experiences_size(); ++i) {
    const v1::Experience& e = original.experiences(i);
    if (!e.has_remote_payload()) continue;
    {
      absl::MutexLock lock(&mu_);
      if (seen_.contains(e.experience_id().value())) continue;
    }
    if (!resolved) resolved = original;
    std::string why = FetchPayload(e, deadline, resolved->mutable_experiences(i));
    if (!why.empty()) unfetched[i] = absl::StrCat("remote_payload: ", why);
  }
  const v1::PutExperiencesRequest& request = resolved ? *resolved : original;
  // Three phases, so that concurrent producers overlap their durable writes (and the
  // store can commit them together): decide and reserve under the lock; write to the
  // store without it; take the experiences under the lock.
  mu_.Lock();
  if (!request.run_id().empty() && !config_.run_id().empty() && request.run_id() != config_.run_id()) {
    const std::string run = config_.run_id();
    mu_.Unlock();
    return absl::InvalidArgumentError(absl::StrCat("run_id `", request.run_id(), "` is not this buffer's run `",
                                                   run, "`"));
  }
  ExpireLeasesLocked();
  const uint32_t group_size = config_.group_size();
  // First pass: decide; nothing changes unless the accepted ones fit.
  std::vector<int> accept;
  std::vector<uint64_t> accept_bytes;  // (computing a size walks every token: once)
  absl::flat_hash_set<std::string> ids_in_request;
  std::map<std::string, int> adding_to_group;
  uint64_t adding_bytes = 0;
  for (int i = 0; i < request.experiences_size(); ++i) {
    const v1::Experience& e = request.experiences(i);
    const std::string& id = e.experience_id().value();
    if (seen_.contains(id) || reserved_ids_.contains(id) || ids_in_request.contains(id)) {
      response->set_duplicates(response->duplicates() + 1);
      *response->add_duplicate_ids() = e.experience_id();
      continue;
    }
    if (auto it = unfetched.find(i); it != unfetched.end()) {
      Reject(response, i, e, v1::REJECT_REASON_INVALID, it->second);
      continue;
    }
    if (std::string why = Invalid(e, group_size); !why.empty()) {
      Reject(response, i, e, v1::REJECT_REASON_INVALID, why);
      continue;
    }
    if (!e.has_reward()) {
      Reject(response, i, e, v1::REJECT_REASON_NO_REWARD, "reward: not set (score it first)");
      continue;
    }
    if (TooStaleLocked(OldestVersion(e), current_version_)) {
      Reject(response, i, e, v1::REJECT_REASON_STALE,
             absl::StrCat("token_policy_versions: oldest ", OldestVersion(e), " is more than ",
                          config_.max_staleness(), " behind ", current_version_));
      continue;
    }
    const uint64_t bytes = e.ByteSizeLong();
    if (bytes > config_.capacity_bytes() / 16) {
      Reject(response, i, e, v1::REJECT_REASON_TOO_LARGE,
             absl::StrCat(bytes, " bytes; the limit is capacity_bytes / 16 = ", config_.capacity_bytes() / 16));
      continue;
    }
    const std::string group = group_size > 1 ? e.group_id() : id;
    auto it = filling_.find(group);
    auto reserved = reserved_groups_.find(group);
    const int have = (it == filling_.end() ? 0 : static_cast<int>(it->second.members.size())) +
                     (reserved == reserved_groups_.end() ? 0 : reserved->second) + adding_to_group[group];
    if (have >= static_cast<int>(group_size)) {
      Reject(response, i, e, v1::REJECT_REASON_GROUP_FULL,
             absl::StrCat("group_id `", group, "` already has ", group_size, " experiences"));
      continue;
    }
    ++adding_to_group[group];
    ids_in_request.insert(id);
    adding_bytes += bytes;
    accept.push_back(i);
    accept_bytes.push_back(bytes);
  }
  response->set_rejected(response->rejections_size());
  if (bytes_ + reserved_bytes_ + adding_bytes > config_.capacity_bytes()) {
    // Nothing is taken or counted: the producer retries the same batch.
    const std::string message = absl::StrCat(
        "buffer full: ", bytes_ + reserved_bytes_, " of ", config_.capacity_bytes(),
        " bytes held or being written, this batch needs ", adding_bytes,
        " more; retry after the trainer consumes a batch (nothing was taken)");
    mu_.Unlock();
    return absl::ResourceExhaustedError(message);
  }
  dropped_.set_duplicate(dropped_.duplicate() + response->duplicates());
  dropped_.set_rejected(dropped_.rejected() + response->rejected());
  // Reserve: concurrent Puts see these ids as duplicates and these bytes as held.
  reserved_bytes_ += adding_bytes;
  for (const auto& [group, n] : adding_to_group) reserved_groups_[group] += n;
  for (const std::string& id : ids_in_request) reserved_ids_.insert(id);
  mu_.Unlock();

  // Second pass: store them (all or none) without the lock.
  absl::Status stored;
  if (store_ != nullptr) {
    std::vector<const v1::Experience*> taking;
    for (int i : accept) taking.push_back(&request.experiences(i));
    stored = store_->Added(taking);
    if (stored.ok()) {
      (void)store_->Count("dropped_duplicate", response->duplicates());
      (void)store_->Count("dropped_rejected", response->rejected());
    }
  }

  // Third pass: take them (or release the reservation).
  absl::MutexLock lock(&mu_);
  reserved_bytes_ -= adding_bytes;
  for (const auto& [group, n] : adding_to_group) {
    if ((reserved_groups_[group] -= n) == 0) reserved_groups_.erase(group);
  }
  for (const std::string& id : ids_in_request) reserved_ids_.erase(id);
  if (!stored.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot record experiences durably (nothing was taken): ",
                                               stored.message()));
  }
  for (size_t k = 0; k < accept.size(); ++k) AddLocked(request.experiences(accept[k]), accept_bytes[k]);
  accepted_total_ += accept.size();
  response->set_accepted(static_cast<uint32_t>(accept.size()));
  response->set_buffer_bytes(bytes_);
  response->set_capacity_bytes(config_.capacity_bytes());
  return absl::OkStatus();
}

void BufferCore::ExpireLeasesLocked() {
  const absl::Time now = clock_->Now();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires_at <= now) {
      for (auto g = it->second.groups.rbegin(); g != it->second.groups.rend(); ++g) {
        ready_.push_front(std::move(*g));
      }
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status BufferCore::SampleBatch(const v1::SampleBatchRequest& request,
                                     v1::SampleBatchResponse* response) {
  if (request.num_groups() < 1 || request.num_groups() > kMaxGroupsPerSample) {
    return absl::InvalidArgumentError(absl::StrCat("num_groups ", request.num_groups(), " is outside 1..1024"));
  }
  if (request.min_groups() > request.num_groups()) {
    return absl::InvalidArgumentError("min_groups is larger than num_groups");
  }
  if (request.wait_ms() < 0 || request.wait_ms() > kMaxWaitMs) {
    return absl::InvalidArgumentError(absl::StrCat("wait_ms ", request.wait_ms(), " is outside 0..600000"));
  }
  if (request.lease_ttl_ms() != 0 && (request.lease_ttl_ms() < 1000 || request.lease_ttl_ms() > 600000)) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ttl_ms ", request.lease_ttl_ms(), " is outside 1000..600000"));
  }
  const uint32_t want = std::max<uint32_t>(request.min_groups(), 1);
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  // Wait (real time, bounded) until enough complete groups are ready.
  auto enough = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_.size() >= want; };
  mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Milliseconds(request.wait_ms()));
  ExpireLeasesLocked();
  const uint64_t current = std::max(current_version_, request.current_policy_version());
  current_version_ = current;
  const bool staleness_override = request.has_max_staleness();
  LeaseState lease;
  while (!ready_.empty() && lease.groups.size() < request.num_groups()) {
    auto [id, group] = std::move(ready_.front());
    ready_.pop_front();
    uint64_t oldest = UINT64_MAX;
    double sum = 0, sq = 0;
    for (const v1::Experience& e : group.members) {
      oldest = std::min(oldest, OldestVersion(e));
      sum += e.reward();
      sq += static_cast<double>(e.reward()) * e.reward();
    }
    const double n = static_cast<double>(group.members.size());
    const double mean = sum / n;
    const double stddev = std::sqrt(std::max(0.0, sq / n - mean * mean));
    const bool stale = staleness_override
                           ? (current > oldest && current - oldest > request.max_staleness())
                           : TooStaleLocked(oldest, current);
    auto forget = [&](const char* counter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (store_ == nullptr) return;
      std::vector<std::string> ids;
      for (const v1::Experience& e : group.members) ids.push_back(e.experience_id().value());
      (void)store_->Removed(ids, counter);  // if it fails they return after a restart, and drop again
    };
    if (stale) {
      forget("dropped_stale");
      response->set_dropped_stale_groups(response->dropped_stale_groups() + 1);
      dropped_.set_stale(dropped_.stale() + group.members.size());
      bytes_ -= group.bytes;
      continue;
    }
    if (config_.filter_zero_variance() && group.members.size() > 1 &&
        stddev <= config_.zero_variance_epsilon()) {
      forget("dropped_zero_variance");
      response->set_dropped_zero_variance_groups(response->dropped_zero_variance_groups() + 1);
      dropped_.set_zero_variance(dropped_.zero_variance() + group.members.size());
      bytes_ -= group.bytes;
      continue;
    }
    staleness_[std::min<uint64_t>(current - std::min(current, oldest), kHistogramBuckets - 1)] +=
        group.members.size();
    v1::ExperienceGroup* out = response->add_groups();
    out->set_group_id(id);
    out->set_prompt_id(group.prompt_id);
    for (const v1::Experience& e : group.members) *out->add_experiences() = e;
    out->set_reward_mean(static_cast<float>(mean));
    out->set_reward_std(static_cast<float>(stddev));
    out->set_min_policy_version(oldest);
    lease.groups.emplace_back(std::move(id), std::move(group));
  }
  if (lease.groups.empty()) return absl::OkStatus();
  const int64_t ttl_ms = request.lease_ttl_ms() ? request.lease_ttl_ms() : config_.default_lease_ttl_ms();
  lease.expires_at = clock_->Now() + absl::Milliseconds(ttl_ms);
  const std::string lease_id = common::NewId("lease");
  response->set_lease_id(lease_id);
  response->set_lease_expires_at_unix_ms(absl::ToUnixMillis(lease.expires_at));
  leases_[lease_id] = std::move(lease);
  return absl::OkStatus();
}

absl::Status BufferCore::Ack(const v1::AckBatchRequest& request, v1::AckBatchResponse* response) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  if (acked_leases_.count(request.lease_id())) {
    response->set_already_acked(true);
    return absl::OkStatus();
  }
  auto it = leases_.find(request.lease_id());
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease `", request.lease_id(),
                                            "` is unknown or expired (its groups are back in the buffer)"));
  }
  if (store_ != nullptr) {
    std::vector<std::string> ids;
    for (auto& [id, group] : it->second.groups) {
      for (const v1::Experience& e : group.members) ids.push_back(e.experience_id().value());
    }
    if (absl::Status s = store_->Removed(ids, "consumed_total"); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot record the ack durably (lease still open): ",
                                                 s.message()));
    }
  }
  uint32_t consumed = 0;
  for (auto& [id, group] : it->second.groups) {
    consumed += group.members.size();
    bytes_ -= group.bytes;
  }
  consumed_total_ += consumed;
  response->set_consumed_experiences(consumed);
  acked_leases_.insert(request.lease_id());
  leases_.erase(it);
  return absl::OkStatus();
}

absl::Status BufferCore::Nack(const v1::NackBatchRequest& request, v1::NackBatchResponse* response) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  auto it = leases_.find(request.lease_id());
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease `", request.lease_id(), "` is unknown, acked or expired"));
  }
  uint32_t returned = 0;
  for (auto g = it->second.groups.rbegin(); g != it->second.groups.rend(); ++g) {
    returned += g->second.members.size();
    ready_.push_front(std::move(*g));
  }
  response->set_returned_experiences(returned);
  leases_.erase(it);
  return absl::OkStatus();
}

absl::Status BufferCore::GetStats(v1::GetStatsResponse* response) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  uint64_t depth = 0, leased = 0;
  for (const auto& [id, g] : ready_) depth += g.members.size();
  for (const auto& [id, g] : filling_) depth += g.members.size();
  for (const auto& [id, l] : leases_) {
    for (const auto& [gid, g] : l.groups) leased += g.members.size();
  }
  response->set_depth_experiences(depth);
  response->set_complete_groups(ready_.size());
  response->set_partial_groups(filling_.size());
  response->set_leased_experiences(leased);
  response->set_open_leases(leases_.size());
  response->set_buffer_bytes(bytes_);
  response->set_capacity_bytes(config_.capacity_bytes());
  response->set_accepted_total(accepted_total_);
  response->set_consumed_total(consumed_total_);
  *response->mutable_dropped() = dropped_;
  for (const auto& [lag, count] : staleness_) {
    v1::StalenessBucket* b = response->add_staleness_histogram();
    b->set_staleness(lag);
    b->set_count(count);
  }
  response->set_current_policy_version(current_version_);
  *response->mutable_config() = config_;
  return absl::OkStatus();
}

}  // namespace rlfleet::buffer
