#include "libs/transport/descriptor_fetcher.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/checksum.h"
#include "libs/common/huge_string.h"
#include "libs/common/status_macros.h"

namespace rlfleet::transport {

DescriptorFetcher::DescriptorFetcher(Transport* transport, Options options)
    : transport_(transport), options_(options) {}

absl::StatusOr<std::string> DescriptorFetcher::Fetch(const v1::TransferDescriptor& d, absl::Time deadline,
                                                     std::string reuse, FetchTimings* timings) {
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
  absl::StatusOr<std::string> bytes;
  switch (d.segment().backend()) {
    case v1::TRANSFER_BACKEND_FILE: {
      const absl::Time start = absl::Now();
      bytes = FetchFile(d);
      timings->transfer = absl::Now() - start;
      break;
    }
    case v1::TRANSFER_BACKEND_UCX:
    case v1::TRANSFER_BACKEND_LOOPBACK:
      bytes = FetchMemory(d, deadline, std::move(reuse), timings);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("segment.backend: ", v1::TransferBackend_Name(d.segment().backend()),
                       " is not one the buffer fetches from (FILE, UCX, LOOPBACK)"));
  }
  if (!bytes.ok()) return bytes.status();
  const absl::Time verify_start = absl::Now();
  const uint64_t got =
      d.digest().algorithm() == v1::DIGEST_ALGORITHM_XXHASH64 ? common::Xxh64(*bytes) : common::Crc32c(*bytes);
  timings->verify = absl::Now() - verify_start;
  if (got != d.digest().value()) {
    // (The computed value is not echoed: it would tell a producer about bytes it
    // cannot read.)
    return absl::DataLossError(absl::StrFormat("digest: the %d bytes fetched do not match the descriptor's %s",
                                               bytes->size(), v1::DigestAlgorithm_Name(d.digest().algorithm())));
  }
  return bytes;
}

absl::StatusOr<std::string> DescriptorFetcher::FetchFile(const v1::TransferDescriptor& d) {
  const std::string& path = d.segment().worker_address();
  if (path.empty()) return absl::InvalidArgumentError("segment.worker_address: empty (the file's path)");
  if (options_.file_root.empty()) {
    return absl::InvalidArgumentError("segment.backend: FILE payloads are not accepted here (no --payload_dir)");
  }
  // The real path must lie under the root: no "..", no symlink out of it.
  char resolved[PATH_MAX], root[PATH_MAX];
  if (realpath(options_.file_root.c_str(), root) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("payload directory ", options_.file_root, " does not exist"));
  }
  if (realpath(path.c_str(), resolved) == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const std::string prefix = std::string(root) == "/" ? "/" : absl::StrCat(root, "/");
  if (std::string(resolved).rfind(prefix, 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment.worker_address: ", path, " is not under the payload directory ", options_.file_root));
  }
  const int fd = open(resolved, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("segment.worker_address: ", path, " is not a regular file"));
  }
  std::string bytes(d.length_bytes(), '\0');
  uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = pread(fd, bytes.data() + done, bytes.size() - done, d.offset_bytes() + done);
    if (n <= 0) break;
    done += n;
  }
  close(fd);
  if (done != bytes.size()) {
    return absl::DataLossError(
        absl::StrCat(path, " holds ", done, " of the ", bytes.size(), " bytes at offset ", d.offset_bytes()));
  }
  return bytes;
}

absl::StatusOr<std::string> DescriptorFetcher::FetchMemory(const v1::TransferDescriptor& d, absl::Time deadline,
                                                           std::string reuse, FetchTimings* timings) {
  if (transport_ == nullptr) {
    return absl::InvalidArgumentError("segment.backend: this buffer has no data-plane transport (FILE only)");
  }
  const std::string mine = transport_->GetCapabilities().backend;
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
  ASSIGN_OR_RETURN(PeerId peer, transport_->Connect(d.segment().worker_address()));
  // The bytes land straight in the string returned (registered for the Get), not in a
  // buffer copied out afterwards; a big one is faulted in as huge pages first, since
  // faulting 4 KiB pages capped a 400 MiB pull at ~1.4 GB/s where ucx_perftest's warm
  // buffers reach ~12 (bench/fetch_bw).
  const absl::Time allocate_start = absl::Now();
  std::string bytes = common::ReuseOrNewHugeString(std::move(reuse), d.length_bytes());
  const absl::Time transfer_start = absl::Now();
  timings->allocate = transfer_start - allocate_start;
  ASSIGN_OR_RETURN(MemoryHandle local,
                   transport_->RegisterMemory(bytes.data(), bytes.size(), MemoryKind::kHost, 0));
  std::unique_ptr<Completion> get = transport_->Get(peer, local, 0, d.segment(), d.offset_bytes(), d.length_bytes());
  absl::Status s = get->Wait(deadline - absl::Now());
  if (absl::IsDeadlineExceeded(s)) {
    // The bytes may still land: the region stays registered and allocated (a producer
    // that is late, not dead, must not write into freed memory).
    new std::string(std::move(bytes));  // NOLINT: leaked on purpose
    return s;
  }
  (void)transport_->DeregisterMemory(local);
  timings->transfer = absl::Now() - transfer_start;
  if (!s.ok()) return s;
  return bytes;
}

}  // namespace rlfleet::transport
