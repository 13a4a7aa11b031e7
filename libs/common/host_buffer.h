// Large host byte buffers (a weight version, a pulled payload) and the memory they are
// written into version after version:
//   BufferPool   buffers kept for reuse, so that each version is written into memory
//                faulted in already (a fresh 400 MB buffer costs 0.5-1 s of page faults
//                on these VMs). Keeps at most `max_buffers`, the largest. Thread-safe.
//   HostBuffer   one buffer, move-only, that gives its memory back to the pool it came
//                from when it is dropped: no caller keeps a "spare" by hand.
#ifndef RLFLEET_LIBS_COMMON_HOST_BUFFER_H_
#define RLFLEET_LIBS_COMMON_HOST_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/huge_string.h"

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

class HostBuffer {
 public:
  HostBuffer() = default;
  // `bytes`, given back to `home` (may be null: freed) when dropped.
  explicit HostBuffer(std::string bytes, std::shared_ptr<BufferPool> home = nullptr)
      : bytes_(std::move(bytes)), home_(std::move(home)) {}
  // `length` bytes, not written (to be filled), in the largest buffer `pool` holds when
  // it is large enough, else in fresh memory (huge-page backed when large:
  // NewHugeString). Goes back to `pool` when dropped. A null pool: fresh memory, freed.
  static HostBuffer Allocate(const std::shared_ptr<BufferPool>& pool, uint64_t length) {
    return HostBuffer(ReuseOrNewHugeString(pool != nullptr ? pool->Take() : std::string(), length), pool);
  }

  HostBuffer(HostBuffer&& other) noexcept = default;
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      GiveBack();
      bytes_ = std::move(other.bytes_);
      home_ = std::move(other.home_);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { GiveBack(); }

  char* data() { return bytes_.data(); }
  const char* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }
  absl::string_view view() const { return bytes_; }
  // The bytes as a string, for code that reads one (the memory stays this buffer's).
  const std::string& str() const { return bytes_; }
  // The bytes, out of the pool's care (they are freed with the string).
  std::string Release() && {
    home_.reset();
    return std::move(bytes_);
  }

 private:
  void GiveBack() {
    if (home_ != nullptr) home_->Give(std::move(bytes_));
    bytes_ = std::string();
    home_.reset();
  }

  std::string bytes_;
  std::shared_ptr<BufferPool> home_;
};

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_HOST_BUFFER_H_
