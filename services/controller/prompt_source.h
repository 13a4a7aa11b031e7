// Where a run's prompts come from, and how its texts become token ids and back: a
// built-in digit task (the character tokenizer; prompts drawn from the run's seed), or
// a JSONL dataset (libs/tasks/prompt_dataset.h) tokenized by a Hugging Face model
// directory's tokenizer.json and scored as a reward task (`math`) against each record's
// answer. Not thread-safe: the run loop's thread draws the prompts.
#ifndef RLFLEET_SERVICES_CONTROLLER_PROMPT_SOURCE_H_
#define RLFLEET_SERVICES_CONTROLLER_PROMPT_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlfleet::controller {

struct LoopConfig;      // run_loop.h
class ToolEnvironment;  // tool_episodes.h

// One prompt: its text (for the reward service), its token ids (for the rollout) and
// its reference answer.
struct RunPrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::string answer;
};

class PromptSource {
 public:
  virtual ~PromptSource() = default;
  // The reward service's task of every prompt ("reverse", "math", ...).
  virtual const std::string& task() const = 0;
  // The held-out prompts (fixed for the run).
  virtual const std::vector<RunPrompt>& held_out() const = 0;
  // The next `n` training prompts: the same sequence for the same seed.
  virtual std::vector<RunPrompt> Next(int n) = 0;
  // A response's text (special tokens such as an end-of-turn left out).
  virtual absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  // The response cap when the run sets none.
  virtual int default_max_new_tokens() const = 0;
  // What it is, for the run's start line.
  virtual std::string Describe() const = 0;
  // The tool its prompts' responses may call (multi-turn episodes: tool_episodes.h), or
  // null.
  virtual const ToolEnvironment* tools() const { return nullptr; }
};

// The source `config` asks for: config.dataset's records (the tokenizer of
// config.tokenizer_dir, the held-out split of config.held_out records, the rest shuffled
// by config.seed and cycled, reshuffled each pass), else config.task's generator.
// INVALID_ARGUMENT / NOT_FOUND naming the file, field or line for a dataset that cannot
// be used (a bad line, a record with chat messages: chat templates are not supported
// yet, a prompt the tokenizer cannot encode, fewer than held_out + 1 records).
absl::StatusOr<std::unique_ptr<PromptSource>> NewPromptSource(const LoopConfig& config);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_PROMPT_SOURCE_H_
