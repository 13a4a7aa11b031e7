// HfTokenizer's state and helpers, shared by its two translation units:
// hf_tokenizer_load.cc (tokenizer.json -> Impl) and hf_tokenizer.cc (encode, decode).
// Not part of the library's interface.
#ifndef RLFLEET_LIBS_MODEL_HF_TOKENIZER_IMPL_H_
#define RLFLEET_LIBS_MODEL_HF_TOKENIZER_IMPL_H_

#include <unicode/uregex.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "libs/model/hf_tokenizer.h"

namespace rlfleet::model::hf_internal {

// GPT-2's byte-level alphabet: every byte as one printable character (its UTF-8).
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  absl::flat_hash_map<std::string, uint8_t> byte_of;
  ByteAlphabet();
};
const ByteAlphabet& Alphabet();

// A compiled ICU regex, cloned per use (a URegularExpression matches one text at a
// time). Thread-safe.
class Regex {
 public:
  // INVALID_ARGUMENT (naming `where`) when `pattern` does not compile.
  static absl::StatusOr<std::shared_ptr<Regex>> Compile(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of every non-empty match in `text` (UTF-8).
  // RESOURCE_EXHAUSTED when one match runs past ICU's step limit or its backtracking
  // stack (a pattern that backtracks badly on this text), INTERNAL for other failures.
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Matches(absl::string_view text) const;

 private:
  explicit Regex(URegularExpression* re) : re_(re) {}
  URegularExpression* re_;
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

// The added tokens as a byte trie, to find the longest one starting at a position in
// one walk (a prompt of n bytes costs O(n), not O(n x added tokens)). Immutable after
// Build.
class AddedTokenTrie {
 public:
  void Build(const std::vector<AddedToken>& added);
  // The index (into Build's vector) of the longest added token that starts at text[i],
  // or -1.
  int32_t LongestAt(absl::string_view text, size_t i) const {
    if (!starts_[static_cast<uint8_t>(text[i])]) return -1;
    return Walk(text, i);
  }

 private:
  int32_t Walk(absl::string_view text, size_t i) const;
  std::array<bool, 256> starts_{};
  absl::flat_hash_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> node
  std::vector<int32_t> token_at_;                 // per node: an added token ending there, or -1
};

// Pre-tokenized pieces -> their ids, for pieces of at most kMaxWordBytes; at most
// kCapacity entries (a shard that fills is emptied, so the cache follows the text being
// encoded). Thread-safe: sharded, a mutex per shard.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kCapacity = 16384;

  // Appends the cached ids of `word` to `ids`; false when absent.
  bool Lookup(absl::string_view word, std::vector<int32_t>* ids) const;
  void Insert(absl::string_view word, const int32_t* ids, size_t n) const;

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words ABSL_GUARDED_BY(mu);
  };
  Shard& ShardOf(absl::string_view word) const;
  mutable std::array<Shard, kShards> shards_;
};

// One BPE merge: the rank (its index in model.merges) and the id of the token it makes.
struct Merge {
  int32_t rank;
  int32_t id;
};
inline uint64_t PairKey(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

}  // namespace rlfleet::model::hf_internal

namespace rlfleet::model {

struct HfTokenizer::Impl {
  std::string name;
  bool nfc = false;
  // The pre-tokenizers' splits, in order (each refines the pieces of the one before);
  // then the byte-level mapping.
  std::vector<std::shared_ptr<hf_internal::Regex>> splits;
  bool add_prefix_space = false;
  absl::flat_hash_map<std::string, int32_t> vocab;
  // (left id, right id) -> merge, as the tokenizers library keys its merges.
  absl::flat_hash_map<uint64_t, hf_internal::Merge> merges;
  std::array<int32_t, 256> byte_id{};  // the id of each byte's byte-level token
  bool ignore_merges = false;
  std::vector<hf_internal::AddedToken> added;  // longest first (at one position the longest wins)
  hf_internal::AddedTokenTrie added_trie;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  std::vector<const std::string*> token_of_id;  // vocabulary spellings by id (null: none)
  int32_t size = 0;
  hf_internal::WordCache cache;

  // Appends the ids of a stretch of text without added tokens.
  absl::Status EncodeStretch(absl::string_view text, std::vector<int32_t>* ids) const;
  // Appends the ids of one pre-tokenized piece (its bytes).
  absl::Status EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const;
  // Appends the BPE merges' result for `piece` (its bytes, at least one).
  void MergeBytes(absl::string_view piece, std::vector<int32_t>* ids) const;
};

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_HF_TOKENIZER_IMPL_H_
