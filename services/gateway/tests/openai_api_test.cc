#include "services/gateway/openai_api.h"

#include <gtest/gtest.h>

namespace rlfleet::gateway {
namespace {

std::optional<ApiError> Parse(Endpoint endpoint, const std::string& body, GenerationRequest* out = nullptr) {
  GenerationRequest ignored;
  return ParseGenerationRequest(endpoint, body, "m", out != nullptr ? out : &ignored);
}

TEST(OpenAiApi, ReadsACompletionRequest) {
  GenerationRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions,
                     R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"n":3,"seed":4,
                         "stop":["x","yz"],"stream":true,"stream_options":{"include_usage":true},"logprobs":0,
                         "top_k":5,"ignore_eos":true,"min_policy_version":2,"user":"u"})",
                     &r)
                   .has_value());
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_EQ(r.max_tokens, 7u);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.n, 3u);
  EXPECT_EQ(r.seed, 4u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs && r.ignore_eos);
  EXPECT_EQ(r.top_k, 5u);
  EXPECT_EQ(r.min_policy_version, 2u);
}

TEST(OpenAiApi, DefaultsAsOpenAi) {
  GenerationRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"model":"m","prompt":[3,4]})", &r).has_value());
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(r.max_tokens, 16u);  // OpenAI's default for completions
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.n, 1u);
  EXPECT_FALSE(r.seed.has_value());
  ASSERT_FALSE(Parse(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"a"}]})", &r).has_value());
  EXPECT_EQ(r.max_tokens, 0u);  // the replica's default
}

TEST(OpenAiApi, ChatContentPartsAndRolesAndTools) {
  GenerationRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
                         {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                         "tools":[{"type":"function","function":{"name":"add"}}],"max_completion_tokens":9})",
                     &r)
                   .has_value());
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.max_tokens, 9u);
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"model":"m","messages":[{"role":"user","content":"a"}],
                         "tools":[{"type":"function","function":{"name":"add"}}],"tool_choice":"none"})",
                     &r)
                   .has_value());
  EXPECT_TRUE(r.tools.is_null());
}

TEST(OpenAiApi, RefusesWhatItCannotHonourByName) {
  const std::string chat = R"("model":"m","messages":[{"role":"user","content":"a"}])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{" + chat + R"(,"frequency_penalty":0.5})", "frequency_penalty"},
      {"{" + chat + R"(,"presence_penalty":1})", "presence_penalty"},
      {"{" + chat + R"(,"logit_bias":{"5":1}})", "logit_bias"},
      {"{" + chat + R"(,"top_logprobs":2,"logprobs":true})", "top_logprobs"},
      {"{" + chat + R"(,"temperature":2.5})", "temperature"},
      {"{" + chat + R"(,"top_p":0})", "top_p"},
      {"{" + chat + R"(,"n":65})", "n"},
      {"{" + chat + R"(,"n":"2"})", "n"},
      {"{" + chat + R"(,"max_tokens":0})", "max_tokens"},
      {"{" + chat + R"(,"stop":["a","b","c","d","e"]})", "stop"},
      {"{" + chat + R"(,"stop":""})", "stop"},
      {"{" + chat + R"(,"stream_options":{"include_usage":true}})", "stream_options"},
      {"{" + chat + R"(,"response_format":{"type":"json_object"}})", "response_format"},
      {"{" + chat + R"(,"tool_choice":"required"})", "tool_choice"},
      {"{" + chat + R"(,"audio":{}})", "audio"},
      {"{" + chat + R"(,"seed":-1})", "seed"},
      {"{" + chat + R"(,"bogus":1})", "bogus"},
      {R"({"model":"m","messages":[]})", "messages"},
      {R"({"model":"m","messages":[{"role":"robot","content":"a"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"a"}]})", "model"},
  };
  for (const auto& [body, param] : cases) {
    std::optional<ApiError> e = Parse(Endpoint::kChat, body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400) << body;
    EXPECT_EQ(e->param, param) << body;
    EXPECT_NE(e->message.find(param.substr(0, param.find('['))), std::string::npos) << e->message;
  }
  const std::vector<std::pair<std::string, std::string>> completions = {
      {R"({"model":"m"})", "prompt"},
      {R"({"model":"m","prompt":["a","b"]})", "prompt"},
      {R"({"model":"m","prompt":[1,-2]})", "prompt"},
      {R"({"model":"m","prompt":"a","logprobs":2})", "logprobs"},
      {R"({"model":"m","prompt":"a","echo":true})", "echo"},
      {R"({"model":"m","prompt":"a","best_of":2})", "best_of"},
      {R"({"model":"m","prompt":"a","suffix":"z"})", "suffix"},
      {R"({"model":"m","prompt":"a","messages":[]})", "messages"},  // a chat key
  };
  for (const auto& [body, param] : completions) {
    std::optional<ApiError> e = Parse(Endpoint::kCompletions, body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param) << body;
  }
  std::optional<ApiError> unknown_model = Parse(Endpoint::kCompletions, R"({"model":"other","prompt":"a"})");
  ASSERT_TRUE(unknown_model.has_value());
  EXPECT_EQ(unknown_model->status, 404);
  EXPECT_EQ(unknown_model->code, "model_not_found");
  for (const std::string body : {"", "{", "[1]", "\"x\"", "{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}"}) {
    std::optional<ApiError> e = Parse(Endpoint::kCompletions, body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400);
  }
}

TEST(OpenAiApi, ErrorBodyIsOpenAisShape) {
  ApiError e;
  e.message = "bad \"x\"";
  e.param = "x";
  const Json body = Json::parse(ErrorBody(e));
  EXPECT_EQ(body["error"]["message"], "bad \"x\"");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "x");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(ApiErrorFromStatus(absl::ResourceExhaustedError("q")).status, 429);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("q")).status, 503);
  EXPECT_EQ(ApiErrorFromStatus(absl::FailedPreconditionError("q")).status, 400);
  EXPECT_EQ(ApiErrorFromStatus(absl::DeadlineExceededError("q")).status, 504);
  EXPECT_EQ(ApiErrorFromStatus(absl::InternalError("q")).status, 500);
}

TEST(OpenAiApi, StopStringsCutAndHoldBackWhatMayBecomeOne) {
  ChoiceState c;
  const std::vector<std::string> stops = {"END", "\n\n"};
  EXPECT_EQ(UpdateChoiceText(c, "abc", stops, false), 3u);
  EXPECT_EQ(UpdateChoiceText(c, "abcE", stops, false), 3u);  // "E" may start "END"
  EXPECT_EQ(UpdateChoiceText(c, "abcEN", stops, false), 3u);
  EXPECT_EQ(UpdateChoiceText(c, "abcENx", stops, false), 6u);  // it did not
  EXPECT_EQ(UpdateChoiceText(c, "abcENx\n", stops, false), 6u);
  EXPECT_FALSE(c.stopped);
  EXPECT_EQ(UpdateChoiceText(c, "abcENx\n\nmore", stops, false), 6u);
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.text, "abcENx");
  // Once stopped, nothing changes.
  EXPECT_EQ(UpdateChoiceText(c, "abcENx\n\nmore and more", stops, false), 6u);
  EXPECT_EQ(c.text, "abcENx");
  // At the end, everything goes out.
  ChoiceState d;
  EXPECT_EQ(UpdateChoiceText(d, "xxEN", stops, true), 4u);
}

TEST(OpenAiApi, HoldsBackAnIncompleteCharacter) {
  ChoiceState c;
  EXPECT_EQ(UpdateChoiceText(c, "h\xEF\xBF\xBD", {}, false), 1u);  // a partial "é" decodes as U+FFFD
  EXPECT_EQ(UpdateChoiceText(c, "h\xC3\xA9", {}, false), 3u);
  EXPECT_EQ(UpdateChoiceText(c, "h\xC3\xA9\xEF\xBF\xBD", {}, true), 6u);  // invalid at the end: sent as is
}

TEST(OpenAiApi, ResponsesCarryTokensAndUsage) {
  GenerationRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":true})", &r)
                   .has_value());
  ResponseMeta meta{"chatcmpl-1", 5, "m", {1, 2}};
  ChoiceState c;
  c.token_ids = {7, 8};
  c.logprobs = {-0.5f, -1.5f};
  c.versions = {3, 4};
  c.text = "hi";
  c.finish_reason = "length";
  const Json out = CompletionResponse(r, meta, {c}, [](int32_t id) { return id == 7 ? std::string("h") : "i"; });
  EXPECT_EQ(out["object"], "chat.completion");
  EXPECT_EQ(out["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(out["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(out["choices"][0]["token_ids"], Json({7, 8}));
  EXPECT_EQ(out["choices"][0]["policy_versions"], Json({3, 4}));
  EXPECT_EQ(out["choices"][0]["logprobs"]["content"][1]["token"], "i");
  EXPECT_FLOAT_EQ(out["choices"][0]["logprobs"]["content"][1]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(out["usage"]["total_tokens"], 4);
  EXPECT_EQ(out["prompt_token_ids"], Json({1, 2}));
  const Json chunk = StreamChunk(r, meta, 0, c, 1, 2, 1, 2, true, [](int32_t) { return "i"; });
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "i");
  EXPECT_EQ(chunk["choices"][0]["token_ids"], Json({8}));
  EXPECT_EQ(SseEvent(Json({{"a", 1}})), "data: {\"a\":1}\n\n");
}

TEST(OpenAiApi, ToolCallsAreFoundInTheHermesForm) {
  ParsedToolCalls p = ParseToolCalls(
      "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"neg\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
      "call_x_");
  EXPECT_EQ(p.content, "Let me add.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].id, "call_x_0");
  EXPECT_EQ(p.calls[0].name, "add");
  EXPECT_EQ(Json::parse(p.calls[0].arguments), Json({{"a", 2}, {"b", 3}}));
  EXPECT_EQ(p.calls[1].name, "neg");
  EXPECT_EQ(p.calls[1].arguments, "{\"x\": 1}");  // (given as text: kept as text)
  // Not a call: the text stays the content.
  for (const std::string text :
       {"no call", "<tool_call>{not json}</tool_call>", "<tool_call>{\"args\": 1}</tool_call>"}) {
    ParsedToolCalls q = ParseToolCalls(text, "c");
    EXPECT_TRUE(q.calls.empty()) << text;
    EXPECT_EQ(q.content, text);
  }
  // An unclosed last call (cut by the length cap) still parses when its JSON is whole.
  EXPECT_EQ(ParseToolCalls("<tool_call>{\"name\": \"f\"}", "c").calls.size(), 1u);
  // Streaming holds back from the call on.
  ChoiceState c;
  EXPECT_EQ(UpdateChoiceText(c, "hi <tool", {}, false, kToolCallOpen), 3u);
  EXPECT_EQ(UpdateChoiceText(c, "hi <tool_call>{\"na", {}, false, kToolCallOpen), 3u);
}

TEST(OpenAiApi, EarlierToolCallsReachTheTemplateAsObjects) {
  GenerationRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"model":"m","messages":[{"role":"user","content":"2+3?"},
                         {"role":"assistant","content":null,"tool_calls":[{"id":"c0","type":"function",
                          "function":{"name":"add","arguments":"{\"a\":2,\"b\":3}"}}]},
                         {"role":"tool","tool_call_id":"c0","content":"5"}]})",
                     &r)
                   .has_value());
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"], Json({{"a", 2}, {"b", 3}}));
  EXPECT_EQ(Parse(Endpoint::kChat, R"({"model":"m","messages":[{"role":"assistant","tool_calls":5}]})")->param,
            "messages[0].tool_calls");
}

}  // namespace
}  // namespace rlfleet::gateway
