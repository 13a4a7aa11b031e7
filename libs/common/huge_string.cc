#include "libs/common/huge_string.h"

#include <sys/mman.h>

#include <cstring>

namespace rlfleet::common {
namespace {

// `out`'s length set to `length` (within its capacity) without writing the bytes.
// This file is built as C++23 (BUILD.bazel) for resize_and_overwrite; elsewhere (the
// fuzz and thread-safety builds, C++17) resize writes zeros.
void SetLengthUnwritten(std::string& out, uint64_t length) {
#if defined(__cpp_lib_string_resize_and_overwrite)
  out.resize_and_overwrite(length, [](char*, size_t n) { return n; });
#else
  out.resize(length);
#endif
}

}  // namespace

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
  SetLengthUnwritten(out, length);
  return out;
}

std::string PrefaultedHugeString(uint64_t length) {
  std::string out = NewHugeString(length);
  std::memset(out.data(), 0, out.size());
  return out;
}

std::string ReuseOrNewHugeString(std::string reuse, uint64_t length) {
  if (reuse.capacity() >= length) {
    SetLengthUnwritten(reuse, length);
    return reuse;
  }
  reuse = std::string();
  return NewHugeString(length);
}

}  // namespace rlfleet::common
