// libFuzzer harness: HfTokenizer::Encode and Decode over arbitrary text, with the Llama
// 3-style byte-level BPE of libs/model/testdata (no normalizer). Byte-level BPE loses
// nothing: text that is UTF-8 decodes back from its ids exactly; text that is not is
// INVALID_ARGUMENT. Encoding is deterministic (the second encode of a text comes from
// the word cache and must give the same ids), and every id is in the vocabulary.
// Decoding any ids of the vocabulary gives UTF-8. An input that starts with '{' is also
// loaded as a tokenizer.json (the streaming, depth-bounded parser): it loads or is
// INVALID_ARGUMENT, and a tokenizer it loads encodes a short text or says why.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "libs/model/hf_tokenizer.h"

namespace {
std::unique_ptr<rlfleet::model::HfTokenizer> tokenizer;

void LoadAsTokenizerJson(const std::string& json) {
  auto loaded = rlfleet::model::HfTokenizer::FromJson(json, "fuzz.json");
  if (!loaded.ok()) {
    if (loaded.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return;
  }
  auto ids = (*loaded)->Encode("Hello world, 123 <|im_end|> \xC3\xA9t\xC3\xA9");
  // (a fuzzed pre-tokenizer regex may backtrack past ICU's limit: RESOURCE_EXHAUSTED)
  if (!ids.ok() && ids.status().code() != absl::StatusCode::kResourceExhausted) std::abort();
  if (ids.ok() && !(*loaded)->Decode(*ids).ok()) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto t = rlfleet::model::HfTokenizer::FromFile("libs/model/testdata/hf/tokenizer_llama3/tokenizer.json");
  if (!t.ok()) std::abort();  // (run from the repository's root, as tools/fuzz.sh does)
  tokenizer = std::move(*t);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (size > 0 && data[0] == '{') LoadAsTokenizerJson(text);
  auto ids = tokenizer->Encode(text);
  if (ids.ok()) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= tokenizer->vocab_size()) std::abort();
    }
    auto again = tokenizer->Encode(text);
    if (!again.ok() || *again != *ids) std::abort();
    auto back = tokenizer->Decode(*ids);
    if (!back.ok() || *back != text) std::abort();
  } else if (ids.status().code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }
  // The bytes read as ids: their text is UTF-8 (the lossy decode's promise).
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < size && raw.size() < 64; i += 2) raw.push_back((data[i] << 8 | data[i + 1]) % 900);
  auto decoded = tokenizer->Decode(raw);
  if (!decoded.ok() || rlfleet::model::Utf8Lossy(*decoded) != *decoded) std::abort();
  return 0;
}
