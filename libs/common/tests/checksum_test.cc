// XXH64 and CRC-32C against reference values (xxhsum 0.8.1 -H1; the CRC-32C check value).
#include "libs/common/checksum.h"

#include <string>

#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

TEST(Checksum, Xxh64MatchesTheReference) {
  EXPECT_EQ(Xxh64(""), 0xef46db3751d8e999ull);
  EXPECT_EQ(Xxh64("a"), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(Xxh64("abc"), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(Xxh64("The quick brown fox jumps over the lazy dog"), 0x0b242d361fda71bcull);
  std::string bytes(100, '\0');
  for (int i = 0; i < 100; ++i) bytes[i] = static_cast<char>(i);
  EXPECT_EQ(Xxh64(bytes), 0x6ac1e58032166597ull);
}

TEST(Checksum, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

}  // namespace
}  // namespace rlfleet::common
