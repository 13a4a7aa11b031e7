// A Hugging Face model's chat template: the Jinja text from chat_template.jinja or
// tokenizer_config.json, rendered over a conversation the way transformers'
// `apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False)`
// renders it (the tokenizer's named special tokens and the caller's extra variables,
// e.g. enable_thinking, in the template's scope).
#ifndef RLFLEET_LIBS_MODEL_CHAT_TEMPLATE_H_
#define RLFLEET_LIBS_MODEL_CHAT_TEMPLATE_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/model/jinja.h"

namespace rlfleet::model {

class ChatTemplate {
 public:
  // `special_tokens`: a JSON object of the tokenizer's named special tokens
  // ({"eos_token": "<|im_end|>", ...}); unset ones are left out.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromText(absl::string_view text, std::string name,
                                                                nlohmann::ordered_json special_tokens);
  // From a model directory: chat_template.jinja when present, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {"name", "template"}: the one named
  // "default"), with that file's special tokens. NOT_FOUND when the directory has no
  // template; INVALID_ARGUMENT naming what does not parse or is not supported.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromModelDir(const std::string& dir);

  // The text of `messages` (a JSON array of {"role", "content", ...}). `tools`: a JSON
  // array of tool schemas, or null. `extra`: a JSON object of further variables (they
  // override the special tokens). INVALID_ARGUMENT for a malformed conversation or an
  // error the template raises (its message).
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                    const nlohmann::ordered_json& tools = nullptr,
                                    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                                    absl::Time now = absl::Now()) const;

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(std::unique_ptr<JinjaTemplate> jinja, nlohmann::ordered_json special_tokens)
      : jinja_(std::move(jinja)), special_tokens_(std::move(special_tokens)) {}
  std::unique_ptr<JinjaTemplate> jinja_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_CHAT_TEMPLATE_H_
