// BufferPool: large byte buffers kept for reuse, so that version after version is
// written into memory faulted in already (a fresh 400 MB buffer costs 0.5-1 s of page
// faults on these VMs). Keeps at most `max_buffers`, the largest. Thread-safe.
#ifndef RLFLEET_LIBS_COMMON_BUFFER_POOL_H_
#define RLFLEET_LIBS_COMMON_BUFFER_POOL_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rlfleet::common {

class BufferPool {
 public:
  explicit BufferPool(size_t max_buffers) : max_buffers_(std::max<size_t>(1, max_buffers)) {}

  // At most `max_buffers` are kept from now on (the smallest go first).
  void SetMaxBuffers(size_t max_buffers) {
    absl::MutexLock lock(&mu_);
    max_buffers_ = std::max<size_t>(1, max_buffers);
    TrimLocked();
  }

  // Keeps `buffer`'s memory (not its contents' meaning) for a later Take; one without
  // memory of its own (within the string's inline capacity) is dropped.
  void Give(std::string buffer) {
    if (buffer.capacity() <= std::string().capacity()) return;
    absl::MutexLock lock(&mu_);
    buffers_.push_back(std::move(buffer));
    TrimLocked();
  }

  // The largest buffer kept (its memory; size and contents as given), or an empty
  // string when none is.
  std::string Take() {
    absl::MutexLock lock(&mu_);
    if (buffers_.empty()) return std::string();
    std::string out = std::move(buffers_.front());
    buffers_.erase(buffers_.begin());
    return out;
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return buffers_.size();
  }

 private:
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::stable_sort(buffers_.begin(), buffers_.end(),
                     [](const std::string& a, const std::string& b) { return a.capacity() > b.capacity(); });
    if (buffers_.size() > max_buffers_) buffers_.resize(max_buffers_);
  }

  mutable absl::Mutex mu_;
  size_t max_buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> buffers_ ABSL_GUARDED_BY(mu_);  // largest first
};

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_BUFFER_POOL_H_
