// UTF-8 for the model library's text code (tokenizer.json BPE, chat templates):
// encoding a code point, the length of the sequence at a byte, and lossy decoding as the
// `tokenizers` library does it.
#ifndef RLFLEET_LIBS_MODEL_UTF8_H_
#define RLFLEET_LIBS_MODEL_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace rlfleet::model {

// Appends code point `c` (at most U+10FFFF) to `out` as UTF-8.
void AppendUtf8(std::string* out, char32_t c);

// The length of the well-formed UTF-8 sequence at s[i] (Unicode table 3-7), or the
// length of its maximal ill-formed subpart as a negative number.
int Utf8SequenceAt(absl::string_view s, size_t i);

// `bytes` as UTF-8, each maximal subpart of an ill-formed sequence replaced by U+FFFD
// (Unicode's recommended practice; Rust's String::from_utf8_lossy).
std::string Utf8Lossy(absl::string_view bytes);

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_UTF8_H_
