// gRPC adapter for RolloutCore: Generate (server streaming), GenerateBatch, GetInfo,
// Drain, Resume, and UpdateWeights: from a FILE source (a regular file under the
// fetcher's root, --publish_dir; read on the RPC's thread), pulled over the data plane, or
// pushed by the weights service's resharding round (PrepareWeightsRequest.reshard;
// PrepareWeights / CommitWeights as two calls answer UNIMPLEMENTED for now).
// Thread-safe.
#ifndef RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
#define RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/huge_string.h"
#include "libs/reshard/round.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/server_call.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "services/rollout/rollout_core.h"

namespace rlfleet::rollout {

// The call's deadline, or `fallback` from now when the client set none.
inline absl::Time CallDeadline(const grpc::CallbackServerContext& context,
                               absl::Duration fallback = absl::Minutes(10)) {
  const auto deadline = context.deadline();
  const absl::Time latest = absl::Now() + absl::Hours(24);
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24)) return absl::Now() + fallback;
  return std::min(absl::FromChrono(deadline), latest);
}

// Streams one Generate job: the scheduler pushes messages (never blocking), and the
// reactor writes them one at a time; a client that goes away cancels the job.
// StartWrite and Finish are never called with the lock held (gRPC may run
// OnWriteDone inline), and OnDone waits for any pusher still inside Pump.
class GenerateStream : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // The state the job's sink shares with the reactor (the sink may outlive it).
  struct Shared {
    absl::Mutex mu;
    GenerateStream* reactor ABSL_GUARDED_BY(mu) = nullptr;
    int pushers ABSL_GUARDED_BY(mu) = 0;         // sinks inside reactor->Pump()
    std::deque<v1::GenerateResponse> queue ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool done ABSL_GUARDED_BY(mu) = false;       // the job finished: Finish after the queue
    bool finished ABSL_GUARDED_BY(mu) = false;   // Finish called
    absl::Status status ABSL_GUARDED_BY(mu);
  };

  static RolloutCore::StreamSink SinkFor(std::shared_ptr<Shared> shared) {
    return [shared](std::vector<v1::GenerateResponse> messages, bool done, absl::Status status) {
      GenerateStream* reactor = nullptr;
      {
        absl::MutexLock lock(&shared->mu);
        for (auto& m : messages) shared->queue.push_back(std::move(m));
        if (done) {
          shared->done = true;
          shared->status = status;
        }
        reactor = shared->reactor;
        if (reactor != nullptr) ++shared->pushers;
      }
      if (reactor == nullptr) return;
      reactor->Pump();
      absl::MutexLock lock(&shared->mu);
      --shared->pushers;
    };
  }

  GenerateStream(RolloutCore* core, std::shared_ptr<Shared> shared) : core_(core), shared_(std::move(shared)) {}

  // Starts writing (call once the job exists).
  void Start(std::shared_ptr<RolloutCore::Job> job) {
    {
      absl::MutexLock lock(&shared_->mu);
      job_ = std::move(job);
      shared_->reactor = this;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    std::shared_ptr<RolloutCore::Job> job;
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->writing = false;
      if (!ok && !shared_->finished) {  // the client is gone
        shared_->finished = true;
        finish = true;
        job = job_;
      }
    }
    if (!finish) {
      Pump();
      return;
    }
    if (job != nullptr) core_->Cancel(job);
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed: client gone"));
  }
  void OnCancel() override {
    std::shared_ptr<RolloutCore::Job> job;
    {
      absl::MutexLock lock(&shared_->mu);
      job = job_;
    }
    if (job != nullptr) core_->Cancel(job);
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->reactor = nullptr;
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) { return shared_->pushers == 0; };
      shared_->mu.Await(absl::Condition(&idle));
    }
    delete this;
  }

 private:
  // Starts the next write, or finishes the call once the job is done and all is sent.
  void Pump() {
    bool write = false;
    grpc::Status final_status;
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->writing || shared_->finished) return;
      if (!shared_->queue.empty()) {
        current_ = std::move(shared_->queue.front());
        shared_->queue.pop_front();
        shared_->writing = true;
        write = true;
      } else if (shared_->done) {
        shared_->finished = true;
        final_status = rpc::ToGrpcStatus(shared_->status);
      } else {
        return;
      }
    }
    if (write) {
      StartWrite(&current_);
    } else {
      Finish(final_status);
    }
  }

  RolloutCore* const core_;
  const std::shared_ptr<Shared> shared_;
  std::shared_ptr<RolloutCore::Job> job_;
  v1::GenerateResponse current_;
};

// This replica's copy of the last version it pulled, registered on its data plane so
// that other replicas can pull it from here (the weights service's relay tree): one
// copy of the model in memory. A newer copy replaces it (a replica still pulling the
// old one then fails with a stale key, and the weights service sends it elsewhere).
// Thread-safe.
class RelayCopy {
 public:
  explicit RelayCopy(transport::Transport* data_plane) : data_plane_(data_plane) {}
  ~RelayCopy() {
    absl::MutexLock lock(&mu_);
    ReleaseLocked();
  }
  // Serves `bytes` (taken over: the installed image, not a copy of it), the version
  // `pulled` describes; returns where to pull it (same length, digest and version).
  // The image it served before, no longer registered, goes to `previous` (memory for
  // the next pull). Errors from registering it.
  absl::StatusOr<v1::TransferDescriptor> Serve(std::string bytes, const v1::TransferDescriptor& pulled,
                                               std::string* previous = nullptr) {
    absl::MutexLock lock(&mu_);
    if (handle_) (void)data_plane_->DeregisterMemory(*handle_);
    handle_.reset();
    // (handed on whole, not cleared: the next pull into it then fills nothing first)
    if (previous != nullptr) *previous = std::move(bytes_);
    ReleaseLocked();
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

 private:
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (handle_) (void)data_plane_->DeregisterMemory(*handle_);
    handle_.reset();
    bytes_.clear();
  }
  transport::Transport* const data_plane_;
  absl::Mutex mu_;
  std::string bytes_ ABSL_GUARDED_BY(mu_);
  std::optional<transport::MemoryHandle> handle_ ABSL_GUARDED_BY(mu_);
};

class RolloutServiceImpl final : public v1::RolloutService::CallbackService {
 public:
  // `on_state_change` is told whether the replica serves (the health status follows it).
  // `fetcher` (not owned; may be null) pulls versions sent by memory descriptor;
  // `data_plane` (not owned; may be null) serves relay copies of them.
  RolloutServiceImpl(RolloutCore* core, rpc::CallAuth auth, std::function<void(bool)> on_state_change = {},
                     transport::DescriptorFetcher* fetcher = nullptr, transport::Transport* data_plane = nullptr)
      : core_(core),
        auth_(std::move(auth)),
        on_state_change_(std::move(on_state_change)),
        fetcher_(fetcher),
        data_plane_(data_plane),
        relay_(data_plane != nullptr ? std::make_unique<RelayCopy>(data_plane) : nullptr),
        receiver_(data_plane != nullptr ? std::make_unique<reshard::ShardReceiver>(*data_plane) : nullptr) {}

  // Faults in memory for one pulled version of `bytes` now, so that the first pull does
  // not: in a single-version sync of a 404 MB policy, a fresh buffer was 0.87-0.99 s of
  // each replica's ~1 s pull on our VM (bench/weights_service.py). Later versions reuse
  // their predecessors' memory anyway.
  // Pushed versions land in shard memory of the transport's, faulted in here too.
  void PrefaultStaging(uint64_t bytes) {
    std::string staging = common::NewHugeString(bytes);
    {
      absl::MutexLock lock(&spare_mu_);
      spare_ = std::move(staging);
    }
    if (receiver_ != nullptr) {
      absl::MutexLock lock(&receive_mu_);
      (void)receiver_->Prefault(bytes);  // (if it fails, the first push allocates)
    }
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* c,
                                                           const v1::GenerateRequest* req) override {
    using Failed = rpc::FinishedStream<grpc::ServerWriteReactor<v1::GenerateResponse>>;
    if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "Generate"); !s.ok()) {
      return new Failed(rpc::ToGrpcStatus(s));
    }
    auto shared = std::make_shared<GenerateStream::Shared>();
    absl::StatusOr<std::shared_ptr<RolloutCore::Job>> job =
        core_->Generate(*req, GenerateStream::SinkFor(shared), CallDeadline(*c));
    if (!job.ok()) return new Failed(rpc::ToGrpcStatus(job.status()));
    auto* stream = new GenerateStream(core_, shared);
    stream->Start(std::move(*job));
    return stream;
  }
  grpc::ServerUnaryReactor* GenerateBatch(grpc::CallbackServerContext* c, const v1::GenerateBatchRequest* req,
                                          v1::GenerateBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GenerateBatch(*req, resp, CallDeadline(*c)); });
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* c, const v1::GetInfoRequest*,
                                    v1::GetInfoResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      RETURN_IF_ERROR(core_->GetInfo(resp));
      if (data_plane_ != nullptr && data_plane_->GetCapabilities().two_sided) {
        resp->mutable_data_plane()->set_backend(v1::TRANSFER_BACKEND_UCX);
        resp->mutable_data_plane()->set_worker_address(data_plane_->LocalAddress());
      }
      return absl::OkStatus();
    });
  }
  // One chunk holding the whole version as a safetensors image: a FILE source (the
  // trainer's file, read here), or the weights service's or another replica's memory
  // (UCX; pulled over this replica's data plane, digest checked). Installed at the next
  // decode-step boundary; in-flight sequences continue on it. With serve_relay, a
  // pulled version is also served from here (relay_source in the reply).
  grpc::ServerUnaryReactor* UpdateWeights(grpc::CallbackServerContext* c, const v1::PrepareWeightsRequest* req,
                                          v1::CommitWeightsResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&]() -> absl::Status {
      RETURN_IF_ERROR(CheckUpdate(*req));
      // transfer_timeout_ms (0 = 60 s), within the call's own deadline
      const absl::Time deadline =
          std::min(CallDeadline(*c, absl::Minutes(1)),
                   absl::Now() + (req->transfer_timeout_ms() > 0 ? absl::Milliseconds(req->transfer_timeout_ms())
                                                                 : absl::Seconds(60)));
      if (req->has_reshard()) return UpdateFromRound(*req, deadline, resp);
      const v1::TransferDescriptor& source = req->chunks(0).source();
      const uint64_t version = req->manifest().version().version();
      absl::StatusOr<InstallReport> report;
      std::optional<v1::TransferDescriptor> relay;
      if (source.segment().backend() == v1::TRANSFER_BACKEND_FILE) {
        // Read by the fetcher on this thread (never the scheduler's): a regular file
        // under --publish_dir, of the descriptor's length, its digest checked.
        if (fetcher_ == nullptr) {
          return absl::InvalidArgumentError(
              "chunks[0].source.segment.backend: FILE descriptors are not accepted here (no --publish_dir)");
        }
        absl::StatusOr<std::string> bytes = fetcher_->Fetch(source, deadline);
        if (!bytes.ok()) return common::Annotate(bytes.status(), "chunks[0].source");
        report = core_->InstallFromBytes(std::move(*bytes), absl::StrCat("version ", version, " (file)"), version,
                                         deadline);
      } else {
        if (fetcher_ == nullptr) {
          return absl::FailedPreconditionError("this replica has no data plane to pull weights over (FILE only)");
        }
        const absl::Time pull_start = absl::Now();
        // Into the memory of the image before last (faulted in already), if there is one.
        std::string reuse;
        {
          absl::MutexLock lock(&spare_mu_);
          reuse.swap(spare_);
        }
        transport::FetchTimings timings;
        absl::StatusOr<std::string> bytes = fetcher_->Fetch(source, deadline, std::move(reuse), &timings);
        if (!bytes.ok()) return common::Annotate(bytes.status(), "chunks[0].source: pulling the version");
        resp->set_pull_us(absl::ToInt64Microseconds(absl::Now() - pull_start));
        resp->set_pull_allocate_us(absl::ToInt64Microseconds(timings.allocate));
        resp->set_pull_verify_us(absl::ToInt64Microseconds(timings.verify));
        const bool serve = req->serve_relay() && relay_ != nullptr;
        std::string image;  // handed back by the install, to serve without a copy
        report = core_->InstallFromBytes(std::move(*bytes), absl::StrCat("version ", version, " (pulled)"), version,
                                         deadline, &image);
        std::string spare;
        if (report.ok() && serve && image.size() == source.length_bytes()) {
          // (no relay copy is not an error: the weights service then serves the others)
          absl::StatusOr<v1::TransferDescriptor> served = relay_->Serve(std::move(image), source, &spare);
          if (served.ok()) relay = *served;
        } else {
          spare = std::move(image);
        }
        if (spare.capacity() > (1 << 20)) {  // (cleared, not freed: its memory is what counts)
          absl::MutexLock lock(&spare_mu_);
          spare_ = std::move(spare);
        }
      }
      if (!report.ok()) return report.status();
      if (relay) *resp->mutable_relay_source() = *relay;
      Installed(*report, resp);
      return absl::OkStatus();
    });
  }
  // Two-phase installs are not offered: UpdateWeights stages and installs in one call.
  // Refused with a message (an RPC left to gRPC's default answers UNIMPLEMENTED with none).
  grpc::ServerUnaryReactor* PrepareWeights(grpc::CallbackServerContext* c, const v1::PrepareWeightsRequest*,
                                           v1::PrepareWeightsResponse*) override {
    return rpc::HandleUnary(c, auth_, [] {
      return absl::UnimplementedError("PrepareWeights: use UpdateWeights, which stages and installs in one call");
    });
  }
  grpc::ServerUnaryReactor* CommitWeights(grpc::CallbackServerContext* c, const v1::CommitWeightsRequest*,
                                          v1::CommitWeightsResponse*) override {
    return rpc::HandleUnary(c, auth_, [] {
      return absl::UnimplementedError("CommitWeights: use UpdateWeights, which stages and installs in one call");
    });
  }

  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* c, const v1::DrainRequest* req,
                                  v1::DrainResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      if (on_state_change_) on_state_change_(false);  // stop new work from being routed here
      absl::Status s = core_->Drain(*req, resp);
      if (on_state_change_) on_state_change_(core_->serving());
      return s;
    });
  }
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* c, const v1::ResumeRequest*,
                                   v1::ResumeResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      absl::Status s = core_->Resume(resp);
      if (s.ok() && on_state_change_) on_state_change_(core_->serving());
      return s;
    });
  }

 private:
  // Every field of an UpdateWeights request, before anything is fetched or allocated:
  // honoured, or refused naming it (INVALID_ARGUMENT; UNIMPLEMENTED for what this
  // replica does not support: docs/unsupported_fields.md).
  absl::Status CheckUpdate(const v1::PrepareWeightsRequest& req) {
    const v1::WeightManifest& m = req.manifest();
    if (m.version().version() == 0) return absl::InvalidArgumentError("manifest.version.version: 0");
    RETURN_IF_ERROR(common::CheckInRange<int64_t>("transfer_timeout_ms", req.transfer_timeout_ms(), 0,
                                                  int64_t{3600} * 1000));
    if (m.wire_dtype() != v1::DTYPE_UNSPECIFIED) {
      return absl::UnimplementedError(
          "manifest.wire_dtype: this replica installs the image's own dtypes and does not cast (send UNSPECIFIED)");
    }
    v1::GetInfoResponse info;
    RETURN_IF_ERROR(core_->GetInfo(&info));
    const uint64_t most = model::F32ImageBytesBound(info.model().num_parameters());
    if (req.has_reshard()) {
      if (req.chunks_size() > 0) {
        return absl::InvalidArgumentError("chunks: a pushed version (reshard) comes with no chunks");
      }
      return absl::OkStatus();
    }
    if (req.chunks_size() != 1) {
      return absl::UnimplementedError(absl::StrCat(
          "chunks: ", req.chunks_size(), " chunks; this replica takes one chunk holding the whole version"));
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
    if (chunk.source().length_bytes() > most) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[0].source.length_bytes: ", chunk.source().length_bytes(),
                                                     "; this replica's model is at most ", most, " bytes"));
    }
    if (m.total_bytes() != 0 && m.total_bytes() != chunk.source().length_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.total_bytes: ", m.total_bytes(), "; the chunk holds ",
                                                     chunk.source().length_bytes()));
    }
    return absl::OkStatus();
  }

  // A version pushed by the weights service's resharding round: this replica (TP 1) is
  // destination rank 0, receives every tensor whole into its shard memory (relaying it
  // on, chunk by chunk, when the round says forward_to), checks the digest shares and
  // installs straight from the shard.
  absl::Status UpdateFromRound(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                               v1::CommitWeightsResponse* resp) {
    if (receiver_ == nullptr) {
      return absl::FailedPreconditionError("this replica has no data plane to receive a pushed version on");
    }
    if (req.reshard().destination_layout().world_size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat("reshard.destination_layout.world_size: ",
                                                     req.reshard().destination_layout().world_size(),
                                                     "; this replica holds every tensor whole (TP 1)"));
    }
    const uint64_t version = req.manifest().version().version();
    if (version <= core_->installed_version()) {  // (before joining: the round then misses only this rank)
      return absl::FailedPreconditionError(
          absl::StrCat("version ", version, " is not newer than the installed ", core_->installed_version()));
    }
    // At most this model's size (the round's sizes come from the network; each tensor
    // is checked when installed).
    v1::GetInfoResponse info;
    RETURN_IF_ERROR(core_->GetInfo(&info));
    const uint64_t most = model::F32ImageBytesBound(info.model().num_parameters());
    if (!receive_mu_.TryLock()) {
      return absl::FailedPreconditionError("a pushed version is being received; retry after it");
    }
    absl::Status received = ReceiveAndInstallLocked(req, deadline, most, version, resp);
    receive_mu_.Unlock();
    return received;
  }

  // UpdateFromRound's part under receive_mu_ (held by a TryLock: one push at a time).
  // Never throws: libtorch's exceptions become INTERNAL here, so the lock is released.
  absl::Status ReceiveAndInstallLocked(const v1::PrepareWeightsRequest& req, absl::Time deadline, uint64_t most,
                                       uint64_t version, v1::CommitWeightsResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_) {
    try {
      return ReceiveAndInstallLockedOrThrow(req, deadline, most, version, resp);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("installing the pushed version: ", e.what()));
    }
  }
  absl::Status ReceiveAndInstallLockedOrThrow(const v1::PrepareWeightsRequest& req, absl::Time deadline,
                                              uint64_t most, uint64_t version, v1::CommitWeightsResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_) {
    const absl::Time start = absl::Now();
    absl::StatusOr<reshard::ShardReceiver::Received> received = receiver_->Receive(req.reshard(), deadline, most);
    if (!received.ok()) return common::Annotate(received.status(), "reshard: receiving the pushed version");
    resp->set_pull_us(absl::ToInt64Microseconds(absl::Now() - start));
    resp->set_pull_allocate_us(absl::ToInt64Microseconds(received->allocate));
    resp->set_pull_verify_us(absl::ToInt64Microseconds(received->verify));
    std::map<std::string, model::TensorView> tensors;
    for (size_t t = 0; t < received->plan.tensors.size(); ++t) {
      const reshard::TensorSpec& spec = received->plan.tensors[t];
      tensors[spec.name] = {absl::AsciiStrToUpper(reshard::DTypeName(spec.dtype)), spec.shape, received->Part(t)};
    }
    absl::StatusOr<InstallReport> report = core_->InstallFromTensors(
        std::move(tensors), absl::StrCat("version ", version, " (pushed)"), version, deadline);
    if (!report.ok()) return report.status();
    Installed(*report, resp);
    return absl::OkStatus();
  }

  // An install's report in the reply, and the health status after it.
  void Installed(const InstallReport& report, v1::CommitWeightsResponse* resp) {
    resp->mutable_installed_version()->set_version(report.version);
    resp->set_decode_step(report.decode_step);
    resp->set_inflight_sequences(report.inflight_sequences);
    resp->set_pause_us(report.pause_us);
    resp->set_install_us(report.install_us);
    if (on_state_change_) on_state_change_(core_->serving());
  }

  RolloutCore* const core_;
  const rpc::CallAuth auth_;
  std::function<void(bool)> on_state_change_;
  transport::DescriptorFetcher* const fetcher_;
  transport::Transport* const data_plane_;
  const std::unique_ptr<RelayCopy> relay_;
  // Pushed versions: one round at a time, and the shard untouched until installed.
  absl::Mutex receive_mu_;
  const std::unique_ptr<reshard::ShardReceiver> receiver_ ABSL_PT_GUARDED_BY(receive_mu_);
  // A pulled image's memory, kept for the next pull (with a relay: the one it served
  // before the current one).
  absl::Mutex spare_mu_;
  std::string spare_ ABSL_GUARDED_BY(spare_mu_);
};

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
