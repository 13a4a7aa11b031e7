#include "services/rollout/weight_intake.h"

#include <atomic>
#include <exception>
#include <iostream>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/host_buffer.h"
#include "libs/common/huge_string.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::rollout {

RelayCopy::~RelayCopy() {
  absl::MutexLock lock(&mu_);
  ReleaseLocked();
}

absl::StatusOr<v1::TransferDescriptor> RelayCopy::Serve(common::HostBuffer bytes,
                                                        const v1::TransferDescriptor& pulled) {
  absl::MutexLock lock(&mu_);
  ReleaseLocked();  // (the image served before goes back to its pool)
  bytes_ = std::move(bytes);
  absl::StatusOr<transport::MemoryHandle> handle =
      data_plane_->RegisterMemory(bytes_.data(), bytes_.size(), transport::MemoryKind::kHost, 0);
  if (!handle.ok()) return handle.status();
  handle_ = *handle;
  absl::StatusOr<v1::RemoteMemoryDescriptor> segment = data_plane_->Describe(*handle_);
  if (!segment.ok()) return segment.status();
  v1::TransferDescriptor out = pulled;
  *out.mutable_segment() = *segment;
  out.set_offset_bytes(0);
  out.set_length_bytes(bytes_.size());
  return out;
}

void RelayCopy::ReleaseLocked() {
  if (handle_) (void)data_plane_->DeregisterMemory(*handle_);
  handle_.reset();
  bytes_ = common::HostBuffer();
}

void ReportInstall(const InstallReport& report, v1::CommitWeightsResponse* response) {
  response->mutable_installed_version()->set_version(report.version);
  response->set_decode_step(report.decode_step);
  response->set_inflight_sequences(report.inflight_sequences);
  response->set_pause_us(report.pause_us);
  response->set_install_us(report.install_us);
  response->set_from_device_image(report.from_device);
}

WeightIntake::WeightIntake(RolloutCore* core, transport::DescriptorFetcher* fetcher, transport::Transport* data_plane)
    : core_(core),
      device_([core] {
        v1::GetInfoResponse info;
        return core->GetInfo(&info).ok() ? info.device() : std::string();
      }()),
      fetcher_(fetcher),
      data_plane_(data_plane),
      relay_(data_plane != nullptr ? std::make_unique<RelayCopy>(data_plane) : nullptr),
      receiver_(data_plane != nullptr ? std::make_unique<reshard::ShardReceiver>(*data_plane) : nullptr) {}

void WeightIntake::PrefaultStaging(uint64_t bytes) {
  staging_->Give(common::PrefaultedHugeString(bytes));
  if (receiver_ != nullptr) {
    absl::MutexLock lock(&receive_mu_);
    (void)receiver_->Prefault(bytes);  // (if it fails, the first push allocates)
  }
}

void WeightIntake::DescribeDataPlane(v1::GetInfoResponse* response) const {
  if (data_plane_ != nullptr && data_plane_->GetCapabilities().two_sided) {
    response->mutable_data_plane()->set_backend(v1::TRANSFER_BACKEND_UCX);
    response->mutable_data_plane()->set_worker_address(data_plane_->LocalAddress());
  }
}

absl::StatusOr<uint64_t> WeightIntake::MostImageBytes() const {
  v1::GetInfoResponse info;
  RETURN_IF_ERROR(core_->GetInfo(&info));
  return model::F32ImageBytesBound(info.model().num_parameters());
}

absl::Status WeightIntake::Check(const v1::PrepareWeightsRequest& req) const {
  const v1::WeightManifest& m = req.manifest();
  if (m.version().version() == 0) return absl::InvalidArgumentError("manifest.version.version: 0");
  RETURN_IF_ERROR(
      common::CheckInRange<int64_t>("transfer_timeout_ms", req.transfer_timeout_ms(), 0, int64_t{3600} * 1000));
  if (m.wire_dtype() != v1::DTYPE_UNSPECIFIED) {
    return absl::UnimplementedError(
        "manifest.wire_dtype: this replica installs the image's own dtypes and does not cast (send UNSPECIFIED)");
  }
  if (req.has_device_image()) {
    ASSIGN_OR_RETURN(const uint64_t most, MostImageBytes());
    RETURN_IF_ERROR(transport::CheckCudaIpcImage(req.device_image(), "device_image", m.version().version(), most));
    if (req.chunks_size() == 0 && !req.has_reshard()) return absl::OkStatus();  // (the only source)
  }
  if (req.has_reshard()) {
    if (req.chunks_size() > 0) {
      return absl::InvalidArgumentError("chunks: a pushed version (reshard) comes with no chunks");
    }
    return absl::OkStatus();
  }
  if (req.chunks_size() != 1) {
    return absl::UnimplementedError(
        absl::StrCat("chunks: ", req.chunks_size(), " chunks; this replica takes one chunk holding the whole version"));
  }
  const v1::WeightChunk& chunk = req.chunks(0);
  if (chunk.dst_rank() != 0 || !chunk.tensor_name().empty() || chunk.dst_offset_bytes() != 0) {
    return absl::UnimplementedError(
        "chunks[0]: dst_rank, tensor_name and dst_offset_bytes must be unset (one chunk: the whole image)");
  }
  if (chunk.already_pushed()) {
    return absl::UnimplementedError("chunks[0].already_pushed: pushed chunks come by reshard, not as chunks");
  }
  // At most this model's image, before anything is allocated for it.
  ASSIGN_OR_RETURN(const uint64_t most, MostImageBytes());
  if (chunk.source().length_bytes() > most) {
    return absl::InvalidArgumentError(absl::StrCat("chunks[0].source.length_bytes: ", chunk.source().length_bytes(),
                                                   "; this replica's model is at most ", most, " bytes"));
  }
  if (m.total_bytes() != 0 && m.total_bytes() != chunk.source().length_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.total_bytes: ", m.total_bytes(), "; the chunk holds ", chunk.source().length_bytes()));
  }
  return absl::OkStatus();
}

absl::Status WeightIntake::Update(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                  v1::CommitWeightsResponse* resp) {
  RETURN_IF_ERROR(Check(req));
  // transfer_timeout_ms (0 = 60 s), within the call's own deadline
  deadline =
      std::min(deadline, absl::Now() + (req.transfer_timeout_ms() > 0 ? absl::Milliseconds(req.transfer_timeout_ms())
                                                                      : absl::Seconds(60)));
  if (req.has_device_image()) {
    absl::StatusOr<bool> from_device = UpdateFromDevice(req, deadline, resp);
    if (from_device.ok() && *from_device) return absl::OkStatus();
    const bool only_source = req.chunks_size() == 0 && !req.has_reshard();
    if (!from_device.ok() && (only_source || from_device.status().code() == absl::StatusCode::kFailedPrecondition ||
                              from_device.status().code() == absl::StatusCode::kDeadlineExceeded)) {
      return from_device.status();
    }
    if (only_source) {
      return absl::FailedPreconditionError(
          absl::StrCat("device_image: this replica (", device_, ") is not on a CUDA device of host ",
                       req.device_image().host_id(), " and the request has no other source"));
    }
    if (!from_device.ok()) {  // (the other source serves; said, as it costs a host copy)
      std::cerr << "rlfleet-rollout: version " << req.manifest().version().version()
                << " from the trainer's GPU copy failed, installing from the host copy: " << from_device.status()
                << std::endl;
    }
  }
  if (req.has_reshard()) return UpdateFromRound(req, deadline, resp);
  if (req.chunks(0).source().segment().backend() == v1::TRANSFER_BACKEND_FILE) {
    return UpdateFromFile(req, deadline, resp);
  }
  return UpdateByPull(req, deadline, resp);
}

absl::StatusOr<bool> WeightIntake::UpdateFromDevice(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                                    v1::CommitWeightsResponse* resp) {
  const v1::CudaIpcImage& image = req.device_image();
  if (!absl::StartsWith(device_, "cuda") || image.host_id() != common::HostId()) return false;
  model::DeviceImage::Ref ref;
  ref.version = image.version();
  ref.ipc_handle = image.ipc_handle();
  ref.pci_bus_id = image.pci_bus_id();
  ref.length_bytes = image.length_bytes();
  ref.digest = image.digest().value();
  ref.layout = image.layout();
  const uint64_t version = req.manifest().version().version();
  ASSIGN_OR_RETURN(InstallReport report, core_->InstallFromDevice(ref, version, verify_device_images_, deadline));
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {  // (the first: how this replica takes versions from now on)
    std::cout << "rlfleet-rollout: version " << version << " installed GPU to GPU from the trainer's copy on "
              << image.pci_bus_id() << " (" << report.device.bytes << " bytes: map " << report.device.open_us
              << " us, digest " << report.device.verify_us << " us, copy " << report.device.copy_us << " us)"
              << std::endl;
  }
  ReportInstall(report, resp);
  resp->set_pull_us(report.device.open_us + report.device.verify_us);
  resp->set_pull_verify_us(report.device.verify_us);
  return true;
}

absl::Status WeightIntake::UpdateFromFile(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                          v1::CommitWeightsResponse* resp) {
  // Read by the fetcher on this thread (never the scheduler's): a regular file under
  // --publish_dir, of the descriptor's length, its digest checked.
  if (fetcher_ == nullptr) {
    return absl::InvalidArgumentError(
        "chunks[0].source.segment.backend: FILE descriptors are not accepted here (no --publish_dir)");
  }
  const uint64_t version = req.manifest().version().version();
  absl::StatusOr<common::HostBuffer> bytes = fetcher_->Fetch(req.chunks(0).source(), deadline, staging_);
  if (!bytes.ok()) return common::Annotate(bytes.status(), "chunks[0].source");
  ASSIGN_OR_RETURN(
      InstallReport report,
      core_->InstallFromBytes(std::move(*bytes), absl::StrCat("version ", version, " (file)"), version, deadline));
  ReportInstall(report, resp);
  return absl::OkStatus();
}

absl::Status WeightIntake::UpdateByPull(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                        v1::CommitWeightsResponse* resp) {
  if (fetcher_ == nullptr) {
    return absl::FailedPreconditionError("this replica has no data plane to pull weights over (FILE only)");
  }
  const v1::TransferDescriptor& source = req.chunks(0).source();
  const uint64_t version = req.manifest().version().version();
  const absl::Time pull_start = absl::Now();
  // Into the memory of the image before last (faulted in already), if there is one.
  transport::FetchTimings timings;
  absl::StatusOr<common::HostBuffer> bytes = fetcher_->Fetch(source, deadline, staging_, &timings);
  if (!bytes.ok()) return common::Annotate(bytes.status(), "chunks[0].source: pulling the version");
  resp->set_pull_us(absl::ToInt64Microseconds(absl::Now() - pull_start));
  resp->set_pull_allocate_us(absl::ToInt64Microseconds(timings.allocate));
  resp->set_pull_verify_us(absl::ToInt64Microseconds(timings.verify));
  const bool serve = req.serve_relay() && relay_ != nullptr;
  common::HostBuffer image;  // handed back by the install, to serve without a copy
  absl::StatusOr<InstallReport> report = core_->InstallFromBytes(
      std::move(*bytes), absl::StrCat("version ", version, " (pulled)"), version, deadline, &image);
  std::optional<v1::TransferDescriptor> relay;
  if (report.ok() && serve && image.size() == source.length_bytes()) {
    // (no relay copy is not an error: the weights service then serves the others)
    absl::StatusOr<v1::TransferDescriptor> served = relay_->Serve(std::move(image), source);
    if (served.ok()) relay = *served;
  }  // (else the image's memory goes back to the staging pool here)
  if (!report.ok()) return report.status();
  if (relay) *resp->mutable_relay_source() = *relay;
  ReportInstall(*report, resp);
  return absl::OkStatus();
}

// A version pushed by the weights service's resharding round: this replica (TP 1) is
// destination rank 0, receives every tensor whole into its shard memory (relaying it
// on, chunk by chunk, when the round says forward_to), checks the digest shares and
// installs from what it checked.
absl::Status WeightIntake::UpdateFromRound(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                           v1::CommitWeightsResponse* resp) {
  if (receiver_ == nullptr) {
    return absl::FailedPreconditionError("this replica has no data plane to receive a pushed version on");
  }
  if (req.reshard().destination_layout().world_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard.destination_layout.world_size: ", req.reshard().destination_layout().world_size(),
                     "; this replica holds every tensor whole (TP 1)"));
  }
  const uint64_t version = req.manifest().version().version();
  if (version <= core_->installed_version()) {  // (before joining: the round then misses only this rank)
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " is not newer than the installed ", core_->installed_version()));
  }
  // At most this model's size (the round's sizes come from the network; each tensor
  // is checked when installed).
  ASSIGN_OR_RETURN(const uint64_t most, MostImageBytes());
  if (!receive_mu_.TryLock()) {
    return absl::FailedPreconditionError("a pushed version is being received; retry after it");
  }
  absl::Status received = ReceiveAndInstallLocked(req, deadline, most, resp);
  receive_mu_.Unlock();
  return received;
}

// UpdateFromRound's part under receive_mu_ (held by a TryLock: one push at a time).
// Never throws: libtorch's exceptions become INTERNAL here, so the lock is released.
absl::Status WeightIntake::ReceiveAndInstallLocked(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                                   uint64_t most, v1::CommitWeightsResponse* resp) {
  try {
    const uint64_t version = req.manifest().version().version();
    const absl::Time start = absl::Now();
    absl::StatusOr<reshard::ShardReceiver::Received> received = receiver_->Receive(req.reshard(), deadline, most);
    if (!received.ok()) return common::Annotate(received.status(), "reshard: receiving the pushed version");
    resp->set_pull_us(absl::ToInt64Microseconds(absl::Now() - start));
    resp->set_pull_allocate_us(absl::ToInt64Microseconds(received->allocate));
    resp->set_pull_verify_us(absl::ToInt64Microseconds(received->verify));
    std::map<std::string, model::TensorView> tensors;
    for (size_t t = 0; t < received->plan.tensors.size(); ++t) {
      const reshard::TensorSpec& spec = received->plan.tensors[t];
      tensors[spec.name] = {reshard::SafetensorsName(spec.dtype), spec.shape, received->Part(t)};
    }
    ASSIGN_OR_RETURN(InstallReport report,
                     core_->InstallFromTensors(std::move(tensors), absl::StrCat("version ", version, " (pushed)"),
                                               version, deadline));
    ReportInstall(report, resp);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("installing the pushed version: ", e.what()));
  }
}

}  // namespace rlfleet::rollout
