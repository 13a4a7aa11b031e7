// The content digests v1::Digest names: XXH64 (seed 0) and CRC-32C (Castagnoli), for
// payloads that travel by TransferDescriptor (the receiver checks what it fetched).
#ifndef RLFLEET_LIBS_COMMON_CHECKSUM_H_
#define RLFLEET_LIBS_COMMON_CHECKSUM_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace rlfleet::common {

uint64_t Xxh64(absl::string_view data, uint64_t seed = 0);
uint32_t Crc32c(absl::string_view data);

// A digest a GPU computes in one read pass (libs/model's DeviceImage): the bytes as
// little-endian 32-bit words in blocks of 1024 words (4 KiB; the last may be short),
// each block's words summed modulo 2^32, and XXH64 over those sums (4 bytes each,
// little-endian). It catches any change to a block that alters its sum (every single
// changed word does); it is a check of memory that stays on one host, not a MAC.
// `data.size()` must be a multiple of 4.
uint64_t BlockSumDigest(absl::string_view data);
inline constexpr int kBlockSumWords = 1024;

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_CHECKSUM_H_
