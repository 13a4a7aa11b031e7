#include "services/buffer/buffer_core.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/await_callback.h"
#include "libs/common/checks.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::buffer {
namespace {

constexpr uint64_t kDefaultCapacity = 1ull << 30;
constexpr int64_t kDefaultLeaseTtlMs = 60000;
constexpr uint64_t kHistogramBuckets = 8;

void Reject(v1::PutExperiencesResponse* response, uint32_t index, const std::string& id, v1::RejectReason reason,
            std::string message) {
  v1::Rejection* r = response->add_rejections();
  r->set_index(index);
  r->mutable_experience_id()->set_value(id);
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

std::string BufferCore::FetchPayload(const ExperienceFacts& sent, absl::Time deadline, std::string* out) {
  if (fetcher_ == nullptr) return "this buffer fetches no payloads (no fetcher)";
  absl::StatusOr<std::string> bytes = fetcher_->Fetch(sent.remote_payload, deadline);
  if (!bytes.ok()) return std::string(bytes.status().ToString());
  v1::Experience fetched;
  if (!fetched.ParseFromString(*bytes)) return "the fetched bytes are not a serialized Experience";
  if (fetched.experience_id().value() != sent.id) {
    return absl::StrCat("the fetched experience is `", fetched.experience_id().value(), "`, not `", sent.id, "`");
  }
  if (fetched.has_remote_payload()) return "the fetched experience has a remote_payload of its own";
  *out = std::move(*bytes);
  return "";
}

void BufferCore::AddLocked(Member m, const std::string& group, const ExperienceFacts& facts) {
  bytes_ += m.bytes.size();
  current_version_ = std::max(current_version_, facts.newest_version);
  if (config_.group_size() == 1) {  // (its own group, complete at once)
    Group g;
    g.prompt_id = facts.prompt_id;
    g.bytes = m.bytes.size();
    g.members.push_back(std::move(m));
    ready_.emplace_back(group, std::move(g));
    return;
  }
  Group& g = filling_[group];
  g.prompt_id = facts.prompt_id;
  g.bytes += m.bytes.size();
  g.members.push_back(std::move(m));
  if (g.members.size() == config_.group_size()) {
    ready_.emplace_back(group, std::move(g));
    filling_.erase(group);
  }
}

BufferCore::Member BufferCore::MemberOf(const ExperienceFacts& facts) {
  Member m;
  m.id = facts.id;
  m.reward = facts.reward;
  m.oldest_version = facts.oldest_version;
  return m;
}

absl::Status BufferCore::Recover(std::vector<std::string>* skipped) {
  if (store_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(BufferSnapshot snapshot, store_->Load());
  std::vector<std::string> ignored;
  if (skipped == nullptr) skipped = &ignored;
  for (std::string& why : snapshot.skipped) skipped->push_back(std::move(why));
  absl::MutexLock lock(&mu_);
  if (snapshot.config) {
    // (groups come back at the size they were taken at; a stored configuration outside
    // what Configure takes is not used)
    if (absl::Status s = ValidConfig(*snapshot.config); s.ok()) {
      config_ = *snapshot.config;
    } else {
      skipped->push_back(absl::StrCat("the stored configuration: ", s.message(), " (the defaults apply)"));
    }
  }
  if (snapshot.policy_version <= kMaxPolicyVersion) {
    current_version_ = std::max(current_version_, snapshot.policy_version);
  } else {
    skipped->push_back(
        absl::StrCat("the stored policy version ", snapshot.policy_version, " is above ", kMaxPolicyVersion));
  }
  for (std::string& id : snapshot.seen_ids) seen_.insert(std::move(id));
  ExperienceReader reader;
  ExperienceFacts facts;
  for (StoredExperience& stored : snapshot.experiences) {
    reader.Read(stored.bytes, &facts);
    std::string why = InvalidExperience(facts);
    if (why.empty() && facts.newest_version > kMaxPolicyVersion) {
      why = absl::StrCat("token_policy_versions: ", facts.newest_version, " is above ", kMaxPolicyVersion);
    }
    if (why.empty() && config_.group_size() > 1 && facts.group_id.empty()) why = "group_id: empty";
    if (!why.empty()) {
      skipped->push_back(absl::StrCat("a stored experience (segment ", stored.segment, ", id `",
                                      absl::CHexEscape(facts.id.substr(0, 128)), "`) does not load: ", why));
      continue;
    }
    Member m = MemberOf(facts);
    m.bytes = std::move(stored.bytes);
    m.segment = stored.segment;
    const std::string group = config_.group_size() > 1 ? facts.group_id : m.id;
    AddLocked(std::move(m), group, facts);
  }
  // A group written before replies were bounded that no reply can hold would stay at
  // the front of the queue for good: left out.
  auto too_large = [&](const std::string& id, const Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ReplyBytes(id, g.prompt_id, g.bytes, g.members.size()) <= kMaxReplyBytes) return false;
    skipped->push_back(absl::StrCat("group `", absl::CHexEscape(id.substr(0, 128)), "` (", g.members.size(),
                                    " experiences, ", g.bytes, " bytes) does not fit in one SampleBatch reply"));
    bytes_ -= g.bytes;
    return true;
  };
  for (auto it = ready_.begin(); it != ready_.end();) {
    it = too_large(it->first, it->second) ? ready_.erase(it) : it + 1;
  }
  for (auto it = filling_.begin(); it != filling_.end();) {
    if (too_large(it->first, it->second)) {
      filling_.erase(it++);
    } else {
      ++it;
    }
  }
  auto counter = [&](const char* name) { return snapshot.counters[name]; };
  accepted_total_ = counter("accepted_total");
  consumed_total_ = counter("consumed_total");
  dropped_.set_stale(counter("dropped_stale"));
  dropped_.set_zero_variance(counter("dropped_zero_variance"));
  dropped_.set_duplicate(counter("dropped_duplicate"));
  dropped_.set_rejected(counter("dropped_rejected"));
  return absl::OkStatus();
}

absl::Status BufferCore::ValidConfig(const v1::ConfigureRequest& request) {
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("group_size", request.group_size(), 1, 1024));
  if (request.capacity_bytes() != 0) {  // (0: the default)
    RETURN_IF_ERROR(common::CheckInRange<uint64_t>("capacity_bytes", request.capacity_bytes(), kMinCapacityBytes,
                                                   kMaxCapacityBytes));
  }
  RETURN_IF_ERROR(common::CheckFiniteInRange("zero_variance_epsilon", request.zero_variance_epsilon(), 0, 1e30));
  if (request.default_lease_ttl_ms() != 0) {  // (0: the default)
    RETURN_IF_ERROR(common::CheckInRange<int64_t>("default_lease_ttl_ms", request.default_lease_ttl_ms(),
                                                  kMinLeaseTtlMs, kMaxLeaseTtlMs));
  }
  if (request.run_id().size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat("run_id is ", request.run_id().size(), " bytes; at most 256"));
  }
  return absl::OkStatus();
}

absl::Status BufferCore::Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response) {
  RETURN_IF_ERROR(ValidConfig(request));
  absl::MutexLock lock(&mu_);
  if (request.group_size() != config_.group_size() &&
      (!filling_.empty() || !ready_.empty() || !leases_.empty() || !acking_.empty() || reserving_puts_ > 0)) {
    return absl::FailedPreconditionError("group_size cannot change while experiences are held");
  }
  v1::ConfigureRequest next = request;
  if (next.capacity_bytes() == 0) next.set_capacity_bytes(kDefaultCapacity);
  if (!next.has_filter_zero_variance()) next.set_filter_zero_variance(true);
  if (next.zero_variance_epsilon() == 0) next.set_zero_variance_epsilon(1e-6f);
  if (next.default_lease_ttl_ms() == 0) next.set_default_lease_ttl_ms(kDefaultLeaseTtlMs);
  if (store_ != nullptr) {
    if (absl::Status s = store_->SaveConfig(next); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot record the configuration durably (it is unchanged): ", s.message()));
    }
  }
  config_ = next;
  *response->mutable_config() = config_;
  return absl::OkStatus();
}

std::string BufferCore::BadVersionLocked(absl::string_view field, uint64_t version) const {
  if (version > kMaxPolicyVersion) {
    return absl::StrCat(field, " is ", version, "; a policy version is at most ", kMaxPolicyVersion);
  }
  // (0: no version known yet, e.g. a buffer without a store that just started; the
  // first one seen is taken)
  if (current_version_ > 0 && version > current_version_ + kMaxVersionLead) {
    return absl::StrCat(field, " is ", version, ", more than ", kMaxVersionLead,
                        " ahead of the newest policy version this buffer knows (", current_version_, ")");
  }
  return "";
}

uint64_t BufferCore::ReplyBytes(const std::string& group_id, const std::string& prompt_id, uint64_t member_bytes,
                                size_t members) {
  // Each member: a tag and a length of at most 5 bytes; the group: its ids with theirs,
  // two floats, a version and its own tag and length (under 48 bytes).
  return member_bytes + 6 * members + group_id.size() + prompt_id.size() + 64;
}

bool BufferCore::TooStaleLocked(uint64_t oldest_version, uint64_t current) const {
  return config_.has_max_staleness() && current > oldest_version && current - oldest_version > config_.max_staleness();
}

absl::Status BufferCore::StoreRemoved(const std::vector<const Group*>& groups, const std::string& counter) {
  if (store_ == nullptr) return absl::OkStatus();
  std::vector<StoredRef> refs;
  for (const Group* g : groups) {
    for (const Member& m : g->members) refs.push_back({m.segment, m.id});
  }
  return store_->Removed(refs, counter);
}

absl::Status BufferCore::ForgetLocked(const std::vector<const Group*>& groups, const std::string& counter) {
  RETURN_IF_ERROR(StoreRemoved(groups, counter));
  RememberRemovedLocked(groups);
  return absl::OkStatus();
}

void BufferCore::RememberRemovedLocked(const std::vector<const Group*>& groups) {
  // A removed id stays a duplicate for a while (a producer's retry, a resumed run's
  // step), not for ever: the newest remembered_removed_ids_ of them (every id held is
  // one too). Before, every id ever taken stayed in memory: a 30-minute soak grew the
  // buffer from 67 to 467 MiB.
  for (const Group* g : groups) {
    for (const Member& m : g->members) removed_ids_.push_back(m.id);
  }
  while (removed_ids_.size() > remembered_removed_ids_) {
    seen_.erase(removed_ids_.front());
    removed_ids_.pop_front();
  }
}

absl::Status BufferCore::Put(const v1::PutExperiencesRequest& typed, v1::PutExperiencesResponse* response) {
  v1::PutExperiencesRequestWire wire;
  wire.set_producer_id(typed.producer_id());
  wire.set_run_id(typed.run_id());
  for (const v1::Experience& e : typed.experiences()) e.SerializeToString(wire.add_experiences());
  return Put(&wire, response);
}

absl::Status BufferCore::Put(v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response) {
  // (answered inline without a store; else the store's timeout bounds the wait)
  return common::AwaitCallback<absl::Status>([&](auto done) { PutAsync(request, response, std::move(done)); });
}

// What a Put decided under the lock, carried through its store write to the taking.
struct BufferCore::PutPlan {
  std::vector<ExperienceFacts> facts;
  std::vector<std::string> groups;  // (not resized once filled: adding_to_group's keys view them)
  std::vector<int> accept;
  absl::flat_hash_map<absl::string_view, Reserved> adding_to_group;
  uint64_t adding_bytes = 0;
};

void BufferCore::PutAsync(v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response,
                          std::function<void(absl::Status)> done) {
  auto plan = std::make_shared<PutPlan>();
  if (absl::Status s = PlanPut(request, response, plan.get()); !s.ok()) return done(s);
  if (store_ == nullptr) return done(TakePut(*plan, absl::OkStatus(), 0, request, response));
  // Stored without the lock and without this thread waiting for it (the store commits
  // concurrent producers' batches together), then taken under the lock.
  std::vector<ExperienceBytes> taking;
  taking.reserve(plan->accept.size());
  for (int i : plan->accept) taking.push_back({request->experiences(i), plan->facts[i].newest_version});
  store_->AddedAsync(taking, [this, plan, request, response, done = std::move(done)](absl::StatusOr<uint64_t> added) {
    if (added.ok()) {
      (void)store_->Count("dropped_duplicate", response->duplicates());
      (void)store_->Count("dropped_rejected", response->rejected());
    }
    done(TakePut(*plan, added.status(), added.ok() ? *added : 0, request, response));
  });
}

absl::Status BufferCore::PlanPut(v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response,
                                 PutPlan* plan) {
  const int n = request->experiences_size();
  if (n == 0) return absl::InvalidArgumentError("experiences is empty");
  if (n > kMaxExperiencesPerPut) {
    return absl::InvalidArgumentError(
        absl::StrCat("experiences has ", n, " entries; the limit is ", kMaxExperiencesPerPut));
  }
  // Read every experience without the lock (what deciding needs; the bytes stay as
  // sent). Experiences sent by descriptor are fetched first, under one deadline for the
  // request; ids already taken are not fetched (they are duplicates); one that cannot
  // be fetched is rejected and the others go on.
  plan->facts.resize(n);
  std::vector<ExperienceFacts>& facts = plan->facts;
  std::vector<std::string> invalid(n);  // why not, or empty
  thread_local ExperienceReader reader;
  const absl::Time deadline = absl::Now() + (fetcher_ ? fetcher_->options().timeout : absl::ZeroDuration());
  for (int i = 0; i < n; ++i) {
    std::string* bytes = request->mutable_experiences(i);
    reader.Read(*bytes, &facts[i]);
    invalid[i] = InvalidExperience(facts[i]);
    if (!invalid[i].empty() || !facts[i].has_remote_payload) continue;
    {
      absl::MutexLock lock(&mu_);
      if (seen_.contains(facts[i].id)) continue;
    }
    std::string fetched;
    if (std::string why = FetchPayload(facts[i], deadline, &fetched); !why.empty()) {
      invalid[i] = absl::StrCat("remote_payload: ", why);
      continue;
    }
    bytes->swap(fetched);
    reader.Read(*bytes, &facts[i]);
    invalid[i] = InvalidExperience(facts[i]);
  }
  // Three phases, so that concurrent producers overlap their durable writes (and the
  // store can commit them together): decide and reserve under the lock; write to the
  // store without it; take the experiences under the lock.
  mu_.Lock();
  if (!request->run_id().empty() && !config_.run_id().empty() && request->run_id() != config_.run_id()) {
    const std::string run = config_.run_id();
    mu_.Unlock();
    return absl::FailedPreconditionError(
        absl::StrCat("run_id `", request->run_id(), "` is not this buffer's run `", run, "`"));
  }
  ExpireLeasesLocked();
  const uint32_t group_size = config_.group_size();
  // First pass: decide; nothing changes unless the accepted ones fit.
  std::vector<int>& accept = plan->accept;
  std::vector<std::string>& groups = plan->groups;
  groups.resize(n);
  absl::flat_hash_map<absl::string_view, Reserved>& adding_to_group = plan->adding_to_group;
  uint64_t& adding_bytes = plan->adding_bytes;
  for (int i = 0; i < n; ++i) {
    const ExperienceFacts& f = facts[i];
    const std::string& id = f.id;
    // (an id being taken by a concurrent Put, or earlier in this one, is in seen_ too)
    if (!id.empty() && seen_.contains(id)) {
      response->set_duplicates(response->duplicates() + 1);
      response->add_duplicate_ids()->set_value(id);
      continue;
    }
    if (!invalid[i].empty()) {
      Reject(response, i, id, v1::REJECT_REASON_INVALID, invalid[i]);
      continue;
    }
    if (group_size > 1 && f.group_id.empty()) {
      Reject(response, i, id, v1::REJECT_REASON_INVALID, "group_id: required when group_size > 1");
      continue;
    }
    if (!f.has_reward) {
      Reject(response, i, id, v1::REJECT_REASON_NO_REWARD, "reward: not set (score it first)");
      continue;
    }
    if (std::string why = BadVersionLocked("token_policy_versions", f.newest_version); !why.empty()) {
      Reject(response, i, id, v1::REJECT_REASON_INVALID, why);
      continue;
    }
    if (TooStaleLocked(f.oldest_version, current_version_)) {
      Reject(response, i, id, v1::REJECT_REASON_STALE,
             absl::StrCat("token_policy_versions: oldest ", f.oldest_version, " is more than ", config_.max_staleness(),
                          " behind ", current_version_));
      continue;
    }
    const uint64_t bytes = request->experiences(i).size();
    if (bytes > config_.capacity_bytes() / 16) {
      Reject(response, i, id, v1::REJECT_REASON_TOO_LARGE,
             absl::StrCat(bytes, " bytes; the limit is capacity_bytes / 16 = ", config_.capacity_bytes() / 16));
      continue;
    }
    if (group_size > 1) {  // (with group_size 1 every experience is a group of its own: a new id, a new group)
      groups[i] = f.group_id;
      const std::string& group = groups[i];
      auto it = filling_.find(group);
      auto reserved = reserved_groups_.find(group);
      Reserved& adding = adding_to_group[group];
      const int have = (it == filling_.end() ? 0 : static_cast<int>(it->second.members.size())) +
                       (reserved == reserved_groups_.end() ? 0 : reserved->second.members) + adding.members;
      if (have >= static_cast<int>(group_size)) {
        Reject(response, i, id, v1::REJECT_REASON_GROUP_FULL,
               absl::StrCat("group_id `", group, "` already has ", group_size, " experiences"));
        continue;
      }
      // A group that no SampleBatch reply could hold would never leave the queue.
      const uint64_t group_bytes = (it == filling_.end() ? 0 : it->second.bytes) +
                                   (reserved == reserved_groups_.end() ? 0 : reserved->second.bytes) + adding.bytes +
                                   bytes;
      if (ReplyBytes(group, f.prompt_id, group_bytes, have + 1) > kMaxReplyBytes) {
        Reject(response, i, id, v1::REJECT_REASON_TOO_LARGE,
               absl::StrCat("group_id `", group, "` would hold ", group_bytes, " bytes of experiences with this one; ",
                            "a group must fit in one SampleBatch reply (", kMaxReplyBytes, " bytes)"));
        continue;
      }
      ++adding.members;
      adding.bytes += bytes;
    } else {
      if (ReplyBytes(id, f.prompt_id, bytes, 1) > kMaxReplyBytes) {
        Reject(response, i, id, v1::REJECT_REASON_TOO_LARGE,
               absl::StrCat(bytes, " bytes; an experience must fit in one SampleBatch reply (", kMaxReplyBytes,
                            " bytes)"));
        continue;
      }
      groups[i] = id;
    }
    seen_.insert(id);  // (reserved: taken back if the store write fails)
    adding_bytes += bytes;
    accept.push_back(i);
  }
  response->set_rejected(response->rejections_size());
  if (bytes_ + reserved_bytes_ + adding_bytes > config_.capacity_bytes()) {
    // Nothing is taken or counted: the producer retries the same batch.
    const std::string message =
        absl::StrCat("buffer full: ", bytes_ + reserved_bytes_, " of ", config_.capacity_bytes(),
                     " bytes held or being written, this batch needs ", adding_bytes,
                     " more; retry after the trainer consumes a batch (nothing was taken)");
    for (int i : accept) seen_.erase(facts[i].id);
    mu_.Unlock();
    return absl::ResourceExhaustedError(message);
  }
  dropped_.set_duplicate(dropped_.duplicate() + response->duplicates());
  dropped_.set_rejected(dropped_.rejected() + response->rejected());
  // Reserve: concurrent Puts see these ids as duplicates and these bytes as held.
  reserved_bytes_ += adding_bytes;
  for (const auto& [group, k] : adding_to_group) {
    Reserved& r = reserved_groups_[group];
    r.members += k.members;
    r.bytes += k.bytes;
  }
  ++reserving_puts_;
  mu_.Unlock();
  return absl::OkStatus();
}

absl::Status BufferCore::TakePut(PutPlan& plan, const absl::Status& stored, uint64_t segment,
                                 v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response) {
  const std::vector<ExperienceFacts>& facts = plan.facts;
  const std::vector<int>& accept = plan.accept;
  // Third pass: take them (or release the reservation).
  absl::MutexLock lock(&mu_);
  reserved_bytes_ -= plan.adding_bytes;
  for (const auto& [group, k] : plan.adding_to_group) {
    auto it = reserved_groups_.find(group);
    it->second.bytes -= k.bytes;
    if ((it->second.members -= k.members) == 0) reserved_groups_.erase(it);
  }
  --reserving_puts_;
  if (!stored.ok()) {
    for (int i : accept) seen_.erase(facts[i].id);
    return absl::UnavailableError(
        absl::StrCat("cannot record experiences durably (nothing was taken): ", stored.message()));
  }
  for (int i : accept) {
    Member m = MemberOf(facts[i]);
    m.bytes = std::move(*request->mutable_experiences(i));
    m.segment = segment;
    AddLocked(std::move(m), plan.groups[i], facts[i]);
  }
  accepted_total_ += accept.size();
  response->set_accepted(static_cast<uint32_t>(accept.size()));
  response->set_buffer_bytes(bytes_);
  response->set_capacity_bytes(config_.capacity_bytes());
  return absl::OkStatus();
}

void BufferCore::EndLeasesLocked(const std::function<bool(const LeaseState&)>& ended) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (ended(it->second)) {
      for (auto g = it->second.groups.rbegin(); g != it->second.groups.rend(); ++g) {
        ready_.push_front(std::move(*g));
      }
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
}

void BufferCore::ExpireLeasesLocked() {
  const absl::Time now = clock_->Now();
  EndLeasesLocked([now](const LeaseState& lease) { return lease.expires_at <= now; });
}

void BufferCore::ReleaseEarlierIncarnationsLocked(const std::string& consumer, const std::string& incarnation) {
  if (incarnation.empty()) return;
  EndLeasesLocked([&](const LeaseState& lease) {
    return lease.consumer == consumer && !lease.incarnation.empty() && lease.incarnation != incarnation;
  });
}

absl::Status BufferCore::SampleBatch(const v1::SampleBatchRequest& request, v1::SampleBatchResponse* response) {
  v1::SampleBatchResponseWire wire;
  RETURN_IF_ERROR(SampleBatch(request, &wire));
  // (the same field numbers; each experience parsed at Put: cannot fail)
  if (!response->ParseFromString(wire.SerializeAsString())) {
    return absl::InternalError("a stored experience does not parse");
  }
  return absl::OkStatus();
}

absl::Status BufferCore::SampleBatch(const v1::SampleBatchRequest& request, v1::SampleBatchResponseWire* response) {
  response->Clear();
  if (request.num_groups() < 1 || request.num_groups() > kMaxGroupsPerSample) {
    return absl::InvalidArgumentError(absl::StrCat("num_groups ", request.num_groups(), " is outside 1..1024"));
  }
  if (request.min_groups() > request.num_groups()) {
    return absl::InvalidArgumentError("min_groups is larger than num_groups");
  }
  if (request.wait_ms() < 0 || request.wait_ms() > kMaxWaitMs) {
    return absl::InvalidArgumentError(absl::StrCat("wait_ms ", request.wait_ms(), " is outside 0..600000"));
  }
  if (request.lease_ttl_ms() != 0) {  // (0: the configured default)
    RETURN_IF_ERROR(
        common::CheckInRange<int64_t>("lease_ttl_ms", request.lease_ttl_ms(), kMinLeaseTtlMs, kMaxLeaseTtlMs));
  }
  if (request.consumer_id().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("consumer_id is ", request.consumer_id().size(), " bytes; at most 256"));
  }
  const uint32_t want = std::max<uint32_t>(request.min_groups(), 1);
  absl::MutexLock lock(&mu_);
  if (std::string why = BadVersionLocked("current_policy_version", request.current_policy_version()); !why.empty()) {
    return absl::InvalidArgumentError(why);
  }
  ExpireLeasesLocked();
  std::string consumer, incarnation;
  if (const size_t hash = request.consumer_id().rfind('#'); hash != std::string::npos) {
    consumer = request.consumer_id().substr(0, hash);
    incarnation = request.consumer_id().substr(hash + 1);
    ReleaseEarlierIncarnationsLocked(consumer, incarnation);
  }
  // Wait (real time, bounded) until enough complete groups are ready.
  auto enough = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_.size() >= want; };
  mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Milliseconds(request.wait_ms()));
  ExpireLeasesLocked();
  const uint64_t current = std::max(current_version_, request.current_policy_version());
  if (current > current_version_ && store_ != nullptr) {
    // (if it cannot be recorded the bound still holds here; a restart would measure
    // from the newest version among what it recovers)
    (void)store_->SavePolicyVersion(current);
  }
  current_version_ = current;
  const bool staleness_override = request.has_max_staleness();
  LeaseState lease;
  std::vector<std::pair<std::string, Group>> unrecorded;  // drops the store did not take
  uint64_t reply_bytes = 256;                             // (the lease id, its expiry and the drop counts)
  while (!ready_.empty() && lease.groups.size() < request.num_groups()) {
    const uint64_t group_reply_bytes = ReplyBytes(ready_.front().first, ready_.front().second.prompt_id,
                                                  ready_.front().second.bytes, ready_.front().second.members.size());
    // The reply stays under the message limit: the group waits for the next call (every
    // group fits in one reply on its own: Put and Recover see to it).
    if (!lease.groups.empty() && reply_bytes + group_reply_bytes > kMaxReplyBytes) break;
    // (named variables, not a structured binding: C++17 lambdas below capture them)
    std::string id = std::move(ready_.front().first);
    Group group = std::move(ready_.front().second);
    ready_.pop_front();
    uint64_t oldest = UINT64_MAX;
    double sum = 0, sq = 0;
    for (const Member& m : group.members) {
      oldest = std::min(oldest, m.oldest_version);
      sum += m.reward;
      sq += static_cast<double>(m.reward) * m.reward;
    }
    const double n = static_cast<double>(group.members.size());
    const double mean = sum / n;
    const double stddev = std::sqrt(std::max(0.0, sq / n - mean * mean));
    const bool stale = staleness_override ? (current > oldest && current - oldest > request.max_staleness())
                                          : TooStaleLocked(oldest, current);
    // A drop the store cannot record is not made: the group stays (it is looked at
    // again next time), so what the buffer counts is what a restart would find.
    auto drop = [&](const char* counter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!ForgetLocked({&group}, counter).ok()) {
        unrecorded.emplace_back(std::move(id), std::move(group));
        return false;
      }
      bytes_ -= group.bytes;
      return true;
    };
    if (stale) {
      if (drop("dropped_stale")) {
        response->set_dropped_stale_groups(response->dropped_stale_groups() + 1);
        dropped_.set_stale(dropped_.stale() + group.members.size());
      }
      continue;
    }
    if (config_.filter_zero_variance() && group.members.size() > 1 && stddev <= config_.zero_variance_epsilon()) {
      if (drop("dropped_zero_variance")) {
        response->set_dropped_zero_variance_groups(response->dropped_zero_variance_groups() + 1);
        dropped_.set_zero_variance(dropped_.zero_variance() + group.members.size());
      }
      continue;
    }
    staleness_[std::min<uint64_t>(current - std::min(current, oldest), kHistogramBuckets - 1)] += group.members.size();
    v1::ExperienceGroupWire* out = response->add_groups();
    out->set_group_id(id);
    out->set_prompt_id(group.prompt_id);
    out->mutable_experiences()->Reserve(static_cast<int>(group.members.size()));
    for (const Member& m : group.members) out->add_experiences()->assign(m.bytes);
    out->set_reward_mean(static_cast<float>(mean));
    out->set_reward_std(static_cast<float>(stddev));
    out->set_min_policy_version(oldest);
    reply_bytes += group_reply_bytes;
    lease.groups.emplace_back(std::move(id), std::move(group));
  }
  for (auto it = unrecorded.rbegin(); it != unrecorded.rend(); ++it) ready_.push_front(std::move(*it));
  if (lease.groups.empty()) return absl::OkStatus();
  const int64_t ttl_ms = request.lease_ttl_ms() ? request.lease_ttl_ms() : config_.default_lease_ttl_ms();
  lease.expires_at = clock_->Now() + absl::Milliseconds(ttl_ms);
  lease.consumer = std::move(consumer);
  lease.incarnation = std::move(incarnation);
  const std::string lease_id = common::NewId("lease");
  response->set_lease_id(lease_id);
  response->set_lease_expires_at_unix_ms(absl::ToUnixMillis(lease.expires_at));
  leases_[lease_id] = std::move(lease);
  return absl::OkStatus();
}

absl::Status BufferCore::Ack(const v1::AckBatchRequest& request, v1::AckBatchResponse* response) {
  if (request.lease_id().empty()) return absl::InvalidArgumentError("lease_id is empty");
  const std::string& lease_id = request.lease_id();
  absl::MutexLock lock(&mu_);
  auto not_acking = [this, &lease_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return acking_.count(lease_id) == 0; };
  mu_.Await(absl::Condition(&not_acking));  // (a retried Ack of one being recorded)
  ExpireLeasesLocked();
  if (acked_leases_.count(lease_id)) {
    response->set_already_acked(true);
    return absl::OkStatus();
  }
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("lease `", lease_id, "` is unknown or expired (its groups are back in the buffer)"));
  }
  // The consumption is recorded in the store without the lock (Puts and samples go on
  // meanwhile): the lease is out of leases_ (no expiry touches it) and back in if the
  // write fails.
  LeaseState lease = std::move(it->second);
  leases_.erase(it);
  std::vector<const Group*> groups;
  for (const auto& [id, group] : lease.groups) groups.push_back(&group);
  if (store_ != nullptr) {
    acking_.insert(lease_id);
    mu_.Unlock();
    const absl::Status stored = StoreRemoved(groups, "consumed_total");
    mu_.Lock();
    acking_.erase(lease_id);
    if (!stored.ok()) {
      leases_.emplace(lease_id, std::move(lease));
      return absl::UnavailableError(
          absl::StrCat("cannot record the ack durably (lease still open): ", stored.message()));
    }
  }
  RememberRemovedLocked(groups);
  uint32_t consumed = 0;
  for (auto& [id, group] : lease.groups) {
    consumed += group.members.size();
    bytes_ -= group.bytes;
  }
  consumed_total_ += consumed;
  response->set_consumed_experiences(consumed);
  acked_leases_.insert(lease_id);
  acked_order_.push_back(lease_id);
  if (acked_order_.size() > kRememberedAckedLeases) {  // (a late second ack of an old lease is NOT_FOUND)
    acked_leases_.erase(acked_order_.front());
    acked_order_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status BufferCore::Nack(const v1::NackBatchRequest& request, v1::NackBatchResponse* response) {
  if (request.lease_id().empty()) return absl::InvalidArgumentError("lease_id is empty");
  absl::MutexLock lock(&mu_);
  auto not_acking = [this, &request]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return acking_.count(request.lease_id()) == 0; };
  mu_.Await(absl::Condition(&not_acking));  // (its Ack decides: acked, or still open)
  ExpireLeasesLocked();
  if (acked_leases_.count(request.lease_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease `", request.lease_id(), "` was acked: its groups are consumed"));
  }
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
