#include "services/weights/version_store.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/common/checksum.h"
#include "libs/common/huge_string.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"
#include "libs/reshard/round.h"
#include "libs/transport/descriptor_fetcher.h"
#include "services/weights/weights_requests.h"

namespace rlfleet::weights {

bool TakesDeviceImage(const VersionInfo& version, const v1::GetInfoResponse& info) {
  return !version.device_image.host_id().empty() && info.host_id() == version.device_image.host_id() &&
         absl::StartsWith(info.device(), "cuda");
}

namespace {

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

// The tensors of a safetensors image, in name order (what replicas install); empty if a
// dtype is not one the planner moves.
std::vector<reshard::TensorSpec> TensorsOf(const std::string& bytes) {
  std::vector<reshard::TensorSpec> out;
  auto header = model::ParseSafetensorsHeader(bytes, "the version");
  if (!header.ok()) return out;
  for (const auto& [name, blob] : *header) {
    std::optional<reshard::DType> dtype = reshard::DTypeOfSafetensors(blob.dtype);
    if (!dtype) return {};
    reshard::TensorSpec spec{name, blob.shape, *dtype};
    if (spec.shape.empty()) spec.shape = {1};
    out.push_back(std::move(spec));
  }
  return out;
}

// What a sync of a version whose bytes were given up is told.
absl::Status NoLongerHeld(uint64_t version, int keep_versions) {
  return absl::FailedPreconditionError(absl::StrCat("version ", version, " is no longer held here (only the newest ",
                                                    keep_versions, " are, --keep_versions): sync a newer one"));
}

// The record of a version published by `request` from `where`: its tensors and layout
// from the manifest's layout, else from the image's header (`bytes`; null while the
// image is not pulled: none known yet).
absl::StatusOr<std::shared_ptr<VersionInfo>> NewInfo(const v1::PublishVersionRequest& request,
                                                     const v1::TransferDescriptor& where, const std::string* bytes) {
  auto info = std::make_shared<VersionInfo>();
  info->number = request.manifest().version().version();
  info->manifest = request.manifest();
  info->location = where;
  info->device_image = request.device_image();
  info->trainer_pause_us = request.trainer_pause_us();
  const v1::ShardLayout& published_layout = request.manifest().layout();
  if (published_layout.tensors_size() > 0) {
    // (checked by CheckPublishVersion: at most 1024 ranks, 4096 tensors, shapes bounded)
    ASSIGN_OR_RETURN(reshard::ModelLayout model,
                     reshard::ModelLayoutFromProto(published_layout, "manifest.layout", kMaxSourceRanks));
    info->tensors = std::move(model.tensors);
    info->layout = std::move(model.layout);
  } else {
    if (bytes != nullptr) info->tensors = TensorsOf(*bytes);  // (the trainer's one rank holds all of it)
    info->layout =
        reshard::Layout::Tp(1, std::vector<reshard::Split>(info->tensors.size(), reshard::Split::kReplicated));
  }
  return info;
}

// A version sharded over the trainer's ranks: the manifest's layout (world_size ranks,
// each tensor's split) and, per source rank, one descriptor per tensor. Every shard
// used is pulled and its digest checked (a replicated tensor is taken from rank 0), the
// tensors are assembled whole (libs/reshard's PartIntervals: where each of a rank's
// elements belongs) and written as the safetensors image replicas install.
// INVALID_ARGUMENT naming the field for a request that does not fit the layout;
// DATA_LOSS naming the rank and tensor whose bytes do not match their digest; the data
// plane's error for a shard that cannot be pulled.
absl::StatusOr<common::HostBuffer> AssembleSharded(const v1::PublishVersionRequest& request,
                                                   transport::Transport* data_plane,
                                                   const transport::DescriptorFetcher::Options& fetch,
                                                   absl::Time deadline,
                                                   const std::shared_ptr<common::BufferPool>& pool) {
  ASSIGN_OR_RETURN(reshard::ModelLayout model,
                   reshard::ModelLayoutFromProto(request.manifest().layout(), "manifest.layout", 1024));
  const int ranks = model.layout.ranks;
  if (request.sources_size() != ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("sources: ", request.sources_size(), " source ranks; the layout has ", ranks));
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
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".location.length_bytes: ", shard.location().length_bytes(), "; rank ", rank,
                         "'s shard of `", specs[t].name, "` is ", held, " bytes (the tensor ", tensor_bytes, ")"));
      }
      if (auto d = listed.find({source.rank(), specs[t].name}); d != listed.end()) {
        if (d->second->algorithm() != shard.location().digest().algorithm() ||
            d->second->value() != shard.location().digest().value()) {
          return absl::InvalidArgumentError(absl::StrCat(field,
                                                         ".location.digest: not manifest.shard_digests' for rank ",
                                                         rank, ", tensor `", specs[t].name, "`"));
        }
      }
      if (splits[t] == reshard::Split::kReplicated && rank != 0) continue;  // taken from rank 0
      if (held == 0) continue;
      absl::StatusOr<std::string> bytes = fetcher.Fetch(shard.location(), deadline);
      if (!bytes.ok()) {
        return common::Annotate(bytes.status(),
                                absl::StrCat(field, " (rank ", rank, ", tensor `", specs[t].name, "`)"));
      }
      for (const reshard::Interval& p : parts) {
        std::memcpy(whole[t].data() + p.global * elem, bytes->data() + p.local * elem, p.count * elem);
      }
    }
  }
  std::map<std::string, model::TensorView> views;
  for (size_t t = 0; t < specs.size(); ++t) {
    views[specs[t].name] = {reshard::SafetensorsName(specs[t].dtype), specs[t].shape, whole[t]};
  }
  return model::SerializeSafetensors(views, pool);  // (into a retired version's memory if it fits)
}

}  // namespace

VersionImage::~VersionImage() {
  // (deregistering waits for the peers that know the key: never under a lock)
  if (registered_) (void)data_plane_->DeregisterMemory(*registered_);
}

absl::Status VersionImage::Stage(uint64_t version, const v1::Digest& digest) {
  auto handle = data_plane_->RegisterMemory(bytes_.data(), bytes_.size(), transport::MemoryKind::kHost, 0);
  auto segment = handle.ok() ? data_plane_->Describe(*handle) : handle.status();
  if (!segment.ok()) {
    if (handle.ok()) (void)data_plane_->DeregisterMemory(*handle);
    return absl::Status(segment.status().code(),
                        absl::StrCat("staging version ", version, ": ", segment.status().message()));
  }
  registered_ = *handle;
  *staging_.mutable_segment() = *segment;
  staging_.set_length_bytes(bytes_.size());
  *staging_.mutable_digest() = digest;
  staging_.set_version(version);
  return absl::OkStatus();
}

VersionStore::VersionStore(transport::Transport* data_plane)
    : data_plane_(data_plane), pool_(std::make_shared<common::BufferPool>(2)) {}

VersionStore::~VersionStore() {
  // (the images deregister as they go, each outside the lock)
  std::map<uint64_t, Record> records;
  {
    absl::MutexLock lock(&mu_);
    records.swap(records_);
  }
}

void VersionStore::SetKeepVersions(int versions) {
  keep_versions_ = std::clamp(versions, 2, 8);
  pool_->SetMaxBuffers(keep_versions_);
}

void VersionStore::PrefaultMemory(uint64_t bytes) {
  // One buffer per version kept: the first versions then fault in nothing either.
  for (int i = 0; i < keep_versions_; ++i) pool_->Give(common::PrefaultedHugeString(bytes));
}

absl::StatusOr<common::HostBuffer> VersionStore::Read(const v1::PublishVersionRequest& request, bool sharded,
                                                      v1::TransferDescriptor* where, absl::Time deadline) const {
  const uint64_t version = request.manifest().version().version();
  const transport::DescriptorFetcher::Options fetch = TrainerFetch(file_root_, max_version_bytes_);
  const bool file = where->segment().backend() == v1::TRANSFER_BACKEND_FILE;
  deadline = std::min(deadline, absl::Now() + fetch.timeout);
  // Either way the digest is checked.
  absl::StatusOr<common::HostBuffer> fetched =
      sharded ? AssembleSharded(request, data_plane_, fetch, deadline, pool_)
              : transport::DescriptorFetcher(file ? nullptr : data_plane_, fetch).Fetch(*where, deadline, pool_);
  if (!fetched.ok()) {
    return common::Annotate(fetched.status(),
                            absl::StrCat("version ", version, sharded ? "" : ": sources[0].shards[0].location"));
  }
  if (sharded) {  // what replicas pull: the whole image, with its digest
    where->set_length_bytes(fetched->size());
    where->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
    where->mutable_digest()->set_value(common::Xxh64(fetched->view()));
    where->set_version(version);
  }
  return fetched;
}

absl::Status VersionStore::Publish(const v1::PublishVersionRequest& request,
                                   const std::vector<std::string>& destinations, v1::PublishVersionResponse* response) {
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
  // Versions beyond the newest keep_versions (this one counted) give their bytes up
  // first, so that this pull reuses their memory (a fresh 400 MB buffer on this VM costs
  // 0.5-1 s to fault in, and the trainer waits for this call); one a sync still holds
  // gives it when the sync ends.
  std::vector<std::shared_ptr<const VersionImage>> given_up;
  {
    absl::MutexLock lock(&mu_);
    // The same version again with the same digest (the trainer handed it on and the
    // controller does too, or a retry), or the same sharded manifest: already published.
    if (auto it = records_.find(version);
        it != records_.end() &&
        (sharded ? it->second.info->manifest.SerializeAsString() == request.manifest().SerializeAsString()
                 : it->second.info->location.digest().algorithm() == where.digest().algorithm() &&
                       it->second.info->location.digest().value() == where.digest().value())) {
      *response->mutable_version() = request.manifest().version();
      response->set_destinations(destinations.size());
      return absl::OkStatus();
    }
    if (!records_.empty() && version <= records_.rbegin()->first) {
      return absl::FailedPreconditionError(
          absl::StrCat("version ", version, " is not newer than the latest, ", records_.rbegin()->first));
    }
    int newer = 1;
    for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
      ++newer;
      // (a deferred host copy only while the trainer still holds it; keep_versions_ >= 2)
      if (newer > kTrainerKeeps) it->second.deferred.reset();
      if (newer > keep_versions_ && it->second.image != nullptr) given_up.push_back(std::move(it->second.image));
    }
  }
  given_up.clear();  // (outside the lock: each deregisters, its memory goes to the pool)

  // Read or pull, and verify, before anyone sees the version (the trainer's file may be
  // anywhere on this host: PublishVersion is the trainer's call, not a producer's); or,
  // for a version with the trainer's GPU copy, nothing yet (PullDeferred).
  // (a device image in the request is whole: CheckPublishVersion checked its fields)
  const bool defer = defer_host_copy_ && !sharded && !file && request.has_device_image();
  const absl::Time start = absl::Now();
  std::optional<common::HostBuffer> bytes;
  if (!defer) {
    ASSIGN_OR_RETURN(common::HostBuffer read, Read(request, sharded, &where));
    bytes.emplace(std::move(read));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<VersionInfo> info,
                   NewInfo(request, where, bytes.has_value() ? &bytes->str() : nullptr));
  std::shared_ptr<VersionImage> image;
  if (data_plane_ != nullptr && bytes.has_value()) {  // served from memory: the replicas pull it over the data plane
    image = std::make_shared<VersionImage>(std::move(*bytes), data_plane_);
    RETURN_IF_ERROR(image->Stage(version, where.digest()));
  }
  info->read_us = absl::ToInt64Microseconds(absl::Now() - start);
  std::vector<Record> retired;
  {
    absl::MutexLock lock(&mu_);
    if (!records_.empty() && version <= records_.rbegin()->first) {
      return absl::FailedPreconditionError(absl::StrCat("version ", version, " was overtaken while it was read"));
    }
    Record& record = records_[version];
    record.info = info;
    record.image = std::move(image);
    if (defer) record.deferred = std::make_shared<const v1::PublishVersionRequest>(request);
    for (const std::string& id : destinations) {
      v1::DestinationSyncStatus& s = record.status[id];
      s.set_replica_id(id);
      s.set_version(version);
      s.set_phase(v1::SYNC_PHASE_PENDING);
      s.set_bytes_needed(where.length_bytes());
    }
    // Keep the latest few versions' records.
    while (records_.size() > static_cast<size_t>(kRecords)) {
      retired.push_back(std::move(records_.begin()->second));
      records_.erase(records_.begin());
    }
  }
  retired.clear();
  const std::string publisher = request.publisher_id().empty() ? "(unnamed)" : request.publisher_id();
  if (defer) {
    Log(
        absl::StrFormat("version %d published by %s (its pause %.1f ms): %.1f MB, in the trainer's GPU copy for "
                        "same-host CUDA replicas; its host copy is pulled here when a destination needs it",
                        version, publisher, request.trainer_pause_us() / 1e3, where.length_bytes() / 1e6));
  } else {
    Log(absl::StrFormat("version %d published by %s (its pause %.1f ms): %.1f MB %s in %.1f ms, digest verified",
                        version, publisher, request.trainer_pause_us() / 1e3, where.length_bytes() / 1e6,
                        file ? "read from the trainer's file" : "pulled from the trainer",
                        absl::ToDoubleMilliseconds(absl::Now() - start)));
  }
  *response->mutable_version() = request.manifest().version();
  response->set_destinations(destinations.size());
  response->set_bytes_read(defer ? 0 : where.length_bytes());
  response->set_read_us(absl::ToInt64Microseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::StatusOr<const VersionStore::Record*> VersionStore::FindLocked(uint64_t version) const {
  if (version == 0 && !records_.empty()) version = records_.rbegin()->first;
  auto it = records_.find(version);
  if (it == records_.end()) return absl::NotFoundError(absl::StrCat("version ", version, " is not published"));
  return &it->second;
}

absl::StatusOr<uint64_t> VersionStore::Resolve(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Record* record, FindLocked(version));
  return record->info->number;
}

std::shared_ptr<const VersionInfo> VersionStore::Latest() const {
  absl::MutexLock lock(&mu_);
  return records_.empty() ? nullptr : records_.rbegin()->second.info;
}

absl::StatusOr<std::shared_ptr<const VersionInfo>> VersionStore::Info(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Record* record, FindLocked(version));
  return record->info;
}

absl::StatusOr<Lease> VersionStore::Acquire(uint64_t version, Bytes bytes, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const Record* record, FindLocked(version));
    if (data_plane_ == nullptr || record->image != nullptr) return Lease{record->info, record->image};
    if (record->deferred == nullptr) {
      return NoLongerHeld(record->info->number, keep_versions_);
    }
    if (bytes == Bytes::kNotNeeded) return Lease{record->info, nullptr};  // (its Source(): the trainer's memory)
    version = record->info->number;
  }
  return PullDeferred(version, deadline);
}

bool VersionStore::HostCopyDeferred(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<const Record*> record = FindLocked(version);
  return record.ok() && (*record)->deferred != nullptr;
}

absl::StatusOr<Lease> VersionStore::PullDeferred(uint64_t version, absl::Time deadline) {
  std::shared_ptr<const v1::PublishVersionRequest> request;
  std::shared_ptr<const VersionInfo> published;
  {
    absl::MutexLock lock(&mu_);
    // One pull per version at a time: a second sync needing it waits for that pull
    // (until its own deadline) and then takes what it brought.
    auto not_pulling = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = records_.find(version);
      return it == records_.end() || !it->second.pulling;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&not_pulling), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, "'s host copy is still being pulled from the trainer"));
    }
    ASSIGN_OR_RETURN(const Record* found, FindLocked(version));
    if (found->image != nullptr) return Lease{found->info, found->image};  // (pulled while this one waited)
    if (found->deferred == nullptr) return NoLongerHeld(version, keep_versions_);
    Record& record = records_[version];
    record.pulling = true;
    request = record.deferred;
    published = record.info;
  }
  const absl::Time start = absl::Now();
  v1::TransferDescriptor where = published->location;
  absl::StatusOr<std::shared_ptr<VersionImage>> image = [&]() -> absl::StatusOr<std::shared_ptr<VersionImage>> {
    absl::StatusOr<common::HostBuffer> bytes = Read(*request, /*sharded=*/false, &where, deadline);
    if (!bytes.ok()) {
      return common::Annotate(bytes.status(),
                              absl::StrCat("version ", version,
                                           "'s host copy (pulled when a destination first needs it; the trainer "
                                           "keeps its latest two versions)"));
    }
    auto staged = std::make_shared<VersionImage>(std::move(*bytes), data_plane_);
    RETURN_IF_ERROR(staged->Stage(version, where.digest()));
    return staged;
  }();
  absl::StatusOr<std::shared_ptr<VersionInfo>> info =
      image.ok() ? NewInfo(*request, where, &(*image)->bytes()) : image.status();
  if (info.ok()) {
    (*info)->trainer_pause_us = published->trainer_pause_us;
    (*info)->read_us = absl::ToInt64Microseconds(absl::Now() - start);
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = records_.find(version);
    if (it != records_.end()) it->second.pulling = false;
    RETURN_IF_ERROR(info.status());
    if (it == records_.end() || it->second.deferred == nullptr) {  // (given up while it was pulled)
      return NoLongerHeld(version, keep_versions_);
    }
    it->second.info = *info;
    it->second.image = *image;
    it->second.deferred.reset();
  }
  Log(
      absl::StrFormat("version %d: its host copy pulled from the trainer for a destination that needs it: %.1f MB in "
                      "%.1f ms, digest verified",
                      version, where.length_bytes() / 1e6, absl::ToDoubleMilliseconds(absl::Now() - start)));
  return Lease{*info, *image};
}

void VersionStore::SetStatus(uint64_t version, const v1::DestinationSyncStatus& status) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(version);
  if (it != records_.end()) it->second.status[status.replica_id()] = status;
}

std::optional<v1::DestinationSyncStatus> VersionStore::StatusOf(uint64_t version, const std::string& replica_id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(version);
  if (it == records_.end()) return std::nullopt;
  auto s = it->second.status.find(replica_id);
  if (s == it->second.status.end()) return std::nullopt;
  return s->second;
}

absl::StatusOr<std::vector<v1::DestinationSyncStatus>> VersionStore::Statuses(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(version);
  if (it == records_.end()) return absl::NotFoundError(absl::StrCat("version ", version, " is not published"));
  std::vector<v1::DestinationSyncStatus> out;
  for (const auto& [id, s] : it->second.status) out.push_back(s);
  return out;
}

}  // namespace rlfleet::weights
