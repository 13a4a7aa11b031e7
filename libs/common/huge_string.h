// Large byte buffers that are filled at once (a weight version, a pulled payload):
// strings whose memory the kernel backs with huge pages where it allows (madvise), so
// that filling 400 MiB costs ~200 page faults instead of ~100000.
#ifndef RLFLEET_LIBS_COMMON_HUGE_STRING_H_
#define RLFLEET_LIBS_COMMON_HUGE_STRING_H_

#include <cstdint>
#include <string>

namespace rlfleet::common {

// A string of `length` bytes, huge-page backed when it is large (>= 8 MiB), whose
// bytes are NOT written: for a buffer about to be filled (a fetch, a serialised
// image), so that nothing writes it twice. Fresh memory reads as zero (the kernel's
// pages) but is not faulted in until it is filled. (With a C++17 standard library
// without resize_and_overwrite it falls back to zero-filling.)
std::string NewHugeString(uint64_t length);
// NewHugeString with every page written now (zeros): memory kept to be filled later,
// faulted in ahead of time so that the fill does not pay for it.
std::string PrefaultedHugeString(uint64_t length);
// `reuse`'s memory holding `length` bytes when its capacity allows (the contents are
// what was there, bytes past its old size unwritten; no new memory), else
// NewHugeString(length) (`reuse` released first). For writing version after version
// into memory faulted in already.
std::string ReuseOrNewHugeString(std::string reuse, uint64_t length);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_HUGE_STRING_H_
