// XXH64 and CRC-32C against reference values (xxhsum 0.8.1 -H1; the CRC-32C check value).
#include "libs/common/checksum.h"

#include <algorithm>
#include <cstring>
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

TEST(Checksum, BlockSumDigestIsXxh64OfEachBlocksWordSum) {
  // 1025 words: a full block of 1024 and a block of one.
  std::string bytes(4 * 1025, '\0');
  uint64_t sums[2] = {0, 0};
  for (int i = 0; i < 1025; ++i) {
    const uint32_t word = 2654435761u * static_cast<uint32_t>(i + 1);
    std::memcpy(&bytes[4 * i], &word, 4);
    sums[i / 1024] += word;
  }
  std::string expected;
  for (uint64_t sum : sums) {
    const uint32_t low = static_cast<uint32_t>(sum & 0xffffffffu);
    expected.append(reinterpret_cast<const char*>(&low), 4);
  }
  EXPECT_EQ(BlockSumDigest(bytes), Xxh64(expected));
  EXPECT_EQ(BlockSumDigest(""), Xxh64(""));
  // One changed word changes it; so does moving a word to another block.
  std::string changed = bytes;
  changed[4 * 700] ^= 1;
  EXPECT_NE(BlockSumDigest(changed), BlockSumDigest(bytes));
  std::string moved = bytes;
  std::swap_ranges(moved.begin(), moved.begin() + 4, moved.begin() + 4 * 1024);
  EXPECT_NE(BlockSumDigest(moved), BlockSumDigest(bytes));
}

}  // namespace
}  // namespace rlfleet::common
