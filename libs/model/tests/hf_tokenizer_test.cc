// tokenizer.json byte-level BPE against the `tokenizers` library's own ids: two
// tokenizers trained by libs/model/reference/make_hf_fixtures.py with Qwen2's and
// Llama 3's pre-tokenizers, and 16 texts (the empty string, unicode, runs of spaces
// and newlines, special tokens in the text, unnormalized text, long runs).
#include "libs/model/hf_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace rlfleet::model {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string Fixture(const std::string& style, const std::string& file) {
  return rlfleet::testing::RunfilePath("libs/model/testdata/hf/tokenizer_" + style + "/" + file);
}

class HfTokenizerStyle : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Style, HfTokenizerStyle, ::testing::Values("qwen2", "llama3"));

TEST_P(HfTokenizerStyle, IdsAndTextAreTheTokenizersLibrarys) {
  auto tokenizer = HfTokenizer::FromFile(Fixture(GetParam(), "tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 900);
  const nlohmann::json expected = nlohmann::json::parse(Read(Fixture(GetParam(), "expected.json")));
  ASSERT_EQ(expected["cases"].size(), 16u);
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"];
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    auto decoded = (*tokenizer)->Decode(c["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
  }
  for (const auto& c : expected["decode_cases"]) {  // (invalid UTF-8 among them)
    auto decoded = (*tokenizer)->Decode(c["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>()) << c["ids"].dump();
  }
  // Special tokens: found by content, skipped on request.
  const auto im_end = (*tokenizer)->TokenId("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_TRUE((*tokenizer)->IsSpecial(*im_end));
  auto ids = (*tokenizer)->Encode("hi<|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*(*tokenizer)->Decode(*ids, /*skip_special_tokens=*/true), "hi");
  // An id past the vocabulary (a model's padded embedding rows) decodes to nothing, as
  // tokenizers' decode skips it; a negative id is an error.
  std::vector<int32_t> padded = *ids;
  padded.insert(padded.begin() + 1, 1 << 20);
  EXPECT_EQ(*(*tokenizer)->Decode(padded, /*skip_special_tokens=*/true), "hi");
  EXPECT_EQ((*tokenizer)->Decode({-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*tokenizer)->Encode("bad \xC3 utf-8").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Utf8Lossy, ReplacesEachMaximalSubpartOnce) {
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("\xE4"), "\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xE4\xB8"), "\xEF\xBF\xBD");  // a truncated 3-byte sequence: one
  EXPECT_EQ(Utf8Lossy("\xE4\xB8"
                      "a"),
            "\xEF\xBF\xBD"
            "a");                                                                // ... before a valid byte
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // lone continuation bytes: one each
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: three
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x99\x82"), "\xF0\x9F\x99\x82");
}

TEST(HfTokenizerErrors, UnsupportedTokenizersAreNamed) {
  const std::string good = Read(Fixture("qwen2", "tokenizer.json"));
  auto expect_error = [&](const std::string& from, const std::string& to, const std::string& needle) {
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    auto t = HfTokenizer::FromJson(text, "tokenizer.json");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(absl::StrContains(t.status().message(), needle)) << t.status();
  };
  expect_error("\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "WordPiece");
  expect_error("\"byte_fallback\": false", "\"byte_fallback\": true", "byte_fallback");
  expect_error("\"type\": \"NFC\"", "\"type\": \"NFKC\"", "NFKC");
  expect_error("\"behavior\": \"Isolated\"", "\"behavior\": \"MergedWithPrevious\"", "MergedWithPrevious");
  expect_error("\"rstrip\": false", "\"rstrip\": true", "rstrip");
  expect_error("\"Regex\": \"", "\"Regex\": \"(", "does not compile");
  EXPECT_EQ(HfTokenizer::FromJson("{", "t.json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HfTokenizer::FromFile("/nonexistent/tokenizer.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rlfleet::model
