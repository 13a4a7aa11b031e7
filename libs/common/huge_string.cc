#include "libs/common/huge_string.h"

#include <sys/mman.h>

namespace rlfleet::common {

std::string NewHugeString(uint64_t length) {
  std::string out;
  out.reserve(length);
  constexpr uint64_t kHuge = 2 << 20;
  if (length >= 4 * kHuge) {
    // The allocation is fresh (untouched): ask for huge pages on its aligned interior.
    const auto begin = reinterpret_cast<uintptr_t>(out.data());
    const uintptr_t first = (begin + kHuge - 1) / kHuge * kHuge;
    const uintptr_t last = (begin + length) / kHuge * kHuge;
    if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
  out.resize(length);
  return out;
}

std::string ReuseOrNewHugeString(std::string reuse, uint64_t length) {
  if (reuse.capacity() >= length) {
    reuse.resize(length);
    return reuse;
  }
  reuse = std::string();
  return NewHugeString(length);
}

}  // namespace rlfleet::common
