// Safetensors images written from blobs or from views are the same bytes; parsing as
// views, blobs or header-only agrees; a malformed image is DATA_LOSS; huge strings are
// zeroed and sized.
#include "libs/model/safetensors.h"

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

// Written into an earlier image's memory when it fits: the same bytes, the same memory.
TEST(Safetensors, AnImageIsWrittenIntoReusedMemoryWhenItFits) {
  const auto blobs = Blobs();
  std::map<std::string, TensorView> views;
  for (const auto& [name, b] : blobs) views[name] = {b.dtype, b.shape, b.bytes};
  const std::string want = SerializeSafetensors(views);
  std::string old(want.size() + 100, 'z');
  const char* memory = old.data();
  std::string again = SerializeSafetensors(views, std::move(old));
  EXPECT_EQ(again, want);
  EXPECT_EQ(again.data(), memory);
  std::string small(10, 'z');
  EXPECT_EQ(SerializeSafetensors(views, std::move(small)), want);  // too small: new memory, same image
}

TEST(Safetensors, AMalformedImageIsDataLossInEveryParse) {
  std::string image = SerializeSafetensors(Blobs());
  image.resize(image.size() - 3);  // the last tensor's bytes cut short
  EXPECT_EQ(ParseSafetensors(image, "cut").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSafetensorsViews(image, "cut").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSafetensorsHeader(image, "cut").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSafetensors("short", "tiny").status().code(), absl::StatusCode::kDataLoss);
}

TEST(HugeString, IsZeroedAndSizedLargeOrSmall) {
  for (uint64_t n : {uint64_t{0}, uint64_t{100}, uint64_t{9} << 20}) {
    const std::string s = common::NewHugeString(n);
    ASSERT_EQ(s.size(), n);
    EXPECT_EQ(s.find_first_not_of('\0'), std::string::npos);
  }
}

}  // namespace
}  // namespace rlfleet::model
