#include "services/gateway/gateway_core.h"

#include <algorithm>
#include <map>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
    return chat_->Apply(messages, /*add_generation_prompt=*/true, tools);
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

void SendError(HttpResponder* responder, const ApiError& error) {
  responder->Send(error.status, kJson, ErrorBody(error));
}

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

}  // namespace

std::unique_ptr<TextCodec> BuiltinCodec() { return std::make_unique<Builtin>(); }

absl::StatusOr<std::unique_ptr<TextCodec>> ModelDirCodec(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<model::HfTokenizer>> tokenizer = model::HfTokenizer::FromFile(dir);
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<std::unique_ptr<model::ChatTemplate>> chat = model::ChatTemplate::FromModelDir(dir);
  if (!chat.ok() && chat.status().code() != absl::StatusCode::kNotFound) return chat.status();
  return std::make_unique<ModelDir>(*std::move(tokenizer), chat.ok() ? *std::move(chat) : nullptr);
}

Gateway::Gateway(GatewayOptions options, std::unique_ptr<TextCodec> codec, GenerateBackend* backend)
    : options_(std::move(options)), codec_(std::move(codec)), backend_(backend) {}

void Gateway::Handle(const HttpRequest& request, HttpResponder* responder) {
  const std::string& path = request.head.path;
  const std::string& method = request.head.method;
  if (path == "/health") {
    if (method != "GET") return SendError(responder, Simple(405, "GET /health"));
    return responder->Send(200, kJson, R"({"status":"ok"})");
  }
  if (!options_.api_key.empty()) {
    const std::optional<std::string> auth = request.head.Header("authorization");
    if (!auth.has_value() || *auth != absl::StrCat("Bearer ", options_.api_key)) {
      ApiError e = Simple(401, auth.has_value() ? "Incorrect API key provided"
                                                : "You didn't provide an API key (Authorization: Bearer KEY)");
      e.code = "invalid_api_key";
      return SendError(responder, e);
    }
  }
  if (path == "/v1/models") {
    if (method != "GET") return SendError(responder, Simple(405, "GET /v1/models"));
    Json model = {{"id", options_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "rlfleet"}};
    return responder->Send(200, kJson, Json({{"object", "list"}, {"data", Json::array({model})}}).dump());
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (method != "POST") return SendError(responder, Simple(405, absl::StrCat("POST ", path)));
    return Generate(path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat, request, responder);
  }
  ApiError e = Simple(404, absl::StrCat("Unknown path ", path,
                                        ": this gateway serves /v1/completions, /v1/chat/completions, /v1/models"));
  e.code = "unknown_url";
  SendError(responder, e);
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

void Gateway::Generate(Endpoint endpoint, const HttpRequest& http, HttpResponder* responder) {
  GenerationRequest request;
  if (std::optional<ApiError> e = ParseGenerationRequest(endpoint, http.body, options_.model_name, &request)) {
    return SendError(responder, *e);
  }
  ApiError prompt_error;
  absl::StatusOr<std::vector<int32_t>> prompt = PromptIds(request, &prompt_error);
  if (!prompt.ok()) {
    prompt_error.message = absl::StrCat(prompt_error.param, ": ", prompt.status().message());
    return SendError(responder, prompt_error);
  }
  if (prompt->empty()) return SendError(responder, Simple(400, "the prompt has no tokens"));

  ResponseMeta meta;
  meta.id = absl::StrFormat("%s%016x", endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                            absl::Uniform<uint64_t>(absl::BitGen()));
  meta.created = absl::ToUnixSeconds(absl::Now());
  meta.model = options_.model_name;
  meta.prompt_ids = *prompt;

  v1::GenerateRequest g;
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
    if (!request.stream) return;
    if (ready == c.sent_chars && c.sent_tokens == c.token_ids.size() && !done) return;
    const Json chunk =
        StreamChunk(request, meta, index, c, c.sent_chars, ready, c.sent_tokens, c.token_ids.size(), done, token_text);
    c.sent_chars = ready;
    c.sent_tokens = c.token_ids.size();
    if (!responder->Write(SseEvent(chunk))) client_gone = true;
  };
  if (request.stream) {
    if (!responder->StartStream(200, "text/event-stream")) return;
    if (endpoint == Endpoint::kChat) {
      for (uint32_t i = 0; i < request.n && !client_gone; ++i) {
        if (!responder->Write(SseEvent(ChatRoleChunk(meta, i)))) client_gone = true;
      }
    }
  }
  const absl::Status status =
      backend_->Generate(g, absl::Now() + options_.request_timeout, [&](const v1::GenerateResponse& m) {
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
  if (client_gone) return;
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
  if (!request.stream) {
    if (failure.has_value()) return SendError(responder, *failure);
    return responder->Send(
        200, kJson,
        CompletionResponse(request, meta, choices, token_text).dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  if (failure.has_value()) {
    responder->Write(absl::StrCat("data: ", ErrorBody(*failure), "\n\n"));
    return;
  }
  if (request.include_usage) responder->Write(SseEvent(UsageChunk(request, meta, choices)));
  responder->Write("data: [DONE]\n\n");
}

}  // namespace rlfleet::gateway
