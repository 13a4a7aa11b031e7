// tokenizer.json byte-level BPE against the `tokenizers` library's own ids: two
// tokenizers trained by libs/model/reference/make_hf_fixtures.py with Qwen2's and
// Llama 3's pre-tokenizers, and 16 texts (the empty string, unicode, runs of spaces
// and newlines, special tokens in the text, unnormalized text, long runs). Then the
// priority-queue merging against the plain algorithm it replaced (lowest rank, leftmost
// first, rescanning every pair per merge) on thousands of words; 100,000-character
// inputs; the word cache under threads; and what loading refuses.
#include "libs/model/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <unordered_map>

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

// The merging HfTokenizer did before the priority queue, as a reference: merge the
// adjacent pair of lowest rank (the leftmost among equals) until none merges. For pieces
// of ASCII letters with at most a leading space (which the byte-level alphabet spells
// as U+0120).
class PlainBpe {
 public:
  explicit PlainBpe(const nlohmann::json& tokenizer) {
    const nlohmann::json& model = tokenizer["model"];
    ignore_merges_ = model.value("ignore_merges", false);
    for (const auto& [token, id] : model["vocab"].items()) vocab_[token] = id.get<int32_t>();
    int32_t rank = 0;
    for (const auto& m : model["merges"])
      rank_.emplace(std::make_pair(m[0].get<std::string>(), m[1].get<std::string>()), rank++);
  }
  std::vector<int32_t> Encode(const std::string& piece) const {
    std::vector<std::string> symbols;
    std::string whole;
    for (char c : piece) {
      symbols.push_back(c == ' ' ? "\xC4\xA0" : std::string(1, c));
      whole += symbols.back();
    }
    if (ignore_merges_ && vocab_.count(whole)) return {vocab_.at(whole)};
    while (symbols.size() > 1) {
      int32_t best = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = rank_.find(std::make_pair(symbols[i], symbols[i + 1]));
        if (it != rank_.end() && (best < 0 || it->second < best)) {
          best = it->second;
          at = i;
        }
      }
      if (best < 0) break;
      symbols[at] += symbols[at + 1];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    std::vector<int32_t> ids;
    for (const std::string& s : symbols) ids.push_back(vocab_.at(s));
    return ids;
  }
  // The vocabulary's tokens made of ASCII letters only (to build words that merge a lot).
  std::vector<std::string> LetterTokens() const {
    std::vector<std::string> out;
    for (const auto& [token, id] : vocab_) {
      if (std::all_of(token.begin(), token.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); })) {
        out.push_back(token);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> vocab_;
  std::map<std::pair<std::string, std::string>, int32_t> rank_;
};

TEST_P(HfTokenizerStyle, MergesAsThePlainAlgorithmDid) {
  auto tokenizer = HfTokenizer::FromFile(Fixture(GetParam(), "tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const PlainBpe plain(nlohmann::json::parse(Read(Fixture(GetParam(), "tokenizer.json"))));
  const std::vector<std::string> tokens = plain.LetterTokens();
  ASSERT_GT(tokens.size(), 100u);
  std::mt19937 rng(43);
  int multi_token_words = 0;
  for (int n = 0; n < 3000; ++n) {
    // A letters-only word (one pre-tokenized piece), with a leading space half the time:
    // vocabulary tokens glued together, or random letters.
    std::string word = n % 2 ? " " : "";
    const size_t length = 1 + rng() % (n < 2900 ? 24 : 400);
    while (word.size() < length) {
      if (rng() % 4) {
        word += tokens[rng() % tokens.size()];
      } else {
        word += static_cast<char>((rng() % 2 ? 'a' : 'A') + rng() % 26);
      }
    }
    auto ids = (*tokenizer)->Encode(word);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_EQ(*ids, plain.Encode(word)) << "word: `" << word << "`";
    multi_token_words += ids->size() > 1;
    // Again (now from the word cache): the same ids.
    ASSERT_EQ(*(*tokenizer)->Encode(word), *ids);
  }
  EXPECT_GT(multi_token_words, 1000);
}

TEST_P(HfTokenizerStyle, HundredThousandCharacterInputsEncodeAndDecodeBack) {
  auto tokenizer = HfTokenizer::FromFile(Fixture(GetParam(), "tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const PlainBpe plain(nlohmann::json::parse(Read(Fixture(GetParam(), "tokenizer.json"))));
  std::mt19937 rng(7);
  std::string letters_mixed;
  for (int i = 0; i < 100000; ++i) letters_mixed += static_cast<char>('a' + rng() % 26);
  std::vector<std::string> tokens = plain.LetterTokens();
  std::sort(tokens.begin(), tokens.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  std::string repeated;  // the longest letters-only token, over and over: merges everywhere
  while (repeated.size() < 100000) repeated += tokens[0];
  // Each one pre-tokenized piece of 100,000 letters: the plain algorithm took minutes.
  for (const std::string& text : {std::string(100000, 'a'), letters_mixed, repeated}) {
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_LE(ids->size(), text.size());
    EXPECT_EQ(*(*tokenizer)->Decode(*ids), text);
  }
  EXPECT_LT((*tokenizer)->Encode(repeated)->size(), repeated.size() / 2);
  // Agreement with the plain algorithm on a piece long enough to matter (it is O(n^2)).
  const std::string long_word = letters_mixed.substr(0, 3000);
  EXPECT_EQ(*(*tokenizer)->Encode(long_word), plain.Encode(long_word));
  // Runs the pre-tokenizer's regex backtracks on, and other long runs.
  for (const std::string& text : {std::string(100000, ' ') + "x", std::string(100000, ' '), std::string(100000, '\n'),
                                  std::string(50000, '\r') + std::string(50000, '\n'), std::string(100000, '7'),
                                  std::string(100000, '!'), std::string(50000, ' ') + std::string(50000, '\n') + "x"}) {
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*(*tokenizer)->Decode(*ids), text);
  }
  auto huge = (*tokenizer)->Encode(std::string(HfTokenizer::kMaxEncodeBytes + 1, 'a'));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(huge.status().message(), "longer than")) << huge.status();
}

TEST_P(HfTokenizerStyle, ThreadsShareTheWordCache) {
  auto tokenizer = HfTokenizer::FromFile(Fixture(GetParam(), "tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<std::string> texts;
  std::mt19937 rng(11);
  for (int t = 0; t < 40; ++t) {
    std::string text;
    for (int w = 0; w < 400; ++w) {
      text += w % 7 ? " " : "\n";
      const int length = 1 + rng() % 9;
      for (int c = 0; c < length; ++c) text += static_cast<char>('a' + rng() % 6);
    }
    texts.push_back(text + "<|im_end|>");
  }
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& text : texts) expected.push_back(*(*tokenizer)->Encode(text));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = (*tokenizer)->Encode(texts[(i + k) % texts.size()]);
          mismatches[k] += !ids.ok() || *ids != expected[(i + k) % texts.size()];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(HfTokenizerLoad, MembersInAnyOrderAndRefusals) {
  const std::string good = Read(Fixture("qwen2", "tokenizer.json"));
  auto reference = HfTokenizer::FromJson(good, "tokenizer.json");
  ASSERT_TRUE(reference.ok()) << reference.status();
  // nlohmann::json writes members sorted: model.merges before model.vocab.
  const nlohmann::json parsed = nlohmann::json::parse(good);
  auto reordered = HfTokenizer::FromJson(parsed.dump(), "sorted.json");
  ASSERT_TRUE(reordered.ok()) << reordered.status();
  const std::string text = "Hello world, the quick brown fox: 12345 <|im_end|> \xC3\xA9t\xC3\xA9";
  EXPECT_EQ(*(*reordered)->Encode(text), *(*reference)->Encode(text));

  auto expect_error = [](const std::string& json, const std::string& needle) {
    auto t = HfTokenizer::FromJson(json, "t.json");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(absl::StrContains(t.status().message(), needle)) << t.status();
  };
  nlohmann::json bad = parsed;
  bad["model"]["merges"].push_back({"zzzq", "qqqz"});
  expect_error(bad.dump(), "is not in the vocabulary");
  bad = parsed;
  bad["model"]["merges"].push_back({"a"});
  expect_error(bad.dump(), "is not two tokens");
  bad = parsed;
  bad["model"]["vocab"] = nlohmann::json::array();
  expect_error(bad.dump(), "model.vocab wants an object");
  bad = parsed;
  bad["model"]["vocab"]["extra"] = "not an id";
  expect_error(bad.dump(), "is not an id");
  bad = parsed;
  bad["model"].erase("merges");
  expect_error(bad.dump(), "model.merges wants an array");
  // Nesting is bounded while parsing (no recursion over a hostile file).
  expect_error("{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "nested deeper than");
  expect_error(good.substr(0, good.size() / 2), "not JSON");
}

TEST(HfTokenizerLoad, ARegexThatBacktracksWithoutEndIsCutOff) {
  nlohmann::json t = nlohmann::json::parse(Read(Fixture("llama3", "tokenizer.json")));
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a+)+$";
  auto tokenizer = HfTokenizer::FromJson(t.dump(), "t.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_TRUE((*tokenizer)->Encode("aaaa").ok());
  auto ids = (*tokenizer)->Encode(std::string(40, 'a') + "b");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kResourceExhausted) << ids.status();
}

}  // namespace
}  // namespace rlfleet::model
