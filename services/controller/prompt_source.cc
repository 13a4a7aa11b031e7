#include "services/controller/prompt_source.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "libs/common/json_depth.h"
#include "libs/common/status_macros.h"
#include "libs/model/chat_template.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/tokenizer.h"
#include "libs/tasks/prompt_dataset.h"
#include "libs/tasks/tasks.h"
#include "services/controller/run_loop.h"
#include "services/controller/tool_episodes.h"

namespace rlfleet::controller {
namespace {

class TaskSource : public PromptSource {
 public:
  TaskSource(const tasks::Task* task, const LoopConfig& config)
      : task_(task),
        name_(task->name()),
        lengths_{config.min_len, config.max_len},
        gen_(std::seed_seq{config.seed}),
        // (with the calculator: "[a*b](product)product" and EOS)
        max_new_tokens_(task->UsesCalculator() ? 3 * config.max_len + 9 : config.max_len + 3),
        tools_(task->UsesCalculator() ? CalculatorEnvironment() : nullptr) {
    // (drawn first from the run's generator, then the training prompts: as ever)
    for (int i = 0; i < config.held_out; ++i) held_out_.push_back(Make());
  }
  const std::string& task() const override { return name_; }
  const std::vector<RunPrompt>& held_out() const override { return held_out_; }
  std::vector<RunPrompt> Next(int n) override {
    std::vector<RunPrompt> prompts;
    for (int i = 0; i < n; ++i) prompts.push_back(Make());
    return prompts;
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return model::Tokenizer::DecodeResponse(ids);
  }
  int default_max_new_tokens() const override { return max_new_tokens_; }
  std::string Describe() const override {
    return absl::StrCat(name_, " n=", lengths_.min_len, "..", lengths_.max_len,
                        tools_ != nullptr ? ", with the calculator tool" : "");
  }
  const ToolEnvironment* tools() const override { return tools_.get(); }

 private:
  RunPrompt Make() {
    tasks::Example e = task_->Make(gen_, lengths_);
    absl::StatusOr<std::vector<int32_t>> ids = model::Tokenizer::EncodePrompt(e.prompt);
    return {e.prompt, ids.ok() ? *ids : std::vector<int32_t>{}, e.answer};  // (a task's prompts always encode)
  }

  const tasks::Task* task_;
  const std::string name_;
  const tasks::TaskOptions lengths_;
  absl::BitGen gen_;
  const int max_new_tokens_;
  const std::unique_ptr<ToolEnvironment> tools_;
  std::vector<RunPrompt> held_out_;
};

class DatasetSource : public PromptSource {
 public:
  DatasetSource(std::string task, std::string describe, std::unique_ptr<model::HfTokenizer> tokenizer,
                std::vector<RunPrompt> train, std::vector<RunPrompt> held_out, uint64_t seed)
      : task_(std::move(task)),
        describe_(std::move(describe)),
        tokenizer_(std::move(tokenizer)),
        train_(std::move(train)),
        held_out_(std::move(held_out)),
        seed_(seed) {
    Shuffle();
  }
  const std::string& task() const override { return task_; }
  const std::vector<RunPrompt>& held_out() const override { return held_out_; }
  std::vector<RunPrompt> Next(int n) override {
    std::vector<RunPrompt> prompts;
    for (int i = 0; i < n; ++i) {
      if (next_ == order_.size()) {
        ++pass_;
        Shuffle();
      }
      prompts.push_back(train_[order_[next_++]]);
    }
    return prompts;
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return tokenizer_->Decode(ids, /*skip_special_tokens=*/true);
  }
  int default_max_new_tokens() const override { return 128; }
  std::string Describe() const override { return describe_; }

 private:
  // Each pass in its own order (the same on every machine).
  void Shuffle() {
    order_ = tasks::ShuffledOrder(train_.size(), seed_ ^ ((pass_ + 1) * 0x9e3779b97f4a7c15ull));
    next_ = 0;
  }

  const std::string task_;
  const std::string describe_;
  std::unique_ptr<model::HfTokenizer> tokenizer_;
  const std::vector<RunPrompt> train_;
  const std::vector<RunPrompt> held_out_;
  const uint64_t seed_;
  uint64_t pass_ = 0;
  std::vector<size_t> order_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PromptSource>> NewPromptSource(const LoopConfig& config) {
  if (config.dataset.empty()) {
    const tasks::Task* task = tasks::FindTask(config.task);
    if (task == nullptr) return absl::InvalidArgumentError(absl::StrCat("task: unknown task '", config.task, "'"));
    return std::unique_ptr<PromptSource>(new TaskSource(task, config));
  }
  if (config.tokenizer_dir.empty()) {
    return absl::InvalidArgumentError("dataset: needs tokenizer_dir (the model directory whose tokenizer.json to use)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::HfTokenizer> tokenizer, model::HfTokenizer::FromFile(config.tokenizer_dir));
  tasks::PromptFields fields;
  fields.prompt = config.prompt_field;
  fields.answer = config.answer_field;
  ASSIGN_OR_RETURN(std::vector<tasks::PromptRecord> records, tasks::ReadPromptJsonl(config.dataset, fields));
  if (records.size() < static_cast<size_t>(config.held_out) + 1) {
    return absl::InvalidArgumentError(absl::StrCat("dataset ", config.dataset, ": ", records.size(),
                                                   " records; held_out ", config.held_out, " needs more"));
  }
  // The chat template, when a record or the config asks for it.
  std::unique_ptr<model::ChatTemplate> chat;
  nlohmann::ordered_json chat_kwargs = nlohmann::ordered_json::object();
  const bool any_messages =
      std::any_of(records.begin(), records.end(), [](const tasks::PromptRecord& r) { return !r.messages.empty(); });
  if (any_messages || config.apply_chat_template) {
    auto loaded = model::ChatTemplate::FromModelDir(config.tokenizer_dir);
    if (!loaded.ok()) {
      return common::Annotate(loaded.status(),
                              any_messages ? absl::StrCat("dataset ", config.dataset, ": records are chat messages")
                                           : "apply_chat_template");
    }
    chat = *std::move(loaded);
  }
  if (!config.chat_template_kwargs.empty()) {
    // (variables for every prompt's render: small and shallow, as the templates' own are)
    constexpr size_t kMaxKwargsBytes = 64 << 10;
    if (config.chat_template_kwargs.size() > kMaxKwargsBytes) {
      return absl::InvalidArgumentError(absl::StrCat("chat_template_kwargs: ", config.chat_template_kwargs.size(),
                                                     " bytes, more than the limit of ", kMaxKwargsBytes));
    }
    RETURN_IF_ERROR(common::CheckJsonDepth(config.chat_template_kwargs, "chat_template_kwargs", 16));
    chat_kwargs = nlohmann::ordered_json::parse(config.chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    if (chat_kwargs.is_discarded() || !chat_kwargs.is_object()) {
      return absl::InvalidArgumentError("chat_template_kwargs: not a JSON object");
    }
    if (chat == nullptr) {
      return absl::InvalidArgumentError(
          "chat_template_kwargs: set, but no prompt goes through the chat template (see apply_chat_template)");
    }
  }
  // A record's prompt text: the string as it is, or through the chat template.
  auto prompt_text = [&](const tasks::PromptRecord& r) -> absl::StatusOr<std::string> {
    if (chat == nullptr || (r.messages.empty() && !config.apply_chat_template)) return r.prompt;
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (r.messages.empty()) messages.push_back({{"role", "user"}, {"content", r.prompt}});
    for (const tasks::ChatMessage& m : r.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    auto text = chat->Apply(messages, /*add_generation_prompt=*/true, nullptr, chat_kwargs);
    if (!text.ok()) return common::Annotate(text.status(), absl::StrCat(config.dataset, ":", r.line));
    return text;
  };
  tasks::PromptSplit split = tasks::SplitPrompts(std::move(records), config.seed, config.held_out);
  size_t longest = 0;
  auto encode = [&](const std::vector<tasks::PromptRecord>& from) -> absl::StatusOr<std::vector<RunPrompt>> {
    std::vector<RunPrompt> out;
    for (const tasks::PromptRecord& r : from) {
      ASSIGN_OR_RETURN(std::string text, prompt_text(r));
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text);
      if (!ids.ok()) return common::Annotate(ids.status(), absl::StrCat(config.dataset, ":", r.line));
      if (ids->empty()) return absl::InvalidArgumentError(absl::StrCat(config.dataset, ":", r.line, ": empty prompt"));
      longest = std::max(longest, ids->size());
      out.push_back({std::move(text), std::move(*ids), r.answer});
    }
    return out;
  };
  ASSIGN_OR_RETURN(std::vector<RunPrompt> train, encode(split.train));
  ASSIGN_OR_RETURN(std::vector<RunPrompt> held_out, encode(split.heldout));
  const std::string describe = absl::StrCat(
      config.dataset, " (", train.size(), " train, ", held_out.size(), " held out, prompts up to ", longest, " tokens",
      chat != nullptr ? ", through the chat template" : "", ") as task ", config.dataset_task);
  return std::unique_ptr<PromptSource>(new DatasetSource(config.dataset_task, describe, std::move(tokenizer),
                                                         std::move(train), std::move(held_out), config.seed));
}

}  // namespace rlfleet::controller
