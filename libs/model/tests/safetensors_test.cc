// Safetensors images written from blobs or from views are the same bytes; parsing as
// views, blobs or header-only agrees; a malformed image is DATA_LOSS; huge strings are
// zeroed and sized.
#include "libs/model/safetensors.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"
#include "libs/common/huge_string.h"

namespace rlfleet::model {
namespace {

std::map<std::string, TensorBlob> Blobs() {
  std::map<std::string, TensorBlob> t;
  t["a.weight"] = {"F32", {3, 4}, std::string(48, '\x11')};
  t["b"] = {"BF16", {5}, std::string(10, '\x22')};
  t["c.bias"] = {"F32", {7}, std::string(28, '\x33')};
  return t;
}

TEST(Safetensors, ViewsAndBlobsWriteTheSameImageAndParseBackAlike) {
  const auto blobs = Blobs();
  std::map<std::string, TensorView> views;
  for (const auto& [name, b] : blobs) views[name] = {b.dtype, b.shape, b.bytes};
  const std::string image = SerializeSafetensors(blobs);
  EXPECT_EQ(SerializeSafetensors(views), image);
  uint64_t header = 0;
  std::memcpy(&header, image.data(), 8);
  EXPECT_EQ(header % 8, 0u);  // the data stays 8-byte aligned

  auto parsed = ParseSafetensors(image, "image");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto as_views = ParseSafetensorsViews(image, "image");
  ASSERT_TRUE(as_views.ok());
  auto header_only = ParseSafetensorsHeader(image, "image");
  ASSERT_TRUE(header_only.ok());
  ASSERT_EQ(parsed->size(), blobs.size());
  for (const auto& [name, b] : blobs) {
    EXPECT_EQ((*parsed)[name].bytes, b.bytes) << name;
    EXPECT_EQ((*parsed)[name].shape, b.shape) << name;
    EXPECT_EQ((*as_views)[name].bytes, b.bytes) << name;
    // A view points into the image itself: nothing was copied.
    EXPECT_GE((*as_views)[name].bytes.data(), image.data());
    EXPECT_LT((*as_views)[name].bytes.data(), image.data() + image.size());
    EXPECT_TRUE((*header_only)[name].bytes.empty());
    EXPECT_EQ((*header_only)[name].dtype, b.dtype);
  }
}

// Written into a pooled buffer's memory when it fits: the same bytes, the same memory.
TEST(Safetensors, AnImageIsWrittenIntoPooledMemoryWhenItFits) {
  const auto blobs = Blobs();
  std::map<std::string, TensorView> views;
  for (const auto& [name, b] : blobs) views[name] = {b.dtype, b.shape, b.bytes};
  const std::string want = SerializeSafetensors(views);
  auto pool = std::make_shared<common::BufferPool>(1);
  std::string old(want.size() + 100, 'z');
  const char* memory = old.data();
  pool->Give(std::move(old));
  common::HostBuffer again = SerializeSafetensors(views, pool);
  EXPECT_EQ(again.str(), want);
  EXPECT_EQ(again.data(), memory);
  again = common::HostBuffer();  // (dropped: back to the pool)
  EXPECT_EQ(pool->size(), 1u);
  common::HostBuffer taken = common::HostBuffer::Allocate(pool, 1);  // (empties the pool)
  pool->Give(std::string(100, 'z'));
  EXPECT_EQ(SerializeSafetensors(views, pool).str(), want);  // too small: new memory, same image
}

TEST(Safetensors, AMalformedImageIsDataLossInEveryParse) {
  std::string image = SerializeSafetensors(Blobs());
  image.resize(image.size() - 3);  // the last tensor's bytes cut short
  EXPECT_EQ(ParseSafetensors(image, "cut").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSafetensorsViews(image, "cut").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSafetensorsHeader(image, "cut").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSafetensors("short", "tiny").status().code(), absl::StatusCode::kDataLoss);
}

// An image of `header` (padded to 8 bytes) followed by `data`.
std::string Image(std::string header, const std::string& data) {
  while (header.size() % 8 != 0) header += ' ';
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

absl::StatusCode ParseCode(const std::string& image) {
  const absl::StatusCode code = ParseSafetensorsViews(image, "image").status().code();
  EXPECT_EQ(ParseSafetensorsHeader(image, "image").status().code(), code);
  return code;
}

TEST(Safetensors, DeeplyNestedMetadataIsDataLossNotAStackOverflow) {
  // A million open brackets: a recursive reader would overflow its stack.
  const std::string deep(1 << 20, '[');
  EXPECT_EQ(ParseCode(Image("{\"__metadata__\":" + deep + "}", "")), absl::StatusCode::kDataLoss);
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"k\":";
    return s;
  }();
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"extra\":" + objects + "1}}", "")), absl::StatusCode::kDataLoss);
  // Nesting within the bound (the metadata object is one level) is skipped, as are
  // unknown keys.
  std::string nested =
      std::string(kMaxSafetensorsJsonDepth - 1, '[') + "1" + std::string(kMaxSafetensorsJsonDepth - 1, ']');
  // (the views point into the image: it outlives them)
  const std::string image = Image("{\"__metadata__\":{\"a\":" + nested +
                                      ",\"b\":{}},\"x\":{\"dtype\":\"U8\",\"shape\":[2],"
                                      "\"data_offsets\":[0,2],\"note\":{\"k\":[\"v\",{}]}}}",
                                  "ab");
  auto ok = ParseSafetensorsViews(image, "image");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["x"].bytes, "ab");
  std::string too_deep =
      std::string(kMaxSafetensorsJsonDepth + 1, '[') + std::string(kMaxSafetensorsJsonDepth + 1, ']');
  EXPECT_EQ(ParseCode(Image("{\"__metadata__\":" + too_deep + "}", "")), absl::StatusCode::kDataLoss);
}

TEST(Safetensors, AShapeWhoseProductOverflowsIsRefused) {
  // 2^62 x 2^2 x 4 bytes wraps to 0 in 64 bits: it must not match data_offsets [0,0].
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                            "\"data_offsets\":[0,0]}}",
                            "")),
            absl::StatusCode::kDataLoss);
  // 2^61 x 8 wraps to 0 as well; so does a product wrapping to exactly the span.
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
                            "\"data_offsets\":[0,0]}}",
                            "")),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967297,4294967297],"
                            "\"data_offsets\":[0,1]}}",  // (2^32+1)^2 = 2^64 + 2^33 + 1
                            "x")),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"dtype\":\"U8\",\"shape\":[-1,-1],\"data_offsets\":[0,1]}}", "x")),
            absl::StatusCode::kDataLoss);
  // A zero dimension makes an empty tensor, however large the others.
  auto empty = ParseSafetensorsViews(
      Image("{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,0],\"data_offsets\":[0,0]}}", ""), "image");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)["t"].bytes.empty());
  // More dimensions than kMaxSafetensorsRank.
  std::string dims = "1";
  for (size_t i = 0; i < kMaxSafetensorsRank; ++i) dims += ",1";
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"dtype\":\"U8\",\"shape\":[" + dims + "],\"data_offsets\":[0,1]}}", "x")),
            absl::StatusCode::kDataLoss);
}

TEST(Safetensors, OffsetsHeaderLengthAndFieldsAreChecked) {
  auto with = [](const std::string& tensor) { return Image("{\"t\":{" + tensor + "}}", "abcd"); };
  // Within the file and matching dtype x shape: fine.
  EXPECT_EQ(ParseCode(with("\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]")), absl::StatusCode::kOk);
  for (const std::string bad : {
           "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]",                    // past the end
           "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[9223372036854775807,1]",  // reversed
           "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]",
           "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]",
           "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999]",  // not an int64
           "\"dtype\":\"X9\",\"shape\":[2],\"data_offsets\":[0,2]",                     // unknown dtype
           "\"shape\":[2],\"data_offsets\":[0,2]",                                      // no dtype
           "\"dtype\":\"U8\",\"data_offsets\":[0,2]",                                   // no shape
           "\"dtype\":\"U8\",\"shape\":[2]",                                            // no offsets
           "\"dtype\":\"U8\",\"shape\":[2],\"shape\":[4],\"data_offsets\":[0,2]",       // twice
       }) {
    EXPECT_EQ(ParseCode(with(bad)), absl::StatusCode::kDataLoss) << bad;
  }
  // A tensor named twice; trailing bytes after the object.
  EXPECT_EQ(ParseCode(Image("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                            "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                            "ab")),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseCode(Image("{} {}", "")), absl::StatusCode::kDataLoss);
  // A header length past the file or past the format's bound, including one that
  // would wrap 8 + length.
  for (uint64_t n : {uint64_t{100}, kMaxSafetensorsHeaderBytes + 1, ~uint64_t{0}, ~uint64_t{0} - 7}) {
    std::string image(8, '\0');
    std::memcpy(image.data(), &n, 8);
    image += "{}      ";
    EXPECT_EQ(ParseCode(image), absl::StatusCode::kDataLoss) << n;
  }
}

TEST(Safetensors, ReadingAFileThatIsNotRegularIsRefusedBeforeReading) {
  // /dev/zero would never end; a directory is not a file.
  EXPECT_EQ(ReadSafetensors("/dev/zero").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSafetensors("/").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSafetensors("/nonexistent/x.safetensors").status().code(), absl::StatusCode::kNotFound);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/w.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, Blobs()).ok());
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)["b"].bytes, Blobs()["b"].bytes);
}

// Found by fuzz/safetensors_header_fuzzer: a name holding `"` or `\` was written
// unescaped, so the image did not parse back.
TEST(Safetensors, NamesWithQuotesAndBackslashesRoundTrip) {
  std::map<std::string, TensorBlob> t;
  t["q\"uote\\back"] = {"U8", {2}, "ab"};
  t["\\"] = {"U8", {1}, "c"};
  auto parsed = ParseSafetensors(SerializeSafetensors(t), "image");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)["q\"uote\\back"].bytes, "ab");
  EXPECT_EQ((*parsed)["\\"].bytes, "c");
}

TEST(HugeString, IsSizedLargeOrSmallAndPrefaultedIsZeroed) {
  for (uint64_t n : {uint64_t{0}, uint64_t{100}, uint64_t{9} << 20}) {
    std::string s = common::NewHugeString(n);
    ASSERT_EQ(s.size(), n);
    if (n > 0) s[n - 1] = 'x';  // (its bytes are ours to fill)
    const std::string z = common::PrefaultedHugeString(n);
    ASSERT_EQ(z.size(), n);
    EXPECT_EQ(z.find_first_not_of('\0'), std::string::npos);
  }
  // A new buffer is not written (its pages are not faulted in until filled: the fetch
  // that fills it pays once); a prefaulted one is.
  auto faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  };
  const long before = faults();
  std::string fresh = common::NewHugeString(uint64_t{64} << 20);
  const long unwritten = faults() - before;
  std::string prefaulted = common::PrefaultedHugeString(uint64_t{64} << 20);
  const long written = faults() - before - unwritten;
  EXPECT_LT(unwritten, 8) << "NewHugeString wrote its 64 MiB (zero-filled?)";
  EXPECT_GE(written, 30) << "PrefaultedHugeString did not touch its pages";
  // Reused memory keeps its capacity and what was written in it.
  std::string first = common::NewHugeString(1000);
  std::memset(first.data(), 'a', first.size());
  const char* where = first.data();
  std::string again = common::ReuseOrNewHugeString(std::move(first), 600);
  EXPECT_EQ(again.data(), where);
  EXPECT_EQ(again, std::string(600, 'a'));
  again = common::ReuseOrNewHugeString(std::move(again), 1000);  // back up to the capacity
  EXPECT_EQ(again.data(), where);
  EXPECT_EQ(again.size(), 1000u);
}

}  // namespace
}  // namespace rlfleet::model
