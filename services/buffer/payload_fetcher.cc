#include "services/buffer/payload_fetcher.h"

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/checksum.h"
#include "libs/common/status_macros.h"

namespace rlfleet::buffer {

PayloadFetcher::PayloadFetcher(transport::Transport* transport, Options options)
    : transport_(transport), options_(options) {}

absl::StatusOr<std::string> PayloadFetcher::Fetch(const v1::TransferDescriptor& d) {
  if (d.length_bytes() == 0) return absl::InvalidArgumentError("length_bytes: 0");
  if (d.length_bytes() > options_.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("length_bytes: ", d.length_bytes(), " exceeds the limit of ", options_.max_bytes));
  }
  if (d.digest().algorithm() != v1::DIGEST_ALGORITHM_XXHASH64 && d.digest().algorithm() != v1::DIGEST_ALGORITHM_CRC32C) {
    return absl::InvalidArgumentError("digest: required (XXHASH64 or CRC32C)");
  }
  absl::StatusOr<std::string> bytes;
  switch (d.segment().backend()) {
    case v1::TRANSFER_BACKEND_FILE:
      bytes = FetchFile(d);
      break;
    case v1::TRANSFER_BACKEND_UCX:
    case v1::TRANSFER_BACKEND_LOOPBACK:
      bytes = FetchMemory(d);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("segment.backend: ",
                                                     v1::TransferBackend_Name(d.segment().backend()),
                                                     " is not one the buffer fetches from (FILE, UCX)"));
  }
  if (!bytes.ok()) return bytes.status();
  const uint64_t got = d.digest().algorithm() == v1::DIGEST_ALGORITHM_XXHASH64 ? common::Xxh64(*bytes)
                                                                               : common::Crc32c(*bytes);
  if (got != d.digest().value()) {
    return absl::DataLossError(absl::StrFormat("digest: the %d bytes fetched hash to %#x, the descriptor says %#x",
                                               bytes->size(), got, d.digest().value()));
  }
  return bytes;
}

absl::StatusOr<std::string> PayloadFetcher::FetchFile(const v1::TransferDescriptor& d) {
  const std::string& path = d.segment().worker_address();
  if (path.empty()) return absl::InvalidArgumentError("segment.worker_address: empty (the file's path)");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string bytes(d.length_bytes(), '\0');
  uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = pread(fd, bytes.data() + done, bytes.size() - done, d.offset_bytes() + done);
    if (n <= 0) break;
    done += n;
  }
  close(fd);
  if (done != bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, " holds ", done, " of the ", bytes.size(), " bytes at offset ",
                                            d.offset_bytes()));
  }
  return bytes;
}

absl::StatusOr<std::string> PayloadFetcher::FetchMemory(const v1::TransferDescriptor& d) {
  if (transport_ == nullptr) {
    return absl::InvalidArgumentError("segment.backend: this buffer has no data-plane transport (FILE only)");
  }
  const std::string mine = transport_->GetCapabilities().backend;
  const std::string theirs = d.segment().backend() == v1::TRANSFER_BACKEND_UCX ? "ucx" : "loopback";
  if (mine != theirs) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment.backend: ", theirs, "; this buffer's data plane is ", mine));
  }
  if (d.offset_bytes() + d.length_bytes() > d.segment().length_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("offset_bytes + length_bytes (", d.offset_bytes() + d.length_bytes(),
                                                   ") exceeds segment.length_bytes (", d.segment().length_bytes(), ")"));
  }
  ASSIGN_OR_RETURN(transport::PeerId peer, transport_->Connect(d.segment().worker_address()));
  ASSIGN_OR_RETURN(transport::MemoryHandle local, transport_->AllocateMemory(d.length_bytes()));
  std::unique_ptr<transport::Completion> get =
      transport_->Get(peer, local, 0, d.segment(), d.offset_bytes(), d.length_bytes());
  absl::Status s = get->Wait(options_.timeout);
  std::string bytes;
  if (s.ok()) bytes.assign(static_cast<const char*>(local.base), d.length_bytes());
  if (!absl::IsDeadlineExceeded(s)) (void)transport_->DeregisterMemory(local);  // (else it may still land)
  if (!s.ok()) return s;
  return bytes;
}

}  // namespace rlfleet::buffer
