#include "libs/common/hmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>
#include <iostream>

namespace rlfleet::common {

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  const unsigned char* ok = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                                 reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &md_len);
  if (ok == nullptr || md_len != kHmacSha256Bytes) {
    std::cerr << "HMAC-SHA256 failed in libcrypto" << std::endl;
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(md), md_len);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace rlfleet::common
