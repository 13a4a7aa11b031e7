// The tokenizer of the built-in tasks (libs/tasks), shared by rollout, reward and
// trainer. Character level with special tokens; the task name is one token, so a
// prompt "reverse:123" is [BOS, <reverse>, '1', '2', '3', SEP] and a response is
// digits (or '-', '+', '*', and the calculator's brackets) followed by EOS. The
// vocabulary fits in 32 ids.
#ifndef RLFLEET_LIBS_MODEL_TOKENIZER_H_
#define RLFLEET_LIBS_MODEL_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlfleet::model {

class Tokenizer {
 public:
  static constexpr int32_t kPad = 0;
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;
  static constexpr int32_t kSep = 3;
  static constexpr int32_t kVocabSize = 32;
  // The calculator tool's protocol (libs/tasks: Calculate): the policy writes
  // [kCall, expression..., kEndCall]; the environment answers [kResult, digits...,
  // kEndResult]. As text: "[37*4](148)".
  static constexpr int32_t kCall = 21;
  static constexpr int32_t kEndCall = 22;
  static constexpr int32_t kResult = 23;
  static constexpr int32_t kEndResult = 24;

  // Encodes a prompt "<task>:<input>". INVALID_ARGUMENT naming the offending character
  // or an unknown task.
  static absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view prompt);
  // Encodes response text (answer characters, then EOS).
  static absl::StatusOr<std::vector<int32_t>> EncodeResponse(absl::string_view text);
  // Decodes response tokens up to the first EOS; ids that are not answer characters
  // become '?', so a malformed response stays visibly malformed for the reward.
  static std::string DecodeResponse(const std::vector<int32_t>& ids);
  // Decodes a prompt back to "<task>:<input>" (for logs and the reward service).
  static std::string DecodePrompt(const std::vector<int32_t>& ids);
};

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_TOKENIZER_H_
