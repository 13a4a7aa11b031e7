#include "services/gateway/gateway_core.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "libs/model/chat_template.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/tokenizer.h"

namespace rlfleet::gateway {
namespace {

constexpr char kJson[] = "application/json";

class Builtin : public TextCodec {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    return model::Tokenizer::EncodePrompt(text);
  }
  absl::StatusOr<std::string> RenderChat(const Json&, const Json&) const override {
    return absl::UnimplementedError(
        "the built-in tokenizer has no chat template: use /v1/completions with a prompt like \"reverse:123\", or "
        "start the gateway with --model_dir");
  }
  std::string Decode(const std::vector<int32_t>& ids) const override { return model::Tokenizer::DecodeResponse(ids); }
  std::string TokenText(int32_t id) const override {
    return id == model::Tokenizer::kEos ? "" : model::Tokenizer::DecodeResponse({id});
  }
  int32_t vocab_size() const override { return model::Tokenizer::kVocabSize; }
};

class ModelDir : public TextCodec {
 public:
  ModelDir(std::unique_ptr<model::HfTokenizer> tokenizer, std::unique_ptr<model::ChatTemplate> chat)
      : tokenizer_(std::move(tokenizer)), chat_(std::move(chat)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    return tokenizer_->Encode(text);
  }
  absl::StatusOr<std::string> RenderChat(const Json& messages, const Json& tools) const override {
    if (chat_ == nullptr) {
      return absl::UnimplementedError("the model directory has no chat template: use /v1/completions");
    }
    try {  // (the template engine's own errors are statuses; this is a backstop)
      return chat_->Apply(messages, /*add_generation_prompt=*/true, tools);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the chat template could not render this conversation: ", e.what()));
    }
  }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    absl::StatusOr<std::string> text = tokenizer_->Decode(ids, /*skip_special_tokens=*/true);
    return text.ok() ? *text : std::string();
  }
  std::string TokenText(int32_t id) const override {
    absl::StatusOr<std::string> text = tokenizer_->Decode({id});
    return text.ok() ? *text : std::string();
  }
  int32_t vocab_size() const override { return tokenizer_->vocab_size(); }

 private:
  const std::unique_ptr<model::HfTokenizer> tokenizer_;
  const std::unique_ptr<model::ChatTemplate> chat_;
};

ApiError Simple(int status, std::string message, std::string type = "invalid_request_error") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  return e;
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    default:
      return "";
  }
}

http::Reply ErrorReply(const ApiError& error) {
  http::Reply r;
  r.status = error.status;
  r.body = ErrorBody(error);
  if (error.status == 429 || error.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// Whether a Host header names this machine: localhost or 127.x, with any port.
bool LocalHost(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) return absl::StartsWith(host, "::1]");
  const size_t colon = host.rfind(':');
  if (colon != absl::string_view::npos) host = host.substr(0, colon);
  return host == "localhost" || (http::IsLoopbackHost(host) && !host.empty());
}

}  // namespace

std::unique_ptr<TextCodec> BuiltinCodec() { return std::make_unique<Builtin>(); }

absl::StatusOr<std::unique_ptr<TextCodec>> ModelDirCodec(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<model::HfTokenizer>> tokenizer = model::HfTokenizer::FromFile(dir);
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<std::unique_ptr<model::ChatTemplate>> chat = model::ChatTemplate::FromModelDir(dir);
  if (!chat.ok() && chat.status().code() != absl::StatusCode::kNotFound) return chat.status();
  return std::make_unique<ModelDir>(*std::move(tokenizer), chat.ok() ? *std::move(chat) : nullptr);
}

absl::Status CompleteOptions(const std::string& http_host, int max_connections, bool insecure,
                             GatewayOptions* options) {
  const bool loopback = http::IsLoopbackHost(http_host);
  if (options->api_key.empty() && !loopback && !insecure) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_host ", http_host,
                     " is reachable from other machines and no --api_key_file is set: give a key, or pass --insecure "
                     "to serve anyone who reaches the port"));
  }
  options->local_origin_only = options->api_key.empty() && loopback;
  if (max_connections < 2) return absl::InvalidArgumentError("--max_connections must be at least 2");
  if (options->max_generations <= 0) options->max_generations = std::max(1, max_connections - 16);
  if (options->max_generations >= max_connections) {
    return absl::InvalidArgumentError("--max_generations must be below --max_connections (room for /health)");
  }
  if (options->max_requests_per_minute_per_client < 0) {
    return absl::InvalidArgumentError("--max_requests_per_minute_per_client must be 0 (no bound) or more");
  }
  if (options->max_generations_per_client < 1) {
    return absl::InvalidArgumentError("--max_generations_per_client must be at least 1");
  }
  return absl::OkStatus();
}

std::vector<std::string> GatewayPaths() { return {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions"}; }

// One generation's place in the bounds; released when the last holder (the stream
// function, or the handler) lets go.
struct Gateway::Slot {
  Gateway* gateway;
  std::string client;
  ~Slot() {
    absl::MutexLock lock(&gateway->mu_);
    --gateway->running_;
    if (--gateway->per_client_[client] <= 0) gateway->per_client_.erase(client);
  }
};

// A generation on a thread of its own, its messages queued for the stream's writer
// (at most kMaxQueued: a client that reads slowly slows the generation). Destroying it
// cancels the generation (at its next message) and waits for the thread.
class Gateway::Feed {
 public:
  Feed(GenerateBackend* backend, const v1::GenerateRequest& request, absl::Time deadline) {
    thread_ = std::thread([this, backend, request, deadline] {
      const absl::Status status = backend->Generate(request, deadline, [this](const v1::GenerateResponse& m) {
        absl::MutexLock lock(&mu_);
        auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ || messages_.size() < kMaxQueued; };
        mu_.Await(absl::Condition(&room));
        if (cancelled_) return false;
        messages_.push_back(m);
        return true;
      });
      absl::MutexLock lock(&mu_);
      done_ = status;
    });
  }
  ~Feed() {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    thread_.join();
  }
  // Waits until the first message or the end: the end's status when the generation
  // ended before any message, nullopt once a message is there. `connected` is asked
  // every second (false: cancelled, CANCELLED).
  std::optional<absl::Status> WaitForFirst(const std::function<bool()>& connected) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !messages_.empty() || done_.has_value(); };
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1))) {
          if (!messages_.empty()) return std::nullopt;
          return *done_;
        }
      }
      if (!connected()) {
        absl::MutexLock lock(&mu_);
        cancelled_ = true;
        return absl::CancelledError("the client closed the request");
      }
    }
  }
  // GenerateBackend::Generate over the queued messages.
  absl::Status Drain(const std::function<bool(const v1::GenerateResponse&)>& on_message) {
    for (;;) {
      v1::GenerateResponse m;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !messages_.empty() || done_.has_value(); };
        mu_.Await(absl::Condition(&ready));
        if (messages_.empty()) return *done_;
        m = std::move(messages_.front());
        messages_.pop_front();
      }
      if (!on_message(m)) {
        absl::MutexLock lock(&mu_);
        cancelled_ = true;
        return absl::OkStatus();
      }
    }
  }

 private:
  static constexpr size_t kMaxQueued = 4096;
  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> messages_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> done_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// One generation request as it runs.
struct Gateway::Job {
  GenerationRequest request;
  ResponseMeta meta;
  v1::GenerateRequest generate;
  std::unique_ptr<Feed> feed;  // a streamed request's generation (destroyed before the slot)
  std::shared_ptr<Slot> slot;
  ~Job() { feed.reset(); }
};

Gateway::Gateway(GatewayOptions options, std::unique_ptr<TextCodec> codec, GenerateBackend* backend)
    : options_(std::move(options)), codec_(std::move(codec)), backend_(backend) {}

int Gateway::generations() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

std::optional<http::Reply> Gateway::CheckRate(const http::Request& request) const {
  const int per_minute = options_.max_requests_per_minute_per_client;
  if (per_minute <= 0) return std::nullopt;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (buckets_.size() > kMaxBuckets) {  // (drop idle clients: their buckets have refilled)
    absl::erase_if(buckets_, [&](const auto& entry) {
      return entry.second.tokens + absl::ToDoubleMinutes(now - entry.second.last) * per_minute >= per_minute;
    });
  }
  auto [it, fresh] = buckets_.try_emplace(ClientOf(request));
  Bucket& b = it->second;
  b.tokens =
      fresh ? per_minute : std::min<double>(per_minute, b.tokens + absl::ToDoubleMinutes(now - b.last) * per_minute);
  b.last = now;
  if (b.tokens < 1) {
    ApiError e = Simple(
        429, absl::StrCat("this client is over its limit of ", per_minute, " requests a minute; retry in a second"),
        "rate_limit_error");
    e.code = "rate_limit_exceeded";
    return ErrorReply(e);
  }
  b.tokens -= 1;
  return std::nullopt;
}

std::string Gateway::ClientOf(const http::Request& request) const {
  return options_.api_key.empty() ? request.remote_addr : request.Header("authorization").value_or("");
}

std::optional<http::Reply> Gateway::CheckHead(const http::Request& request) const {
  if (request.path == "/health") return std::nullopt;
  if (!options_.api_key.empty()) {  // (the key first: only a client that holds it gets a rate bucket)
    const std::optional<std::string> auth = request.Header("authorization");
    if (!auth.has_value() || !absl::StartsWith(*auth, "Bearer ") ||
        !http::ConstantTimeEquals(absl::string_view(*auth).substr(7), options_.api_key)) {
      ApiError e = Simple(401, auth.has_value() ? "Incorrect API key provided"
                                                : "You didn't provide an API key (Authorization: Bearer KEY)");
      e.code = "invalid_api_key";
      return ErrorReply(e);
    }
    return CheckRate(request);
  }
  if (std::optional<http::Reply> limited = CheckRate(request); limited.has_value()) return limited;
  if (options_.local_origin_only) {
    const std::optional<std::string> host = request.Header("host");
    if (!host.has_value() || !LocalHost(*host)) {
      return ErrorReply(Simple(400, absl::StrCat("Host `", host.value_or(""),
                                                 "` does not name this machine: a gateway without an API key answers "
                                                 "only requests addressed to localhost / 127.0.0.1")));
    }
    const std::optional<std::string> type = request.Header("content-type");
    if (request.method == "POST" &&
        (!type.has_value() || !absl::StartsWith(absl::AsciiStrToLower(*type), "application/json"))) {
      return ErrorReply(Simple(415, "send the body as Content-Type: application/json"));
    }
  }
  return std::nullopt;
}

http::Reply Gateway::Handle(const http::Request& request) {
  const std::string& path = request.path;
  const std::string& method = request.method;
  if (path == "/health") {
    if (method != "GET") return ErrorReply(Simple(405, "GET /health"));
    http::Reply r;
    r.body = R"({"status":"ok"})";
    return r;
  }
  if (path == "/v1/models") {
    if (method != "GET") return ErrorReply(Simple(405, "GET /v1/models"));
    Json model = {{"id", options_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "rlfleet"}};
    http::Reply r;
    r.body =
        Json({{"object", "list"}, {"data", Json::array({model})}}).dump(-1, ' ', false, Json::error_handler_t::replace);
    return r;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (method != "POST") return ErrorReply(Simple(405, absl::StrCat("POST ", path)));
    return Generate(path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat, request);
  }
  ApiError e = Simple(404, absl::StrCat("Unknown path ", path.substr(0, 200),
                                        ": this gateway serves /v1/completions, /v1/chat/completions, /v1/models"));
  e.code = "unknown_url";
  return ErrorReply(e);
}

absl::StatusOr<std::shared_ptr<Gateway::Slot>> Gateway::TakeSlot(const std::string& client) {
  absl::MutexLock lock(&mu_);
  if (running_ >= options_.max_generations) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the gateway is running its limit of ", options_.max_generations, " generations; retry later"));
  }
  int& mine = per_client_[client];
  if (mine >= options_.max_generations_per_client) {
    if (mine == 0) per_client_.erase(client);
    return absl::ResourceExhaustedError(absl::StrCat("this client is running its limit of ",
                                                     options_.max_generations_per_client,
                                                     " generations at once; retry when one ends"));
  }
  ++mine;
  ++running_;
  return std::shared_ptr<Slot>(new Slot{this, client});
}

absl::StatusOr<std::vector<int32_t>> Gateway::PromptIds(const GenerationRequest& request, ApiError* error) const {
  std::vector<int32_t> ids = request.prompt_ids;
  error->status = 400;
  if (request.endpoint == Endpoint::kChat) {
    error->param = "messages";
    absl::StatusOr<std::string> text = codec_->RenderChat(request.messages, request.tools);
    if (!text.ok()) return text.status();
    return codec_->Encode(*text);
  }
  error->param = "prompt";
  if (request.prompt_text.has_value()) return codec_->Encode(*request.prompt_text);
  for (int32_t id : ids) {
    if (id >= codec_->vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary of ", codec_->vocab_size()));
    }
  }
  return ids;
}

http::Reply Gateway::Generate(Endpoint endpoint, const http::Request& http) {
  auto job = std::make_shared<Job>();
  GenerationRequest& request = job->request;
  if (std::optional<ApiError> e = ParseGenerationRequest(endpoint, http.body, options_.model_name, &request)) {
    return ErrorReply(*e);
  }
  const std::string client = ClientOf(http);
  absl::StatusOr<std::shared_ptr<Slot>> slot = TakeSlot(client);
  if (!slot.ok()) {
    ApiError e = ApiErrorFromStatus(slot.status());
    e.code = "rate_limit_exceeded";
    return ErrorReply(e);
  }
  job->slot = *std::move(slot);
  ApiError prompt_error;
  absl::StatusOr<std::vector<int32_t>> prompt = PromptIds(request, &prompt_error);
  if (!prompt.ok()) {
    prompt_error.message = absl::StrCat(prompt_error.param, ": ", prompt.status().message());
    return ErrorReply(prompt_error);
  }
  if (prompt->empty()) return ErrorReply(Simple(400, "the prompt has no tokens"));

  ResponseMeta& meta = job->meta;
  meta.id = absl::StrFormat("%s%016x", endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                            absl::Uniform<uint64_t>(absl::BitGen()));
  meta.created = absl::ToUnixSeconds(absl::Now());
  meta.model = options_.model_name;
  meta.prompt_ids = *prompt;

  v1::GenerateRequest& g = job->generate;
  g.set_request_id(meta.id);
  g.set_prompt_id(meta.id);
  g.set_task("openai");
  for (int32_t id : *prompt) g.add_prompt_token_ids(id);
  v1::SamplingParams* s = g.mutable_sampling();
  s->set_temperature(request.temperature);
  s->set_top_p(request.top_p);
  s->set_top_k(request.top_k);
  s->set_max_new_tokens(request.max_tokens);
  if (request.seed.has_value()) s->set_seed(*request.seed);
  s->set_ignore_eos(request.ignore_eos);
  g.set_num_samples(request.n);
  g.set_min_policy_version(request.min_policy_version);
  g.set_chunk_tokens(request.stream ? 1 : 64);

  if (!request.stream) return Run(*job, nullptr, http.connected);
  return StartStream(std::move(job), http.connected);
}

http::Reply Gateway::StartStream(std::shared_ptr<Job> job, const std::function<bool()>& connected) {
  job->feed = std::make_unique<Feed>(backend_, job->generate, absl::Now() + options_.request_timeout);
  if (std::optional<absl::Status> ended = job->feed->WaitForFirst(connected); ended.has_value()) {
    return ErrorReply(ApiErrorFromStatus(
        ended->ok() ? absl::UnavailableError("the replica ended the generation before its first token") : *ended));
  }
  http::Reply reply;
  reply.content_type = "text/event-stream";
  reply.stream = [this, job](http::StreamWriter& out) { Run(*job, &out, [] { return true; }); };
  return reply;
}

http::Reply Gateway::Run(Job& job, http::StreamWriter* out, const std::function<bool()>& connected) {
  const GenerationRequest& request = job.request;
  const ResponseMeta& meta = job.meta;
  std::vector<ChoiceState> choices(request.n);
  const auto token_text = [this](int32_t id) { return codec_->TokenText(id); };
  bool client_gone = false;
  uint32_t finished = 0;
  const auto emit = [&](uint32_t index, bool done) {
    ChoiceState& c = choices[index];
    const bool tools = request.endpoint == Endpoint::kChat && !request.tools.is_null();
    size_t ready = UpdateChoiceText(c, codec_->Decode(c.token_ids), request.stop, done, tools ? kToolCallOpen : "");
    if (done && tools) {
      c.tool_calls =
          ParseToolCalls(c.text, absl::StrCat("call_", meta.id.substr(meta.id.find('-') + 1), "_", index, "_")).calls;
      if (!c.tool_calls.empty()) {
        if (c.finish_reason == "stop") c.finish_reason = "tool_calls";
        ready = std::max(c.sent_chars, std::min(ready, c.text.find(kToolCallOpen)));  // (the calls go as tool_calls)
      }
    }
    if (out == nullptr) {
      if (!connected()) client_gone = true;
      return;
    }
    if (ready == c.sent_chars && c.sent_tokens == c.token_ids.size() && !done) return;
    const Json chunk =
        StreamChunk(request, meta, index, c, c.sent_chars, ready, c.sent_tokens, c.token_ids.size(), done, token_text);
    c.sent_chars = ready;
    c.sent_tokens = c.token_ids.size();
    if (!out->Write(SseEvent(chunk))) client_gone = true;
  };
  if (out != nullptr && request.endpoint == Endpoint::kChat) {
    for (uint32_t i = 0; i < request.n && !client_gone; ++i) {
      if (!out->Write(SseEvent(ChatRoleChunk(meta, i)))) client_gone = true;
    }
  }
  const auto generate = [&](const std::function<bool(const v1::GenerateResponse&)>& on_message) {
    if (job.feed != nullptr) return job.feed->Drain(on_message);
    return backend_->Generate(job.generate, absl::Now() + options_.request_timeout, on_message);
  };
  const absl::Status status = generate([&](const v1::GenerateResponse& m) {
    if (m.has_chunk()) {
      const v1::TokenChunk& chunk = m.chunk();
      if (chunk.sample_index() >= choices.size()) return !client_gone;
      ChoiceState& c = choices[chunk.sample_index()];
      if (!c.finish_reason.empty()) return !client_gone;  // (cut at a stop string)
      for (int i = 0; i < chunk.token_ids_size(); ++i) {
        c.token_ids.push_back(chunk.token_ids(i));
        c.logprobs.push_back(i < chunk.logprobs_size() ? chunk.logprobs(i) : 0.0f);
        c.versions.push_back(i < chunk.policy_versions_size() ? chunk.policy_versions(i) : 0);
      }
      emit(chunk.sample_index(), false);
      if (c.stopped) {
        c.finish_reason = "stop";
        ++finished;
        emit(chunk.sample_index(), true);
      }
    } else if (m.has_finished()) {
      const uint32_t index = m.finished().sample_index();
      if (index < choices.size() && choices[index].finish_reason.empty()) {
        const std::string reason = FinishReasonName(m.finished().finish_reason());
        choices[index].finish_reason = reason.empty() ? "abort" : reason;
        ++finished;
        emit(index, true);
      }
    }
    return !client_gone && finished < request.n;
  });
  if (client_gone) return ErrorReply(Simple(499, "the client closed the request"));
  const bool complete = finished == request.n;
  std::optional<ApiError> failure;
  if (!complete) {
    failure =
        ApiErrorFromStatus(status.ok() ? absl::InternalError("the stream ended before every choice finished") : status);
  } else {
    for (const ChoiceState& c : choices) {
      if (c.finish_reason == "abort") failure = Simple(503, "the replica aborted the generation", "server_error");
    }
  }
  if (out == nullptr) {
    if (failure.has_value()) return ErrorReply(*failure);
    http::Reply r;
    r.body =
        CompletionResponse(request, meta, choices, token_text).dump(-1, ' ', false, Json::error_handler_t::replace);
    return r;
  }
  if (failure.has_value()) {
    out->Write(absl::StrCat("data: ", ErrorBody(*failure), "\n\n"));
  } else {
    if (request.include_usage) out->Write(SseEvent(UsageChunk(request, meta, choices)));
    out->Write("data: [DONE]\n\n");
  }
  return {};
}

}  // namespace rlfleet::gateway
