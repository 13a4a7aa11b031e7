// HfTokenizer's encode and decode (hf_tokenizer_load.cc reads tokenizer.json).
//
// BPE merging is the tokenizers library's (tokenizers/src/models/bpe/word.rs,
// merge_all): the piece's symbols in a linked list, the mergeable adjacent pairs in a
// priority queue by (rank, position), a popped pair applied only if it is still there;
// O(n log n) in the piece's length, so one 100,000-letter word costs milliseconds, not
// the minutes of rescanning every pair per merge.
#include "libs/model/hf_tokenizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/utext.h>

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/model/hf_tokenizer_impl.h"
#include "libs/model/utf8.h"

namespace rlfleet::model {

namespace hf_internal {

// ICU's per-match limit, in its match-engine steps (about 0.15 ms each on this machine's
// kind, so ~0.15 s for one match): the patterns tokenizers use match in linear time and
// stay far below it; a pattern that backtracks catastrophically on some text fails with
// RESOURCE_EXHAUSTED instead of holding a thread.
constexpr int32_t kRegexStepLimit = 1000;

ByteAlphabet::ByteAlphabet() {
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    AppendUtf8(&of_byte[b], printable[b] ? static_cast<char32_t>(b) : next++);
    byte_of[of_byte[b]] = static_cast<uint8_t>(b);
  }
}

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

absl::StatusOr<std::shared_ptr<Regex>> Regex::Compile(const std::string& pattern, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse{};
  UText* text = utext_openUTF8(nullptr, pattern.data(), static_cast<int64_t>(pattern.size()), &status);
  URegularExpression* re = uregex_openUText(text, 0, &parse, &status);
  utext_close(text);
  if (U_FAILURE(status)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the regex `", pattern, "` does not compile (",
                                                   u_errorName(status), " at offset ", parse.offset, ")"));
  }
  return std::shared_ptr<Regex>(new Regex(re));
}

Regex::~Regex() { uregex_close(re_); }

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Regex::Matches(absl::string_view text) const {
  UErrorCode status = U_ZERO_ERROR;
  URegularExpression* re = uregex_clone(re_, &status);
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  uregex_setUText(re, ut, &status);
  uregex_setTimeLimit(re, kRegexStepLimit, &status);
  std::vector<std::pair<size_t, size_t>> out;
  while (U_SUCCESS(status) && uregex_findNext(re, &status)) {
    const int64_t s = uregex_start64(re, 0, &status), e = uregex_end64(re, 0, &status);
    if (U_SUCCESS(status) && e > s) out.emplace_back(static_cast<size_t>(s), static_cast<size_t>(e));
  }
  uregex_close(re);
  utext_close(ut);
  if (status == U_REGEX_TIME_OUT || status == U_REGEX_STACK_OVERFLOW) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the pre-tokenizer's regex gave up on this text (", u_errorName(status), ")"));
  }
  if (U_FAILURE(status)) return absl::InternalError(absl::StrCat("regex match failed: ", u_errorName(status)));
  return out;
}

void AddedTokenTrie::Build(const std::vector<AddedToken>& added) {
  token_at_.assign(1, -1);
  for (size_t t = 0; t < added.size(); ++t) {
    int32_t node = 0;
    for (char c : added[t].content) {
      const uint64_t key = static_cast<uint64_t>(node) << 8 | static_cast<uint8_t>(c);
      auto [it, fresh] = edges_.try_emplace(key, static_cast<int32_t>(token_at_.size()));
      if (fresh) token_at_.push_back(-1);
      node = it->second;
    }
    // (contents are unique in practice; with duplicates the first, as a linear scan of
    // the longest-first list would find)
    if (token_at_[node] < 0) token_at_[node] = static_cast<int32_t>(t);
    starts_[static_cast<uint8_t>(added[t].content[0])] = true;
  }
}

int32_t AddedTokenTrie::Walk(absl::string_view text, size_t i) const {
  int32_t node = 0, found = -1;
  for (; i < text.size(); ++i) {
    auto it = edges_.find(static_cast<uint64_t>(node) << 8 | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (token_at_[node] >= 0) found = token_at_[node];
  }
  return found;
}

WordCache::Shard& WordCache::ShardOf(absl::string_view word) const { return shards_[absl::HashOf(word) % kShards]; }

bool WordCache::Lookup(absl::string_view word, std::vector<int32_t>* ids) const {
  Shard& shard = ShardOf(word);
  absl::MutexLock lock(&shard.mu);
  auto it = shard.words.find(word);
  if (it == shard.words.end()) return false;
  ids->insert(ids->end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::Insert(absl::string_view word, const int32_t* ids, size_t n) const {
  if (word.size() > kMaxWordBytes) return;
  Shard& shard = ShardOf(word);
  absl::MutexLock lock(&shard.mu);
  if (shard.words.size() >= kCapacity / kShards) shard.words.clear();
  shard.words.try_emplace(word, ids, ids + n);
}

}  // namespace hf_internal

using hf_internal::AddedToken;

// Pieces up to this many bytes leave their merge scratch to the next on the thread.
constexpr int32_t kKeptScratch = 4096;

void HfTokenizer::Impl::MergeBytes(absl::string_view piece, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;  // -1: merged into the symbol before it
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, pos, id;
    bool operator<(const Candidate& o) const {  // "pops later": a higher rank, or further right
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;  // a max-heap by Candidate::operator<: lowest rank on top
  const int32_t n = static_cast<int32_t>(piece.size());
  symbols.resize(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {byte_id[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  heap.clear();
  auto push_pair = [&](int32_t pos) {
    auto it = merges.find(hf_internal::PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, pos, it->second.id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& s = symbols[top.pos];
    if (s.id < 0 || s.next < 0) continue;
    const Symbol right = symbols[s.next];
    auto it = merges.find(hf_internal::PairKey(s.id, right.id));
    if (it == merges.end() || it->second.id != top.id) continue;  // (no longer this pair)
    symbols[s.next].id = -1;
    s.id = top.id;
    s.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (s.prev >= 0) push_pair(s.prev);
    if (s.next >= 0) push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) ids->push_back(symbols[i].id);
  if (n > kKeptScratch) {  // (a huge piece's scratch is not kept for the thread's life)
    std::vector<Symbol>().swap(symbols);
    std::vector<Candidate>().swap(heap);
  }
}

absl::Status HfTokenizer::Impl::EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return absl::OkStatus();
  if (cache.Lookup(piece, ids)) return absl::OkStatus();
  const size_t first = ids->size();
  bool whole = false;
  if (ignore_merges) {  // (Llama 3: a piece that is a token is taken whole)
    const hf_internal::ByteAlphabet& alphabet = hf_internal::Alphabet();
    std::string mapped;
    mapped.reserve(piece.size() * 2);
    for (char c : piece) mapped += alphabet.of_byte[static_cast<uint8_t>(c)];
    if (auto it = vocab.find(mapped); it != vocab.end()) {
      ids->push_back(it->second);
      whole = true;
    }
  }
  if (!whole) MergeBytes(piece, ids);
  cache.Insert(piece, ids->data() + first, ids->size() - first);
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::EncodeStretch(absl::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized;
  if (nfc) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    const icu::StringPiece in(text.data(), static_cast<int32_t>(text.size()));
    if (U_SUCCESS(status) && !n->isNormalizedUTF8(in, status)) {
      icu::StringByteSink<std::string> sink(&normalized);
      n->normalizeUTF8(0, in, sink, nullptr, status);
      text = normalized;
    }
    if (U_FAILURE(status)) return absl::InternalError(absl::StrCat("NFC failed: ", u_errorName(status)));
  }
  std::vector<absl::string_view> pieces = {text};
  for (const auto& re : splits) {
    std::vector<absl::string_view> next;
    for (absl::string_view piece : pieces) {
      ASSIGN_OR_RETURN(auto matches, re->Matches(piece));
      size_t done = 0;
      for (const auto& [s, e] : matches) {  // Isolated: each match a piece, and each gap between
        if (s > done) next.push_back(piece.substr(done, s - done));
        next.push_back(piece.substr(s, e - s));
        done = e;
      }
      if (done < piece.size()) next.push_back(piece.substr(done));
    }
    pieces = std::move(next);
  }
  for (absl::string_view piece : pieces) {
    if (add_prefix_space && !piece.empty() && piece[0] != ' ') {
      RETURN_IF_ERROR(EncodePiece(absl::StrCat(" ", piece), ids));
    } else {
      RETURN_IF_ERROR(EncodePiece(piece, ids));
    }
  }
  return absl::OkStatus();
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(absl::string_view text) const {
  if (text.size() > kMaxEncodeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("text of ", text.size(), " bytes is longer than the tokenizer takes (", kMaxEncodeBytes, ")"));
  }
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const int n = Utf8SequenceAt(text, i);
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("text is not UTF-8 (byte ", i, ")"));
    i += n;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4);
  size_t done = 0;
  for (size_t i = 0; i < text.size();) {
    const int32_t found = impl_->added_trie.LongestAt(text, i);
    if (found < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = impl_->added[found];
    if (i > done) RETURN_IF_ERROR(impl_->EncodeStretch(text.substr(done, i - done), &ids));
    ids.push_back(token.id);
    i += token.content.size();
    done = i;
  }
  if (done < text.size()) RETURN_IF_ERROR(impl_->EncodeStretch(text.substr(done), &ids));
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const hf_internal::ByteAlphabet& alphabet = hf_internal::Alphabet();
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      const AddedToken& t = impl_->added[it->second];
      if (skip_special_tokens && t.special) continue;
      token = &t.content;
    } else if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is negative"));
    } else if (id < impl_->size && impl_->token_of_id[id] != nullptr) {
      token = impl_->token_of_id[id];
    } else {
      // An id with no token: skipped, as tokenizers' decode does. A model's embedding
      // is often larger than its tokenizer's vocabulary (Qwen2.5: 151936 rows, 151665
      // tokens), and a policy can sample those rows.
      continue;
    }
    // ByteLevel's decoder: a token whose every character is in the byte alphabet gives
    // those bytes; any other token (an added one with a space, say) its own UTF-8.
    std::string mapped;
    bool all = true;
    for (size_t i = 0; i < token->size() && all;) {
      const int n = Utf8SequenceAt(*token, i);
      auto it = n > 0 ? alphabet.byte_of.find(token->substr(i, n)) : alphabet.byte_of.end();
      if (it == alphabet.byte_of.end()) {
        all = false;
      } else {
        mapped.push_back(static_cast<char>(it->second));
        i += n;
      }
    }
    bytes += all ? mapped : *token;
  }
  return Utf8Lossy(bytes);
}

int32_t HfTokenizer::vocab_size() const { return impl_->size; }

std::optional<int32_t> HfTokenizer::TokenId(absl::string_view token) const {
  for (const AddedToken& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace rlfleet::model
