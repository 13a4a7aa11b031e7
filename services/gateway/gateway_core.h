// The OpenAI-compatible gateway's logic, without gRPC: HTTP requests in (routes,
// API key, openai_api.h's parsing), prompts tokenized (TextCodec), generation through
// a GenerateBackend (the rollout replicas' streaming Generate), responses out whole or
// as server-sent events.
//
// Routes: GET /v1/models, GET /health, POST /v1/completions, POST
// /v1/chat/completions. A stream that has begun and then fails ends with an error
// event ({"error": {...}}); before that, errors are HTTP errors in OpenAI's shape. A
// client that goes away cancels its generation. Thread-safe: one Handle per connection
// thread.
#ifndef RLFLEET_SERVICES_GATEWAY_GATEWAY_CORE_H_
#define RLFLEET_SERVICES_GATEWAY_GATEWAY_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rlfleet/v1/rollout.pb.h"
#include "services/gateway/http_server.h"
#include "services/gateway/openai_api.h"

namespace rlfleet::model {
class ChatTemplate;
class HfTokenizer;
}  // namespace rlfleet::model

namespace rlfleet::gateway {

// Text <-> token ids for the served model.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // INVALID_ARGUMENT naming what cannot be encoded.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const = 0;
  // The prompt text of a conversation (generation prompt added); UNIMPLEMENTED without
  // a chat template, INVALID_ARGUMENT for what the template refuses.
  virtual absl::StatusOr<std::string> RenderChat(const Json& messages, const Json& tools) const = 0;
  // The text of response tokens (special tokens left out).
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // One token as text (for logprobs).
  virtual std::string TokenText(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
};

// The built-in tasks' character tokenizer: a prompt is "<task>:<input>" (e.g.
// "reverse:123"); no chat template.
std::unique_ptr<TextCodec> BuiltinCodec();
// A model directory's tokenizer.json and chat template (none: chat is refused).
absl::StatusOr<std::unique_ptr<TextCodec>> ModelDirCodec(const std::string& dir);

// Runs one streaming Generate; `on_message` returning false cancels it (the call then
// returns OK or CANCELLED). Returns the stream's final status.
class GenerateBackend {
 public:
  virtual ~GenerateBackend() = default;
  virtual absl::Status Generate(const v1::GenerateRequest& request, absl::Time deadline,
                                const std::function<bool(const v1::GenerateResponse&)>& on_message) = 0;
};

struct GatewayOptions {
  std::string model_name = "rlfleet";
  std::string api_key;  // "" = none required
  absl::Duration request_timeout = absl::Minutes(5);
};

class Gateway {
 public:
  Gateway(GatewayOptions options, std::unique_ptr<TextCodec> codec, GenerateBackend* backend);
  // HttpServer's handler.
  void Handle(const HttpRequest& request, HttpResponder* responder);

 private:
  void Generate(Endpoint endpoint, const HttpRequest& request, HttpResponder* responder);
  absl::StatusOr<std::vector<int32_t>> PromptIds(const GenerationRequest& request, ApiError* error) const;

  const GatewayOptions options_;
  const std::unique_ptr<TextCodec> codec_;
  GenerateBackend* const backend_;
};

}  // namespace rlfleet::gateway

#endif  // RLFLEET_SERVICES_GATEWAY_GATEWAY_CORE_H_
