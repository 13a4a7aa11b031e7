#include "libs/model/chat_template.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/files.h"
#include "libs/common/status_macros.h"

namespace rlfleet::model {

namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxConfigBytes = 64 << 20;

// The named special tokens transformers puts in a template's scope
// (tokenizer.special_tokens_map), as tokenizer_config.json spells them: a string, or
// an AddedToken object with "content"; null ones are left out.
Json SpecialTokens(const Json& config) {
  Json tokens = Json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->is_string()) tokens[key] = *it;
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) tokens[key] = (*it)["content"];
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromText(absl::string_view text, std::string name,
                                                                     nlohmann::ordered_json special_tokens) {
  if (!special_tokens.is_object()) return absl::InvalidArgumentError("special tokens must be a JSON object");
  ASSIGN_OR_RETURN(auto jinja, JinjaTemplate::Parse(text, std::move(name)));
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(jinja), std::move(special_tokens)));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromModelDir(const std::string& dir) {
  const std::filesystem::path root(dir);
  Json config = Json::object();
  const std::filesystem::path config_path = root / "tokenizer_config.json";
  auto config_text = common::ReadRegularFile("tokenizer_config.json", config_path, kMaxConfigBytes);
  if (config_text.ok()) {
    config = Json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path.string(), " is not a JSON object"));
    }
  } else if (!absl::IsNotFound(config_text.status())) {
    return config_text.status();
  }
  const std::filesystem::path jinja_path = root / "chat_template.jinja";
  auto jinja_text = common::ReadRegularFile("chat_template.jinja", jinja_path, kMaxConfigBytes);
  if (jinja_text.ok()) return FromText(*jinja_text, jinja_path.string(), SpecialTokens(config));
  if (!absl::IsNotFound(jinja_text.status())) return jinja_text.status();

  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(dir,
                                            " has no chat template (neither chat_template.jinja nor a "
                                            "\"chat_template\" in tokenizer_config.json)"));
  }
  const std::string name = config_path.string();
  if (it->is_string()) return FromText(it->get<std::string>(), name, SpecialTokens(config));
  if (it->is_array()) {  // named templates: the default one
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return FromText(entry["template"].get<std::string>(), name + " (default)", SpecialTokens(config));
      }
    }
    return absl::NotFoundError(absl::StrCat(name, ": \"chat_template\" lists no template named \"default\""));
  }
  return absl::InvalidArgumentError(absl::StrCat(name, ": \"chat_template\" must be a string or a list"));
}

absl::StatusOr<std::string> ChatTemplate::Apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                                const nlohmann::ordered_json& tools,
                                                const nlohmann::ordered_json& extra, absl::Time now) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("the conversation must be a JSON array of messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " must be an object with a string \"role\""));
    }
  }
  if (!tools.is_null() && !tools.is_array()) return absl::InvalidArgumentError("tools must be a JSON array");
  if (!extra.is_object()) return absl::InvalidArgumentError("the template's extra variables must be a JSON object");
  // As transformers: render(messages=, tools=, documents=, add_generation_prompt=,
  // **{**special_tokens_map, **kwargs}).
  Json variables = special_tokens_;
  for (const auto& [key, value] : extra.items()) variables[key] = value;
  variables["messages"] = messages;
  variables["tools"] = tools;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = add_generation_prompt;
  return jinja_->Render(variables, now);
}

}  // namespace rlfleet::model
