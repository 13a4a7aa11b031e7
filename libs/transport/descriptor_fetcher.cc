#include "libs/transport/descriptor_fetcher.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/checksum.h"
#include "libs/common/files.h"
#include "libs/common/host_buffer.h"
#include "libs/common/status_macros.h"

namespace rlfleet::transport {

DescriptorFetcher::DescriptorFetcher(Transport* transport, Options options)
    : transport_(transport), options_(options) {}

absl::StatusOr<std::string> DescriptorFetcher::Fetch(const v1::TransferDescriptor& d, absl::Time deadline) {
  ASSIGN_OR_RETURN(common::HostBuffer bytes, Fetch(d, deadline, nullptr));
  return std::move(bytes).Release();
}

absl::StatusOr<common::HostBuffer> DescriptorFetcher::Fetch(const v1::TransferDescriptor& d, absl::Time deadline,
                                                            const std::shared_ptr<common::BufferPool>& pool,
                                                            FetchTimings* timings) {
  FetchTimings local_timings;
  if (timings == nullptr) timings = &local_timings;
  *timings = FetchTimings();
  if (absl::Now() >= deadline) return absl::DeadlineExceededError("no time left for this fetch");
  if (d.length_bytes() == 0) return absl::InvalidArgumentError("length_bytes: 0");
  if (d.length_bytes() > options_.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("length_bytes: ", d.length_bytes(), " exceeds the limit of ", options_.max_bytes));
  }
  if (d.digest().algorithm() != v1::DIGEST_ALGORITHM_XXHASH64 &&
      d.digest().algorithm() != v1::DIGEST_ALGORITHM_CRC32C) {
    return absl::InvalidArgumentError("digest: required (XXHASH64 or CRC32C)");
  }
  absl::StatusOr<common::HostBuffer> bytes;
  switch (d.segment().backend()) {
    case v1::TRANSFER_BACKEND_FILE: {
      const absl::Time start = absl::Now();
      bytes = FetchFile(d, pool);
      timings->transfer = absl::Now() - start;
      break;
    }
    case v1::TRANSFER_BACKEND_UCX:
    case v1::TRANSFER_BACKEND_LOOPBACK:
      bytes = FetchMemory(d, deadline, pool, timings);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("segment.backend: ", v1::TransferBackend_Name(d.segment().backend()),
                       " is not one the buffer fetches from (FILE, UCX, LOOPBACK)"));
  }
  if (!bytes.ok()) return bytes.status();
  const absl::Time verify_start = absl::Now();
  const uint64_t got = d.digest().algorithm() == v1::DIGEST_ALGORITHM_XXHASH64 ? common::Xxh64(bytes->view())
                                                                               : common::Crc32c(bytes->view());
  timings->verify = absl::Now() - verify_start;
  if (got != d.digest().value()) {
    // (The computed value is not echoed: it would tell a producer about bytes it
    // cannot read.)
    return absl::DataLossError(absl::StrFormat("digest: the %d bytes fetched do not match the descriptor's %s",
                                               bytes->size(), v1::DigestAlgorithm_Name(d.digest().algorithm())));
  }
  return bytes;
}

absl::StatusOr<common::HostBuffer> DescriptorFetcher::FetchFile(const v1::TransferDescriptor& d,
                                                                const std::shared_ptr<common::BufferPool>& pool) {
  const std::string& path = d.segment().worker_address();
  if (path.empty()) return absl::InvalidArgumentError("segment.worker_address: empty (the file's path)");
  if (options_.file_root.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment.backend: FILE descriptors are not accepted here (no ", options_.file_root_flag, ")"));
  }
  // The real path must lie under the root: no "..", no symlink out of it.
  ASSIGN_OR_RETURN(const std::filesystem::path resolved,
                   common::ResolveUnderRoot("segment.worker_address", options_.file_root, path));
  // No size limit at the open: the range is checked against the size of the open
  // descriptor (what is read) below, before a byte is allocated, and the file's size is
  // not echoed. no_follow: the last component was resolved above, so a link swapped in
  // since is refused.
  ASSIGN_OR_RETURN(const common::RegularFile file,
                   common::OpenRegularFile("segment.worker_address", resolved, UINT64_MAX, /*no_follow=*/true));
  if (d.offset_bytes() > file.size() || d.length_bytes() > file.size() - d.offset_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("offset_bytes + length_bytes: past the end of ", path));
  }
  common::HostBuffer bytes = common::HostBuffer::Allocate(pool, d.length_bytes());
  RETURN_IF_ERROR(file.ReadAt("segment.worker_address", d.offset_bytes(), bytes.data(), bytes.size()));
  return bytes;
}

DescriptorFetcher::~DescriptorFetcher() {
  ReleaseFinished();
  absl::MutexLock lock(&mu_);
  // Still in flight: the transport may write into this memory, so it is never freed.
  for (Pending& p : pending_) {
    new common::HostBuffer(std::move(p.bytes));  // NOLINT: leaked on purpose
    (void)p.get.release();
  }
}

size_t DescriptorFetcher::ReleaseFinished(absl::Duration wait) {
  std::vector<Pending> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(pending_);
  }
  std::vector<Pending> kept;
  uint64_t released = 0;
  for (Pending& p : all) {
    if (wait > absl::ZeroDuration() && !p.get->Done()) (void)p.get->Wait(wait);
    if (!p.get->Done()) {
      kept.push_back(std::move(p));
      continue;
    }
    (void)transport_->DeregisterMemory(p.local);
    released += p.bytes.size();
  }
  absl::MutexLock lock(&mu_);
  pending_bytes_ -= released;
  for (Pending& p : kept) pending_.push_back(std::move(p));
  return pending_.size();
}

absl::StatusOr<common::HostBuffer> DescriptorFetcher::FetchMemory(const v1::TransferDescriptor& d, absl::Time deadline,
                                                                  const std::shared_ptr<common::BufferPool>& pool,
                                                                  FetchTimings* timings) {
  if (transport_ == nullptr) {
    return absl::InvalidArgumentError("segment.backend: this buffer has no data-plane transport (FILE only)");
  }
  // (decorators, fault-injecting or authenticating, move their inner backend's descriptors)
  const std::string mine = BaseBackend(transport_->GetCapabilities());
  const std::string theirs = d.segment().backend() == v1::TRANSFER_BACKEND_UCX ? "ucx" : "loopback";
  if (mine != theirs) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment.backend: ", theirs, "; this buffer's data plane is ", mine));
  }
  if (d.offset_bytes() > d.segment().length_bytes() ||
      d.length_bytes() > d.segment().length_bytes() - d.offset_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("offset_bytes + length_bytes (", d.offset_bytes() + d.length_bytes(),
                                                   ") exceeds segment.length_bytes (", d.segment().length_bytes(),
                                                   ")"));
  }
  ReleaseFinished();
  {
    absl::MutexLock lock(&mu_);
    if (pending_bytes_ > options_.max_pending_bytes || d.length_bytes() > options_.max_pending_bytes - pending_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat(pending_bytes_, " bytes of fetches that timed out are still in flight; retry when they finish"));
    }
  }
  ASSIGN_OR_RETURN(PeerId peer, transport_->Connect(d.segment().worker_address()));
  // The bytes land straight in the string returned (registered for the Get), not in a
  // buffer copied out afterwards; a big one is faulted in as huge pages first, since
  // faulting 4 KiB pages capped a 400 MiB pull at ~1.4 GB/s where ucx_perftest's warm
  // buffers reach ~12 (bench/fetch_bw).
  const absl::Time allocate_start = absl::Now();
  common::HostBuffer bytes = common::HostBuffer::Allocate(pool, d.length_bytes());
  const absl::Time transfer_start = absl::Now();
  timings->allocate = transfer_start - allocate_start;
  ASSIGN_OR_RETURN(MemoryHandle local, transport_->RegisterMemory(bytes.data(), bytes.size(), MemoryKind::kHost, 0));
  std::unique_ptr<Completion> get = transport_->Get(peer, local, 0, d.segment(), d.offset_bytes(), d.length_bytes());
  absl::Status s = get->Wait(deadline - absl::Now());
  if (absl::IsDeadlineExceeded(s) && !get->Done()) {
    // The bytes may still land: the region stays registered and allocated (a producer
    // that is late, not dead, must not write into freed memory) until the Get finishes;
    // the next fetch (or ReleaseFinished) releases it then.
    absl::MutexLock lock(&mu_);
    pending_bytes_ += bytes.size();
    pending_.push_back({std::move(get), local, std::move(bytes)});
    return s;
  }
  (void)transport_->DeregisterMemory(local);
  timings->transfer = absl::Now() - transfer_start;
  if (!s.ok()) return s;
  return bytes;
}

absl::Status CheckCudaIpcImage(const v1::CudaIpcImage& image, const std::string& field, uint64_t version,
                               uint64_t max_bytes) {
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(field, ".", what)); };
  if (image.ipc_handle().size() != 64)
    return bad(absl::StrCat("ipc_handle: ", image.ipc_handle().size(), " bytes; want 64"));
  if (image.host_id().empty() || image.host_id().size() > 128) return bad("host_id: want 1..128 bytes");
  if (image.pci_bus_id().size() > 64) return bad("pci_bus_id: longer than 64 bytes");
  if (image.digest().algorithm() != v1::DIGEST_ALGORITHM_BLOCKSUM32_XXH64) {
    return bad("digest.algorithm: want DIGEST_ALGORITHM_BLOCKSUM32_XXH64");
  }
  if (image.version() != version)
    return bad(absl::StrCat("version: ", image.version(), "; the manifest's is ", version));
  if (image.length_bytes() == 0 || image.length_bytes() % 4 != 0 || image.length_bytes() > max_bytes) {
    return bad(absl::StrCat("length_bytes: ", image.length_bytes(), "; want a multiple of 4 in 4..", max_bytes));
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::transport
