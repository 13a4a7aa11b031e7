// A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, Llama 3, Qwen2 /
// Qwen2.5 / Qwen3): the ids the `tokenizers` library gives, and text back from ids.
//
// Encode follows tokenizers' pipeline: added tokens (special or not) are found in the
// text first and kept whole; each stretch between them is normalized (none or NFC),
// split by the pre-tokenizers (Split with a regex, behaviour Isolated; ByteLevel, with
// or without its own GPT-2 split), mapped byte by byte to the byte-level alphabet and
// merged by the BPE merges in rank order (or taken whole when `ignore_merges` and the
// piece is in the vocabulary, as Llama 3's). Decode maps tokens back to bytes and reads
// them as UTF-8 with each maximal invalid subsequence replaced by U+FFFD, as
// tokenizers does; an id with no token (past the vocabulary: a model's embedding
// often has more rows) decodes to nothing, as there. Regexes and NFC run on ICU.
//
// Merging is the library's O(n log n) algorithm (a priority queue over merge ranks), with
// a bounded cache of pre-tokenized words, so a 100,000-letter word costs milliseconds.
// Loading streams the file's vocabulary and merges (one SAX pass, depth-bounded).
//
// A tokenizer.json using anything else (another model type, byte fallback, another
// normalizer or pre-tokenizer, an added token with lstrip / rstrip / single_word) is
// refused at load with an error naming it, never half-supported. Thread-safe after load.
#ifndef RLFLEET_LIBS_MODEL_HF_TOKENIZER_H_
#define RLFLEET_LIBS_MODEL_HF_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/model/utf8.h"  // Utf8Lossy

namespace rlfleet::model {

class HfTokenizer {
 public:
  // The longest text Encode takes (16 MiB: millions of tokens, past any context window).
  static constexpr size_t kMaxEncodeBytes = size_t{16} << 20;

  // From tokenizer.json's text (`name` names it in errors). INVALID_ARGUMENT naming
  // what does not parse or is not supported.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(absl::string_view json, const std::string& name);
  // From a file, or from DIR/tokenizer.json when `path` is a directory (a model
  // directory). NOT_FOUND when absent.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromFile(const std::string& path);
  ~HfTokenizer();

  // The ids of `text`, as tokenizers' `encode(text, add_special_tokens=False).ids`.
  // INVALID_ARGUMENT for text that is not UTF-8 or longer than kMaxEncodeBytes;
  // RESOURCE_EXHAUSTED when a pre-tokenizer regex backtracks past ICU's per-match limit
  // on this text (none of Qwen's, Llama 3's or GPT-2's patterns does).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;
  // The text of `ids`, as tokenizers' `decode(ids, skip_special_tokens)`.
  // INVALID_ARGUMENT naming an id that is neither in the vocabulary nor added.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const;
  // The id of a token (its vocabulary spelling, or an added token's content).
  std::optional<int32_t> TokenId(absl::string_view token) const;
  // Whether `id` is an added token marked special (<|im_end|>, <|eot_id|>, ...).
  bool IsSpecial(int32_t id) const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_HF_TOKENIZER_H_
