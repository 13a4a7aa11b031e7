// The content digests v1::Digest names: XXH64 (seed 0) and CRC-32C (Castagnoli), for
// payloads that travel by TransferDescriptor (the receiver checks what it fetched).
#ifndef RLFLEET_LIBS_COMMON_CHECKSUM_H_
#define RLFLEET_LIBS_COMMON_CHECKSUM_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace rlfleet::common {

uint64_t Xxh64(absl::string_view data, uint64_t seed = 0);
uint32_t Crc32c(absl::string_view data);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_CHECKSUM_H_
