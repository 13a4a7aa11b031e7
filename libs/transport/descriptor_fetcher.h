// Fetches the bytes a TransferDescriptor names (an experience payload the buffer is sent
// by descriptor, a weight version a rollout replica pulls): FILE (a path both sides
// read: one machine or a shared filesystem) and, with a data-plane Transport, a Get
// from the owner's registered memory (UCX; loopback in tests). The digest the
// descriptor carries (XXH64 or CRC-32C) is checked. Free of gRPC; thread-safe.
#ifndef RLFLEET_LIBS_TRANSPORT_DESCRIPTOR_FETCHER_H_
#define RLFLEET_LIBS_TRANSPORT_DESCRIPTOR_FETCHER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/host_buffer.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::transport {

// Where a fetch's time went (memory payloads; a FILE read is all `transfer`).
struct FetchTimings {
  absl::Duration allocate;  // memory for the bytes (fresh memory is faulted in here)
  absl::Duration transfer;  // the transport moving them (or the file read)
  absl::Duration verify;    // the digest check
};

class DescriptorFetcher {
 public:
  struct Options {
    uint64_t max_bytes = uint64_t{64} << 20;     // one payload at most
    absl::Duration timeout = absl::Seconds(10);  // per fetch: a dead producer is an error after this
    // FILE descriptors may only name regular files under this directory (no symlinks
    // out of it, no directories, FIFOs or devices); empty: FILE descriptors are refused.
    // (A peer must not be able to make the service read any file it can.)
    std::string file_root;
    // The flag that sets file_root, named when a FILE descriptor is refused.
    std::string file_root_flag = "--payload_dir";
    // Memory of fetches that timed out while the transport may still write into it is
    // held (not freed) until their transfer finishes; beyond this many bytes so held,
    // new memory fetches are refused with RESOURCE_EXHAUSTED.
    uint64_t max_pending_bytes = uint64_t{16} << 30;
  };
  // `transport` (not owned, may be null: memory descriptors are then refused) serves
  // descriptors of its backend.
  DescriptorFetcher(Transport* transport, Options options);
  DescriptorFetcher(Transport* transport) : DescriptorFetcher(transport, Options()) {}
  // Holds (leaks, on purpose) the memory of fetches still in flight: a transfer the
  // transport may still complete must not write into freed memory.
  ~DescriptorFetcher();
  DescriptorFetcher(const DescriptorFetcher&) = delete;
  DescriptorFetcher& operator=(const DescriptorFetcher&) = delete;

  // The bytes. INVALID_ARGUMENT naming the field for a malformed descriptor (no digest,
  // zero or oversized length, range outside the segment, a backend this buffer does not
  // fetch from, a path outside file_root, not a regular file, or a range past its end,
  // checked before anything is allocated); NOT_FOUND for a file that cannot be opened;
  // DATA_LOSS for a digest mismatch; RESOURCE_EXHAUSTED while too much memory of
  // timed-out fetches is still held (see max_pending_bytes); the transport's error
  // (UNAVAILABLE, FAILED_PRECONDITION for a stale registration, DEADLINE_EXCEEDED)
  // otherwise.
  absl::StatusOr<std::string> Fetch(const v1::TransferDescriptor& descriptor) {
    return Fetch(descriptor, absl::Now() + options_.timeout);
  }
  // With a deadline of its own (several fetches of one request share one).
  absl::StatusOr<std::string> Fetch(const v1::TransferDescriptor& descriptor, absl::Time deadline);
  // Into memory from `pool` (when it holds a buffer large enough; the buffer returned
  // goes back there when dropped): a caller that fetches one version after another (a
  // rollout replica, the weights service) writes each into memory faulted in already
  // instead of a fresh buffer per pull (a fresh 400 MB buffer: 46 ms here when memory
  // is warm, 460-780 ms when it is not). A null pool: fresh memory.
  absl::StatusOr<common::HostBuffer> Fetch(const v1::TransferDescriptor& descriptor, absl::Time deadline,
                                           const std::shared_ptr<common::BufferPool>& pool,
                                           FetchTimings* timings = nullptr);
  const Options& options() const { return options_; }

  // Fetches that timed out and whose memory is still held (their transfer has not
  // finished), after releasing those that finished. Waits up to `wait` for each to
  // finish first (zero: only looks).
  size_t ReleaseFinished(absl::Duration wait = absl::ZeroDuration());

 private:
  // A timed-out Get: its registration and memory, released once it finishes.
  struct Pending {
    std::unique_ptr<Completion> get;
    MemoryHandle local;
    common::HostBuffer bytes;
  };
  absl::StatusOr<common::HostBuffer> FetchFile(const v1::TransferDescriptor& d,
                                               const std::shared_ptr<common::BufferPool>& pool);
  absl::StatusOr<common::HostBuffer> FetchMemory(const v1::TransferDescriptor& d, absl::Time deadline,
                                                 const std::shared_ptr<common::BufferPool>& pool,
                                                 FetchTimings* timings);

  Transport* const transport_;
  const Options options_;
  absl::Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A CudaIpcImage from a peer, checked before anything maps it: a 64-byte handle, a host
// id and PCI bus id of sane length, the BlockSum digest, `version`, and a length in
// 1..max_bytes. INVALID_ARGUMENT naming `field` and the problem.
absl::Status CheckCudaIpcImage(const v1::CudaIpcImage& image, const std::string& field, uint64_t version,
                               uint64_t max_bytes);

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_DESCRIPTOR_FETCHER_H_
