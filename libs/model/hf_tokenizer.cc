#include "libs/model/hf_tokenizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uregex.h>
#include <unicode/utext.h>

#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/files.h"
#include "libs/common/status_macros.h"
#include "libs/model/utf8.h"

namespace rlfleet::model {

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxTokenizerJsonBytes = 256 << 20;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
constexpr char kGpt2Split[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's byte-level alphabet: every byte as one printable character (its UTF-8).
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  absl::flat_hash_map<std::string, uint8_t> byte_of;
  ByteAlphabet() {
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
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

// A compiled ICU regex, cloned per use (a URegularExpression matches one text at a time).
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<Regex>> Compile(const std::string& pattern, const std::string& where) {
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
  ~Regex() { uregex_close(re_); }

  // The [start, end) byte ranges of every match in `text` (UTF-8).
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Matches(absl::string_view text) const {
    UErrorCode status = U_ZERO_ERROR;
    URegularExpression* re = uregex_clone(re_, &status);
    UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
    uregex_setUText(re, ut, &status);
    std::vector<std::pair<size_t, size_t>> out;
    while (U_SUCCESS(status) && uregex_findNext(re, &status)) {
      const int64_t s = uregex_start64(re, 0, &status), e = uregex_end64(re, 0, &status);
      if (U_SUCCESS(status) && e > s) out.emplace_back(static_cast<size_t>(s), static_cast<size_t>(e));
    }
    uregex_close(re);
    utext_close(ut);
    if (U_FAILURE(status)) return absl::InternalError(absl::StrCat("regex match failed: ", u_errorName(status)));
    return out;
  }

 private:
  explicit Regex(URegularExpression* re) : re_(re) {}
  URegularExpression* re_;
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

// Typed reads of tokenizer.json's members, each error naming the file and the member.
absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

}  // namespace

struct HfTokenizer::Impl {
  std::string name;
  bool nfc = false;
  // The pre-tokenizers' splits, in order (each refines the pieces of the one before);
  // then the byte-level mapping.
  std::vector<std::shared_ptr<Regex>> splits;
  bool add_prefix_space = false;
  absl::flat_hash_map<std::string, int32_t> vocab;
  absl::flat_hash_map<std::pair<std::string, std::string>, int32_t> merge_rank;
  bool ignore_merges = false;
  std::vector<AddedToken> added;  // longest first (at one position the longest wins)
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  std::vector<const std::string*> token_of_id;  // vocabulary spellings by id (null: none)
  int32_t size = 0;

  absl::Status ReadNormalizer(const Json& j);
  absl::Status ReadPreTokenizer(const Json& j);
  absl::Status ReadModel(const Json& j);
  absl::Status ReadAddedTokens(const Json& j);
  absl::Status ReadDecoder(const Json& j) const;

  // Appends the ids of a stretch of text without added tokens.
  absl::Status EncodeStretch(absl::string_view text, std::vector<int32_t>* ids) const;
  // Appends the ids of one pre-tokenized piece (its bytes).
  absl::Status EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const;
};

absl::Status HfTokenizer::Impl::ReadNormalizer(const Json& j) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (const Json& n : j["normalizers"]) RETURN_IF_ERROR(ReadNormalizer(n));
    return absl::OkStatus();
  }
  return Bad(name, absl::StrCat("normalizer `", type, "` is not supported (none and NFC are)"));
}

absl::Status HfTokenizer::Impl::ReadPreTokenizer(const Json& j) {
  if (j.is_null()) return Bad(name, "pre_tokenizer is null: a byte-level BPE tokenizer has a ByteLevel one");
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return Bad(name, "pre_tokenizer Sequence wants `pretokenizers`");
    }
    bool byte_level = false;
    for (const Json& p : j["pretokenizers"]) {
      if (byte_level) return Bad(name, "a pre-tokenizer after ByteLevel is not supported");
      RETURN_IF_ERROR(ReadPreTokenizer(p));
      byte_level = p.value("type", "") == "ByteLevel";
    }
    if (!byte_level) return Bad(name, "pre_tokenizer Sequence does not end with ByteLevel");
    return absl::OkStatus();
  }
  if (type == "Split") {
    if (j.value("behavior", "") != "Isolated" || j.value("invert", false)) {
      return Bad(name, absl::StrCat("Split pre-tokenizer with behavior `", j.value("behavior", ""),
                                    "` / invert: only Isolated, not inverted, is supported"));
    }
    const Json& pattern = j.value("pattern", Json::object());
    if (!pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      return Bad(name, "Split pre-tokenizer wants a `pattern` {\"Regex\": ...} (a String pattern is not supported)");
    }
    ASSIGN_OR_RETURN(auto re, Regex::Compile(pattern["Regex"].get<std::string>(), name));
    splits.push_back(std::move(re));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      ASSIGN_OR_RETURN(auto re, Regex::Compile(kGpt2Split, name));
      splits.push_back(std::move(re));
    }
    return absl::OkStatus();
  }
  return Bad(name, absl::StrCat("pre-tokenizer `", type, "` is not supported (Split, ByteLevel, Sequence are)"));
}

absl::Status HfTokenizer::Impl::ReadModel(const Json& j) {
  if (!j.is_object() || j.value("type", "") != "BPE") {
    return Bad(name, absl::StrCat("model type `", j.is_object() ? j.value("type", "") : "", "` is not supported: ",
                                  "a byte-level BPE tokenizer (Llama 3, Qwen2, Qwen3, GPT-2) is"));
  }
  if (j.value("byte_fallback", false)) return Bad(name, "BPE byte_fallback (sentencepiece style) is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && !j[key].is_null() && j[key] != "") {
      return Bad(name, absl::StrCat("BPE `", key, "` is not supported"));
    }
  }
  if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"] != 0.0) {
    return Bad(name, "BPE dropout is not supported (encoding would not be deterministic)");
  }
  ignore_merges = j.value("ignore_merges", false);
  if (!j.contains("vocab") || !j["vocab"].is_object()) return Bad(name, "model.vocab wants an object");
  for (const auto& [token, id] : j["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 24)) {
      return Bad(name, absl::StrCat("model.vocab[\"", token, "\"] is not an id in [0, 2^24)"));
    }
    vocab[token] = static_cast<int32_t>(id.get<int64_t>());
  }
  if (!j.contains("merges") || !j["merges"].is_array()) return Bad(name, "model.merges wants an array");
  int32_t rank = 0;
  for (const Json& m : j["merges"]) {
    std::pair<std::string, std::string> pair;
    if (m.is_string()) {  // "a b" (older files)
      std::vector<std::string> parts = absl::StrSplit(m.get<std::string>(), absl::MaxSplits(' ', 1));
      if (parts.size() != 2) return Bad(name, absl::StrCat("merge ", rank, " is not two tokens: ", m.dump()));
      pair = {parts[0], parts[1]};
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      pair = {m[0].get<std::string>(), m[1].get<std::string>()};
    } else {
      return Bad(name, absl::StrCat("merge ", rank, " is not two tokens: ", m.dump()));
    }
    merge_rank.emplace(std::move(pair), rank++);
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::ReadAddedTokens(const Json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_array()) return Bad(name, "added_tokens wants an array");
  for (const Json& t : j) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string() || t["content"].get<std::string>().empty()) {
      return Bad(name, absl::StrCat("added token ", t.dump(), " wants an id and a content"));
    }
    const std::string content = t["content"].get<std::string>();
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      if (t.value(flag, false)) {
        return Bad(name, absl::StrCat("added token ", content, " sets ", flag, ", which is not supported"));
      }
    }
    if (nfc && t.value("normalized", false)) {
      return Bad(name, absl::StrCat("added token ", content, " is matched after normalization, not supported"));
    }
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 24)) return Bad(name, absl::StrCat("added token ", content, ": bad id"));
    added.push_back({static_cast<int32_t>(id), content, t.value("special", false)});
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < added.size(); ++i) added_by_id[added[i].id] = i;
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::ReadDecoder(const Json& j) const {
  if (!j.is_null() && j.value("type", "") == "ByteLevel") return absl::OkStatus();
  return Bad(
      name, absl::StrCat("decoder `", j.is_null() ? "null" : j.value("type", ""), "` is not supported (ByteLevel is)"));
}

absl::Status HfTokenizer::Impl::EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const {
  const ByteAlphabet& alphabet = Alphabet();
  std::vector<std::string> symbols;
  symbols.reserve(piece.size());
  std::string whole;
  for (char c : piece) {
    symbols.push_back(alphabet.of_byte[static_cast<uint8_t>(c)]);
    whole += symbols.back();
  }
  if (ignore_merges) {
    if (auto it = vocab.find(whole); it != vocab.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  // Merge the adjacent pair of lowest rank (the leftmost among equals) until none merges.
  while (symbols.size() > 1) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank.find(std::make_pair(symbols[i], symbols[i + 1]));
      if (it != merge_rank.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (const std::string& s : symbols) {
    auto it = vocab.find(s);
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": the vocabulary has no token `", s, "`"));
    }
    ids->push_back(it->second);
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::EncodeStretch(absl::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized;
  if (nfc) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    icu::StringByteSink<std::string> sink(&normalized);
    if (U_SUCCESS(status)) {
      n->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr, status);
    }
    if (U_FAILURE(status)) return absl::InternalError(absl::StrCat("NFC failed: ", u_errorName(status)));
    text = normalized;
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

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(absl::string_view json, const std::string& name) {
  Json j;
  try {
    j = Json::parse(json);
  } catch (const Json::exception& e) {
    return Bad(name, absl::StrCat("not JSON: ", e.what()));
  }
  if (!j.is_object()) return Bad(name, "wants a JSON object");
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  try {
    RETURN_IF_ERROR(impl->ReadNormalizer(j.value("normalizer", Json())));
    RETURN_IF_ERROR(impl->ReadPreTokenizer(j.value("pre_tokenizer", Json())));
    RETURN_IF_ERROR(impl->ReadModel(j.value("model", Json())));
    RETURN_IF_ERROR(impl->ReadAddedTokens(j.value("added_tokens", Json())));
    RETURN_IF_ERROR(impl->ReadDecoder(j.value("decoder", Json())));
  } catch (const Json::exception& e) {  // (a member of the wrong type where a value was read)
    return Bad(name, e.what());
  }
  int32_t size = 0;
  for (const auto& [token, id] : impl->vocab) size = std::max(size, id + 1);
  for (const AddedToken& t : impl->added) size = std::max(size, t.id + 1);
  impl->size = size;
  impl->token_of_id.assign(size, nullptr);
  for (const auto& [token, id] : impl->vocab) impl->token_of_id[id] = &token;
  // Every byte must be spellable, or some text could not be encoded.
  for (const std::string& b : Alphabet().of_byte) {
    if (!impl->vocab.contains(b)) {
      return Bad(name, absl::StrCat("the vocabulary lacks byte-level token `", b, "`: not a byte-level BPE"));
    }
  }
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromFile(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile("tokenizer.json", p, kMaxTokenizerJsonBytes));
  return FromJson(text, p.string());
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(absl::string_view text) const {
  for (size_t i = 0; i < text.size();) {
    const int n = Utf8SequenceAt(text, i);
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("text is not UTF-8 (byte ", i, ")"));
    i += n;
  }
  std::vector<int32_t> ids;
  size_t done = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* found = nullptr;
    for (const AddedToken& t : impl_->added) {  // (longest first)
      if (text.substr(i, t.content.size()) == t.content) {
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > done) RETURN_IF_ERROR(impl_->EncodeStretch(text.substr(done, i - done), &ids));
    ids.push_back(found->id);
    i += found->content.size();
    done = i;
  }
  if (done < text.size()) RETURN_IF_ERROR(impl_->EncodeStretch(text.substr(done), &ids));
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const ByteAlphabet& alphabet = Alphabet();
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
