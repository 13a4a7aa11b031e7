// The OpenAI-compatible gateway's logic, without gRPC: HTTP requests in (routes,
// API key, openai_api.h's parsing), prompts tokenized (TextCodec), generation through
// a GenerateBackend (the rollout replicas' streaming Generate), responses out whole or
// as server-sent events.
//
// Routes: GET /v1/models, GET /health, POST /v1/completions, POST
// /v1/chat/completions. A stream that has begun and then fails ends with an error
// event ({"error": {...}}); before that, errors are HTTP errors in OpenAI's shape. A
// client that goes away cancels its generation, streamed or not.
//
// Admission (CheckHead, before a body is read): the API key, compared in constant
// time; without a key on loopback, a Host naming this machine and JSON bodies only (a
// web page cannot post to it). Generations at once are bounded in all
// (max_generations) and per client (its key, or its address without one): past
// either, 429 with Retry-After, so that /health and /v1/models are always answered.
//
// Thread-safe: CheckHead and Handle are called concurrently, one per connection thread.
#ifndef RLFLEET_SERVICES_GATEWAY_GATEWAY_CORE_H_
#define RLFLEET_SERVICES_GATEWAY_GATEWAY_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/http/http_server.h"
#include "rlfleet/v1/rollout.pb.h"
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
  int max_generations = 192;            // generation requests at once, all clients
  int max_generations_per_client = 64;  // at once, per API key (or per address without a key)
  // Requests per minute per client (a token bucket holding a minute's worth: bursts up to
  // it); past it 429 before the body is read. 0: no rate bound. /health is not counted.
  int max_requests_per_minute_per_client = 6000;
  // Without a key: refuse a Host that does not name this machine and a POST body that
  // is not application/json (DNS rebinding and cross-site posts from a browser).
  bool local_origin_only = false;
};

// Checks `options`' bounds against the HTTP server's and fills what follows from them:
// max_generations 0 becomes max_connections - 16 (room kept for /health), and
// local_origin_only is set for a keyless gateway on loopback. INVALID_ARGUMENT naming
// the flag for a bound out of range, or for a keyless gateway on a host reachable from
// other machines unless `insecure`.
absl::Status CompleteOptions(const std::string& http_host, int max_connections, bool insecure, GatewayOptions* options);

// The paths the gateway serves (for http::Server::Options::paths).
std::vector<std::string> GatewayPaths();

class Gateway {
 public:
  Gateway(GatewayOptions options, std::unique_ptr<TextCodec> codec, GenerateBackend* backend);
  // http::Server's head check: 401 / 400 / 415 for a request refused before its body.
  std::optional<http::Reply> CheckHead(const http::Request& request) const;
  // http::Server's handler. A streamed generation runs in the reply's stream function.
  http::Reply Handle(const http::Request& request);
  // Generations running now (their slots), for tests and metrics.
  int generations() const;

 private:
  struct Slot;
  struct Job;
  class Feed;
  http::Reply Generate(Endpoint endpoint, const http::Request& request);
  absl::StatusOr<std::vector<int32_t>> PromptIds(const GenerationRequest& request, ApiError* error) const;
  // A slot for one generation of `client`, or the 429 that refuses it.
  absl::StatusOr<std::shared_ptr<Slot>> TakeSlot(const std::string& client);
  // Runs `job`: chunks to `out` when streaming (nullptr: whole); `connected` false
  // cancels. Returns the whole reply when not streaming.
  http::Reply Run(Job& job, http::StreamWriter* out, const std::function<bool()>& connected);
  // A streamed request: the generation starts on a thread of its own (job.feed), and the
  // reply waits for its first message, so that a generation that fails before it (a full
  // queue, no replica) is an HTTP error (429, 503), not a stream that begins and fails.
  http::Reply StartStream(std::shared_ptr<Job> job, const std::function<bool()>& connected);

  const GatewayOptions options_;
  const std::unique_ptr<TextCodec> codec_;
  GenerateBackend* const backend_;
  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);
  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };
  // Request-rate buckets by client; full (idle) ones are dropped past kMaxBuckets.
  static constexpr size_t kMaxBuckets = 10000;
  mutable absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  // The client a request counts against: its Authorization header with a key, else its
  // address.
  std::string ClientOf(const http::Request& request) const;
  // The request-rate bound: the 429 that refuses `request`, or nullopt (one token taken).
  std::optional<http::Reply> CheckRate(const http::Request& request) const;
};

}  // namespace rlfleet::gateway

#endif  // RLFLEET_SERVICES_GATEWAY_GATEWAY_CORE_H_
