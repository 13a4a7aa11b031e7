#include "services/gateway/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/json_depth.h"

namespace rlfleet::gateway {
namespace {

ApiError Bad(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

// The keys OpenAI's API defines for each endpoint (current API reference), and ours.
const std::set<std::string>& KnownKeys(Endpoint endpoint) {
  static const std::set<std::string> completions = {"model",
                                                    "prompt",
                                                    "best_of",
                                                    "echo",
                                                    "frequency_penalty",
                                                    "logit_bias",
                                                    "logprobs",
                                                    "max_tokens",
                                                    "n",
                                                    "presence_penalty",
                                                    "seed",
                                                    "stop",
                                                    "stream",
                                                    "stream_options",
                                                    "suffix",
                                                    "temperature",
                                                    "top_p",
                                                    "user",
                                                    "top_k",
                                                    "ignore_eos",
                                                    "min_policy_version"};
  static const std::set<std::string> chat = {"model",
                                             "messages",
                                             "audio",
                                             "frequency_penalty",
                                             "function_call",
                                             "functions",
                                             "logit_bias",
                                             "logprobs",
                                             "max_completion_tokens",
                                             "max_tokens",
                                             "metadata",
                                             "modalities",
                                             "n",
                                             "parallel_tool_calls",
                                             "prediction",
                                             "presence_penalty",
                                             "reasoning_effort",
                                             "response_format",
                                             "seed",
                                             "service_tier",
                                             "stop",
                                             "store",
                                             "stream",
                                             "stream_options",
                                             "temperature",
                                             "tool_choice",
                                             "tools",
                                             "top_logprobs",
                                             "top_p",
                                             "user",
                                             "web_search_options",
                                             "top_k",
                                             "ignore_eos",
                                             "min_policy_version"};
  return endpoint == Endpoint::kChat ? chat : completions;
}

std::optional<ApiError> ReadNumber(const Json& body, const char* key, double lo, double hi, double* out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number()) return Bad(key, absl::StrCat(key, ": expected a number"));
  const double v = body[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return Bad(key, absl::StrCat(key, ": ", v, " is outside [", lo, ", ", hi, "]"));
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> ReadInt(const Json& body, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const Json& v = body[key];
  if (!v.is_number_integer()) return Bad(key, absl::StrCat(key, ": expected an integer"));
  const bool in_range = v.is_number_unsigned()
                            ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) && v.get<int64_t>() >= lo
                            : v.get<int64_t>() <= hi && v.get<int64_t>() >= lo;
  if (!in_range) {
    return Bad(key, absl::StrCat(key, ": ", v.dump(), " is outside [", lo, ", ", hi, "]"));
  }
  *out = v.get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const Json& body, const char* key, bool* out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_boolean()) return Bad(key, absl::StrCat(key, ": expected true or false"));
  *out = body[key].get<bool>();
  return std::nullopt;
}

// A key we know but cannot honour: refused when set to anything but its neutral value.
std::optional<ApiError> RefuseUnlessNeutral(const Json& body, const char* key, const Json& neutral,
                                            const std::string& why) {
  if (!body.contains(key) || body[key].is_null() || body[key] == neutral) return std::nullopt;
  return Bad(key, absl::StrCat(key, ": not supported (", why, ")"));
}

// Whether json[key] is a string (equal to `value` when one is given).
bool IsString(const Json& json, const char* key, const char* value = nullptr) {
  if (!json.contains(key) || !json[key].is_string()) return false;
  return value == nullptr || json[key].get_ref<const std::string&>() == value;
}

// Chat content: a string, or text parts joined.
std::optional<ApiError> NormalizeContent(Json& message, size_t i) {
  if (!message.contains("content") || message["content"].is_null() || message["content"].is_string()) {
    return std::nullopt;
  }
  const std::string param = absl::StrCat("messages[", i, "].content");
  if (!message["content"].is_array()) return Bad(param, param + ": expected a string or an array of text parts");
  std::string text;
  for (const Json& part : message["content"]) {
    if (!part.is_object() || !IsString(part, "type", "text") || !part.contains("text") || !part["text"].is_string()) {
      return Bad(param, param + ": only parts of type \"text\" are supported");
    }
    text += part["text"].get<std::string>();
  }
  message["content"] = text;
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const Json& body, GenerationRequest* out) {
  if (!body.contains("prompt") || body["prompt"].is_null()) return Bad("prompt", "prompt: required");
  const Json& p = body["prompt"];
  if (p.is_string()) {
    out->prompt_text = p.get<std::string>();
    return std::nullopt;
  }
  if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    out->prompt_text = p[0].get<std::string>();
    return std::nullopt;
  }
  if (p.is_array() && !p.empty() &&
      std::all_of(p.begin(), p.end(), [](const Json& x) { return x.is_number_integer(); })) {
    for (const Json& x : p) {
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return Bad("prompt", absl::StrCat("prompt: token id ", id, " is out of range"));
      }
      out->prompt_ids.push_back(static_cast<int32_t>(id));
    }
    return std::nullopt;
  }
  if (p.is_array() && p.size() > 1) {
    return Bad("prompt", "prompt: one prompt per request (a list of several prompts or token lists is not supported)");
  }
  return Bad("prompt", "prompt: expected a string, a list of one string, or a list of token ids");
}

std::optional<ApiError> ReadMessages(const Json& body, GenerationRequest* out) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return Bad("messages", "messages: required, a non-empty array");
  }
  out->messages = body["messages"];
  for (size_t i = 0; i < out->messages.size(); ++i) {
    Json& m = out->messages[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Bad(param, param + ": expected an object with a string \"role\"");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool") {
      return Bad(param + ".role", absl::StrCat(param, ".role: unknown role \"", role, "\""));
    }
    if (role == "developer") m["role"] = "system";  // (what the open chat templates know)
    if (auto e = NormalizeContent(m, i)) return e;
    // An assistant's earlier tool calls: their arguments as objects, as the templates
    // render them (OpenAI sends them as JSON text).
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) return Bad(param + ".tool_calls", param + ".tool_calls: expected an array");
      for (Json& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          return Bad(param + ".tool_calls",
                     param + ".tool_calls: each is {\"type\": \"function\", \"function\": {...}}");
        }
        Json& f = call["function"];
        if (f.contains("arguments") && f["arguments"].is_string()) {
          const std::string& text = f["arguments"].get_ref<const std::string&>();
          Json parsed = common::CheckJsonDepth(text, "arguments").ok()
                            ? Json::parse(text, nullptr, /*allow_exceptions=*/false)
                            : Json(Json::value_t::discarded);
          if (!parsed.is_discarded()) f["arguments"] = std::move(parsed);
        }
      }
    }
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return Bad("tools", "tools: expected an array");
    for (const Json& t : body["tools"]) {
      if (!t.is_object() || !IsString(t, "type", "function") || !t.contains("function") || !t["function"].is_object() ||
          !IsString(t["function"], "name")) {
        return Bad("tools", "tools: each tool is {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
    }
    out->tools = body["tools"];
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& c = body["tool_choice"];
    if (c == "none") {
      out->tools = nullptr;
    } else if (c != "auto") {
      return Bad("tool_choice", "tool_choice: only \"auto\" and \"none\" are supported");
    }
  }
  return std::nullopt;
}

}  // namespace

std::string ErrorBody(const ApiError& error) {
  Json e = {{"message", error.message}, {"type", error.type}};
  e["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  e["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return Json({{"error", e}}).dump(-1, ' ', false, Json::error_handler_t::replace);
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "server_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
  }
  return e;
}

namespace {

std::optional<ApiError> ParseChecked(Endpoint endpoint, absl::string_view text, const std::string& served_model,
                                     GenerationRequest* out) {
  if (absl::Status deep = common::CheckJsonDepth(text, "the body"); !deep.ok()) {
    return Bad("", std::string(deep.message()));
  }
  Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Bad("", "the body is not valid JSON");
  if (!body.is_object()) return Bad("", "the body is not a JSON object");
  for (const auto& [key, value] : body.items()) {
    if (!KnownKeys(endpoint).count(key)) return Bad(key, absl::StrCat("Unrecognized request argument supplied: ", key));
  }
  *out = GenerationRequest{};
  out->endpoint = endpoint;
  if (!body.contains("model") || !body["model"].is_string()) return Bad("model", "model: required, a string");
  out->model = body["model"].get<std::string>();
  if (out->model != served_model) {
    ApiError e = Bad(
        "model", absl::StrCat("The model `", out->model, "` does not exist: this gateway serves `", served_model, "`"));
    e.status = 404;
    e.code = "model_not_found";
    return e;
  }
  if (auto e = endpoint == Endpoint::kChat ? ReadMessages(body, out) : ReadPrompt(body, out)) return e;

  int64_t max_tokens = 0;
  if (endpoint == Endpoint::kCompletions) max_tokens = 16;  // (OpenAI's default there)
  const char* max_key = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                            ? "max_completion_tokens"
                            : "max_tokens";
  if (auto e = ReadInt(body, max_key, 1, 1 << 20, &max_tokens)) return e;
  out->max_tokens = static_cast<uint32_t>(max_tokens);
  double temperature = 1.0, top_p = 1.0;
  if (auto e = ReadNumber(body, "temperature", 0, 2, &temperature)) return e;
  if (auto e = ReadNumber(body, "top_p", 0, 1, &top_p)) return e;
  if (top_p <= 0) return Bad("top_p", "top_p: must be greater than 0");
  out->temperature = static_cast<float>(temperature);
  out->top_p = static_cast<float>(top_p);
  int64_t top_k = 0, n = 1, seed = -1, min_version = 0;
  if (auto e = ReadInt(body, "top_k", -1, 1 << 20, &top_k)) return e;
  out->top_k = static_cast<uint32_t>(std::max<int64_t>(top_k, 0));  // (-1: no limit, as vLLM)
  if (auto e = ReadInt(body, "n", 1, kMaxChoices, &n)) return e;
  out->n = static_cast<uint32_t>(n);
  if (auto e = ReadInt(body, "seed", 0, std::numeric_limits<int64_t>::max(), &seed)) return e;
  if (seed >= 0) out->seed = static_cast<uint64_t>(seed);
  if (auto e = ReadInt(body, "min_policy_version", 0, std::numeric_limits<int64_t>::max(), &min_version)) return e;
  out->min_policy_version = static_cast<uint64_t>(min_version);
  if (auto e = ReadBool(body, "ignore_eos", &out->ignore_eos)) return e;
  if (auto e = ReadBool(body, "stream", &out->stream)) return e;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& so = body["stream_options"];
    if (!out->stream) return Bad("stream_options", "stream_options: only with stream: true");
    if (!so.is_object()) return Bad("stream_options", "stream_options: expected an object");
    for (const auto& [key, value] : so.items()) {
      if (key != "include_usage") return Bad("stream_options", absl::StrCat("stream_options: unknown key ", key));
    }
    if (auto e = ReadBool(so, "include_usage", &out->include_usage)) return e;
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& s = body["stop"];
    if (s.is_string()) {
      out->stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= kMaxStops &&
               std::all_of(s.begin(), s.end(), [](const Json& x) { return x.is_string(); })) {
      for (const Json& x : s) out->stop.push_back(x.get<std::string>());
    } else {
      return Bad("stop", absl::StrCat("stop: expected a string or an array of at most ", kMaxStops, " strings"));
    }
    for (const std::string& x : out->stop) {
      if (x.empty()) return Bad("stop", "stop: an empty string");
    }
  }
  if (body.contains("user") && !body["user"].is_null() && !body["user"].is_string()) {
    return Bad("user", "user: expected a string");
  }
  // Logprobs: the sampled tokens' only.
  if (endpoint == Endpoint::kCompletions) {
    int64_t logprobs = -1;
    if (auto e = ReadInt(body, "logprobs", 0, 5, &logprobs)) return e;
    if (logprobs > 0) {
      return Bad("logprobs",
                 "logprobs: only 0 is supported (the sampled tokens' log-probabilities; top "
                 "alternatives are not computed)");
    }
    out->logprobs = logprobs == 0;
  } else {
    if (auto e = ReadBool(body, "logprobs", &out->logprobs)) return e;
    int64_t top = 0;
    if (auto e = ReadInt(body, "top_logprobs", 0, 20, &top)) return e;
    if (top > 0) {
      return Bad("top_logprobs", "top_logprobs: only 0 is supported (top alternatives are not computed)");
    }
  }
  const std::string penalties = "the replicas sample from the policy as it is: what trains must be what sampled";
  if (auto e = RefuseUnlessNeutral(body, "frequency_penalty", 0, penalties)) return e;
  if (auto e = RefuseUnlessNeutral(body, "presence_penalty", 0, penalties)) return e;
  if (auto e = RefuseUnlessNeutral(body, "logit_bias", Json::object(), penalties)) return e;
  if (auto e = RefuseUnlessNeutral(body, "best_of", 1, "one sample per choice")) return e;
  if (auto e = RefuseUnlessNeutral(body, "echo", false, "the prompt's ids are in prompt_token_ids")) return e;
  if (auto e = RefuseUnlessNeutral(body, "suffix", "", "no insertion")) return e;
  if (auto e = RefuseUnlessNeutral(body, "store", false, "nothing is stored")) return e;
  if (auto e = RefuseUnlessNeutral(body, "metadata", Json::object(), "nothing is stored")) return e;
  if (auto e = RefuseUnlessNeutral(body, "response_format", Json({{"type", "text"}}), "text only")) return e;
  for (const char* key : {"audio", "modalities", "prediction", "reasoning_effort", "service_tier", "web_search_options",
                          "functions", "function_call"}) {
    if (body.contains(key) && !body[key].is_null()) return Bad(key, absl::StrCat(key, ": not supported"));
  }
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null() &&
      !body["parallel_tool_calls"].is_boolean()) {
    return Bad("parallel_tool_calls", "parallel_tool_calls: expected true or false");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseGenerationRequest(Endpoint endpoint, absl::string_view text,
                                               const std::string& served_model, GenerationRequest* out) {
  // Every field is checked by type before use; a use this code got wrong is still a
  // 400 naming the request, never an exception past this function.
  try {
    return ParseChecked(endpoint, text, served_model, out);
  } catch (const Json::exception& e) {
    *out = GenerationRequest{};
    return Bad("", absl::StrCat("the request could not be read: ", e.what()));
  }
}

ParsedToolCalls ParseToolCalls(const std::string& text, const std::string& id_prefix) {
  ParsedToolCalls out;
  const size_t first = text.find(kToolCallOpen);
  if (first == std::string::npos) {
    out.content = text;
    return out;
  }
  static const std::string kClose = "</tool_call>";
  size_t at = first;
  while (at != std::string::npos) {
    const size_t body = at + std::strlen(kToolCallOpen);
    const size_t close = text.find(kClose, body);
    const std::string json = text.substr(body, close == std::string::npos ? std::string::npos : close - body);
    const Json call = common::CheckJsonDepth(json, "a tool call").ok()
                          ? Json::parse(json, nullptr, /*allow_exceptions=*/false)
                          : Json(Json::value_t::discarded);
    if (call.is_discarded() || !call.is_object() || !call.contains("name") || !call["name"].is_string()) {
      return {text, {}};
    }
    const Json args = call.contains("arguments") ? call["arguments"] : Json::object();
    out.calls.push_back({absl::StrCat(id_prefix, out.calls.size()), call["name"].get<std::string>(),
                         args.is_string() ? args.get<std::string>() : args.dump()});
    if (close == std::string::npos) break;
    at = text.find(kToolCallOpen, close + kClose.size());
  }
  out.content = text.substr(0, first);
  while (!out.content.empty() && (out.content.back() == '\n' || out.content.back() == ' ')) out.content.pop_back();
  return out;
}

size_t UpdateChoiceText(ChoiceState& choice, std::string decoded, const std::vector<std::string>& stops, bool finished,
                        const std::string& hold_from) {
  if (choice.stopped) return choice.text.size();
  size_t cut = std::string::npos;
  for (const std::string& s : stops) cut = std::min(cut, decoded.find(s));
  if (cut != std::string::npos) {
    decoded.resize(cut);
    choice.stopped = true;
  }
  choice.text = std::move(decoded);
  if (choice.stopped || finished) return choice.text.size();
  size_t ready = choice.text.size();
  // Not an incomplete character (decoded as U+FFFD so far) ...
  static const std::string kReplacement = "\xEF\xBF\xBD";
  while (ready >= kReplacement.size() && choice.text.compare(ready - 3, 3, kReplacement) == 0) ready -= 3;
  // ... nor a tool call or what may become one ...
  std::vector<std::string> held = stops;
  if (!hold_from.empty()) {
    ready = std::min(ready, choice.text.find(hold_from));
    held.push_back(hold_from);
  }
  // ... nor what may become a stop string.
  for (const std::string& s : held) {
    for (size_t k = std::min(s.size() - 1, ready); k > 0; --k) {
      if (choice.text.compare(ready - k, k, s, 0, k) == 0) {
        ready -= k;
        break;
      }
    }
  }
  return std::max(ready, choice.sent_chars);
}

namespace {

Json Ints(const std::vector<int32_t>& v, size_t from, size_t to) {
  return Json(std::vector<int32_t>(v.begin() + from, v.begin() + to));
}

// The extension fields of a choice (or a chunk of one).
void AddTokens(Json& c, const ChoiceState& choice, size_t from, size_t to) {
  c["token_ids"] = Ints(choice.token_ids, from, to);
  c["token_logprobs"] = std::vector<float>(choice.logprobs.begin() + from, choice.logprobs.begin() + to);
  c["policy_versions"] = std::vector<uint64_t>(choice.versions.begin() + from, choice.versions.begin() + to);
}

Json LogprobsJson(const GenerationRequest& request, const ChoiceState& choice, size_t from, size_t to,
                  const std::function<std::string(int32_t)>& token_text) {
  if (!request.logprobs) return nullptr;
  if (request.endpoint == Endpoint::kChat) {
    Json content = Json::array();
    for (size_t i = from; i < to; ++i) {
      const std::string t = token_text(choice.token_ids[i]);
      std::vector<int> bytes;
      for (unsigned char b : t) bytes.push_back(b);
      content.push_back(
          {{"token", t}, {"logprob", choice.logprobs[i]}, {"bytes", bytes}, {"top_logprobs", Json::array()}});
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), lps = Json::array(), top = Json::array(), offsets = Json::array();
  size_t offset = 0;
  for (size_t i = from; i < to; ++i) {
    tokens.push_back(token_text(choice.token_ids[i]));
    lps.push_back(choice.logprobs[i]);
    top.push_back(nullptr);
    offsets.push_back(offset);
    offset += tokens.back().get<std::string>().size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", top}, {"text_offset", offsets}};
}

Json ToolCallsJson(const std::vector<ToolCall>& calls, bool delta) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call = {{"id", calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (delta) call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

Json Usage(const ResponseMeta& meta, const std::vector<ChoiceState>& choices) {
  size_t completion = 0;
  for (const ChoiceState& c : choices) completion += c.token_ids.size();
  return {{"prompt_tokens", meta.prompt_ids.size()},
          {"completion_tokens", completion},
          {"total_tokens", meta.prompt_ids.size() + completion}};
}

Json Envelope(const GenerationRequest& request, const ResponseMeta& meta, bool chunk) {
  const char* object =
      request.endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

Json FinishReason(const ChoiceState& choice, bool finished) {
  return finished && !choice.finish_reason.empty() ? Json(choice.finish_reason) : Json(nullptr);
}

}  // namespace

Json CompletionResponse(const GenerationRequest& request, const ResponseMeta& meta,
                        const std::vector<ChoiceState>& choices,
                        const std::function<std::string(int32_t)>& token_text) {
  Json out = Envelope(request, meta, false);
  Json list = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    Json choice = {{"index", i}};
    if (request.endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.empty()) {
        const std::string content = ParseToolCalls(c.text, "").content;
        choice["message"]["content"] = content.empty() ? Json(nullptr) : Json(content);
        choice["message"]["tool_calls"] = ToolCallsJson(c.tool_calls, false);
      }
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = LogprobsJson(request, c, 0, c.token_ids.size(), token_text);
    choice["finish_reason"] = FinishReason(c, true);
    AddTokens(choice, c, 0, c.token_ids.size());
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = Usage(meta, choices);
  out["prompt_token_ids"] = meta.prompt_ids;
  return out;
}

Json StreamChunk(const GenerationRequest& request, const ResponseMeta& meta, uint32_t index, const ChoiceState& choice,
                 size_t from, size_t to, size_t from_token, size_t to_token, bool finished,
                 const std::function<std::string(int32_t)>& token_text) {
  Json out = Envelope(request, meta, true);
  Json c = {{"index", index}};
  const std::string delta = choice.text.substr(from, to - from);
  if (request.endpoint == Endpoint::kChat) {
    c["delta"] = delta.empty() && finished ? Json::object() : Json({{"content", delta}});
    if (finished && !choice.tool_calls.empty()) c["delta"]["tool_calls"] = ToolCallsJson(choice.tool_calls, true);
  } else {
    c["text"] = delta;
  }
  c["logprobs"] = LogprobsJson(request, choice, from_token, to_token, token_text);
  c["finish_reason"] = FinishReason(choice, finished);
  AddTokens(c, choice, from_token, to_token);
  out["choices"] = Json::array({c});
  if (from_token == 0 && index == 0) out["prompt_token_ids"] = meta.prompt_ids;
  return out;
}

Json ChatRoleChunk(const ResponseMeta& meta, uint32_t index) {
  Json out = {{"id", meta.id}, {"object", "chat.completion.chunk"}, {"created", meta.created}, {"model", meta.model}};
  out["choices"] = Json::array({{{"index", index},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  return out;
}

Json UsageChunk(const GenerationRequest& request, const ResponseMeta& meta, const std::vector<ChoiceState>& choices) {
  Json out = Envelope(request, meta, true);
  out["choices"] = Json::array();
  out["usage"] = Usage(meta, choices);
  return out;
}

std::string SseEvent(const Json& json) {
  return absl::StrCat("data: ", json.dump(-1, ' ', false, Json::error_handler_t::replace), "\n\n");
}

}  // namespace rlfleet::gateway
