#include "services/weights/weights_core.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/reshard/round.h"
#include "services/weights/spawn.h"
#include "services/weights/weights_requests.h"

namespace rlfleet::weights {

using reshard::SplitFromProto;

WeightsCore::WeightsCore(DestinationFactory factory, transport::Transport* data_plane, int relay_fanout)
    : factory_(std::move(factory)), data_plane_(data_plane), store_(data_plane), relay_(relay_fanout) {}

WeightsCore::~WeightsCore() = default;

void WeightsCore::SetLogger(Logger logger) {
  logger_ = std::move(logger);
  store_.SetLogger(logger_);
  if (push_ != nullptr) push_->SetLogger(logger_);
}

void WeightsCore::EnablePush(bool push, absl::Duration round_timeout) {
  push_.reset();
  if (!push || data_plane_ == nullptr) return;
  push_ = std::make_unique<PushChains>(data_plane_, round_timeout);
  push_->SetLogger(logger_);
}

absl::Status WeightsCore::RegisterDestination(const v1::RegisterDestinationRequest& request,
                                              v1::RegisterDestinationResponse* response) {
  RETURN_IF_ERROR(CheckRegisterDestination(request));
  std::shared_ptr<Destination> d = factory_(request.grpc_address());
  {
    absl::MutexLock lock(&mu_);
    destinations_[request.replica_id()] = {request.grpc_address(), std::move(d), request.layout(), request.can_relay()};
  }
  if (std::shared_ptr<const VersionInfo> latest = store_.Latest()) {
    *response->mutable_latest_version() = latest->manifest.version();
    response->set_bytes_needed(latest->location.length_bytes());
  }
  return absl::OkStatus();
}

absl::Status WeightsCore::UnregisterDestination(const v1::UnregisterDestinationRequest& request,
                                                v1::UnregisterDestinationResponse* response) {
  if (request.replica_id().empty()) return absl::InvalidArgumentError("replica_id: empty");
  {
    absl::MutexLock lock(&mu_);
    response->set_was_registered(destinations_.erase(request.replica_id()) > 0);
  }
  relay_.Gone(request.replica_id());
  return absl::OkStatus();
}

absl::Status WeightsCore::PublishVersion(const v1::PublishVersionRequest& request,
                                         v1::PublishVersionResponse* response) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, d] : destinations_) ids.push_back(id);
  }
  RETURN_IF_ERROR(store_.Publish(request, ids, response));
  // (the relay state of versions whose records are gone)
  if (std::shared_ptr<const VersionInfo> latest = store_.Latest();
      latest != nullptr && latest->number >= static_cast<uint64_t>(VersionStore::kRecords)) {
    relay_.ForgetBefore(latest->number - VersionStore::kRecords + 1);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WeightsCore::ResolveSync(uint64_t version, const std::vector<std::string>& ids) {
  ASSIGN_OR_RETURN(version, store_.Resolve(version));
  absl::MutexLock lock(&mu_);
  for (const std::string& id : ids) {
    if (!destinations_.count(id)) return absl::NotFoundError(absl::StrCat("destination ", id, " is not registered"));
  }
  return version;
}

std::vector<std::string> WeightsCore::DeviceImageTakers(uint64_t version, const std::vector<std::string>& ids,
                                                        absl::Time deadline) {
  std::vector<std::string> out;
  if (!store_.HostCopyDeferred(version)) return out;
  absl::StatusOr<std::shared_ptr<const VersionInfo>> info = store_.Info(version);
  if (!info.ok()) return out;
  std::vector<std::shared_ptr<Destination>> destinations(ids.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      auto d = destinations_.find(ids[i]);
      if (d != destinations_.end()) destinations[i] = d->second.destination;
    }
  }
  // Asked at once (a replica that does not answer costs its 5 s once, not per replica).
  std::vector<char> takes(ids.size(), 0);
  const absl::Time asked_by = std::min(deadline, absl::Now() + absl::Seconds(5));
  std::vector<std::thread> asking;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (destinations[i] == nullptr) continue;
    auto ask = [&, i] {
      absl::StatusOr<v1::GetInfoResponse> replica = destinations[i]->Info(asked_by);
      takes[i] = replica.ok() && TakesDeviceImage(**info, *replica);
    };
    if (!Spawn(&asking, "a replica's info", ask).ok()) ask();  // (no thread: asked here)
  }
  for (auto& t : asking) t.join();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (takes[i]) out.push_back(ids[i]);
  }
  return out;
}

absl::StatusOr<v1::DestinationSyncStatus> WeightsCore::Pull(const std::string& replica_id, uint64_t version,
                                                            absl::Duration timeout, VersionStore::Bytes bytes,
                                                            const absl::StatusOr<Lease>* acquired) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<Lease> leased = acquired != nullptr ? *acquired : store_.Acquire(version, bytes, deadline);
  if (!leased.ok()) {  // (given up, or a deferred host copy the trainer no longer holds)
    RecordFailed(replica_id, version, leased.status());
    return leased.status();
  }
  const Lease lease = *std::move(leased);
  version = lease.info->number;
  const bool relaying = relay_.fanout() > 0 && lease.image != nullptr && lease.image->staged();
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<Destination> destination;
    bool can_relay = false;
    {
      absl::MutexLock lock(&mu_);
      auto d = destinations_.find(replica_id);
      if (d == destinations_.end()) {
        return absl::NotFoundError(absl::StrCat("destination ", replica_id, " is not registered"));
      }
      destination = d->second.destination;
      can_relay = d->second.can_relay;
    }
    // Where from: a replica that holds it (the relay tree), else this service. A retry
    // after a failed relay comes from here.
    std::optional<RelayTree::Sender> sender;
    if (relaying && attempt == 0) {
      sender = relay_.Begin(version, deadline);
    } else if (relaying) {
      relay_.BeginFromHere(version);
    }
    const std::string from = sender ? sender->replica_id : "";
    v1::PrepareWeightsRequest request;
    *request.mutable_manifest() = lease.info->manifest;
    *request.add_chunks()->mutable_source() = sender ? sender->source : lease.Source();
    // (a replica on a CUDA device of the trainer's host installs from its GPU copy and
    // falls back to the chunk; any other ignores it)
    if (lease.info->device_image.ipc_handle().size() > 0) *request.mutable_device_image() = lease.info->device_image;
    request.set_serve_relay(relaying);
    request.set_transfer_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
    v1::DestinationSyncStatus s;
    s.set_replica_id(replica_id);
    s.set_version(version);
    s.set_bytes_needed(lease.info->location.length_bytes());
    s.set_phase(v1::SYNC_PHASE_TRANSFERRING);
    s.set_relayed_from(from);
    store_.SetStatus(version, s);

    const absl::Time start = absl::Now();
    absl::StatusOr<v1::CommitWeightsResponse> installed = destination->Install(request, deadline);
    const absl::Duration took = absl::Now() - start;
    if (relaying) {
      std::optional<RelayTree::Sender> holder;
      if (installed.ok() && can_relay && installed->has_relay_source() && installed->relay_source().has_segment()) {
        holder = RelayTree::Sender{replica_id, installed->relay_source()};
      }
      relay_.End(version, std::move(holder));
    }
    if (!installed.ok()) {
      if (sender && absl::Now() < deadline) {
        // The relay may be what failed (its replica died or moved to a newer version):
        // that holder serves no one else, and this replica gets it from here.
        relay_.Failed(version, from);
        Log(absl::StrCat("version ", version, " -> ", replica_id, ": the relay from ", from, " failed (",
                         installed.status().ToString(), "); sending it from here"));
        continue;
      }
      s.set_phase(v1::SYNC_PHASE_FAILED);
      s.set_error(installed.status().ToString());
      s.set_error_code(static_cast<int32_t>(installed.status().code()));
      store_.SetStatus(version, s);
      Log(absl::StrFormat("version %d -> %s: FAILED after %.1f ms: %s", version, replica_id,
                          absl::ToDoubleMilliseconds(took), installed.status().ToString()));
      return installed.status();
    }
    return RecordInstalled(std::move(s), from, *installed, took, /*pushed=*/false);
  }
}

void WeightsCore::RecordFailed(const std::string& replica_id, uint64_t version, const absl::Status& why) {
  if (version == 0) return;  // (no record to write into)
  std::optional<v1::DestinationSyncStatus> s = store_.StatusOf(version, replica_id);
  if (s.has_value() && s->phase() == v1::SYNC_PHASE_INSTALLED) return;  // (it runs the version already)
  if (!s.has_value()) s.emplace();
  s->set_replica_id(replica_id);
  s->set_version(version);
  s->set_phase(v1::SYNC_PHASE_FAILED);
  s->set_error(why.ToString());
  s->set_error_code(static_cast<int32_t>(why.code()));
  store_.SetStatus(version, *s);
}

v1::DestinationSyncStatus WeightsCore::RecordInstalled(v1::DestinationSyncStatus s, const std::string& from,
                                                       const v1::CommitWeightsResponse& installed, absl::Duration took,
                                                       bool pushed) {
  s.set_phase(v1::SYNC_PHASE_INSTALLED);
  s.clear_error();
  s.clear_error_code();
  s.set_bytes_moved(s.bytes_needed());
  s.set_relayed_from(from);
  s.set_pushed(pushed);
  s.set_from_device_image(installed.from_device_image());
  // (a replica reading the trainer's file, or copying its GPU copy, reports no pull: its
  // install is the transfer)
  s.set_transfer_us(installed.pull_us() > 0 && !installed.from_device_image() ? installed.pull_us()
                                                                              : installed.install_us());
  s.set_pull_allocate_us(installed.pull_allocate_us());
  s.set_pull_verify_us(installed.pull_verify_us());
  s.set_pause_us(installed.pause_us());
  s.set_install_us(installed.install_us());
  s.set_round_trip_us(absl::ToInt64Microseconds(took));
  if (s.transfer_us() > 0) s.set_throughput_gb_per_s(s.bytes_moved() / (s.transfer_us() * 1e3));
  store_.SetStatus(s.version(), s);
  if (s.from_device_image()) {
    Log(
        absl::StrFormat("version %d -> %s (GPU to GPU from the trainer's copy): installed, %.1f MB, install %.1f ms "
                        "(%.2f GB/s), decode pause %.2f ms, round trip %.1f ms",
                        s.version(), s.replica_id(), s.bytes_moved() / 1e6, s.install_us() / 1e3,
                        s.throughput_gb_per_s(), s.pause_us() / 1e3, s.round_trip_us() / 1e3));
    return s;
  }
  Log(
      absl::StrFormat("version %d -> %s (%s %s): installed, %.1f MB, %s %.1f ms (%.2f GB/s; memory %.1f ms, "
                      "digest %.1f ms), install %.1f ms, decode pause %.2f ms, round trip %.1f ms",
                      s.version(), s.replica_id(), pushed ? "pushed from" : "pulled from", from.empty() ? "here" : from,
                      s.bytes_moved() / 1e6, pushed ? "receive" : "pull", s.transfer_us() / 1e3,
                      s.throughput_gb_per_s(), s.pull_allocate_us() / 1e3, s.pull_verify_us() / 1e3,
                      s.install_us() / 1e3, s.pause_us() / 1e3, s.round_trip_us() / 1e3));
  return s;
}

// What a push round reports, recorded in each destination's status.
class WeightsCore::PushObserver : public PushChains::Observer {
 public:
  PushObserver(WeightsCore& core, uint64_t version) : core_(core), version_(version) {}
  void AlreadyInstalled(const std::string& replica_id) override {
    v1::DestinationSyncStatus s = Current(replica_id);
    s.set_phase(v1::SYNC_PHASE_INSTALLED);
    s.clear_error();
    s.clear_error_code();
    core_.store_.SetStatus(version_, s);
  }
  void Transferring(const std::string& replica_id, uint64_t bytes_needed) override {
    v1::DestinationSyncStatus s = Current(replica_id);
    s.set_bytes_needed(bytes_needed);
    s.set_phase(v1::SYNC_PHASE_TRANSFERRING);
    s.clear_error();
    s.clear_error_code();
    core_.store_.SetStatus(version_, s);
  }
  void Installed(const std::string& replica_id, const std::string& from, const v1::CommitWeightsResponse& installed,
                 absl::Duration took) override {
    core_.RecordInstalled(Current(replica_id), from, installed, took, /*pushed=*/true);
  }
  void Failed(const std::string& replica_id, const absl::Status& why) override {
    v1::DestinationSyncStatus s = Current(replica_id);
    s.set_phase(v1::SYNC_PHASE_FAILED);
    s.set_error(absl::StrCat("push: ", why.ToString()));
    s.set_error_code(static_cast<int32_t>(why.code()));
    core_.store_.SetStatus(version_, s);
  }

 private:
  v1::DestinationSyncStatus Current(const std::string& replica_id) const {
    v1::DestinationSyncStatus s = core_.store_.StatusOf(version_, replica_id).value_or(v1::DestinationSyncStatus());
    s.set_replica_id(replica_id);
    s.set_version(version_);
    return s;
  }
  WeightsCore& core_;
  const uint64_t version_;
};

std::vector<std::string> WeightsCore::PushChain(const Lease& version, const std::vector<std::string>& chain,
                                                absl::Time deadline) {
  std::vector<PushChains::Member> members;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : chain) {
      auto d = destinations_.find(id);
      members.push_back({id, d == destinations_.end() ? nullptr : d->second.destination});
    }
  }
  PushObserver observer(*this, version.info->number);
  return push_->Push(version, members, deadline, observer);
}

absl::Status WeightsCore::SyncVersion(const v1::SyncVersionRequest& request, v1::SyncVersionResponse* response) {
  RETURN_IF_ERROR(CheckSyncVersion(request));
  const absl::Duration timeout =
      request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms()) : absl::Seconds(120);
  if (request.replica_id().empty()) {  // every destination (or those named), in one round
    ASSIGN_OR_RETURN(
        std::vector<v1::DestinationSyncStatus> all,
        SyncSome(request.version(), {request.replica_ids().begin(), request.replica_ids().end()}, timeout));
    for (v1::DestinationSyncStatus& s : all) *response->add_destinations() = std::move(s);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(const uint64_t version, ResolveSync(request.version(), {request.replica_id()}));
  if (!DeviceImageTakers(version, {request.replica_id()}, deadline).empty()) {  // (no host copy needed)
    ASSIGN_OR_RETURN(*response->mutable_status(),
                     Pull(request.replica_id(), version, std::max(deadline - absl::Now(), absl::Milliseconds(1)),
                          VersionStore::Bytes::kNotNeeded));
    return absl::OkStatus();
  }
  const absl::StatusOr<Lease> lease = store_.Acquire(version, VersionStore::Bytes::kNeeded, deadline);
  if (push_ != nullptr && lease.ok() && PushChain(*lease, {request.replica_id()}, deadline).empty()) {
    *response->mutable_status() = store_.StatusOf(version, request.replica_id()).value_or(v1::DestinationSyncStatus());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(*response->mutable_status(),
                   Pull(request.replica_id(), version, std::max(deadline - absl::Now(), absl::Milliseconds(1)),
                        VersionStore::Bytes::kNeeded, &lease));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::DestinationSyncStatus>> WeightsCore::SyncAll(uint64_t version, absl::Duration timeout) {
  return SyncSome(version, {}, timeout);
}

absl::StatusOr<std::vector<v1::DestinationSyncStatus>> WeightsCore::SyncSome(uint64_t version,
                                                                             std::vector<std::string> ids,
                                                                             absl::Duration timeout) {
  if (ids.empty()) {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, d] : destinations_) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  ASSIGN_OR_RETURN(version, ResolveSync(version, ids));
  const absl::Time deadline = absl::Now() + timeout;
  // Replicas that install the trainer's GPU copy of a version whose host copy is
  // deferred sync without it; the others (if any) need the bytes, pulled now if not yet.
  const std::vector<std::string> device_takers = DeviceImageTakers(version, ids, deadline);
  std::vector<std::string> need_bytes;
  std::set_difference(ids.begin(), ids.end(), device_takers.begin(), device_takers.end(),
                      std::back_inserter(need_bytes));
  std::vector<std::string> pull = need_bytes;
  absl::StatusOr<Lease> lease = absl::FailedPreconditionError("no destination needs the version's bytes");
  if (!need_bytes.empty()) {
    lease = store_.Acquire(version, VersionStore::Bytes::kNeeded, deadline);  // (held for the whole round)
  }
  if (push_ != nullptr && lease.ok() && !need_bytes.empty()) {
    // Chains of replicas (--relay_fanout of them; 0: each replica its own), each pushed
    // in one round; the replicas a push missed pull the version instead.
    std::vector<std::pair<std::string, bool>> relays;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : need_bytes) {
        auto d = destinations_.find(id);
        relays.push_back({id, d != destinations_.end() && d->second.can_relay});
      }
    }
    const std::vector<std::vector<std::string>> chains = PushChains::ChainsOf(relays, relay_.fanout());
    std::vector<std::vector<std::string>> missed(chains.size());
    std::vector<std::thread> rounds;
    absl::Status spawned = absl::OkStatus();
    for (size_t c = 0; c < chains.size() && spawned.ok(); ++c) {
      spawned = Spawn(&rounds, "a push round", [&, c] { missed[c] = PushChain(*lease, chains[c], deadline); });
    }
    for (auto& t : rounds) t.join();
    RETURN_IF_ERROR(spawned);
    pull.clear();
    for (const auto& m : missed) pull.insert(pull.end(), m.begin(), m.end());
  }
  std::vector<std::pair<std::string, VersionStore::Bytes>> syncs;
  for (const std::string& id : pull) syncs.push_back({id, VersionStore::Bytes::kNeeded});
  for (const std::string& id : device_takers) syncs.push_back({id, VersionStore::Bytes::kNotNeeded});
  std::vector<std::thread> threads;
  absl::Status spawned = absl::OkStatus();
  for (size_t i = 0; i < syncs.size() && spawned.ok(); ++i) {
    spawned = Spawn(&threads, "a replica's sync", [this, sync = syncs[i], version, deadline, &lease] {
      // (those needing bytes share the round's lease: a pull that failed is not tried again per replica)
      (void)Pull(sync.first, version, std::max(deadline - absl::Now(), absl::Milliseconds(1)), sync.second,
                 sync.second == VersionStore::Bytes::kNeeded ? &lease : nullptr);
    });
  }
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(spawned);
  std::vector<v1::DestinationSyncStatus> out;
  for (const std::string& id : ids) {
    std::optional<v1::DestinationSyncStatus> s = store_.StatusOf(version, id);
    if (!s) {  // (its record is gone, or it was never asked)
      s.emplace();
      s->set_replica_id(id);
      s->set_version(version);
    }
    out.push_back(std::move(*s));
  }
  return out;
}

absl::Status WeightsCore::GetPlan(const v1::GetPlanRequest& request, v1::GetPlanResponse* response) {
  if (request.max_ranges() > 100000) {
    return absl::InvalidArgumentError(absl::StrCat("max_ranges ", request.max_ranges(), " is over 100000"));
  }
  const uint64_t max_ranges = request.max_ranges() == 0 ? 10000 : request.max_ranges();
  ASSIGN_OR_RETURN(std::shared_ptr<const VersionInfo> info, store_.Info(request.version()));
  if (store_.HostCopyDeferred(info->number)) {  // (its tensors are known once its bytes are here)
    ASSIGN_OR_RETURN(const Lease lease,
                     store_.Acquire(info->number, VersionStore::Bytes::kNeeded, absl::Now() + absl::Minutes(1)));
    info = lease.info;
  }
  const VersionInfo& ver = *info;
  const uint64_t version = ver.number;
  v1::ShardLayout wanted;
  {
    absl::MutexLock lock(&mu_);
    auto d = destinations_.find(request.replica_id());
    if (d == destinations_.end()) {
      return absl::NotFoundError(absl::StrCat("destination ", request.replica_id(), " is not registered"));
    }
    wanted = d->second.layout;
  }
  if (ver.tensors.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " has no tensor list (no layout in its manifest, and not a safetensors image)"));
  }
  // The destination's layout, by tensor name; none registered: one rank holds everything.
  reshard::Layout dst;
  if (wanted.tensors_size() == 0) {
    dst = reshard::Layout::Tp(1, std::vector<reshard::Split>(ver.tensors.size(), reshard::Split::kReplicated));
  } else {
    std::map<std::string, const v1::TensorLayout*> kinds;
    for (const v1::TensorLayout& t : wanted.tensors()) kinds[t.spec().name()] = &t;
    // (RegisterDestination bounded it: 1..64)
    dst.ranks = static_cast<int>(std::clamp<uint32_t>(wanted.world_size(), 1, kMaxDestinationRanks));
    for (const reshard::TensorSpec& t : ver.tensors) {
      auto kind = kinds.find(t.name);
      if (kind == kinds.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("destination ", request.replica_id(), "'s layout has no tensor `", t.name, "`"));
      }
      // (a spec given with the layout must be the version's)
      const v1::TensorSpec& given = kind->second->spec();
      if ((given.dtype() != v1::DTYPE_UNSPECIFIED && given.dtype() != reshard::DTypeToProto(t.dtype)) ||
          (given.shape_size() > 0 && std::vector<int64_t>(given.shape().begin(), given.shape().end()) != t.shape)) {
        return absl::FailedPreconditionError(absl::StrCat("destination ", request.replica_id(), "'s layout gives `",
                                                          t.name, "` another dtype or shape than version ", version,
                                                          "'s"));
      }
      ASSIGN_OR_RETURN(reshard::Split split, SplitFromProto(kind->second->kind(), t.name));
      dst.splits.push_back(split);
    }
  }
  ASSIGN_OR_RETURN(reshard::Plan plan, reshard::MakePlan(ver.tensors, ver.layout, dst));
  response->set_version(version);
  uint64_t returned = 0;
  for (int s = 0; s < plan.src.ranks; ++s) {
    for (int r = 0; r < plan.dst.ranks; ++r) {
      const std::vector<reshard::Range>& ranges = plan.Between(s, r);
      if (ranges.empty()) continue;
      v1::RankPairPlan* pair = response->add_pairs();
      pair->set_src_rank(s);
      pair->set_dst_rank(r);
      pair->set_range_count(ranges.size());
      uint64_t bytes = 0;
      for (const reshard::Range& range : ranges) {
        bytes += range.dst_bytes();
        if (!request.include_ranges()) continue;
        if (returned == max_ranges) {
          response->set_truncated(true);
          continue;
        }
        v1::PlannedRange* out = pair->add_ranges();
        out->mutable_src()->set_offset_bytes(range.src_offset);
        out->mutable_src()->set_length_bytes(range.src_bytes());
        out->set_dst_offset_bytes(range.dst_offset);
        ++returned;
      }
      pair->set_bytes(bytes);
    }
  }
  response->set_bytes_needed(plan.BytesNeeded());
  response->set_bytes_planned(plan.BytesMoved());
  if (auto s = store_.StatusOf(version, request.replica_id())) response->set_relay_parent(s->relayed_from());
  return absl::OkStatus();
}

absl::Status WeightsCore::GetSyncStatus(const v1::GetSyncStatusRequest& request, v1::GetSyncStatusResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<const VersionInfo> info, store_.Info(request.version()));
  const uint64_t version = info->number;
  response->set_version(version);
  response->set_trainer_pause_us(info->trainer_pause_us);
  response->set_publish_read_us(info->read_us);
  if (!request.replica_id().empty()) {
    std::optional<v1::DestinationSyncStatus> s = store_.StatusOf(version, request.replica_id());
    if (!s) {
      return absl::NotFoundError(
          absl::StrCat("destination ", request.replica_id(), " has no status for version ", version));
    }
    *response->add_destinations() = std::move(*s);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<v1::DestinationSyncStatus> all, store_.Statuses(version));
  for (v1::DestinationSyncStatus& s : all) *response->add_destinations() = std::move(s);
  return absl::OkStatus();
}

}  // namespace rlfleet::weights
