// The gateway over real HTTP (http::Server on loopback) with a scripted backend.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "libs/http/http_server.h"
#include "libs/http/raw_client.h"
#include "services/gateway/gateway_core.h"

namespace rlfleet::gateway {
namespace {

// The built-in tokenizer's ids: '1' 10, '2' 11, '3' 12, EOS 2.
class ScriptedBackend : public GenerateBackend {
 public:
  absl::Status Generate(const v1::GenerateRequest& request, absl::Time deadline,
                        const std::function<bool(const v1::GenerateResponse&)>& on_message) override {
    {
      absl::MutexLock lock(&mu);
      last = request;
    }
    if (!fail_before.ok()) return fail_before;
    for (uint32_t s = 0; s < std::max(1u, request.num_samples()); ++s) {
      for (size_t i = 0; endless || i < tokens.size(); ++i) {
        if (absl::Now() > deadline) return absl::DeadlineExceededError("deadline");
        v1::GenerateResponse m;
        m.mutable_chunk()->set_sample_index(s);
        m.mutable_chunk()->set_token_offset(static_cast<uint32_t>(i));
        m.mutable_chunk()->add_token_ids(endless ? 11 : tokens[i]);
        m.mutable_chunk()->add_logprobs(-0.25f);
        m.mutable_chunk()->add_policy_versions(7);
        if (!on_message(m)) {
          absl::MutexLock lock(&mu);  // (several requests may be cancelled)
          if (!cancelled.HasBeenNotified()) cancelled.Notify();
          return absl::OkStatus();
        }
        if (fail_after > 0 && static_cast<int>(i) + 1 == fail_after) return absl::UnavailableError("replica died");
        if (endless) absl::SleepFor(absl::Milliseconds(5));
      }
      v1::GenerateResponse done;
      done.mutable_finished()->set_sample_index(s);
      done.mutable_finished()->set_finish_reason(v1::FINISH_REASON_STOP);
      if (!on_message(done)) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  std::vector<int32_t> tokens = {12, 11, 10, 2};
  bool endless = false;
  int fail_after = 0;
  absl::Status fail_before;
  absl::Notification cancelled;
  absl::Mutex mu;
  v1::GenerateRequest last ABSL_GUARDED_BY(mu);
};

using http::ConnectLoopback;
using http::RawReply;
using http::SendAll;
using Reply = http::RawReply;

int Connect(int port) { return ConnectLoopback(port); }

std::string Request(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& extra_headers = "") {
  return http::RawRequest(method, path, body, extra_headers);
}

Reply Exchange(int port, const std::string& raw) { return http::Exchange(port, raw); }

// The JSON of each `data:` event but [DONE].
std::vector<Json> Events(const std::string& body, bool* done) {
  std::vector<Json> events;
  *done = false;
  for (absl::string_view e : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::ConsumePrefix(&e, "data: ")) << e;
    if (e == "[DONE]") {
      *done = true;
      continue;
    }
    events.push_back(Json::parse(e));
  }
  return events;
}

// Bytes as tokens; a conversation as "role: content" lines.
class ByteCodec : public TextCodec {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  absl::StatusOr<std::string> RenderChat(const Json& messages, const Json& tools) const override {
    std::string out = tools.is_null() ? "" : "tools\n";
    for (const Json& m : messages) out += m["role"].get<std::string>() + ": " + m.value("content", "") + "\n";
    return out;
  }
  std::string Decode(const std::vector<int32_t>& ids) const override { return std::string(ids.begin(), ids.end()); }
  std::string TokenText(int32_t id) const override { return std::string(1, static_cast<char>(id)); }
  int32_t vocab_size() const override { return 256; }
};

std::vector<int32_t> Bytes(const std::string& text) { return std::vector<int32_t>(text.begin(), text.end()); }

class GatewayTest : public ::testing::Test {
 protected:
  void Start(GatewayOptions options = {}, http::Server::Options http = {},
             std::unique_ptr<TextCodec> codec = BuiltinCodec()) {
    gateway_ = std::make_unique<Gateway>(options, std::move(codec), &backend_);
    http.paths = GatewayPaths();
    auto server = http::Server::Start(
        "127.0.0.1", 0, http, [this](const http::Request& r) { return gateway_->Handle(r); },
        [this](const http::Request& r) { return gateway_->CheckHead(r); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  int port() const { return server_->port(); }

  ScriptedBackend backend_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<http::Server> server_;
};

TEST_F(GatewayTest, ACompletionWithTokensVersionsAndUsage) {
  Start();
  const Reply r = Exchange(
      port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:123","n":2,"seed":3})"));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json body = Json::parse(r.body);
  ASSERT_EQ(body["choices"].size(), 2u);
  for (const Json& c : body["choices"]) {
    EXPECT_EQ(c["text"], "321");
    EXPECT_EQ(c["finish_reason"], "stop");
    EXPECT_EQ(c["token_ids"], Json({12, 11, 10, 2}));
    EXPECT_EQ(c["policy_versions"], Json({7, 7, 7, 7}));
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
  EXPECT_EQ(body["prompt_token_ids"], Json({1, 4, 10, 11, 12, 3}));
  absl::MutexLock lock(&backend_.mu);
  EXPECT_EQ(backend_.last.num_samples(), 2u);
  EXPECT_EQ(backend_.last.sampling().seed(), 3u);
  EXPECT_EQ(backend_.last.sampling().max_new_tokens(), 16u);
  EXPECT_EQ(backend_.last.prompt_token_ids_size(), 6);
}

TEST_F(GatewayTest, AStreamAddsUpToTheSameTextAndEndsWithDone) {
  Start();
  const Reply r = Exchange(port(), Request("POST", "/v1/completions",
                                           R"({"model":"rlfleet","prompt":"reverse:123","stream":true,
                                               "stream_options":{"include_usage":true}})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.head.find("text/event-stream"), std::string::npos);
  bool done = false;
  const std::vector<Json> events = Events(r.body, &done);
  EXPECT_TRUE(done);
  std::string text;
  std::vector<int> ids;
  std::string finish;
  for (const Json& e : events) {
    for (const Json& c : e["choices"]) {
      text += c["text"].get<std::string>();
      for (const Json& id : c["token_ids"]) ids.push_back(id.get<int>());
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  EXPECT_EQ(text, "321");
  EXPECT_EQ(ids, (std::vector<int>{12, 11, 10, 2}));
  EXPECT_EQ(finish, "stop");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 4);
}

TEST_F(GatewayTest, AStopStringEndsTheGenerationEarly) {
  Start();
  backend_.endless = true;  // "2222..." until cancelled
  const Reply r =
      Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1","stop":"222"})"));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json body = Json::parse(r.body);
  EXPECT_EQ(body["choices"][0]["text"], "");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(backend_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(GatewayTest, AClientThatGoesAwayCancelsItsGeneration) {
  Start();
  backend_.endless = true;
  const int fd = Connect(port());
  const std::string raw = Request("POST", "/v1/completions",
                                  R"({"model":"rlfleet","prompt":"reverse:1","stream":true,"max_tokens":100000})");
  ASSERT_EQ(send(fd, raw.data(), raw.size(), MSG_NOSIGNAL), static_cast<ssize_t>(raw.size()));
  char buffer[256];
  ASSERT_GT(read(fd, buffer, sizeof(buffer)), 0);  // the stream began
  close(fd);
  EXPECT_TRUE(backend_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(GatewayTest, BackendErrorsBeforeAndDuringAStream) {
  Start();
  backend_.fail_before = absl::UnavailableError("no rollout replica serves now");
  Reply r = Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1"})"));
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(Json::parse(r.body)["error"]["message"].get<std::string>().find("no rollout replica"), std::string::npos);
  backend_.fail_before = absl::ResourceExhaustedError("queue full");
  r = Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1"})"));
  EXPECT_EQ(r.status, 429);
  // A stream that fails before its first token is an HTTP error too (clients retry 429).
  r = Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1","stream":true})"));
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.head.find("Retry-After"), std::string::npos);
  backend_.fail_before = absl::InvalidArgumentError("max_new_tokens 2048 exceeds max_seq_len 64");
  r = Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1","stream":true})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("max_seq_len"), std::string::npos) << r.body;
  backend_.fail_before = absl::OkStatus();
  backend_.fail_after = 2;
  r = Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1","stream":true})"));
  ASSERT_EQ(r.status, 200);
  bool done = false;
  const std::vector<Json> events = Events(r.body, &done);
  EXPECT_FALSE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.back()["error"]["message"].get<std::string>().find("replica died"), std::string::npos);
}

TEST_F(GatewayTest, ApiKeyRoutesAndMalformedRequests) {
  GatewayOptions options;
  options.api_key = "k1";
  http::Server::Options http;
  http.max_body_bytes = 1000;
  Start(options, http);
  const std::string ok_body = R"({"model":"rlfleet","prompt":"reverse:1"})";
  Reply r = Exchange(port(), Request("POST", "/v1/completions", ok_body));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(Exchange(port(), Request("POST", "/v1/completions", ok_body, "Authorization: Bearer k2\r\n")).status, 401);
  EXPECT_EQ(Exchange(port(), Request("POST", "/v1/completions", ok_body, "Authorization: Bearer k1\r\n")).status, 200);
  const std::string auth = "Authorization: Bearer k1\r\n";
  EXPECT_EQ(Exchange(port(), Request("GET", "/v1/models", "", auth)).status, 200);
  EXPECT_EQ(Exchange(port(), Request("GET", "/health", "")).status, 200);  // (no key: probes)
  EXPECT_EQ(Exchange(port(), Request("GET", "/v1/completions", "", auth)).status, 405);
  EXPECT_EQ(Exchange(port(), Request("POST", "/v1/embeddings", "{}", auth)).status, 404);
  EXPECT_EQ(Exchange(port(), Request("POST", "/v1/completions", std::string(2000, ' '), auth)).status, 413);
  EXPECT_EQ(Exchange(port(), "BAD\r\n\r\n").status, 400);
  const Reply bad_length = Exchange(port(), "POST /v1/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n");
  EXPECT_TRUE(bad_length.status == 400 || bad_length.status == 401 || bad_length.status == 0) << bad_length.status;
  // The key is checked before the body is read: a head announcing a megabyte is refused at once.
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"));
  EXPECT_EQ(http::ReadReply(fd).status, 401);
  close(fd);
  r = Exchange(port(), Request("POST", "/v1/completions", "{\"model\":", auth));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["message"], "the body is not valid JSON");
  r = Exchange(port(), Request("POST", "/v1/chat/completions",
                               R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}]})", auth));
  EXPECT_EQ(r.status, 400);  // the built-in tokenizer has no chat template
  EXPECT_NE(r.body.find("chat template"), std::string::npos);
  r = Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":[1,99]})", auth));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("outside the vocabulary"), std::string::npos);
}

TEST_F(GatewayTest, ToolCallsComeBackAsToolCallsWholeAndStreamed) {
  Start({}, {}, std::make_unique<ByteCodec>());
  backend_.tokens = Bytes("Adding.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>");
  const std::string body = R"({"model":"rlfleet","messages":[{"role":"user","content":"2+3?"}],
      "tools":[{"type":"function","function":{"name":"add","parameters":{}}}]})";
  Reply r = Exchange(port(), Request("POST", "/v1/chat/completions", body));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json whole = Json::parse(r.body);
  const Json& message = whole["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Adding.");
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "add");
  EXPECT_EQ(Json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json({{"a", 2}}));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  {
    absl::MutexLock lock(&backend_.mu);  // the template saw the tools
    EXPECT_EQ(backend_.last.prompt_token_ids(0), 't');
  }
  // Streamed: the text before the call as content deltas, then the call whole.
  std::string streamed_body = body;
  streamed_body.insert(streamed_body.size() - 1, R"(,"stream":true)");
  r = Exchange(port(), Request("POST", "/v1/chat/completions", streamed_body));
  ASSERT_EQ(r.status, 200);
  bool done = false;
  std::string content;
  Json calls;
  std::string finish;
  for (const Json& e : Events(r.body, &done)) {
    for (const Json& c : e["choices"]) {
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls")) calls = c["delta"]["tool_calls"];
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(content, "Adding.\n");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "add");
  EXPECT_EQ(finish, "tool_calls");
  // Without tools in the request, the same text is plain content.
  r = Exchange(port(), Request("POST", "/v1/chat/completions",
                               R"({"model":"rlfleet","messages":[{"role":"user","content":"2+3?"}]})"));
  EXPECT_NE(Json::parse(r.body)["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"),
            std::string::npos);
}

TEST_F(GatewayTest, OneConnectionPastTheLimitIsTurnedAway) {
  http::Server::Options http;
  http.max_connections = 1;
  Start({}, http);
  backend_.endless = true;
  const int busy = Connect(port());
  const std::string raw = Request("POST", "/v1/completions",
                                  R"({"model":"rlfleet","prompt":"reverse:1","stream":true,"max_tokens":100000})");
  ASSERT_EQ(send(busy, raw.data(), raw.size(), MSG_NOSIGNAL), static_cast<ssize_t>(raw.size()));
  char buffer[256];
  ASSERT_GT(read(busy, buffer, sizeof(buffer)), 0);
  const Reply r = Exchange(port(), Request("GET", "/health", ""));
  EXPECT_EQ(r.status, 503);
  close(busy);
  ASSERT_TRUE(backend_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// Requests of a few dozen bytes whose fields have unexpected JSON types, nested JSON
// bombs and junk: each is a 4xx naming the problem, and the gateway goes on serving.
TEST_F(GatewayTest, MalformedChatRequestsAre400AndTheGatewayLives) {
  Start({}, {}, std::make_unique<ByteCodec>());
  const std::vector<std::string> bodies = {
      R"({"model":"rlfleet","messages":[{"role":"user","content":[{"type":1}]}]})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":[{"type":"text","text":5}]}]})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"tools":[{"type":7}]})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":1}}]})",
      R"({"model":"rlfleet","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"[[[[[[[[[[[["}}]}]})",
      R"({"model":"rlfleet","messages":[{"role":7}]})",
      R"({"model":"rlfleet","messages":[1]})",
      R"({"model":"rlfleet","messages":{}})",
      R"({"model":["rlfleet"],"messages":[]})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"stop":[1]})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"n":"2"})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1},"stream":true})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function"}})",
      R"({"model":"rlfleet","messages":[{"role":"user","content":"x"}],"max_tokens":1e400})",
      std::string(R"({"model":"rlfleet","messages":)") + std::string(100000, '[') + std::string(100000, ']') + "}",
      "[]",
      "null",
      "\"x\"",
      "{",
      std::string("{\"model\":\"rlfleet\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"),
  };
  for (const std::string& body : bodies) {
    const Reply r = Exchange(port(), Request("POST", "/v1/chat/completions", body));
    EXPECT_GE(r.status, 200) << body.substr(0, 200);
    EXPECT_LT(r.status, 500) << body.substr(0, 200) << " -> " << r.body;
    if (r.status >= 400) {
      const Json error = Json::parse(r.body, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(error.is_discarded()) << r.body;
      EXPECT_FALSE(error["error"]["message"].get<std::string>().empty());
    }
  }
  EXPECT_EQ(Exchange(port(), Request("GET", "/health", "")).status, 200);
  const Reply deep = Exchange(port(), Request("POST", "/v1/chat/completions", bodies[14]));
  EXPECT_NE(deep.body.find("nested deeper than"), std::string::npos) << deep.body;
}

TEST_F(GatewayTest, AWholeResponseIsCancelledWhenItsClientGoesAway) {
  Start();
  backend_.endless = true;
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(
      fd, Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1","max_tokens":100000})")));
  for (int i = 0; i < 1000 && gateway_->generations() == 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(gateway_->generations(), 1);
  close(fd);
  EXPECT_TRUE(backend_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 0; i < 1000 && gateway_->generations() != 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(gateway_->generations(), 0);
}

// Past the generation bounds a request is 429 (with Retry-After) while /health and
// /v1/models are still answered; the bounds free up when the streams end.
TEST_F(GatewayTest, GenerationsPastTheLimitsAre429AndHealthStillAnswers) {
  GatewayOptions options;
  options.max_generations = 3;
  options.max_generations_per_client = 2;
  http::Server::Options http;
  http.max_connections = 8;
  Start(options, http);
  backend_.endless = true;
  const std::string stream = Request("POST", "/v1/completions",
                                     R"({"model":"rlfleet","prompt":"reverse:1","stream":true,"max_tokens":100000})");
  std::vector<int> open;
  for (int i = 0; i < 2; ++i) {
    open.push_back(Connect(port()));
    ASSERT_TRUE(SendAll(open.back(), stream));
    char buffer[64];
    ASSERT_GT(read(open.back(), buffer, sizeof(buffer)), 0);
  }
  // The same client (address) a third time: its own bound.
  Reply r = Exchange(port(), stream);
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.head.find("Retry-After"), std::string::npos);
  EXPECT_NE(r.body.find("this client"), std::string::npos) << r.body;
  EXPECT_EQ(Exchange(port(), Request("GET", "/health", "")).status, 200);
  EXPECT_EQ(Exchange(port(), Request("GET", "/v1/models", "")).status, 200);
  for (int fd : open) close(fd);
  for (int i = 0; i < 2000 && gateway_->generations() != 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(gateway_->generations(), 0);
  backend_.endless = false;
  EXPECT_EQ(Exchange(port(), Request("POST", "/v1/completions", R"({"model":"rlfleet","prompt":"reverse:1"})")).status,
            200);
}

TEST_F(GatewayTest, AKeylessLocalGatewayRefusesForeignHostsAndFormPosts) {
  GatewayOptions options;
  options.local_origin_only = true;
  Start(options);
  const std::string body = R"({"model":"rlfleet","prompt":"reverse:1"})";
  EXPECT_EQ(Exchange(port(), Request("POST", "/v1/completions", body)).status, 200);
  const std::string foreign = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: evil.example:8000\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  Reply r = Exchange(port(), foreign);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("does not name this machine"), std::string::npos) << r.body;
  const std::string form = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: localhost:8000\r\nConnection: close\r\n"
      "Content-Type: text/plain\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  EXPECT_EQ(Exchange(port(), form).status, 415);
  EXPECT_EQ(Exchange(port(), "GET /health HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n").status, 200);
}

// Requests a minute per client: a burst up to the bound passes, the next is 429 before
// its body is read; another client (key) has its own bucket; /health is never counted.
TEST_F(GatewayTest, RequestsPastTheRatePerClientAre429) {
  GatewayOptions options;
  options.api_key = "k1";
  options.max_requests_per_minute_per_client = 5;
  Start(options);
  const std::string auth = "Authorization: Bearer k1\r\n";
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Exchange(port(), Request("GET", "/v1/models", "", auth)).status, 200);
  const Reply r = Exchange(port(), Request("GET", "/v1/models", "", auth));
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.body.find("requests a minute"), std::string::npos) << r.body;
  EXPECT_NE(r.head.find("Retry-After"), std::string::npos);
  EXPECT_EQ(Exchange(port(), Request("GET", "/health", "")).status, 200);
  // A wrong key is 401, not counted against anyone.
  EXPECT_EQ(Exchange(port(), Request("GET", "/v1/models", "", "Authorization: Bearer nope\r\n")).status, 401);
}

TEST(GatewayOptions, CompletedFromTheServersBoundsOrRefusedByFlag) {
  GatewayOptions o;
  o.max_generations = 0;
  ASSERT_TRUE(CompleteOptions("127.0.0.1", 256, false, &o).ok());
  EXPECT_EQ(o.max_generations, 240);
  EXPECT_TRUE(o.local_origin_only);
  GatewayOptions open;
  EXPECT_NE(CompleteOptions("0.0.0.0", 256, false, &open).message().find("--insecure"), std::string::npos);
  EXPECT_TRUE(CompleteOptions("0.0.0.0", 256, true, &open).ok());
  EXPECT_FALSE(open.local_origin_only);
  GatewayOptions keyed;
  keyed.api_key = "k";
  EXPECT_TRUE(CompleteOptions("0.0.0.0", 256, false, &keyed).ok());
  GatewayOptions bad;
  bad.max_generations = 300;
  EXPECT_NE(CompleteOptions("127.0.0.1", 256, false, &bad).message().find("--max_generations"), std::string::npos);
  EXPECT_FALSE(CompleteOptions("127.0.0.1", 1, false, &o).ok());
}

}  // namespace
}  // namespace rlfleet::gateway
