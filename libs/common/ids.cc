#include "libs/common/ids.h"

#include <cstdint>
#include <fstream>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace rlfleet::common {

std::string NewId(absl::string_view prefix) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen ABSL_GUARDED_BY(mu) = new absl::BitGen();
  uint64_t bits;
  {
    absl::MutexLock lock(&mu);
    bits = absl::Uniform<uint64_t>(*gen);
  }
  return absl::StrFormat("%s-%016x", prefix, bits);
}

absl::Status ValidateId(absl::string_view field, absl::string_view id) {
  if (id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  if (id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", id.size(), " bytes; the limit is ", kMaxIdBytes));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has an invalid character 0x%02x at byte %d (allowed: A-Z a-z 0-9 . _ : -)", field,
                          static_cast<unsigned char>(c), i));
    }
  }
  return absl::OkStatus();
}

const std::string& HostId() {
  static const std::string* const id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return new std::string(absl::StripAsciiWhitespace(line));
  }();
  return *id;
}

}  // namespace rlfleet::common
