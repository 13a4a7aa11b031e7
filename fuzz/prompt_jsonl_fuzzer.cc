// libFuzzer harness: a prompt dataset's JSONL (ParsePromptJsonl) and the math answers
// read from responses (ExtractMathAnswer, MathAnswersMatch) over arbitrary text. A
// parsed file's records have 1-based line numbers within the text, in order, each with a
// prompt or messages; an error is INVALID_ARGUMENT. Any answer matches itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "libs/tasks/math_answer.h"
#include "libs/tasks/prompt_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto records = rlfleet::tasks::ParsePromptJsonl(text, "fuzz.jsonl");
  if (records.ok()) {
    int64_t lines = 1, last = 0;
    for (char c : text) lines += c == '\n';
    for (const auto& r : *records) {
      if (r.line <= last || r.line > lines) std::abort();
      if (r.prompt.empty() == r.messages.empty() && !(r.prompt.empty() && r.messages.empty())) std::abort();
      last = r.line;
    }
  } else if (records.status().code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }
  auto answer = rlfleet::tasks::ExtractMathAnswer(text);
  if (answer.has_value()) {
    if (answer->how != "boxed" && answer->how != "gsm8k" && answer->how != "last_number") std::abort();
    if (!rlfleet::tasks::MathAnswersMatch(answer->text, answer->text)) std::abort();
  }
  (void)rlfleet::tasks::MathAnswerValue(text);
  return 0;
}
