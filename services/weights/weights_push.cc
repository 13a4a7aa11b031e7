// WeightsCore's push path: a version repacked once in the planner's layout, and rounds
// of libs/reshard's executor along chains of replicas (see weights_core.h).
#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/common/huge_string.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"
#include "libs/reshard/digest.h"
#include "libs/reshard/round.h"
#include "services/weights/spawn.h"
#include "services/weights/weights_core.h"

namespace rlfleet::weights {

WeightsCore::PushSource::~PushSource() {
  if (handle.id != 0) (void)data_plane->DeregisterMemory(handle);
}

absl::StatusOr<std::shared_ptr<WeightsCore::PushSource>> WeightsCore::PushSourceLocked(Version& v) {
  if (v.push != nullptr) return v.push;
  if (v.released) return ReleasedError(v.manifest.version().version());
  if (v.tensors.empty() || v.bytes.empty()) {
    return absl::FailedPreconditionError("the version's tensors are not known (not a safetensors image)");
  }
  auto views = model::ParseSafetensorsViews(v.bytes, "the version");
  if (!views.ok()) return views.status();
  auto push = std::make_shared<PushSource>();
  push->data_plane = data_plane_;
  const reshard::Layout whole =
      reshard::Layout::Tp(1, std::vector<reshard::Split>(v.tensors.size(), reshard::Split::kReplicated));
  ASSIGN_OR_RETURN(push->plan, reshard::MakePlan(v.tensors, whole, whole));
  // Into memory faulted in already when there is some: a retired push copy's, else an
  // older version's that no round is using (pushes are almost always of the latest; an
  // older one pushed again is repacked).
  const uint64_t packed_bytes = push->plan.src_shard_bytes[0];
  for (auto& [number, older] : versions_) {
    if (packed_spare_.capacity() >= packed_bytes) break;
    if (&older != &v) ReclaimPushCopyLocked(older);
  }
  push->packed = common::ReuseOrNewHugeString(std::move(packed_spare_), packed_bytes);
  // The destination (one rank, every tensor whole) has the source's layout, so this
  // service's digest share is computed in the same pass as the copy.
  for (size_t t = 0; t < v.tensors.size(); ++t) {
    auto view = views->find(v.tensors[t].name);
    const reshard::ShardPart& part = push->plan.src_parts[0][t];
    const uint64_t bytes = part.elements * reshard::DTypeSize(part.dtype);
    if (view == views->end() || view->second.bytes.size() != bytes) {
      return absl::FailedPreconditionError(absl::StrCat("tensor `", v.tensors[t].name, "` is not in the image as listed"));
    }
    push->share += reshard::CopyAndDigest(push->packed.data() + part.offset, view->second.bytes.data(), bytes,
                                          part.offset);
  }
  ASSIGN_OR_RETURN(push->handle, data_plane_->RegisterMemory(push->packed.data(), push->packed.size(),
                                                             transport::MemoryKind::kHost, 0));
  v.push = push;
  return push;
}

std::vector<std::string> WeightsCore::PushChain(uint64_t version, std::vector<std::string> chain,
                                                absl::Time deadline) {
  // Each replica's state and data-plane address; one without, or already at the
  // version, leaves the chain.
  std::vector<std::shared_ptr<Destination>> destinations;
  std::vector<std::string> not_pushed;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : chain) {
      auto d = destinations_.find(id);
      destinations.push_back(d == destinations_.end() ? nullptr : d->second.destination);
    }
  }
  std::vector<std::string> members, addresses;
  std::vector<std::shared_ptr<Destination>> member_destinations;
  for (size_t i = 0; i < chain.size(); ++i) {
    if (destinations[i] == nullptr) {  // (unregistered meanwhile: the pull says so)
      not_pushed.push_back(chain[i]);
      continue;
    }
    absl::StatusOr<v1::GetInfoResponse> info = destinations[i]->Info(std::min(deadline, absl::Now() + absl::Seconds(5)));
    if (info.ok() && info->installed_version().version() == version) {  // already there: nothing to move
      absl::MutexLock lock(&mu_);
      if (auto v = versions_.find(version); v != versions_.end()) {
        v1::DestinationSyncStatus& s = v->second.status[chain[i]];
        s.set_replica_id(chain[i]);
        s.set_version(version);
        s.set_phase(v1::SYNC_PHASE_INSTALLED);
        s.clear_error();
      }
      continue;
    }
    // (a replica already past the version refuses it: the pull says so without a round)
    if (!info.ok() || info->data_plane().worker_address().empty() || info->layout().world_size() > 1 ||
        info->installed_version().version() > version) {
      not_pushed.push_back(chain[i]);
      continue;
    }
    members.push_back(chain[i]);
    addresses.push_back(info->data_plane().worker_address());
    member_destinations.push_back(destinations[i]);
  }
  if (members.empty()) return not_pushed;

  std::shared_ptr<PushSource> push;
  std::unique_ptr<reshard::StagingPool> pool;
  uint32_t epoch = 0;  // (each round its own: a failed round's leftovers never match the next)
  v1::WeightManifest manifest;
  {
    absl::MutexLock lock(&mu_);
    auto v = versions_.find(version);
    absl::StatusOr<std::shared_ptr<PushSource>> source =
        v == versions_.end() ? absl::AbortedError("retired") : PushSourceLocked(v->second);
    if (!source.ok()) {
      Log(absl::StrCat("version ", version, ": not pushed (", source.status().ToString(), "); the replicas pull it"));
      not_pushed.insert(not_pushed.end(), members.begin(), members.end());
      return not_pushed;
    }
    push = *source;
    manifest = v->second.manifest;
    if (!pools_.empty()) {
      pool = std::move(pools_.back());
      pools_.pop_back();
    }
    ++v->second.pushing;
    epoch = next_epoch_++ % 16;
    for (const std::string& id : members) {
      v1::DestinationSyncStatus& s = v->second.status[id];
      s.set_replica_id(id);
      s.set_version(version);
      s.set_bytes_needed(push->plan.BytesNeeded());
      s.set_phase(v1::SYNC_PHASE_TRANSFERRING);
      s.clear_error();
    }
  }
  if (pool == nullptr) pool = std::make_unique<reshard::StagingPool>(*data_plane_);

  // The round: this service is source rank 0, the chain's replicas destination rank 0
  // one after the other.
  v1::ReshardRound round;
  *round.mutable_source_layout() = reshard::ModelLayoutToProto(push->plan.tensors, push->plan.src);
  *round.mutable_destination_layout() = reshard::ModelLayoutToProto(push->plan.tensors, push->plan.dst);
  round.add_digest_shares(push->share);
  round.set_tag_epoch(epoch);
  round.set_map_peer_memory(true);
  const absl::Duration round_timeout = push_round_timeout_;
  round.set_round_timeout_ms(absl::ToInt64Milliseconds(round_timeout));
  std::vector<absl::StatusOr<v1::CommitWeightsResponse>> results(members.size(), absl::UnknownError("not run"));
  std::vector<absl::Duration> took(members.size());
  absl::Status sent = absl::OkStatus();
  reshard::ExecutionStats stats;
  const absl::Time start = absl::Now();
  {
    std::vector<std::thread> threads;
    absl::StatusOr<transport::PeerId> first = data_plane_->Connect(addresses[0]);
    if (first.ok()) {
      absl::Status spawned = Spawn(&threads, "the push's source", [&, peer = *first] {
        reshard::SourceRole role{0, push->handle, {peer}};
        auto ops = reshard::NewHostMemoryOps();
        reshard::ExecutorOptions options;
        options.map_peer_memory = true;
        options.tag_epoch = static_cast<int>(epoch);
        options.deadline = deadline;
        options.timeout = std::min(round_timeout, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
        options.digests = false;  // (the shares were computed with the copy)
        options.staging_pool = pool.get();
        absl::StatusOr<reshard::ExecutionStats> executed =
            reshard::Execute(*data_plane_, push->plan, &role, nullptr, *ops, options);
        sent = executed.status();
        if (executed.ok()) stats = *executed;
      });
      if (!spawned.ok()) {  // (no member is asked to join a round with no source)
        first = spawned;
        sent = spawned;
      }
    } else {
      sent = first.status();
    }
    for (size_t i = 0; i < members.size() && first.ok(); ++i) {
      v1::PrepareWeightsRequest request;
      *request.mutable_manifest() = manifest;
      *request.mutable_reshard() = round;
      if (i == 0) {
        request.mutable_reshard()->add_source_addresses(data_plane_->LocalAddress());
      } else {
        request.mutable_reshard()->set_relay_from(addresses[i - 1]);
      }
      if (i + 1 < members.size()) request.mutable_reshard()->set_forward_to(addresses[i + 1]);
      request.set_transfer_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
      absl::Status spawned = Spawn(&threads, "a push member", [&, i, request = std::move(request)] {
        const absl::Time begin = absl::Now();
        results[i] = member_destinations[i]->Install(request, deadline);
        took[i] = absl::Now() - begin;
      });
      if (!spawned.ok()) results[i] = spawned;  // (it pulls instead, or fails with this)
    }
    for (auto& t : threads) t.join();
  }
  absl::MutexLock lock(&mu_);
  pools_.push_back(std::move(pool));
  auto v = versions_.find(version);
  if (v != versions_.end()) --v->second.pushing;
  int installed = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!results[i].ok()) {
      if (results[i].status().code() == absl::StatusCode::kUnknown && !sent.ok()) results[i] = sent;  // (never asked)
      Log(absl::StrFormat("version %d -> %s: the push failed after %.1f ms (%s); it pulls instead", version,
                          members[i], absl::ToDoubleMilliseconds(took[i]), results[i].status().ToString()));
      not_pushed.push_back(members[i]);
      if (v != versions_.end()) {  // (until the pull's own status)
        v1::DestinationSyncStatus& s = v->second.status[members[i]];
        s.set_phase(v1::SYNC_PHASE_FAILED);
        s.set_error(absl::StrCat("push: ", results[i].status().ToString()));
        s.set_error_code(static_cast<int32_t>(results[i].status().code()));
      }
      continue;
    }
    ++installed;
    if (v == versions_.end()) continue;
    v1::DestinationSyncStatus& s = v->second.status[members[i]];
    RecordInstalledLocked(version, s, i == 0 ? "" : members[i - 1], *results[i], took[i], /*pushed=*/true);
  }
  Log(absl::StrFormat("version %d: pushed along a chain of %d in %.1f ms, %d installed; this service sent %.1f MB "
                      "in %d rounds, %s (%s)",
                      version, members.size(), absl::ToDoubleMilliseconds(absl::Now() - start), installed,
                      stats.bytes_sent / 1e6, stats.rounds,
                      stats.mapped_pairs > 0 ? "stored into the first replica's mapped memory" : "as tagged messages",
                      sent.ok() ? "ok" : sent.ToString()));
  return not_pushed;
}

}  // namespace rlfleet::weights
