#include "services/rollout/rollout_core.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::rollout {

absl::StatusOr<std::unique_ptr<RolloutCore>> RolloutCore::Create(const model::PolicyConfig& config,
                                                                  const std::string& device,
                                                                  RolloutLimits limits) {
  ASSIGN_OR_RETURN(auto policy, model::Policy::Create(config, device));
  return std::unique_ptr<RolloutCore>(new RolloutCore(std::move(policy), device, limits));
}

RolloutCore::RolloutCore(std::unique_ptr<model::Policy> policy, std::string device, RolloutLimits limits)
    : device_(std::move(device)), limits_(limits), policy_(std::move(policy)) {}

absl::Status RolloutCore::InstallFromFile(const std::string& path, uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (version <= version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " is not newer than the installed ", version_));
  }
  RETURN_IF_ERROR(policy_->LoadSafetensors(path));
  version_ = version;
  ++swaps_;
  return absl::OkStatus();
}

absl::Status RolloutCore::InstallInitial(uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (version <= version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " is not newer than the installed ", version_));
  }
  version_ = version;
  return absl::OkStatus();
}

uint64_t RolloutCore::installed_version() {
  absl::MutexLock lock(&mu_);
  return version_;
}

bool RolloutCore::serving() {
  absl::MutexLock lock(&mu_);
  return version_ > 0 && !drained_;
}

absl::Status RolloutCore::GenerateBatch(const v1::GenerateBatchRequest& request,
                                        v1::GenerateBatchResponse* response) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(common::ValidateId("request_id", request.request_id()));
  const int prompts = request.prompts_size();
  const int samples = request.num_samples() == 0 ? 1 : static_cast<int>(request.num_samples());
  if (prompts < 1 || prompts > limits_.max_prompts) {
    return absl::InvalidArgumentError(absl::StrCat("prompts has ", prompts, " entries; the limit is 1..",
                                                   limits_.max_prompts));
  }
  if (static_cast<int64_t>(prompts) * samples > limits_.max_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("prompts x num_samples = ", prompts * samples,
                                                   " exceeds the limit of ", limits_.max_sequences, " sequences"));
  }
  const v1::SamplingParams& sp = request.sampling();
  const int max_new = sp.max_new_tokens() == 0 ? 48 : static_cast<int>(sp.max_new_tokens());
  if (max_new > limits_.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_new_tokens ", max_new, " exceeds the limit of ",
                                                   limits_.max_new_tokens));
  }
  if (sp.temperature() < 0) return absl::InvalidArgumentError("sampling.temperature is negative");
  if (sp.top_p() < 0 || sp.top_p() > 1) return absl::InvalidArgumentError("sampling.top_p is outside [0, 1]");
  std::vector<std::vector<int32_t>> rows;
  for (int p = 0; p < prompts; ++p) {
    const auto& ids = request.prompts(p).prompt_token_ids();
    if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat("prompts[", p, "].prompt_token_ids is empty"));
    for (int s = 0; s < samples; ++s) rows.emplace_back(ids.begin(), ids.end());
  }
  absl::MutexLock lock(&mu_);
  if (drained_) return absl::UnavailableError("replica is drained: no new work until Resume");
  if (version_ == 0) return absl::FailedPreconditionError("no weight version installed yet");
  if (request.min_policy_version() > version_) {
    return absl::FailedPreconditionError(absl::StrCat("installed version ", version_, " is below min_policy_version ",
                                                      request.min_policy_version()));
  }
  model::SamplingOptions options;
  options.temperature = sp.temperature();
  options.top_k = static_cast<int>(sp.top_k());
  options.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  options.max_new_tokens = max_new;
  options.seed = sp.seed();
  const int max_len = policy_->config().max_seq_len;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (static_cast<int>(rows[r].size()) + max_new > max_len) {
      return absl::InvalidArgumentError(absl::StrCat("prompts[", r / samples, "] has ", rows[r].size(),
                                                     " tokens; with max_new_tokens ", max_new,
                                                     " that exceeds max_seq_len ", max_len));
    }
  }
  ASSIGN_OR_RETURN(std::vector<model::Generation> gens, policy_->Generate(rows, options));
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  uint64_t tokens = 0;
  for (size_t r = 0; r < gens.size(); ++r) {
    const int p = static_cast<int>(r) / samples, s = static_cast<int>(r) % samples;
    const v1::BatchPrompt& prompt = request.prompts(p);
    v1::Experience* e = response->add_completions();
    e->mutable_experience_id()->set_value(absl::StrCat(request.request_id(), ":", p, ":", s));
    e->set_prompt_id(prompt.prompt_id());
    e->set_group_id(prompt.group_id().empty() ? prompt.prompt_id() : prompt.group_id());
    e->set_task(prompt.task());
    *e->mutable_prompt_token_ids() = prompt.prompt_token_ids();
    for (size_t i = 0; i < gens[r].tokens.size(); ++i) {
      e->add_response_token_ids(gens[r].tokens[i]);
      e->add_response_logprobs(gens[r].logprobs[i]);
      e->add_token_policy_versions(version_);
    }
    e->set_finish_reason(gens[r].stopped_by_eos ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH);
    e->set_created_at_unix_ms(now_ms);
    tokens += gens[r].tokens.size();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  response->set_generated_tokens(tokens);
  response->set_elapsed_ms(seconds * 1000);
  if (seconds > 0) tokens_per_s_ = tokens / seconds;
  return absl::OkStatus();
}

absl::Status RolloutCore::GetInfo(v1::GetInfoResponse* response) {
  absl::MutexLock lock(&mu_);
  const model::PolicyConfig& c = policy_->config();
  v1::ModelConfig* m = response->mutable_model();
  m->set_vocab_size(c.vocab_size);
  m->set_d_model(c.d_model);
  m->set_n_layers(c.n_layers);
  m->set_n_heads(c.n_heads);
  m->set_max_seq_len(c.max_seq_len);
  m->set_has_value_head(c.value_head);
  m->set_dtype(v1::DTYPE_FLOAT32);
  m->set_num_parameters(policy_->num_parameters());
  response->mutable_installed_version()->set_version(version_);
  response->set_state(drained_ ? v1::REPLICA_SERVING_STATE_DRAINED
                      : version_ == 0 ? v1::REPLICA_SERVING_STATE_WAITING_FOR_WEIGHTS
                                      : v1::REPLICA_SERVING_STATE_SERVING);
  response->mutable_load()->set_tokens_per_s(tokens_per_s_);
  response->set_device(device_);
  response->set_max_batch_sequences(limits_.max_sequences);
  response->set_weight_swaps(swaps_);
  return absl::OkStatus();
}

absl::Status RolloutCore::Drain(const v1::DrainRequest&, v1::DrainResponse* response) {
  // Requests run to completion under the lock, so holding it means none is in flight.
  absl::MutexLock lock(&mu_);
  drained_ = true;
  response->set_drained_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  return absl::OkStatus();
}

absl::Status RolloutCore::Resume(v1::ResumeResponse* response) {
  absl::MutexLock lock(&mu_);
  drained_ = false;
  response->set_state(version_ == 0 ? v1::REPLICA_SERVING_STATE_WAITING_FOR_WEIGHTS
                                    : v1::REPLICA_SERVING_STATE_SERVING);
  return absl::OkStatus();
}

}  // namespace rlfleet::rollout
