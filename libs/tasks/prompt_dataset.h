// Prompt datasets from JSONL files, as RL recipes keep them: one JSON object per line
// with a prompt (a string, or chat messages [{"role", "content"}, ...]) and an answer
// (a string or a number; GSM8K's "... #### 72" is kept whole: the math reward reads
// it), under field names the caller chooses; a seeded shuffle and a held-out split.
//
//   auto records = ReadPromptJsonl("gsm8k.jsonl", {.prompt = "question"});
//   PromptSplit split = SplitPrompts(*records, /*seed=*/1, /*heldout=*/200);
#ifndef RLFLEET_LIBS_TASKS_PROMPT_DATASET_H_
#define RLFLEET_LIBS_TASKS_PROMPT_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlfleet::tasks {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

struct PromptRecord {
  int64_t line = 0;                   // 1-based line of the file
  std::string prompt;                 // the prompt string (empty when given as messages)
  std::vector<ChatMessage> messages;  // the prompt as chat messages (empty when a string)
  std::string answer;                 // the reference answer ("" when the file has none)
};

struct PromptFields {
  std::string prompt = "prompt";      // a string field
  std::string messages = "messages";  // an array of {"role", "content"} (used when prompt is absent)
  std::string answer = "answer";      // a string or number; "" = the records have no answer
};

// A record (one line) longer than this is refused, naming its line; so is one whose
// JSON nests deeper than kMaxPromptRecordDepth.
inline constexpr size_t kMaxPromptRecordBytes = 4 << 20;
inline constexpr int kMaxPromptRecordDepth = 32;

// The records of a JSONL text (`name` names it in errors): blank lines skipped; each
// other line an object with the prompt field or the messages field, and the answer
// field unless `fields.answer` is empty. INVALID_ARGUMENT naming the line for a line
// that does not parse, is not an object, lacks both prompt fields, or has a field of
// the wrong type; INVALID_ARGUMENT for a file without records.
absl::StatusOr<std::vector<PromptRecord>> ParsePromptJsonl(absl::string_view text, const std::string& name,
                                                           const PromptFields& fields = {});
// The same from a file (NOT_FOUND when absent), read a block at a time (a file of up to
// 4 GiB; a line past kMaxPromptRecordBytes is refused when it gets there).
absl::StatusOr<std::vector<PromptRecord>> ReadPromptJsonl(const std::string& path, const PromptFields& fields = {});

struct PromptSplit {
  std::vector<PromptRecord> train, heldout;
};

// The indices 0..n-1 in the order `seed` gives them: a Fisher-Yates shuffle over
// splitmix64, the same on every machine (no std:: distribution).
std::vector<size_t> ShuffledOrder(size_t n, uint64_t seed);

// `records` shuffled by `seed` (the same seed, the same order on every machine: a
// Fisher-Yates shuffle over splitmix64), the first `heldout` of them held out (at most
// all but one).
PromptSplit SplitPrompts(std::vector<PromptRecord> records, uint64_t seed, size_t heldout);

}  // namespace rlfleet::tasks

#endif  // RLFLEET_LIBS_TASKS_PROMPT_DATASET_H_
