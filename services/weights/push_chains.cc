#include "services/weights/push_chains.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "libs/common/huge_string.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"
#include "libs/reshard/digest.h"
#include "libs/reshard/round.h"
#include "services/weights/spawn.h"

namespace rlfleet::weights {

namespace {

// How long a push round's source may still be sending after every member of its chain
// answered (then its connection to the first member is given up).
constexpr absl::Duration kSourceGrace = absl::Seconds(2);

}  // namespace

PushChains::Source::~Source() {
  // (a push copy is never described to a peer: deregistering it waits for nobody)
  if (handle.id != 0) (void)data_plane->DeregisterMemory(handle);
}

PushChains::PushChains(transport::Transport* data_plane, absl::Duration round_timeout)
    : data_plane_(data_plane), round_timeout_(round_timeout), pool_(std::make_shared<common::BufferPool>(1)) {}

PushChains::~PushChains() = default;

void PushChains::PrefaultMemory(uint64_t bytes) { pool_->Give(common::PrefaultedHugeString(bytes)); }

std::vector<std::vector<std::string>> PushChains::ChainsOf(const std::vector<std::pair<std::string, bool>>& ids,
                                                           int fanout) {
  std::vector<std::string> relays, leaves;
  for (const auto& [id, can_relay] : ids) (can_relay ? relays : leaves).push_back(id);
  const size_t n = fanout > 0 ? std::min<size_t>(relays.size(), fanout) : relays.size();
  std::vector<std::vector<std::string>> chains(n);
  for (size_t i = 0; i < relays.size(); ++i) chains[i % n].push_back(relays[i]);
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (i < n) {
      chains[i].push_back(leaves[i]);
    } else {
      chains.push_back({leaves[i]});
    }
  }
  return chains;
}

absl::StatusOr<std::shared_ptr<PushChains::Source>> PushChains::SourceLocked(const Lease& version) {
  const uint64_t number = version.info->number;
  if (cached_ != nullptr && cached_->version == number) return cached_;
  // Pushes are almost always of the latest version: the last one's copy (once no round
  // uses it) is this one's memory, and an older version pushed again is repacked.
  cached_.reset();
  const std::vector<reshard::TensorSpec>& tensors = version.info->tensors;
  if (tensors.empty() || version.image == nullptr || version.image->bytes().empty()) {
    return absl::FailedPreconditionError("the version's tensors are not known (not a safetensors image)");
  }
  ASSIGN_OR_RETURN(auto views, model::ParseSafetensorsViews(version.image->bytes(), "the version"));
  auto push = std::make_shared<Source>();
  push->data_plane = data_plane_;
  push->version = number;
  const reshard::Layout whole =
      reshard::Layout::Tp(1, std::vector<reshard::Split>(tensors.size(), reshard::Split::kReplicated));
  ASSIGN_OR_RETURN(push->plan, reshard::MakePlan(tensors, whole, whole));
  push->packed = common::HostBuffer::Allocate(pool_, push->plan.src_shard_bytes[0]);
  // The destination (one rank, every tensor whole) has the source's layout, so this
  // service's digest share is computed in the same pass as the copy.
  for (size_t t = 0; t < tensors.size(); ++t) {
    auto view = views.find(tensors[t].name);
    const reshard::ShardPart& part = push->plan.src_parts[0][t];
    const uint64_t bytes = part.elements * reshard::DTypeSize(part.dtype);
    if (view == views.end() || view->second.bytes.size() != bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor `", tensors[t].name, "` is not in the image as listed"));
    }
    push->share +=
        reshard::CopyAndDigest(push->packed.data() + part.offset, view->second.bytes.data(), bytes, part.offset);
  }
  ASSIGN_OR_RETURN(push->handle, data_plane_->RegisterMemory(push->packed.data(), push->packed.size(),
                                                             transport::MemoryKind::kHost, 0));
  cached_ = push;
  return push;
}

std::vector<std::string> PushChains::Push(const Lease& lease, const std::vector<Member>& chain, absl::Time deadline,
                                          Observer& observer) {
  const uint64_t version = lease.info->number;
  // Each replica's state and data-plane address; one without, or already at the
  // version, leaves the chain.
  std::vector<std::string> not_pushed;
  std::vector<std::string> members, addresses;
  std::vector<std::shared_ptr<Destination>> destinations;
  for (const Member& m : chain) {
    if (m.destination == nullptr) {  // (unregistered meanwhile: the pull says so)
      not_pushed.push_back(m.replica_id);
      continue;
    }
    absl::StatusOr<v1::GetInfoResponse> info = m.destination->Info(std::min(deadline, absl::Now() + absl::Seconds(5)));
    if (info.ok() && info->installed_version().version() == version) {  // already there: nothing to move
      observer.AlreadyInstalled(m.replica_id);
      continue;
    }
    // (a replica already past the version refuses it: the pull says so without a round;
    // one that can take the trainer's GPU copy takes it through the pull's request)
    if (!info.ok() || info->data_plane().worker_address().empty() || info->layout().world_size() > 1 ||
        info->installed_version().version() > version || TakesDeviceImage(*lease.info, *info)) {
      not_pushed.push_back(m.replica_id);
      continue;
    }
    members.push_back(m.replica_id);
    addresses.push_back(info->data_plane().worker_address());
    destinations.push_back(m.destination);
  }
  if (members.empty()) return not_pushed;

  std::shared_ptr<Source> push;
  std::unique_ptr<reshard::StagingPool> staging;
  uint32_t epoch = 0;  // (each round its own: a failed round's leftovers never match the next)
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Source>> source = SourceLocked(lease);
    if (!source.ok()) {
      Log(absl::StrCat("version ", version, ": not pushed (", source.status().ToString(), "); the replicas pull it"));
      not_pushed.insert(not_pushed.end(), members.begin(), members.end());
      return not_pushed;
    }
    push = *source;
    if (!staging_.empty()) {
      staging = std::move(staging_.back());
      staging_.pop_back();
    }
    epoch = next_epoch_++ % 16;
  }
  if (staging == nullptr) staging = std::make_unique<reshard::StagingPool>(*data_plane_);
  for (const std::string& id : members) observer.Transferring(id, push->plan.BytesNeeded());

  // The round: this service is source rank 0, the chain's replicas destination rank 0
  // one after the other.
  v1::ReshardRound round;
  *round.mutable_source_layout() = reshard::ModelLayoutToProto(push->plan.tensors, push->plan.src);
  *round.mutable_destination_layout() = reshard::ModelLayoutToProto(push->plan.tensors, push->plan.dst);
  round.add_digest_shares(push->share);
  round.set_tag_epoch(epoch);
  round.set_map_peer_memory(true);
  round.set_round_timeout_ms(absl::ToInt64Milliseconds(round_timeout_));
  std::vector<absl::StatusOr<v1::CommitWeightsResponse>> results(members.size(), absl::UnknownError("not run"));
  std::vector<absl::Duration> took(members.size());
  absl::Status sent = absl::OkStatus();
  reshard::ExecutionStats stats;
  const absl::Time start = absl::Now();
  {
    std::vector<std::thread> threads, source_thread;
    absl::Notification source_done;
    absl::StatusOr<transport::PeerId> first = data_plane_->Connect(addresses[0]);
    if (first.ok()) {
      absl::Status spawned = Spawn(&source_thread, "the push's source", [&, peer = *first] {
        reshard::SourceRole role{0, push->handle, {peer}};
        auto ops = reshard::NewHostMemoryOps();
        reshard::ExecutorOptions options;
        options.map_peer_memory = true;
        options.tag_epoch = static_cast<int>(epoch);
        options.deadline = deadline;
        options.timeout = std::min(round_timeout_, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
        options.digests = false;  // (the shares were computed with the copy)
        options.staging_pool = staging.get();
        absl::StatusOr<reshard::ExecutionStats> executed =
            reshard::Execute(*data_plane_, push->plan, &role, nullptr, *ops, options);
        sent = executed.status();
        if (executed.ok()) stats = *executed;
        source_done.Notify();
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
      *request.mutable_manifest() = lease.info->manifest;
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
        results[i] = destinations[i]->Install(request, deadline);
        took[i] = absl::Now() - begin;
      });
      if (!spawned.ok()) results[i] = spawned;  // (it pulls instead, or fails with this)
    }
    for (auto& t : threads) t.join();
    // Every member has answered (installed, digest checked, or failed): the round is
    // over, and nothing more is needed from the source's sends. A source still sending
    // is waiting on a connection a partition left behind (tcp backs its retransmissions
    // off to two minutes while a link is down) or on a member that gave up: that
    // connection is given up, its sends fail, and the next round connects afresh.
    if (!source_thread.empty() && !source_done.WaitForNotificationWithTimeout(kSourceGrace)) {
      const int answered_ok =
          static_cast<int>(std::count_if(results.begin(), results.end(), [](const auto& r) { return r.ok(); }));
      Log(
          absl::StrFormat("version %d: %d of %d replicas of the chain installed it, but the source's sends to %s had "
                          "not completed %.0f s after the last answered: that connection is given up",
                          version, answered_ok, members.size(), members[0], absl::ToDoubleSeconds(kSourceGrace)));
      data_plane_->Disconnect(*first, absl::UnavailableError(absl::StrCat("the push round to ", members[0],
                                                                          " was over; its sends stalled")));
    }
    for (auto& t : source_thread) t.join();
  }
  {
    absl::MutexLock lock(&mu_);
    staging_.push_back(std::move(staging));
  }
  int installed = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!results[i].ok()) {
      if (results[i].status().code() == absl::StatusCode::kUnknown && !sent.ok()) results[i] = sent;  // (never asked)
      Log(absl::StrFormat("version %d -> %s: the push failed after %.1f ms (%s); it pulls instead", version, members[i],
                          absl::ToDoubleMilliseconds(took[i]), results[i].status().ToString()));
      not_pushed.push_back(members[i]);
      observer.Failed(members[i], results[i].status());  // (until the pull's own status)
      continue;
    }
    ++installed;
    observer.Installed(members[i], i == 0 ? "" : members[i - 1], *results[i], took[i]);
  }
  Log(absl::StrFormat(
      "version %d: pushed along a chain of %d in %.1f ms, %d installed; this service sent %.1f MB "
      "in %d rounds, %s (%s)",
      version, members.size(), absl::ToDoubleMilliseconds(absl::Now() - start), installed, stats.bytes_sent / 1e6,
      stats.rounds, stats.mapped_pairs > 0 ? "stored into the first replica's mapped memory" : "as tagged messages",
      sent.ok() ? "ok" : sent.ToString()));
  return not_pushed;
}

}  // namespace rlfleet::weights
