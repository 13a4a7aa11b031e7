// OpenAI's completions and chat completions API as the gateway speaks it, without any
// I/O: request bodies parsed and checked into GenerationRequest, and the JSON of
// responses, stream chunks and errors.
//
// What is honoured: model (must be the served name), prompt (a string, a list of one
// string, or token ids) / messages (+ tools, passed to the chat template), max_tokens /
// max_completion_tokens, temperature, top_p, n, seed, stop (strings; the text is cut
// before the first one), stream and stream_options.include_usage, logprobs (the sampled
// tokens' log-probabilities: completions `logprobs: 0`, chat `logprobs: true`), user
// (recorded in nothing, as OpenAI's is an end-user tag). Extensions: top_k, ignore_eos,
// min_policy_version in the request; every choice carries token_ids, token_logprobs and
// policy_versions (the version that decoded each token), the response
// prompt_token_ids. What cannot be honoured is refused by name (400): top alternatives
// (top_logprobs > 0, completions logprobs > 0), penalties, logit_bias, echo, suffix,
// best_of > 1, response_format other than text, and any key OpenAI does not define.
#ifndef RLFLEET_SERVICES_GATEWAY_OPENAI_API_H_
#define RLFLEET_SERVICES_GATEWAY_OPENAI_API_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlfleet::gateway {

using Json = nlohmann::ordered_json;

// An error as OpenAI answers it: an HTTP status and {"error": {...}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault ("" = null)
  std::string code;   // "" = null
};
std::string ErrorBody(const ApiError& error);
// A gRPC-style status from the replicas as an API error: INVALID_ARGUMENT /
// FAILED_PRECONDITION 400, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED
// 504, others 500.
ApiError ApiErrorFromStatus(const absl::Status& status);

enum class Endpoint { kCompletions, kChat };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::optional<std::string> prompt_text;  // completions: text to tokenize
  std::vector<int32_t> prompt_ids;         // completions: given as token ids
  Json messages;                           // chat
  Json tools;                              // chat: null or an array
  uint32_t max_tokens = 0;                 // 0: the replica's default
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint32_t top_k = 0;
  std::optional<uint64_t> seed;
  uint32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  uint64_t min_policy_version = 0;
};

inline constexpr uint32_t kMaxChoices = 64;
inline constexpr size_t kMaxStops = 4;

// Parses a request body. Errors name the field (ApiError::param).
std::optional<ApiError> ParseGenerationRequest(Endpoint endpoint, absl::string_view body,
                                               const std::string& served_model, GenerationRequest* out);

// A tool call the model wrote, as OpenAI returns it (arguments as JSON text).
struct ToolCall {
  std::string id;  // "call_..."
  std::string name;
  std::string arguments;
};
// Finds the tool calls in a response written as the Hermes / Qwen2.5 / Qwen3 templates
// ask: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (blanks around the
// JSON allowed). The text before the first call is the message's content; a call whose
// JSON does not parse, or lacks a string name, leaves the whole text as content and no
// calls (the model's output, not an error). `id_prefix` + the call's index names each.
struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls ParseToolCalls(const std::string& text, const std::string& id_prefix);
inline constexpr char kToolCallOpen[] = "<tool_call>";

// One choice as it grows: tokens appended as they come, text decoded, stop strings
// found. Pure.
struct ChoiceState {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<uint64_t> versions;
  std::string text;                  // decoded so far (cut at a stop string once found)
  size_t sent_chars = 0;             // bytes of `text` already streamed
  size_t sent_tokens = 0;            // tokens already streamed
  bool stopped = false;              // a stop string ended it (finish_reason "stop")
  std::string finish_reason;         // "" while running
  std::vector<ToolCall> tool_calls;  // set at the end when the request had tools
};

// Sets `choice.text` from its tokens' decoded text `decoded` and cuts it at the first
// of `stops` (stopped = true). Returns the bytes of text that may be streamed now:
// everything up to the cut, but while running, not a possible start of a stop string at
// the end nor an incomplete UTF-8 character (U+FFFD at the end). With `hold_from`, also
// nothing from its first occurrence on (a tool call, sent whole at the end).
size_t UpdateChoiceText(ChoiceState& choice, std::string decoded, const std::vector<std::string>& stops, bool finished,
                        const std::string& hold_from = "");

struct ResponseMeta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  std::vector<int32_t> prompt_ids;
};

// The whole (non-streamed) response. `token_text(id)` spells a token for logprobs.
Json CompletionResponse(const GenerationRequest& request, const ResponseMeta& meta,
                        const std::vector<ChoiceState>& choices, const std::function<std::string(int32_t)>& token_text);
// One stream chunk for choice `index`: text bytes [from, to) of its text, tokens
// [from_token, to_token), and its finish_reason when `finished`.
Json StreamChunk(const GenerationRequest& request, const ResponseMeta& meta, uint32_t index, const ChoiceState& choice,
                 size_t from, size_t to, size_t from_token, size_t to_token, bool finished,
                 const std::function<std::string(int32_t)>& token_text);
// The chat stream's first chunk of a choice ({"role": "assistant"}).
Json ChatRoleChunk(const ResponseMeta& meta, uint32_t index);
// The final usage chunk (stream_options.include_usage).
Json UsageChunk(const GenerationRequest& request, const ResponseMeta& meta, const std::vector<ChoiceState>& choices);
// "data: <json>\n\n".
std::string SseEvent(const Json& json);

}  // namespace rlfleet::gateway

#endif  // RLFLEET_SERVICES_GATEWAY_OPENAI_API_H_
