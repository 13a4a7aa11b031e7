#include "services/weights/weights_core.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/common/checksum.h"
#include "libs/common/huge_string.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"
#include "libs/reshard/round.h"
#include "libs/transport/descriptor_fetcher.h"
#include "services/weights/spawn.h"
#include "services/weights/weights_requests.h"

namespace rlfleet::weights {
namespace {

using reshard::DTypeFromProto;
using reshard::SplitFromProto;

// Safetensors' names of the planner's dtypes (both directions).
constexpr std::pair<reshard::DType, const char*> kSafetensorsDTypes[] = {
    {reshard::DType::kF32, "F32"}, {reshard::DType::kBF16, "BF16"}, {reshard::DType::kF16, "F16"},
    {reshard::DType::kI32, "I32"}, {reshard::DType::kI64, "I64"}};

// How a version is read from the trainer: a regular file under `file_root` (the
// trainer's --publish_dir; none: no files) or its memory over the data plane; at most
// `max_bytes`.
transport::DescriptorFetcher::Options TrainerFetch(const std::string& file_root, uint64_t max_bytes) {
  transport::DescriptorFetcher::Options fetch;
  fetch.max_bytes = max_bytes;
  fetch.file_root = file_root;
  fetch.file_root_flag = "--publish_dir";
  fetch.timeout = absl::Minutes(5);
  return fetch;
}

const char* SafetensorsDType(reshard::DType d) {
  for (const auto& [dtype, name] : kSafetensorsDTypes) {
    if (dtype == d) return name;
  }
  return "F32";
}

// The tensors of a safetensors image, in name order (what replicas install); empty if a
// dtype is not one the planner moves.
std::vector<reshard::TensorSpec> TensorsOf(const std::string& bytes) {
  std::vector<reshard::TensorSpec> out;
  auto header = model::ParseSafetensorsHeader(bytes, "the version");
  if (!header.ok()) return out;
  for (const auto& [name, blob] : *header) {
    const std::string& dtype = blob.dtype;  // (C++17 lambdas cannot capture a structured binding)
    const auto* known = std::find_if(std::begin(kSafetensorsDTypes), std::end(kSafetensorsDTypes),
                                     [&](const auto& d) { return dtype == d.second; });
    if (known == std::end(kSafetensorsDTypes)) return {};
    reshard::TensorSpec spec{name, blob.shape, known->first};
    if (spec.shape.empty()) spec.shape = {1};
    out.push_back(std::move(spec));
  }
  return out;
}

// A version sharded over the trainer's ranks: the manifest's layout (world_size ranks,
// each tensor's split) and, per source rank, one descriptor per tensor. Every shard
// used is pulled and its digest checked (a replicated tensor is taken from rank 0), the
// tensors are assembled whole (libs/reshard's PartIntervals: where each of a rank's
// elements belongs) and written as the safetensors image replicas install.
// INVALID_ARGUMENT naming the field for a request that does not fit the layout;
// DATA_LOSS naming the rank and tensor whose bytes do not match their digest; the data
// plane's error for a shard that cannot be pulled.
absl::StatusOr<std::string> AssembleSharded(const v1::PublishVersionRequest& request, transport::Transport* data_plane,
                                            const transport::DescriptorFetcher::Options& fetch, absl::Time deadline,
                                            std::string reuse) {
  ASSIGN_OR_RETURN(reshard::ModelLayout model,
                   reshard::ModelLayoutFromProto(request.manifest().layout(), "manifest.layout", 1024));
  const int ranks = model.layout.ranks;
  if (request.sources_size() != ranks) {
    return absl::InvalidArgumentError(absl::StrCat("sources: ", request.sources_size(), " source ranks; the layout has ",
                                                   ranks));
  }
  const std::vector<reshard::TensorSpec>& specs = model.tensors;
  const std::vector<reshard::Split>& splits = model.layout.splits;
  std::map<std::string, int> index;
  for (size_t t = 0; t < specs.size(); ++t) index[specs[t].name] = static_cast<int>(t);
  // The manifest's digest of each (rank, tensor), when it lists them
  // (CheckPublishVersion checked there is one per pair).
  std::map<std::pair<uint32_t, std::string>, const v1::Digest*> listed;
  for (const v1::ShardDigest& d : request.manifest().shard_digests()) {
    listed[{d.rank(), d.tensor_name()}] = &d.digest();
  }
  // Whole tensors, filled from the shards (their total bounded by the caller's
  // max_bytes, checked before this allocation).
  uint64_t total = 0;
  for (const reshard::TensorSpec& t : specs) total += t.numel() * reshard::DTypeSize(t.dtype);
  if (total > fetch.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.layout: ", total, " bytes of tensors; at most ", fetch.max_bytes, " here"));
  }
  std::vector<std::string> whole(specs.size());
  for (size_t t = 0; t < specs.size(); ++t) whole[t].resize(specs[t].numel() * reshard::DTypeSize(specs[t].dtype));
  std::vector<bool> seen_rank(ranks, false);
  transport::DescriptorFetcher fetcher(data_plane, fetch);
  for (int i = 0; i < request.sources_size(); ++i) {
    const v1::SourceRank& source = request.sources(i);
    // (compared in its own type before it is an index)
    if (source.rank() >= static_cast<uint32_t>(ranks) || seen_rank[source.rank()]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sources[", i, "].rank: ", source.rank(),
                       source.rank() >= static_cast<uint32_t>(ranks) ? " is outside the layout" : " appears twice"));
    }
    const int rank = static_cast<int>(source.rank());
    seen_rank[rank] = true;
    if (source.shards_size() != static_cast<int>(specs.size())) {
      return absl::InvalidArgumentError(absl::StrCat("sources[", i, "].shards: ", source.shards_size(),
                                                     " shards; the layout has ", specs.size(), " tensors"));
    }
    std::vector<bool> seen_tensor(specs.size(), false);
    for (int j = 0; j < source.shards_size(); ++j) {
      const v1::SourceShard& shard = source.shards(j);
      const std::string field = absl::StrCat("sources[", i, "].shards[", j, "]");
      auto it = index.find(shard.tensor_name());
      if (it == index.end() || seen_tensor[it->second]) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".tensor_name: `", shard.tensor_name(), "` ",
                                                       it == index.end() ? "is not in the layout" : "appears twice"));
      }
      const int t = it->second;
      seen_tensor[t] = true;
      const uint32_t elem = reshard::DTypeSize(specs[t].dtype);
      const std::vector<reshard::Interval> parts = reshard::PartIntervals(specs[t], splits[t], ranks, rank);
      uint64_t held = 0;
      for (const reshard::Interval& p : parts) held = std::max(held, (p.local + p.count) * elem);
      // (An FSDP shard may carry the zero padding of the last ranks: never more than
      // the whole tensor.)
      const uint64_t tensor_bytes = specs[t].numel() * elem;
      if (shard.location().length_bytes() < held || shard.location().length_bytes() > tensor_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".location.length_bytes: ", shard.location().length_bytes(),
                                                       "; rank ", rank, "'s shard of `", specs[t].name, "` is ", held,
                                                       " bytes (the tensor ", tensor_bytes, ")"));
      }
      if (auto d = listed.find({source.rank(), specs[t].name}); d != listed.end()) {
        if (d->second->algorithm() != shard.location().digest().algorithm() ||
            d->second->value() != shard.location().digest().value()) {
          return absl::InvalidArgumentError(absl::StrCat(field, ".location.digest: not manifest.shard_digests' for rank ",
                                                         rank, ", tensor `", specs[t].name, "`"));
        }
      }
      if (splits[t] == reshard::Split::kReplicated && rank != 0) continue;  // taken from rank 0
      if (held == 0) continue;
      absl::StatusOr<std::string> bytes = fetcher.Fetch(shard.location(), deadline);
      if (!bytes.ok()) {
        return common::Annotate(bytes.status(), absl::StrCat(field, " (rank ", rank, ", tensor `", specs[t].name, "`)"));
      }
      for (const reshard::Interval& p : parts) {
        std::memcpy(whole[t].data() + p.global * elem, bytes->data() + p.local * elem, p.count * elem);
      }
    }
  }
  std::map<std::string, model::TensorView> views;
  for (size_t t = 0; t < specs.size(); ++t) {
    views[specs[t].name] = {SafetensorsDType(specs[t].dtype), specs[t].shape, whole[t]};
  }
  return model::SerializeSafetensors(views, std::move(reuse));  // (into a retired version's memory if it fits)
}

}  // namespace

WeightsCore::WeightsCore(DestinationFactory factory, transport::Transport* data_plane, int relay_fanout)
    : factory_(std::move(factory)), data_plane_(data_plane), relay_fanout_(relay_fanout) {}

WeightsCore::~WeightsCore() {
  absl::MutexLock lock(&mu_);
  while (!versions_.empty()) RetireLocked(versions_.begin());
}

void WeightsCore::PrefaultVersionMemory(uint64_t bytes) {
  // One buffer per version kept (the first versions then fault in nothing either), and
  // the push copy's.
  std::vector<std::string> memory;
  for (int i = 0; i < keep_versions_; ++i) memory.push_back(common::PrefaultedHugeString(bytes));
  std::string packed = push_ ? common::PrefaultedHugeString(bytes) : std::string();
  absl::MutexLock lock(&mu_);
  spares_ = std::move(memory);
  packed_spare_ = std::move(packed);
}

WeightsCore::Released WeightsCore::ReleaseBytesLocked(Version& v) {
  Released out;
  out.registered = v.registered;
  out.bytes = std::move(v.bytes);
  v.registered.reset();
  v.bytes = std::string();
  ReclaimPushCopyLocked(v);
  v.push.reset();  // (one a round still uses goes when the round ends)
  v.released = true;
  return out;
}

void WeightsCore::ReclaimPushCopyLocked(Version& v) {
  if (v.push == nullptr || v.push.use_count() > 1) return;
  // (a push copy is never described to a peer: deregistering it waits for nobody)
  (void)data_plane_->DeregisterMemory(v.push->handle);
  v.push->handle = {};
  if (v.push->packed.capacity() > packed_spare_.capacity()) packed_spare_ = std::move(v.push->packed);
  v.push.reset();
}

void WeightsCore::KeepSparesLocked(std::vector<std::string> memory) {
  for (std::string& m : memory) {
    if (m.capacity() > 0) spares_.push_back(std::move(m));
  }
  // (the largest kept, at most one per version kept)
  std::sort(spares_.begin(), spares_.end(),
            [](const std::string& a, const std::string& b) { return a.capacity() > b.capacity(); });
  if (spares_.size() > static_cast<size_t>(keep_versions_)) spares_.resize(keep_versions_);
}

void WeightsCore::RetireLocked(std::map<uint64_t, Version>::iterator it) {
  // (versions this old have given their bytes up already, unless a sync held them)
  Released r = ReleaseBytesLocked(it->second);
  if (r.registered) (void)data_plane_->DeregisterMemory(*r.registered);
  std::vector<std::string> memory;
  memory.push_back(std::move(r.bytes));
  KeepSparesLocked(std::move(memory));
  versions_.erase(it);
}

absl::Status WeightsCore::RegisterDestination(const v1::RegisterDestinationRequest& request,
                                              v1::RegisterDestinationResponse* response) {
  RETURN_IF_ERROR(CheckRegisterDestination(request));
  std::shared_ptr<Destination> d = factory_(request.grpc_address());
  absl::MutexLock lock(&mu_);
  destinations_[request.replica_id()] = {request.grpc_address(), std::move(d), request.layout(), request.can_relay()};
  if (!versions_.empty()) {
    const Version& latest = versions_.rbegin()->second;
    *response->mutable_latest_version() = latest.manifest.version();
    response->set_bytes_needed(latest.location.length_bytes());
  }
  return absl::OkStatus();
}

absl::Status WeightsCore::UnregisterDestination(const v1::UnregisterDestinationRequest& request,
                                                v1::UnregisterDestinationResponse* response) {
  if (request.replica_id().empty()) return absl::InvalidArgumentError("replica_id: empty");
  absl::MutexLock lock(&mu_);
  response->set_was_registered(destinations_.erase(request.replica_id()) > 0);
  for (auto& [number, v] : versions_) {
    for (Holder& h : v.holders) h.failed |= h.replica_id == request.replica_id();
  }
  return absl::OkStatus();
}

absl::Status WeightsCore::PublishVersion(const v1::PublishVersionRequest& request,
                                         v1::PublishVersionResponse* response) {
  const uint64_t version = request.manifest().version().version();
  // Sharded: one descriptor per (trainer rank, tensor) of the manifest's layout. Else one
  // source with one shard: the trainer's safetensors image (its file or its memory).
  bool sharded = false;
  for (const v1::SourceRank& s : request.sources()) {
    for (const v1::SourceShard& shard : s.shards()) sharded |= !shard.tensor_name().empty();
  }
  RETURN_IF_ERROR(CheckPublishVersion(request, sharded, max_version_bytes_));
  if (!sharded && (request.sources_size() != 1 || request.sources(0).shards_size() != 1)) {
    return absl::InvalidArgumentError(
        "sources: one source rank with one shard (the trainer's safetensors image), or one shard per tensor of "
        "manifest.layout from each of its ranks (each with its tensor_name)");
  }
  if (sharded && data_plane_ == nullptr) {
    return absl::InvalidArgumentError(
        "sources: a sharded version is assembled and served from memory; this weights service has no data plane "
        "(start it with --data_plane=ucx)");
  }
  // `where`: the trainer's image; for a sharded version, the image assembled here.
  v1::TransferDescriptor where;
  if (!sharded) where = request.sources(0).shards(0).location();
  const bool file = where.segment().backend() == v1::TRANSFER_BACKEND_FILE;
  if (file && where.segment().worker_address().empty()) {
    return absl::InvalidArgumentError("sources[0].shards[0].location.segment.worker_address: empty (the file)");
  }
  if (!sharded && !file && data_plane_ == nullptr) {
    return absl::InvalidArgumentError(
        "sources[0].shards[0].location: the version is in the trainer's memory and this weights service has no "
        "data plane to pull it over (start it with --data_plane=ucx, or the trainer with --publish_dir)");
  }
  {
    absl::MutexLock lock(&mu_);
    // The same version again with the same digest (the trainer handed it on and the
    // controller does too, or a retry), or the same sharded manifest: already published.
    if (auto it = versions_.find(version);
        it != versions_.end() &&
        (sharded ? it->second.manifest.SerializeAsString() == request.manifest().SerializeAsString()
                 : it->second.location.digest().algorithm() == where.digest().algorithm() &&
                       it->second.location.digest().value() == where.digest().value())) {
      *response->mutable_version() = request.manifest().version();
      response->set_destinations(destinations_.size());
      return absl::OkStatus();
    }
    if (!versions_.empty() && version <= versions_.rbegin()->first) {
      return absl::FailedPreconditionError(
          absl::StrCat("version ", version, " is not newer than the latest, ", versions_.rbegin()->first));
    }
  }
  // Read or pull, and verify, before anyone sees the version (the trainer's file may be
  // anywhere on this host: PublishVersion is the trainer's call, not a producer's).
  const absl::Time start = absl::Now();
  // Either way the digest is checked.
  const transport::DescriptorFetcher::Options fetch = TrainerFetch(file_root_, max_version_bytes_);
  std::string reuse;  // a retired version's memory, if there is one
  {
    // Versions beyond the newest keep_versions (this one counted) that no sync is
    // moving give their memory up first, so that this pull reuses it: a fresh 400 MB
    // buffer on this VM costs 0.5-1 s to fault in, and the trainer waits for this call.
    // (Deregistering waits for the peers that know the key: not under the lock.)
    std::vector<Released> released;
    {
      absl::MutexLock lock(&mu_);
      int newer = 1;
      for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
        if (++newer > keep_versions_ && !it->second.released && it->second.in_flight == 0 &&
            it->second.pushing == 0 && data_plane_ != nullptr) {
          released.push_back(ReleaseBytesLocked(it->second));
        }
      }
    }
    std::vector<std::string> memory;
    for (Released& r : released) {
      if (r.registered) (void)data_plane_->DeregisterMemory(*r.registered);
      memory.push_back(std::move(r.bytes));
    }
    absl::MutexLock lock(&mu_);
    KeepSparesLocked(std::move(memory));
    if (!spares_.empty()) {
      reuse = std::move(spares_.front());  // (the largest)
      spares_.erase(spares_.begin());
    }
  }
  absl::StatusOr<std::string> fetched =
      sharded ? AssembleSharded(request, data_plane_, fetch, absl::Now() + fetch.timeout, std::move(reuse))
              : transport::DescriptorFetcher(file ? nullptr : data_plane_, fetch)
                    .Fetch(where, absl::Now() + fetch.timeout, std::move(reuse));
  if (!fetched.ok()) {
    return common::Annotate(fetched.status(),
                            absl::StrCat("version ", version, sharded ? "" : ": sources[0].shards[0].location"));
  }
  std::string bytes = std::move(*fetched);
  if (sharded) {  // what replicas pull: the whole image, with its digest
    where.set_length_bytes(bytes.size());
    where.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
    where.mutable_digest()->set_value(common::Xxh64(bytes));
    where.set_version(version);
  }
  absl::MutexLock lock(&mu_);
  if (!versions_.empty() && version <= versions_.rbegin()->first) {
    return absl::FailedPreconditionError(absl::StrCat("version ", version, " was overtaken while it was read"));
  }
  Version& v = versions_[version];
  v.manifest = request.manifest();
  v.location = where;
  const v1::ShardLayout& published_layout = request.manifest().layout();
  if (published_layout.tensors_size() > 0) {
    v.layout.ranks = static_cast<int>(std::max<uint32_t>(1, published_layout.world_size()));
    // (checked by CheckPublishVersion: at most 1024 ranks, 4096 tensors, shapes bounded)
    absl::StatusOr<reshard::ModelLayout> model =
        reshard::ModelLayoutFromProto(published_layout, "manifest.layout", kMaxSourceRanks);
    if (!model.ok()) {
      versions_.erase(version);
      return model.status();
    }
    v.tensors = std::move(model->tensors);
    v.layout = std::move(model->layout);
  } else {
    v.tensors = TensorsOf(bytes);  // (the trainer's one rank holds all of it)
    v.layout = reshard::Layout::Tp(1, std::vector<reshard::Split>(v.tensors.size(), reshard::Split::kReplicated));
  }
  if (data_plane_ != nullptr) {
    // Served from memory: the replicas pull it over the data plane.
    v.bytes = std::move(bytes);
    auto handle = data_plane_->RegisterMemory(v.bytes.data(), v.bytes.size(), transport::MemoryKind::kHost, 0);
    auto segment = handle.ok() ? data_plane_->Describe(*handle) : handle.status();
    if (!segment.ok()) {
      if (handle.ok()) (void)data_plane_->DeregisterMemory(*handle);
      versions_.erase(version);
      return absl::Status(segment.status().code(),
                          absl::StrCat("staging version ", version, ": ", segment.status().message()));
    }
    v.registered = *handle;
    *v.staging.mutable_segment() = *segment;
    v.staging.set_length_bytes(v.bytes.size());
    *v.staging.mutable_digest() = where.digest();
    v.staging.set_version(version);
  }
  for (const auto& [id, d] : destinations_) {
    v1::DestinationSyncStatus& s = v.status[id];
    s.set_replica_id(id);
    s.set_version(version);
    s.set_phase(v1::SYNC_PHASE_PENDING);
    s.set_bytes_needed(where.length_bytes());
  }
  v.trainer_pause_us = request.trainer_pause_us();
  v.read_us = absl::ToInt64Microseconds(absl::Now() - start);
  Log(absl::StrFormat("version %d published by %s: %.1f MB %s in %.1f ms, digest verified", version,
                      request.publisher_id().empty() ? "(unnamed)" : request.publisher_id(),
                      where.length_bytes() / 1e6, file ? "read from the trainer's file" : "pulled from the trainer",
                      absl::ToDoubleMilliseconds(absl::Now() - start)));
  // Keep the latest few versions' records.
  const uint64_t read = where.length_bytes();
  while (versions_.size() > 8) RetireLocked(versions_.begin());
  *response->mutable_version() = request.manifest().version();
  response->set_destinations(destinations_.size());
  response->set_bytes_read(read);
  response->set_read_us(absl::ToInt64Microseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status WeightsCore::ReleasedError(uint64_t version) const {
  return absl::FailedPreconditionError(absl::StrCat("version ", version, " is no longer held here (only the newest ",
                                                    keep_versions_, " are, --keep_versions): sync a newer one"));
}

absl::StatusOr<uint64_t> WeightsCore::ResolveSync(uint64_t version, const std::vector<std::string>& ids) {
  absl::MutexLock lock(&mu_);
  version = Resolve(version);
  if (!versions_.count(version)) return absl::NotFoundError(absl::StrCat("version ", version, " is not published"));
  for (const std::string& id : ids) {
    if (!destinations_.count(id)) return absl::NotFoundError(absl::StrCat("destination ", id, " is not registered"));
  }
  return version;
}

uint64_t WeightsCore::Resolve(uint64_t version) {
  if (version == 0 && !versions_.empty()) return versions_.rbegin()->first;
  return version;
}

int WeightsCore::PickSourceLocked(uint64_t version, absl::Time deadline) {
  auto pick = [&](bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<int> {
    auto v = versions_.find(version);
    if (v == versions_.end()) return -1;  // (retired: the caller finds out)
    if (v->second.root_children < relay_fanout_) return -1;
    for (size_t i = 0; i < v->second.holders.size(); ++i) {
      const Holder& h = v->second.holders[i];
      if (!h.failed && h.children < relay_fanout_) return static_cast<int>(i);
    }
    // Nobody has room: wait for a sync under way to finish (it may add a holder), or
    // fall back to this service when none is.
    if (wait && v->second.in_flight > 0) return std::nullopt;
    return -1;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pick(true).has_value(); };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  const int chosen = pick(false).value_or(-1);
  auto v = versions_.find(version);
  if (v != versions_.end()) {
    if (chosen < 0) {
      ++v->second.root_children;
    } else {
      ++v->second.holders[chosen].children;
    }
  }
  return chosen;
}

absl::StatusOr<v1::DestinationSyncStatus> WeightsCore::Sync(const std::string& replica_id, uint64_t version,
                                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int attempt = 0;; ++attempt) {
    v1::PrepareWeightsRequest request;
    std::shared_ptr<Destination> destination;
    std::string from;  // the relaying replica, or empty for this service
    int holder = -1;
    {
      absl::MutexLock lock(&mu_);
      version = Resolve(version);
      auto v = versions_.find(version);
      if (v == versions_.end()) return absl::NotFoundError(absl::StrCat("version ", version, " is not published"));
      if (v->second.released) return ReleasedError(version);
      auto d = destinations_.find(replica_id);
      if (d == destinations_.end())
        return absl::NotFoundError(absl::StrCat("destination ", replica_id, " is not registered"));
      destination = d->second.destination;
      const bool relaying = relay_fanout_ > 0 && v->second.registered.has_value();
      if (relaying && attempt == 0) {  // (a retry after a failed relay comes from here)
        holder = PickSourceLocked(version, deadline);  // (may wait: look the version up again)
        v = versions_.find(version);
        if (v == versions_.end()) {
          return absl::AbortedError(absl::StrCat("version ", version, " was retired meanwhile"));
        }
      }
      *request.mutable_manifest() = v->second.manifest;
      if (holder >= 0) {
        from = v->second.holders[holder].replica_id;
        *request.add_chunks()->mutable_source() = v->second.holders[holder].source;
      } else {
        *request.add_chunks()->mutable_source() = v->second.registered ? v->second.staging : v->second.location;
      }
      request.set_serve_relay(relaying);
      request.set_transfer_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
      ++v->second.in_flight;
      v1::DestinationSyncStatus& s = v->second.status[replica_id];
      s.set_replica_id(replica_id);
      s.set_version(version);
      s.set_bytes_needed(v->second.location.length_bytes());
      s.set_phase(v1::SYNC_PHASE_TRANSFERRING);
      s.set_relayed_from(from);
      s.clear_error();
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::CommitWeightsResponse> installed = destination->Install(request, deadline);
    const absl::Duration took = absl::Now() - start;
    absl::MutexLock lock(&mu_);
    auto v = versions_.find(version);
    if (v == versions_.end()) return absl::AbortedError(absl::StrCat("version ", version, " was retired meanwhile"));
    --v->second.in_flight;
    v1::DestinationSyncStatus& s = v->second.status[replica_id];
    if (!installed.ok()) {
      if (holder >= 0 && absl::Now() < deadline) {
        // The relay may be what failed (its replica died or moved to a newer version):
        // that holder serves no one else, and this replica gets it from here.
        v->second.holders[holder].failed = true;
        Log(absl::StrCat("version ", version, " -> ", replica_id, ": the relay from ", from, " failed (",
                         installed.status().ToString(), "); sending it from here"));
        continue;
      }
      s.set_phase(v1::SYNC_PHASE_FAILED);
      s.set_error(installed.status().ToString());
      s.set_error_code(static_cast<int32_t>(installed.status().code()));
      Log(absl::StrFormat("version %d -> %s: FAILED after %.1f ms: %s", version, replica_id,
                          absl::ToDoubleMilliseconds(took), installed.status().ToString()));
      return installed.status();
    }
    auto registered = destinations_.find(replica_id);
    const bool can_relay = registered != destinations_.end() && registered->second.can_relay;
    if (can_relay && installed->has_relay_source() && installed->relay_source().has_segment()) {
      v->second.holders.push_back({replica_id, installed->relay_source()});
    }
    RecordInstalledLocked(version, s, from, *installed, took, /*pushed=*/false);
    return s;
  }
}

void WeightsCore::RecordInstalledLocked(uint64_t version, v1::DestinationSyncStatus& s, const std::string& from,
                                        const v1::CommitWeightsResponse& installed, absl::Duration took,
                                        bool pushed) {
  s.set_phase(v1::SYNC_PHASE_INSTALLED);
  s.set_bytes_moved(s.bytes_needed());
  s.set_relayed_from(from);
  s.set_pushed(pushed);
  // (a replica reading the trainer's file reports no pull: its install is the transfer)
  s.set_transfer_us(installed.pull_us() > 0 ? installed.pull_us() : installed.install_us());
  s.set_pull_allocate_us(installed.pull_allocate_us());
  s.set_pull_verify_us(installed.pull_verify_us());
  s.set_pause_us(installed.pause_us());
  s.set_install_us(installed.install_us());
  s.set_round_trip_us(absl::ToInt64Microseconds(took));
  if (s.transfer_us() > 0) s.set_throughput_gb_per_s(s.bytes_moved() / (s.transfer_us() * 1e3));
  Log(absl::StrFormat("version %d -> %s (%s %s): installed, %.1f MB, %s %.1f ms (%.2f GB/s; memory %.1f ms, "
                      "digest %.1f ms), install %.1f ms, decode pause %.2f ms, round trip %.1f ms",
                      version, s.replica_id(), pushed ? "pushed from" : "pulled from", from.empty() ? "here" : from,
                      s.bytes_moved() / 1e6, pushed ? "receive" : "pull", s.transfer_us() / 1e3,
                      s.throughput_gb_per_s(), s.pull_allocate_us() / 1e3, s.pull_verify_us() / 1e3,
                      s.install_us() / 1e3, s.pause_us() / 1e3, s.round_trip_us() / 1e3));
}

absl::Status WeightsCore::SyncVersion(const v1::SyncVersionRequest& request, v1::SyncVersionResponse* response) {
  RETURN_IF_ERROR(CheckSyncVersion(request));
  const absl::Duration timeout =
      request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms()) : absl::Seconds(120);
  if (request.replica_id().empty()) {  // every destination (or those named), in one round
    ASSIGN_OR_RETURN(std::vector<v1::DestinationSyncStatus> all,
                     SyncSome(request.version(), {request.replica_ids().begin(), request.replica_ids().end()},
                              timeout));
    for (v1::DestinationSyncStatus& s : all) *response->add_destinations() = std::move(s);
    return absl::OkStatus();
  }
  if (push_) {
    const absl::Time deadline = absl::Now() + timeout;
    ASSIGN_OR_RETURN(const uint64_t version, ResolveSync(request.version(), {request.replica_id()}));
    if (PushChain(version, {request.replica_id()}, deadline).empty()) {
      absl::MutexLock lock(&mu_);
      auto v = versions_.find(version);
      if (v == versions_.end()) return absl::AbortedError(absl::StrCat("version ", version, " was retired meanwhile"));
      *response->mutable_status() = v->second.status[request.replica_id()];
      return absl::OkStatus();
    }
    absl::StatusOr<v1::DestinationSyncStatus> s =
        Sync(request.replica_id(), version, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (!s.ok()) return s.status();
    *response->mutable_status() = *s;
    return absl::OkStatus();
  }
  absl::StatusOr<v1::DestinationSyncStatus> s = Sync(request.replica_id(), request.version(), timeout);
  if (!s.ok()) return s.status();
  *response->mutable_status() = *s;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::DestinationSyncStatus>> WeightsCore::SyncAll(uint64_t version, absl::Duration timeout) {
  return SyncSome(version, {}, timeout);
}

std::vector<std::vector<std::string>> WeightsCore::ChainsOf(const std::vector<std::string>& ids) {
  // Only a destination registered with can_relay forwards bytes: relays are spread over
  // --relay_fanout chains; one that may not relay ends a chain, or is a chain of its own.
  std::vector<std::string> relays, leaves;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : ids) {
      auto d = destinations_.find(id);
      (d != destinations_.end() && d->second.can_relay ? relays : leaves).push_back(id);
    }
  }
  const size_t n = relay_fanout_ > 0 ? std::min<size_t>(relays.size(), relay_fanout_) : relays.size();
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
  std::vector<std::string> pull = ids;
  if (push_ && !ids.empty()) {
    // Chains of replicas (--relay_fanout of them; 0: each replica its own), each pushed
    // in one round; the replicas a push missed pull the version instead.
    std::vector<std::vector<std::string>> members = ChainsOf(ids);
    const size_t chains = members.size();
    std::vector<std::vector<std::string>> missed(chains);
    std::vector<std::thread> rounds;
    absl::Status spawned = absl::OkStatus();
    for (size_t c = 0; c < chains && spawned.ok(); ++c) {
      spawned = Spawn(&rounds, "a push round", [&, c] { missed[c] = PushChain(version, members[c], deadline); });
    }
    for (auto& t : rounds) t.join();
    RETURN_IF_ERROR(spawned);
    pull.clear();
    for (const auto& m : missed) pull.insert(pull.end(), m.begin(), m.end());
  }
  std::vector<std::thread> threads;
  absl::Status spawned = absl::OkStatus();
  for (size_t i = 0; i < pull.size() && spawned.ok(); ++i) {
    spawned = Spawn(&threads, "a replica's sync", [this, id = pull[i], version, deadline] {
      (void)Sync(id, version, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    });
  }
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(spawned);
  std::vector<v1::DestinationSyncStatus> out;
  absl::MutexLock lock(&mu_);
  auto v = versions_.find(version);
  if (v == versions_.end()) return absl::AbortedError(absl::StrCat("version ", version, " was retired meanwhile"));
  for (const std::string& id : ids) out.push_back(v->second.status[id]);
  return out;
}

absl::Status WeightsCore::GetPlan(const v1::GetPlanRequest& request, v1::GetPlanResponse* response) {
  if (request.max_ranges() > 100000) {
    return absl::InvalidArgumentError(absl::StrCat("max_ranges ", request.max_ranges(), " is over 100000"));
  }
  const uint64_t max_ranges = request.max_ranges() == 0 ? 10000 : request.max_ranges();
  absl::MutexLock lock(&mu_);
  const uint64_t version = Resolve(request.version());
  auto v = versions_.find(version);
  if (v == versions_.end()) return absl::NotFoundError(absl::StrCat("version ", version, " is not published"));
  auto d = destinations_.find(request.replica_id());
  if (d == destinations_.end()) {
    return absl::NotFoundError(absl::StrCat("destination ", request.replica_id(), " is not registered"));
  }
  const Version& ver = v->second;
  if (ver.tensors.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " has no tensor list (no layout in its manifest, and not a safetensors image)"));
  }
  // The destination's layout, by tensor name; none registered: one rank holds everything.
  reshard::Layout dst;
  const v1::ShardLayout& wanted = d->second.layout;
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
        return absl::FailedPreconditionError(absl::StrCat("destination ", request.replica_id(),
                                                          "'s layout has no tensor `", t.name, "`"));
      }
      // (a spec given with the layout must be the version's)
      const v1::TensorSpec& given = kind->second->spec();
      if ((given.dtype() != v1::DTYPE_UNSPECIFIED && given.dtype() != reshard::DTypeToProto(t.dtype)) ||
          (given.shape_size() > 0 && std::vector<int64_t>(given.shape().begin(), given.shape().end()) != t.shape)) {
        return absl::FailedPreconditionError(absl::StrCat("destination ", request.replica_id(), "'s layout gives `",
                                                          t.name, "` another dtype or shape than version ",
                                                          version, "'s"));
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
  if (auto s = ver.status.find(request.replica_id()); s != ver.status.end()) {
    response->set_relay_parent(s->second.relayed_from());
  }
  return absl::OkStatus();
}

absl::Status WeightsCore::GetSyncStatus(const v1::GetSyncStatusRequest& request, v1::GetSyncStatusResponse* response) {
  absl::MutexLock lock(&mu_);
  const uint64_t version = Resolve(request.version());
  auto v = versions_.find(version);
  if (v == versions_.end()) return absl::NotFoundError(absl::StrCat("version ", version, " is not published"));
  response->set_version(version);
  response->set_trainer_pause_us(v->second.trainer_pause_us);
  response->set_publish_read_us(v->second.read_us);
  if (!request.replica_id().empty()) {
    auto s = v->second.status.find(request.replica_id());
    if (s == v->second.status.end()) {
      return absl::NotFoundError(
          absl::StrCat("destination ", request.replica_id(), " has no status for version ", version));
    }
    *response->add_destinations() = s->second;
    return absl::OkStatus();
  }
  for (const auto& [id, s] : v->second.status) *response->add_destinations() = s;
  return absl::OkStatus();
}

}  // namespace rlfleet::weights
