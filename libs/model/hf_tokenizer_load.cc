// tokenizer.json -> HfTokenizer::Impl. One SAX pass over the file: model.vocab and
// model.merges (most of a 7-11 MB Qwen3 / Llama 3 file: ~150k tokens and merges) go
// straight into their tables; the small rest (normalizer, pre-tokenizer, added tokens,
// decoder, the model's flags) is kept as a JSON tree and read from it. Nesting deeper
// than kMaxJsonDepth is refused while parsing.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/files.h"
#include "libs/common/status_macros.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/hf_tokenizer_impl.h"

namespace rlfleet::model {

namespace {

using Json = nlohmann::json;
using hf_internal::AddedToken;
using hf_internal::Regex;

constexpr uint64_t kMaxTokenizerJsonBytes = 256 << 20;
constexpr size_t kMaxJsonDepth = 64;  // (tokenizer.json files nest 5-6 deep)

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
constexpr char kGpt2Split[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// Merge `rank` of `left` and `right` into t->merges, as the tokenizers library builds
// its merge map: both tokens and their concatenation in the vocabulary (else the file
// is refused), a later duplicate replacing an earlier one.
absl::Status AddMerge(HfTokenizer::Impl* t, int32_t rank, const std::string& left, const std::string& right,
                      std::string* joined) {
  joined->assign(left).append(right);
  const auto l = t->vocab.find(left), r = t->vocab.find(right), m = t->vocab.find(*joined);
  if (l == t->vocab.end() || r == t->vocab.end() || m == t->vocab.end()) {
    const std::string& missing = l == t->vocab.end() ? left : r == t->vocab.end() ? right : *joined;
    return Bad(t->name,
               absl::StrCat("merge ", rank, " (`", left, "` `", right, "`): `", missing, "` is not in the vocabulary"));
  }
  t->merges.insert_or_assign(hf_internal::PairKey(l->second, r->second), hf_internal::Merge{rank, m->second});
  return absl::OkStatus();
}

// The SAX pass: root.model.vocab into t->vocab, root.model.merges into t->merges (as
// they come once the vocabulary is complete; before that, kept spelled in `pending`),
// everything else into `root`. Stops at the first error, kept in `error`.
class TokenizerJsonSax : public nlohmann::json_sax<Json> {
 public:
  TokenizerJsonSax(HfTokenizer::Impl* t, size_t json_bytes) : t_(t) {
    // (~60 bytes of tokenizer.json per token and per merge in Qwen3's and Llama 3's)
    const size_t estimate = std::min<size_t>(json_bytes / 48, size_t{1} << 20);
    t_->vocab.reserve(estimate);
    t_->merges.reserve(estimate);
  }

  Json root;
  std::vector<std::pair<std::string, std::string>> pending;  // merges seen before the vocabulary
  int32_t merge_count = 0;
  bool saw_vocab = false, saw_merges = false;
  absl::Status error;

  bool null() override { return Put(Json()); }
  bool boolean(bool v) override { return Put(Json(v)); }
  bool number_integer(number_integer_t v) override { return Integer(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return Integer(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return Put(Json(v)); }
  bool binary(binary_t&) override { return Fail("binary values are not JSON"); }
  bool string(string_t& s) override {
    if (stack_.empty() || stack_.back().kind == Kind::kTree) return Put(Json(std::move(s)));
    Frame& top = stack_.back();
    if (top.kind == Kind::kMerges) {  // "a b" (older files)
      std::vector<std::string> parts = absl::StrSplit(s, absl::MaxSplits(' ', 1));
      if (parts.size() != 2) return Fail(absl::StrCat("merge ", merge_count, " is not two tokens: \"", s, "\""));
      return Merged(std::move(parts[0]), std::move(parts[1]));
    }
    if (top.kind == Kind::kMergePair && top.count < 2) {
      (top.count++ == 0 ? top.key : top.second) = std::move(s);
      return true;
    }
    return Streamed("a string");
  }
  bool key(string_t& k) override {
    stack_.back().key = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (!Deeper()) return false;
    if (AtModelMember("vocab")) {
      saw_vocab = true;
      stack_.push_back({Kind::kVocab, nullptr});
      return true;
    }
    if (AtModelMember("merges")) return Fail("model.merges wants an array");
    if (!stack_.empty() && stack_.back().kind != Kind::kTree) return Streamed("an object");
    const bool model = stack_.size() == 1 && stack_.back().key == "model";
    Json* node = Insert(Json::object());
    stack_.push_back({Kind::kTree, node});
    stack_.back().is_model = model;
    return true;
  }
  bool end_object() override {
    if (stack_.back().kind == Kind::kVocab) vocab_done_ = true;
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (!Deeper()) return false;
    if (AtModelMember("merges")) {
      saw_merges = true;
      stack_.push_back({Kind::kMerges, nullptr});
      return true;
    }
    if (AtModelMember("vocab")) return Fail("model.vocab wants an object");
    if (!stack_.empty() && stack_.back().kind == Kind::kMerges) {
      stack_.push_back({Kind::kMergePair, nullptr});
      return true;
    }
    if (!stack_.empty() && stack_.back().kind != Kind::kTree) return Streamed("an array");
    Json* node = Insert(Json::array());
    stack_.push_back({Kind::kTree, node});
    return true;
  }
  bool end_array() override {
    Frame top = std::move(stack_.back());
    stack_.pop_back();
    if (top.kind == Kind::kMergePair) {
      if (top.count != 2) return Fail(absl::StrCat("merge ", merge_count, " is not two tokens"));
      return Merged(std::move(top.key), std::move(top.second));
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (error.ok()) error = Bad(t_->name, absl::StrCat("not JSON: ", e.what()));
    return false;
  }

 private:
  enum class Kind { kTree, kVocab, kMerges, kMergePair };
  struct Frame {
    Kind kind;
    Json* node;          // kTree: the object or array being filled
    std::string key;     // an object's pending key; kMergePair: the first token
    std::string second;  // kMergePair: the second token
    int count = 0;       // kMergePair: tokens seen
    bool is_model = false;
  };

  bool Fail(const std::string& what) {
    if (error.ok()) error = Bad(t_->name, what);
    return false;
  }
  bool Deeper() {
    return stack_.size() < kMaxJsonDepth || Fail(absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
  }
  bool AtModelMember(const char* member) const {
    return !stack_.empty() && stack_.back().is_model && stack_.back().key == member;
  }
  bool Streamed(const char* what) {
    switch (stack_.back().kind) {
      case Kind::kVocab:
        return Fail(absl::StrCat("model.vocab[\"", stack_.back().key, "\"] is not an id in [0, 2^24)"));
      case Kind::kMerges:
      case Kind::kMergePair:
        return Fail(absl::StrCat("merge ", merge_count, " is not two tokens (", what, " in it)"));
      case Kind::kTree:
        break;
    }
    return Fail("internal: bad streamed state");
  }
  bool Integer(int64_t v) {
    if (!stack_.empty() && stack_.back().kind == Kind::kVocab) {
      if (v < 0 || v >= (int64_t{1} << 24)) return Streamed("a number");
      t_->vocab.insert_or_assign(std::move(stack_.back().key), static_cast<int32_t>(v));  // (the next key replaces it)
      return true;
    }
    return Put(Json(v));
  }
  // A scalar value: into the tree, or an error where a streamed member wants another.
  bool Put(Json value) {
    if (AtModelMember("vocab")) return Fail("model.vocab wants an object");
    if (AtModelMember("merges")) return Fail("model.merges wants an array");
    if (!stack_.empty() && stack_.back().kind != Kind::kTree) return Streamed("a scalar");
    Insert(std::move(value));
    return true;
  }
  Json* Insert(Json value) {
    if (stack_.empty()) {
      root = std::move(value);
      return &root;
    }
    Frame& top = stack_.back();
    if (top.node->is_array()) {
      top.node->push_back(std::move(value));
      return &top.node->back();
    }
    Json& slot = (*top.node)[top.key];
    slot = std::move(value);
    return &slot;
  }

  bool Merged(std::string left, std::string right) {
    const int32_t rank = merge_count++;
    if (!vocab_done_) {
      pending.emplace_back(std::move(left), std::move(right));
      return true;
    }
    absl::Status added = AddMerge(t_, rank, left, right, &joined_);
    if (!added.ok() && error.ok()) error = std::move(added);
    return error.ok();
  }

  HfTokenizer::Impl* t_;
  std::vector<Frame> stack_;
  bool vocab_done_ = false;
  std::string joined_;
};

struct Loader {
  HfTokenizer::Impl* t;

  absl::Status ReadNormalizer(const Json& j) {
    if (j.is_null()) return absl::OkStatus();
    const std::string type = j.value("type", "");
    if (type == "NFC") {
      t->nfc = true;
      return absl::OkStatus();
    }
    if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
      for (const Json& n : j["normalizers"]) RETURN_IF_ERROR(ReadNormalizer(n));
      return absl::OkStatus();
    }
    return Bad(t->name, absl::StrCat("normalizer `", type, "` is not supported (none and NFC are)"));
  }

  absl::Status ReadPreTokenizer(const Json& j) {
    if (j.is_null()) return Bad(t->name, "pre_tokenizer is null: a byte-level BPE tokenizer has a ByteLevel one");
    const std::string type = j.value("type", "");
    if (type == "Sequence") {
      if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
        return Bad(t->name, "pre_tokenizer Sequence wants `pretokenizers`");
      }
      bool byte_level = false;
      for (const Json& p : j["pretokenizers"]) {
        if (byte_level) return Bad(t->name, "a pre-tokenizer after ByteLevel is not supported");
        RETURN_IF_ERROR(ReadPreTokenizer(p));
        byte_level = p.value("type", "") == "ByteLevel";
      }
      if (!byte_level) return Bad(t->name, "pre_tokenizer Sequence does not end with ByteLevel");
      return absl::OkStatus();
    }
    if (type == "Split") {
      if (j.value("behavior", "") != "Isolated" || j.value("invert", false)) {
        return Bad(t->name, absl::StrCat("Split pre-tokenizer with behavior `", j.value("behavior", ""),
                                         "` / invert: only Isolated, not inverted, is supported"));
      }
      const Json& pattern = j.value("pattern", Json::object());
      if (!pattern.contains("Regex") || !pattern["Regex"].is_string()) {
        return Bad(t->name,
                   "Split pre-tokenizer wants a `pattern` {\"Regex\": ...} (a String pattern is not supported)");
      }
      ASSIGN_OR_RETURN(auto re, Regex::Compile(pattern["Regex"].get<std::string>(), t->name));
      t->splits.push_back(std::move(re));
      return absl::OkStatus();
    }
    if (type == "ByteLevel") {
      t->add_prefix_space = j.value("add_prefix_space", false);
      if (j.value("use_regex", true)) {
        ASSIGN_OR_RETURN(auto re, Regex::Compile(kGpt2Split, t->name));
        t->splits.push_back(std::move(re));
      }
      return absl::OkStatus();
    }
    return Bad(t->name, absl::StrCat("pre-tokenizer `", type, "` is not supported (Split, ByteLevel, Sequence are)"));
  }

  // The model's flags (its vocab and merges were streamed: `sax` has them).
  absl::Status ReadModel(const Json& j, TokenizerJsonSax& sax) {
    if (!j.is_object() || j.value("type", "") != "BPE") {
      return Bad(t->name, absl::StrCat("model type `", j.is_object() ? j.value("type", "") : "", "` is not supported: ",
                                       "a byte-level BPE tokenizer (Llama 3, Qwen2, Qwen3, GPT-2) is"));
    }
    if (j.value("byte_fallback", false))
      return Bad(t->name, "BPE byte_fallback (sentencepiece style) is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (j.contains(key) && !j[key].is_null() && j[key] != "") {
        return Bad(t->name, absl::StrCat("BPE `", key, "` is not supported"));
      }
    }
    if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"] != 0.0) {
      return Bad(t->name, "BPE dropout is not supported (encoding would not be deterministic)");
    }
    t->ignore_merges = j.value("ignore_merges", false);
    if (!sax.saw_vocab) return Bad(t->name, "model.vocab wants an object");
    if (!sax.saw_merges) return Bad(t->name, "model.merges wants an array");
    std::string joined;
    for (size_t rank = 0; rank < sax.pending.size(); ++rank) {
      RETURN_IF_ERROR(
          AddMerge(t, static_cast<int32_t>(rank), sax.pending[rank].first, sax.pending[rank].second, &joined));
    }
    return absl::OkStatus();
  }

  absl::Status ReadAddedTokens(const Json& j) {
    if (j.is_null()) return absl::OkStatus();
    if (!j.is_array()) return Bad(t->name, "added_tokens wants an array");
    for (const Json& a : j) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string() || a["content"].get<std::string>().empty()) {
        return Bad(t->name, absl::StrCat("added token ", a.dump(), " wants an id and a content"));
      }
      const std::string content = a["content"].get<std::string>();
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(flag, false)) {
          return Bad(t->name, absl::StrCat("added token ", content, " sets ", flag, ", which is not supported"));
        }
      }
      if (t->nfc && a.value("normalized", false)) {
        return Bad(t->name, absl::StrCat("added token ", content, " is matched after normalization, not supported"));
      }
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 24)) return Bad(t->name, absl::StrCat("added token ", content, ": bad id"));
      t->added.push_back({static_cast<int32_t>(id), content, a.value("special", false)});
    }
    std::stable_sort(t->added.begin(), t->added.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (size_t i = 0; i < t->added.size(); ++i) t->added_by_id[t->added[i].id] = i;
    t->added_trie.Build(t->added);
    return absl::OkStatus();
  }

  absl::Status ReadDecoder(const Json& j) const {
    if (!j.is_null() && j.value("type", "") == "ByteLevel") return absl::OkStatus();
    return Bad(t->name, absl::StrCat("decoder `", j.is_null() ? "null" : j.value("type", ""),
                                     "` is not supported (ByteLevel is)"));
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(absl::string_view json, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  TokenizerJsonSax sax(impl.get(), json.size());
  try {
    const bool parsed = Json::sax_parse(json.begin(), json.end(), &sax);
    if (!sax.error.ok()) return sax.error;
    if (!parsed) return Bad(name, "not JSON");
  } catch (const Json::exception& e) {
    return Bad(name, absl::StrCat("not JSON: ", e.what()));
  }
  const Json& j = sax.root;
  if (!j.is_object()) return Bad(name, "wants a JSON object");
  Loader loader{impl.get()};
  try {
    RETURN_IF_ERROR(loader.ReadNormalizer(j.value("normalizer", Json())));
    RETURN_IF_ERROR(loader.ReadPreTokenizer(j.value("pre_tokenizer", Json())));
    RETURN_IF_ERROR(loader.ReadModel(j.value("model", Json()), sax));
    RETURN_IF_ERROR(loader.ReadAddedTokens(j.value("added_tokens", Json())));
    RETURN_IF_ERROR(loader.ReadDecoder(j.value("decoder", Json())));
  } catch (const Json::exception& e) {  // (a member of the wrong type where a value was read)
    return Bad(name, e.what());
  }
  int32_t size = 0;
  for (const auto& [token, id] : impl->vocab) size = std::max(size, id + 1);
  for (const AddedToken& a : impl->added) size = std::max(size, a.id + 1);
  impl->size = size;
  impl->token_of_id.assign(size, nullptr);
  for (const auto& [token, id] : impl->vocab) impl->token_of_id[id] = &token;
  // Every byte must be spellable, or some text could not be encoded.
  const hf_internal::ByteAlphabet& alphabet = hf_internal::Alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = impl->vocab.find(alphabet.of_byte[b]);
    if (it == impl->vocab.end()) {
      return Bad(name, absl::StrCat("the vocabulary lacks byte-level token `", alphabet.of_byte[b],
                                    "`: not a byte-level BPE"));
    }
    impl->byte_id[b] = it->second;
  }
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromFile(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile("tokenizer.json", p, kMaxTokenizerJsonBytes));
  return FromJson(text, p.string());
}

}  // namespace rlfleet::model
