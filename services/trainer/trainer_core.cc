#include "services/trainer/trainer_core.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/checksum.h"
#include "libs/common/files.h"
#include "libs/common/huge_string.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/model/hf_model.h"
#include "libs/model/safetensors.h"
#include "services/trainer/train_options.h"

namespace rlfleet::trainer {
namespace {

namespace fs = std::filesystem;

// Advantages of the experiences, by group (group_id), as the estimator says.
absl::StatusOr<std::vector<float>> Advantages(const std::vector<const v1::Experience*>& exps,
                                              v1::AdvantageEstimator estimator) {
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < exps.size(); ++i) {
    groups[exps[i]->group_id().empty() ? exps[i]->experience_id().value() : exps[i]->group_id()].push_back(i);
  }
  std::vector<float> adv(exps.size(), 0.0f);
  for (const auto& [id, members] : groups) {
    const double n = members.size();
    double sum = 0, sq = 0;
    for (size_t i : members) {
      sum += exps[i]->reward();
      sq += static_cast<double>(exps[i]->reward()) * exps[i]->reward();
    }
    const double mean = sum / n;
    const double stddev = std::sqrt(std::max(0.0, sq / n - mean * mean));
    for (size_t i : members) {
      const double r = exps[i]->reward();
      switch (estimator) {
        case v1::ADVANTAGE_ESTIMATOR_GROUP_NORM:
          adv[i] = static_cast<float>((r - mean) / (stddev + 1e-6));
          break;
        case v1::ADVANTAGE_ESTIMATOR_GROUP_MEAN:
          adv[i] = static_cast<float>(r - mean);
          break;
        case v1::ADVANTAGE_ESTIMATOR_LEAVE_ONE_OUT:
          adv[i] = n < 2 ? 0.0f : static_cast<float>(r - (sum - r) / (n - 1));
          break;
        default:
          return absl::InvalidArgumentError("GAE advantages come from the value head, not from groups");
      }
    }
  }
  return adv;
}

}  // namespace

// ---- what rank 0 broadcasts: a tag byte, then the command's fields ----
namespace {

constexpr char kKeepalive = 'N', kStop = 'S', kLoad = 'L', kTrain = 'T';
constexpr absl::Duration kKeepaliveInterval = absl::Seconds(5);

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
void PutVector(std::string* out, const std::vector<T>& v) {
  Put<uint32_t>(out, v.size());
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <typename T>
  T Get() {
    T v{};
    if (in_.size() < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> GetVector() {
    const uint32_t n = Get<uint32_t>();
    if (!ok_ || in_.size() < n * sizeof(T)) {
      ok_ = false;
      return {};
    }
    std::vector<T> v(n);
    std::memcpy(v.data(), in_.data(), n * sizeof(T));
    in_.remove_prefix(n * sizeof(T));
    return v;
  }
  bool ok() const { return ok_ && in_.empty(); }
  bool failed() const { return !ok_; }

 private:
  absl::string_view in_;
  bool ok_ = true;
};

std::string EncodeStep(const std::vector<model::TrainSequence>& seqs, const model::TrainOptions& o) {
  std::string out(1, kTrain);
  Put(&out, o.learning_rate);
  Put(&out, o.weight_decay);
  Put(&out, o.beta1);
  Put(&out, o.beta2);
  Put(&out, o.eps);
  Put<int64_t>(&out, o.warmup_steps);
  Put(&out, o.grad_clip);
  Put(&out, o.clip);
  Put(&out, o.clip_high);
  Put<int32_t>(&out, o.epochs);
  Put<int32_t>(&out, o.mini_batches);
  Put<int32_t>(&out, o.micro_batch_size);
  Put(&out, o.entropy_coef);
  Put<uint8_t>(&out, o.gae);
  Put(&out, o.gamma);
  Put(&out, o.gae_lambda);
  Put(&out, o.value_coef);
  Put(&out, o.value_clip);
  Put<uint32_t>(&out, seqs.size());
  for (const model::TrainSequence& s : seqs) {
    PutVector(&out, s.prompt);
    PutVector(&out, s.response);
    PutVector(&out, s.behaviour_logprobs);
    PutVector(&out, s.loss_mask);
    Put(&out, s.advantage);
    Put(&out, s.reward);
  }
  return out;
}

absl::Status DecodeStep(absl::string_view in, std::vector<model::TrainSequence>* seqs, model::TrainOptions* o) {
  Reader r(in.substr(1));
  o->learning_rate = r.Get<float>();
  o->weight_decay = r.Get<float>();
  o->beta1 = r.Get<float>();
  o->beta2 = r.Get<float>();
  o->eps = r.Get<float>();
  o->warmup_steps = r.Get<int64_t>();
  o->grad_clip = r.Get<float>();
  o->clip = r.Get<double>();
  o->clip_high = r.Get<double>();
  o->epochs = r.Get<int32_t>();
  o->mini_batches = r.Get<int32_t>();
  o->micro_batch_size = r.Get<int32_t>();
  o->entropy_coef = r.Get<double>();
  o->gae = r.Get<uint8_t>() != 0;
  o->gamma = r.Get<double>();
  o->gae_lambda = r.Get<double>();
  o->value_coef = r.Get<double>();
  o->value_clip = r.Get<double>();
  const uint32_t n = r.Get<uint32_t>();
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    model::TrainSequence s;
    s.prompt = r.GetVector<int32_t>();
    s.response = r.GetVector<int32_t>();
    s.behaviour_logprobs = r.GetVector<float>();
    s.loss_mask = r.GetVector<uint8_t>();
    s.advantage = r.Get<float>();
    s.reward = r.Get<float>();
    seqs->push_back(std::move(s));
  }
  if (!r.ok()) return absl::DataLossError("a malformed step from rank 0");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerCore>> TrainerCore::Create(const model::PolicyConfig& config,
                                                                 const std::string& device, uint64_t seed,
                                                                 BufferSource* buffer, dist::GradientGroup* group,
                                                                 fs::path checkpoint_root,
                                                                 std::string checkpoint_owner) {
  RETURN_IF_ERROR(ValidateCheckpointOwner(checkpoint_owner));
  ASSIGN_OR_RETURN(auto policy, model::Policy::Create(config, device, seed));
  if (!checkpoint_root.empty()) {
    std::error_code ec;
    checkpoint_root = fs::absolute(checkpoint_root, ec).lexically_normal();
    if (ec) return absl::InvalidArgumentError(absl::StrCat("checkpoint root: ", ec.message()));
  }
  return std::unique_ptr<TrainerCore>(new TrainerCore(std::move(policy), buffer, device, group,
                                                      std::move(checkpoint_root), std::move(checkpoint_owner)));
}

TrainerCore::TrainerCore(std::unique_ptr<model::Policy> policy, BufferSource* buffer, std::string device,
                         dist::GradientGroup* group, fs::path checkpoint_root, std::string checkpoint_owner)
    : policy_(std::move(policy)),
      buffer_(buffer),
      device_(std::move(device)),
      checkpoint_root_(std::move(checkpoint_root)),
      checkpoint_owner_(std::move(checkpoint_owner)),
      // The optimizer's two moments and step counts, plus headers, at most.
      num_parameters_(policy_->num_parameters()),
      max_checkpoint_file_bytes_(2 * model::F32ImageBytesBound(static_cast<uint64_t>(num_parameters_)) +
                                 (uint64_t{1} << 20)),
      group_(group),
      step_metric_(metrics::Global().AddHistogram("rlfleet_trainer_step_seconds",
                                                  "Wall time of a TrainStep (batch wait included).", {})),
      steps_metric_(metrics::Global().AddCounter("rlfleet_trainer_steps_total", "Train steps taken.", {})),
      loss_metric_(metrics::Global().AddGauge("rlfleet_trainer_loss", "Loss of the last step.", {})),
      version_metric_(
          metrics::Global().AddGauge("rlfleet_policy_version", "Installed policy version.", {{"service", "trainer"}})),
      ack_failures_metric_(metrics::Global().AddCounter(
          "rlfleet_trainer_ack_failures_total",
          "Buffer acks that failed after a step (retried; the groups are not trained on twice).", {})) {
  last_broadcast_ = absl::Now();
  if (group_ != nullptr && group_->rank() == 0 && group_->world_size() > 1) {
    keepalive_ = std::thread([this] { Keepalive(); });
  }
}

TrainerCore::~TrainerCore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (keepalive_.joinable() && group_error_.ok()) (void)BroadcastLocked(std::string(1, kStop));
  }
  if (keepalive_.joinable()) keepalive_.join();
  absl::MutexLock lock(&mu_);
  for (const Published& p : published_) (void)p.data_plane->DeregisterMemory(p.handle);
}

void TrainerCore::Keepalive() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), kKeepaliveInterval);
    if (stop_ || !group_error_.ok()) continue;
    if (absl::Now() - last_broadcast_ >= kKeepaliveInterval) (void)BroadcastLocked(std::string(1, kKeepalive));
  }
}

absl::Status TrainerCore::BroadcastLocked(std::string command) {
  if (!group_error_.ok()) return group_error_;
  absl::Status s = group_->Broadcast(&command);
  last_broadcast_ = absl::Now();
  if (!s.ok()) {
    group_error_ =
        absl::UnavailableError(absl::StrCat("data-parallel group failed (restart every rank): ", s.message()));
  }
  return group_error_;
}

absl::StatusOr<model::TrainStats> TrainerCore::TrainPartLocked(const std::vector<model::TrainSequence>& seqs,
                                                               model::TrainOptions options) {
  if (group_ == nullptr || group_->world_size() == 1) return policy_->TrainStep(seqs, options);
  if (!group_error_.ok()) return group_error_;
  std::vector<model::TrainSequence> part;
  for (size_t i = group_->rank(); i < seqs.size(); i += group_->world_size()) part.push_back(seqs[i]);
  options.group = group_;
  absl::StatusOr<model::TrainStats> stats = policy_->TrainStep(part, options);
  if (!stats.ok() && !model::IsNonFiniteLossError(stats.status())) {
    // The batch was checked whole on rank 0, so this is the group failing mid-step.
    group_error_ = absl::UnavailableError(
        absl::StrCat("data-parallel step failed (restart every rank): ", stats.status().message()));
    return group_error_;
  }
  return stats;
}

absl::Status TrainerCore::ServeWorker() {
  if (group_ == nullptr || group_->rank() == 0) {
    return absl::FailedPreconditionError("ServeWorker is for data-parallel ranks > 0");
  }
  for (;;) {
    std::string command;
    RETURN_IF_ERROR(group_->Broadcast(&command));  // rank 0 keeps it alive while idle
    if (command.empty()) return absl::DataLossError("an empty command from rank 0");
    if (command[0] == kLoad) {
      // The directory rank 0 loaded, resolved under this rank's root too, and read
      // before the lock is taken.
      ASSIGN_OR_RETURN(fs::path dir, CheckpointPath(command.substr(1)));
      ASSIGN_OR_RETURN(CheckpointContents contents, ReadCheckpoint(dir, max_checkpoint_file_bytes_));
      absl::MutexLock lock(&mu_);
      v1::LoadCheckpointResponse response;
      RETURN_IF_ERROR(InstallLocked(std::move(contents), &response));
      continue;
    }
    absl::MutexLock lock(&mu_);
    switch (command[0]) {
      case kKeepalive:
        break;
      case kStop:
        return absl::OkStatus();
      case kTrain: {
        std::vector<model::TrainSequence> seqs;
        model::TrainOptions options;
        RETURN_IF_ERROR(DecodeStep(command, &seqs, &options));
        absl::StatusOr<model::TrainStats> stats = TrainPartLocked(seqs, options);
        // A non-finite loss is skipped by every rank alike (the group agrees on it).
        if (!stats.ok() && model::IsNonFiniteLossError(stats.status())) break;
        RETURN_IF_ERROR(stats.status());
        ++step_;
        ++version_;
        break;
      }
      default:
        return absl::DataLossError(absl::StrCat("unknown command `", command.substr(0, 1), "` from rank 0"));
    }
  }
}

bool TrainerCore::TrainedUnackedLocked(const std::string& id) const {
  for (const UnackedLease& u : unacked_) {
    if (u.experience_ids.contains(id)) return true;
  }
  return false;
}

void TrainerCore::RetryAcksLocked() {
  for (auto it = unacked_.begin(); it != unacked_.end();) {
    if (it->retry_ack) {
      const absl::Status s = buffer_->Ack(it->lease_id);
      if (s.ok()) {  // consumed: its groups never come back
        it = unacked_.erase(it);
        continue;
      }
      // Expired (its groups went back to the buffer) or forgotten: they may come back.
      if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) it->retry_ack = false;
    }
    if (!it->retry_ack && it->experience_ids.empty()) {
      it = unacked_.erase(it);
      continue;
    }
    ++it;
  }
}

void TrainerCore::AckLocked(const std::string& lease_id, const std::vector<std::string>& trained,
                            const std::vector<std::string>& redelivered) {
  if (buffer_->Ack(lease_id).ok()) {
    // The groups trained before are consumed now: they will not come back.
    for (const std::string& id : redelivered) {
      for (UnackedLease& u : unacked_) u.experience_ids.erase(id);
    }
    return;
  }
  ack_failures_metric_->Add();
  UnackedLease u;
  u.lease_id = lease_id;
  u.experience_ids.insert(trained.begin(), trained.end());
  unacked_.push_back(std::move(u));
  while (unacked_.size() > kMaxUnackedLeases) unacked_.pop_front();
}

absl::Status TrainerCore::TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) {
  const absl::Time start = absl::Now();
  const v1::AlgorithmParams& p = request.params();
  // Every field is checked before anything is sampled (mini_batches again below,
  // against the batch's size).
  RETURN_IF_ERROR(CheckSource(request));
  RETURN_IF_ERROR(OptionsFromParams(p, std::numeric_limits<size_t>::max(), 1).status());
  absl::MutexLock lock(&mu_);
  if (request.has_expected_step() && request.expected_step() != step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("expected_step ", request.expected_step(),
                                                      " is not the next step (", step_ + 1,
                                                      "): the step already ran or one is missing"));
  }
  // The batch.
  v1::SampleBatchResponse sampled;
  std::vector<const v1::Experience*> exps;
  std::vector<std::string> redelivered;  // ids already trained on that came back under this lease
  double wait_ms = 0;
  if (request.has_buffer()) {
    if (buffer_ == nullptr) return absl::FailedPreconditionError("no buffer configured for BufferSource batches");
    RetryAcksLocked();
    v1::SampleBatchRequest sample;
    sample.set_num_groups(request.buffer().num_groups());
    sample.set_min_groups(request.buffer().min_groups() ? request.buffer().min_groups()
                                                        : request.buffer().num_groups());
    if (request.buffer().has_max_staleness()) sample.set_max_staleness(request.buffer().max_staleness());
    sample.set_wait_ms(request.buffer().wait_ms());
    sample.set_current_policy_version(version_);
    // name#incarnation: this process's first sample ends the leases a predecessor under
    // the same name (this trainer before a restart) left open.
    sample.set_consumer_id(absl::StrCat(consumer_name_, "#", incarnation_));
    for (int attempt = 0;; ++attempt) {
      sampled.Clear();
      exps.clear();
      redelivered.clear();
      const absl::Time w = absl::Now();
      RETURN_IF_ERROR(buffer_->Sample(sample, &sampled));
      wait_ms += absl::ToDoubleMilliseconds(absl::Now() - w);
      for (const auto& g : sampled.groups()) {
        // (a group is trained whole: one trained before is left out whole)
        bool trained = false;
        for (const auto& e : g.experiences()) trained = trained || TrainedUnackedLocked(e.experience_id().value());
        for (const auto& e : g.experiences()) {
          if (trained) {
            redelivered.push_back(e.experience_id().value());
          } else {
            exps.push_back(&e);
          }
        }
      }
      if (!exps.empty() || sampled.lease_id().empty()) break;
      // Only groups this trainer trained on already (their ack had failed, the lease
      // expired): consumed now, without a second update.
      AckLocked(sampled.lease_id(), {}, redelivered);
      if (attempt >= 3) {
        return absl::UnavailableError(
            "the buffer handed out only groups already trained on (acked now, not trained again); retry");
      }
    }
    if (exps.empty()) return absl::UnavailableError("the buffer had no complete groups within wait_ms; retry");
  } else {
    for (const auto& e : request.inline_batch().experiences()) exps.push_back(&e);
  }
  auto fail = [&](absl::Status s) {
    if (!sampled.lease_id().empty()) (void)buffer_->Nack(sampled.lease_id(), std::string(s.message()));
    return s;
  };
  std::vector<model::TrainSequence> seqs;
  double rsum = 0, rsq = 0, staleness = 0;
  for (size_t i = 0; i < exps.size(); ++i) {
    const v1::Experience& e = *exps[i];
    if (absl::Status s = CheckExperience(i, e); !s.ok()) return fail(s);
    model::TrainSequence seq;
    seq.prompt.assign(e.prompt_token_ids().begin(), e.prompt_token_ids().end());
    seq.response.assign(e.response_token_ids().begin(), e.response_token_ids().end());
    seq.behaviour_logprobs.assign(e.response_logprobs().begin(), e.response_logprobs().end());
    seq.loss_mask.assign(e.response_loss_mask().begin(), e.response_loss_mask().end());
    seq.reward = e.reward();
    seqs.push_back(std::move(seq));
    rsum += e.reward();
    rsq += static_cast<double>(e.reward()) * e.reward();
    for (uint64_t v : e.token_policy_versions()) staleness += version_ > v ? version_ - v : 0;
  }
  const int ranks = group_ != nullptr ? group_->world_size() : 1;
  absl::StatusOr<model::TrainOptions> options = OptionsFromParams(p, seqs.size(), ranks);
  if (!options.ok()) return fail(options.status());
  if (options->gae) {
    // PPO with the critic: per-token advantages come from the value head in the step.
    if (!policy_->config().value_head) {
      return fail(absl::FailedPreconditionError(
          "GAE (PPO) needs a value head: start the trainer with --value_head, or use GRPO / RLOO"));
    }
  } else {
    auto adv = Advantages(exps, EstimatorFor(p));
    if (!adv.ok()) return fail(adv.status());
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].advantage = (*adv)[i];
  }
  if (ranks > 1) {
    if (seqs.size() < static_cast<size_t>(ranks)) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("a batch of ", seqs.size(), " sequences is smaller than the ", ranks, " data-parallel ranks")));
    }
    // Checked whole here, so that no rank fails its part after the others started.
    if (absl::Status s = policy_->CheckBatch(seqs, *options); !s.ok()) return fail(s);
    if (absl::Status s = BroadcastLocked(EncodeStep(seqs, *options)); !s.ok()) return fail(s);
  }
  auto stats = TrainPartLocked(seqs, *options);
  if (!stats.ok()) return fail(stats.status());
  ++step_;
  ++version_;
  if (!sampled.lease_id().empty()) {
    std::vector<std::string> trained;
    for (const v1::Experience* e : exps) trained.push_back(e->experience_id().value());
    AckLocked(sampled.lease_id(), trained, redelivered);
  }
  const double n = exps.size();
  v1::TrainMetrics* m = response->mutable_metrics();
  m->set_loss(stats->loss);
  m->set_policy_loss(stats->policy_loss);
  m->set_value_loss(stats->value_loss);
  m->set_clip_fraction(stats->clip_fraction);
  m->set_approx_kl_old(stats->approx_kl);
  m->set_grad_norm(stats->grad_norm);
  m->set_entropy(stats->entropy);
  m->set_tokens(stats->tokens);
  m->set_sequences(static_cast<uint32_t>(n));
  m->set_reward_mean(static_cast<float>(rsum / n));
  m->set_reward_std(static_cast<float>(std::sqrt(std::max(0.0, rsq / n - (rsum / n) * (rsum / n)))));
  m->set_mean_staleness(stats->tokens ? static_cast<float>(staleness / stats->tokens) : 0.0f);
  m->set_wait_time_ms(wait_ms);
  m->set_step_time_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  step_metric_->Observe(m->step_time_ms() / 1000);
  steps_metric_->Add();
  loss_metric_->Set(m->loss());
  version_metric_->Set(version_);
  last_ = *m;
  response->set_step(step_);
  response->mutable_new_policy_version()->set_version(version_);
  response->set_lease_id(sampled.lease_id());
  return absl::OkStatus();
}

absl::Status TrainerCore::GetState(v1::GetStateResponse* response) {
  absl::MutexLock lock(&mu_);
  response->set_step(step_);
  response->mutable_policy_version()->set_version(version_);
  if (last_publish_.has_value()) *response->mutable_published_version() = last_publish_->version();
  response->set_rank(group_ != nullptr ? group_->rank() : 0);
  response->set_world_size(group_ != nullptr ? group_->world_size() : 1);
  response->set_phase(v1::TRAINER_PHASE_IDLE);
  const model::PolicyConfig& c = policy_->config();
  v1::ModelConfig* mc = response->mutable_config()->mutable_model();
  mc->set_vocab_size(c.vocab_size);
  mc->set_d_model(c.d_model);
  mc->set_n_layers(c.n_layers);
  mc->set_n_heads(c.n_heads);
  mc->set_max_seq_len(c.max_seq_len);
  mc->set_num_parameters(num_parameters_);  // (counting walks every parameter: not per call)
  response->mutable_config()->set_device(device_);
  *response->mutable_last_metrics() = last_;
  return absl::OkStatus();
}

namespace {

std::string ConfigLine(const model::PolicyConfig& c) {
  std::string line = absl::StrCat(c.vocab_size, ",", c.d_model, ",", c.n_layers, ",", c.n_heads, ",", c.max_seq_len,
                                  ",", c.value_head ? 1 : 0);
  if (c.arch != "gpt") {  // (the built-in model's line is as before: older checkpoints load)
    absl::StrAppend(&line, ",", c.arch, ",", c.n_kv_heads, ",", c.head_dim, ",", c.ffn_dim, ",", c.tie_embeddings,
                    c.qkv_bias, c.o_bias, c.mlp_bias, c.qk_norm, ",", c.norm_eps, ",", c.rope_theta, ",", c.rope_factor,
                    ",", c.rope_low_freq_factor, ",", c.rope_high_freq_factor, ",", c.rope_original_max_positions);
  }
  return line;
}

}  // namespace

absl::StatusOr<fs::path> TrainerCore::CheckpointPath(const std::string& path) const {
  if (path.size() > 4096) return absl::InvalidArgumentError("path is over 4096 bytes");
  if (checkpoint_root_.empty()) {
    return absl::InvalidArgumentError(
        "path: this trainer has no checkpoint root (--checkpoint_root), so no checkpoints");
  }
  ASSIGN_OR_RETURN(fs::path dir, common::ResolveUnderRoot("path", checkpoint_root_, path));
  std::error_code ec;
  if (dir == fs::canonical(checkpoint_root_, ec)) {
    return absl::InvalidArgumentError("path names the checkpoint root itself; name a directory inside it");
  }
  return dir;
}

absl::Status TrainerCore::SaveCheckpoint(const v1::SaveCheckpointRequest& request,
                                         v1::SaveCheckpointResponse* response) {
  const absl::Time start = absl::Now();
  if (request.path().empty()) return absl::InvalidArgumentError("path is empty");
  std::error_code ec;
  if (!checkpoint_root_.empty()) fs::create_directories(checkpoint_root_, ec);  // (the first save makes it)
  ASSIGN_OR_RETURN(const fs::path dir, CheckpointPath(request.path()));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("keep_last", request.keep_last(), 0, kMaxKeepLast));
  if (request.keep_last() > 0 && !ParseSeriesName(dir.filename().string()).has_value()) {
    return absl::InvalidArgumentError("keep_last: set, but path's name is not of the form <name>-step-<N>");
  }
  absl::MutexLock lock(&mu_);
  const bool exists = fs::symlink_status(dir, ec).type() != fs::file_type::not_found;
  if (exists && !request.overwrite()) {
    return absl::AlreadyExistsError(absl::StrCat(dir.string(), " exists (set overwrite)"));
  }
  // Only a checkpoint this trainer wrote is ever replaced, and it is checked first.
  if (exists) RETURN_IF_ERROR(CheckIsCheckpoint(dir));
  // Written into a sibling directory, then renamed: a crash mid-write never leaves a
  // checkpoint that loads wrong.
  const uint64_t nanos = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  const fs::path tmp = SaveDir(dir, "tmp", checkpoint_owner_, nanos);
  fs::create_directories(dir.parent_path(), ec);
  if (!fs::create_directory(tmp, ec) || ec) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  }
  bool stopped = false;  // (by the test fault: left as a kill leaves it)
  auto stop_at = [&](SavePhase phase) { return stopped = save_fault_ && save_fault_(phase); };
  if (stop_at(SavePhase::kTmpCreated)) return absl::AbortedError("save stopped by a test fault");
  if (request.dry_run()) {  // (the folder takes a checkpoint: that is all a dry run asks)
    fs::remove(tmp, ec);
    response->set_path(dir.string());
    response->set_step(step_);
    response->mutable_policy_version()->set_version(version_);
    response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
    return absl::OkStatus();
  }
  auto written = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<uint64_t> {
    const std::string weights = policy_->SafetensorsBytes();
    // A Llama-family model's checkpoint is a Hugging Face model directory too.
    const bool hf = policy_->config().arch != "gpt";
    const char* weights_file = hf ? kHfWeightsFile : kWeightsFile;
    RETURN_IF_ERROR(model::WriteFileAtomically((tmp / weights_file).string(), weights));
    if (stop_at(SavePhase::kWeightsWritten)) return absl::AbortedError("save stopped by a test fault");
    if (hf) RETURN_IF_ERROR(model::WriteHfModelFiles(policy_->config(), tmp.string(), tokenizer_dir_.string()));
    std::string state =
        absl::StrCat(kFormatLine, "\nstep ", step_, "\nversion ", version_, "\nconfig ", ConfigLine(policy_->config()),
                     "\ndigest ", weights_file, " ", CheckpointDigest(weights), "\n");
    uint64_t size = weights.size();
    bool optimizer_saved = false;
    RETURN_IF_ERROR(policy_->SaveOptimizerState((tmp / kOptimizerFile).string(), &optimizer_saved));
    if (optimizer_saved) {
      ASSIGN_OR_RETURN(std::string bytes,
                       common::ReadRegularFile("optimizer state", tmp / kOptimizerFile, max_checkpoint_file_bytes_));
      absl::StrAppend(&state, "digest ", kOptimizerFile, " ", CheckpointDigest(bytes), "\n");
      size += bytes.size();
    }
    RETURN_IF_ERROR(model::WriteFileAtomically((tmp / kStateFile).string(), state));
    return size;
  }();
  if (!written.ok()) {
    if (!stopped) RemovePartialCheckpoint(tmp);
    return written.status();
  }
  // The old checkpoint steps aside, the new one takes its name, the old one goes.
  RETURN_IF_ERROR(
      CommitCheckpointDir(tmp, dir, exists ? SaveDir(dir, "old", checkpoint_owner_, nanos) : fs::path(), save_fault_));
  CleanCheckpointRootLocked();  // (what earlier saves of ours left)
  // Retention: the save stands whatever pruning finds (a checkpoint left is logged).
  std::vector<std::string> pruned, prune_errors;
  if (absl::Status s = PruneCheckpointSeries(dir, request.keep_last(), &pruned, &prune_errors); !s.ok()) {
    prune_errors.push_back(std::string(s.message()));
  }
  for (const std::string& line : prune_errors) std::cerr << "rlfleet-trainer: keep_last: " << line << "\n";
  for (std::string& path : pruned) response->add_pruned(std::move(path));
  response->set_path(dir.string());
  response->set_step(step_);
  response->mutable_policy_version()->set_version(version_);
  response->set_size_bytes(*written);
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

std::vector<std::string> TrainerCore::CleanCheckpointRoot() {
  absl::MutexLock lock(&mu_);  // (no save of ours runs meanwhile)
  return CleanCheckpointRootLocked();
}

std::vector<std::string> TrainerCore::CleanCheckpointRootLocked() {
  if (checkpoint_root_.empty()) return {};
  std::vector<std::string> lines = CleanInterruptedSaves(checkpoint_root_, checkpoint_owner_);
  for (const std::string& line : lines) std::cerr << "rlfleet-trainer: checkpoint root: " << line << "\n";
  return lines;
}

absl::Status TrainerCore::LoadModelDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(model::LoadHfWeights(dir, policy_.get()));
  policy_->ResetOptimizer();
  tokenizer_dir_ = dir;
  return absl::OkStatus();
}

absl::Status TrainerCore::LoadCheckpoint(const v1::LoadCheckpointRequest& request,
                                         v1::LoadCheckpointResponse* response) {
  const absl::Time start = absl::Now();
  if (request.path().empty()) return absl::InvalidArgumentError("path is empty");
  ASSIGN_OR_RETURN(const fs::path dir, CheckpointPath(request.path()));
  // Read and checked before the lock: a slow disk never blocks the trainer's other calls.
  ASSIGN_OR_RETURN(CheckpointContents contents, ReadCheckpoint(dir, max_checkpoint_file_bytes_));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(InstallLocked(std::move(contents), response));
  // The other ranks load the same directory (one machine, or a shared filesystem).
  if (group_ != nullptr && group_->world_size() > 1) {
    RETURN_IF_ERROR(BroadcastLocked(std::string(1, kLoad) + dir.string()));
  }
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainerCore::ResumeLatest(v1::LoadCheckpointResponse* response) {
  if (checkpoint_root_.empty()) return absl::NotFoundError("no checkpoint root (--checkpoint_root)");
  const std::optional<fs::path> latest = FindLatestCheckpoint(checkpoint_root_);
  if (!latest.has_value()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint under ", checkpoint_root_.string()));
  }
  v1::LoadCheckpointRequest request;
  request.set_path(latest->string());
  RETURN_IF_ERROR(common::Annotate(LoadCheckpoint(request, response), latest->string()));
  return latest->string();
}

absl::Status TrainerCore::InstallLocked(CheckpointContents contents, v1::LoadCheckpointResponse* response) {
  if (!contents.config.empty() && contents.config != ConfigLine(policy_->config())) {
    // (the file's line is not echoed)
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint's model config (vocab,d_model,layers,heads,len,value) differs from this trainer's ",
        ConfigLine(policy_->config())));
  }
  RETURN_IF_ERROR(policy_->LoadSafetensorsBytes(contents.weights, kWeightsFile));
  if (contents.optimizer.has_value()) {
    RETURN_IF_ERROR(policy_->LoadOptimizerStateBytes(*contents.optimizer, kOptimizerFile));
  } else {
    policy_->ResetOptimizer();  // saved before the first step
  }
  step_ = contents.step;
  version_ = contents.version;
  response->set_step(step_);
  response->mutable_policy_version()->set_version(version_);
  return absl::OkStatus();
}

void TrainerCore::PrefaultPublishMemory() {
  absl::MutexLock lock(&mu_);
  publish_pool_->Give(
      common::PrefaultedHugeString(model::F32ImageBytesBound(static_cast<uint64_t>(policy_->num_parameters()))));
}

absl::Status TrainerCore::Publish(const PublishTarget& target, const v1::PublishWeightsRequest& request,
                                  v1::PublishWeightsResponse* response, bool* republished) {
  const absl::Time start = absl::Now();
  if (republished != nullptr) *republished = false;
  RETURN_IF_ERROR(common::CheckInRange<int64_t>("timeout_ms", request.timeout_ms(), 0, kMaxPublishTimeoutMs));
  switch (request.wire_dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT32:  // (the parameters' dtype: what is published)
      break;
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_FLOAT16:
      return absl::UnimplementedError(absl::StrCat("wire_dtype ", v1::DType_Name(request.wire_dtype()),
                                                   ": versions are published in FLOAT32 (what replicas install)"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("wire_dtype ", request.wire_dtype(), " is not a floating-point DType for weights"));
  }
  if (target.dir.empty() && target.data_plane == nullptr) {
    return absl::FailedPreconditionError(
        "this trainer has neither --publish_dir nor a data plane (--data_plane=ucx) to publish weights through");
  }
  RETURN_IF_ERROR(common::CheckInRange<uint64_t>("min_version", request.min_version(), 0, kMaxVersion));
  absl::MutexLock lock(&mu_);
  if (request.min_version() > version_) {
    // Restarted from an older checkpoint than the fleet's newest weights: these weights
    // get a number of their own (replicas hold other weights under the old ones).
    version_ = request.min_version();
    version_metric_->Set(static_cast<double>(version_));
  }
  if (request.idempotent() && last_publish_.has_value() && last_publish_->version().version() == version_) {
    *response = *last_publish_;  // (still where it was: the file, or the latest version in memory)
    if (republished != nullptr) *republished = true;
    return absl::OkStatus();
  }
  v1::TransferDescriptor* where = response->mutable_location();
  uint64_t digest = 0, length = 0;
  if (!target.dir.empty()) {
    const std::string bytes = policy_->SafetensorsBytes();
    digest = common::Xxh64(bytes);  // (of the bytes in hand: nothing is read back)
    length = bytes.size();
    std::error_code ec;
    fs::create_directories(target.dir, ec);
    // A Llama-family model's version is a Hugging Face directory (policy-v<N>/: config,
    // tokenizer files, then model.safetensors, which the descriptor names).
    std::string path = (fs::path(target.dir) / absl::StrCat("policy-v", version_, ".safetensors")).string();
    if (policy_->config().arch != "gpt") {
      const fs::path dir = fs::path(target.dir) / absl::StrCat("policy-v", version_);
      fs::create_directories(dir, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
      RETURN_IF_ERROR(model::WriteHfModelFiles(policy_->config(), dir.string(), tokenizer_dir_.string()));
      path = (dir / kHfWeightsFile).string();
    }
    RETURN_IF_ERROR(model::WriteFileAtomically(path, bytes));
    where->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
    where->mutable_segment()->set_worker_address(path);
  } else {
    if (published_.empty() || published_.back().version != version_) {  // (else: already in memory)
      // The oldest of the two kept goes first, and its memory (back in the pool) takes
      // the new image (or the memory faulted in at start).
      if (published_.size() >= 2) {
        (void)published_.front().data_plane->DeregisterMemory(published_.front().handle);
        published_.pop_front();
      }
      Published p;
      p.version = version_;
      p.bytes = policy_->SafetensorsImage(publish_pool_);
      p.digest = common::Xxh64(p.bytes.view());
      p.data_plane = target.data_plane;
      ASSIGN_OR_RETURN(
          p.handle, target.data_plane->RegisterMemory(p.bytes.data(), p.bytes.size(), transport::MemoryKind::kHost, 0));
      published_.push_back(std::move(p));
      while (published_.size() > 2) {
        (void)published_.front().data_plane->DeregisterMemory(published_.front().handle);
        published_.pop_front();
      }
    }
    const Published& latest = published_.back();
    digest = latest.digest;
    length = latest.bytes.size();
    ASSIGN_OR_RETURN(*where->mutable_segment(), target.data_plane->Describe(latest.handle));
  }
  if (target.device_images > 0 && absl::StartsWith(device_, "cuda")) {
    ExportDeviceVersionLocked(target.device_images, response->mutable_device_image());
  }
  response->mutable_version()->set_version(version_);
  response->mutable_manifest()->mutable_version()->set_version(version_);
  response->mutable_manifest()->set_total_bytes(length);
  response->mutable_manifest()->set_created_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  where->set_length_bytes(length);
  where->set_version(version_);
  // Its digest, so that whoever pulls or reads it (the weights service, a replica) can check it.
  where->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  where->mutable_digest()->set_value(digest);
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  // Weight sync, phase 1: the trainer's pause to write the version out.
  static metrics::Histogram* publish_seconds = metrics::Global().AddHistogram(
      "rlfleet_weight_publish_seconds", "Weight sync: the trainer writing a version out (its pause).", {});
  static metrics::Counter* publish_bytes = metrics::Global().AddCounter(
      "rlfleet_weight_publish_bytes_total", "Weight sync: bytes of the versions the trainer published.", {});
  publish_seconds->Observe(response->elapsed_ms() / 1000);
  publish_bytes->Add(static_cast<double>(where->length_bytes()));
  last_publish_ = *response;
  return absl::OkStatus();
}

void TrainerCore::ExportDeviceVersionLocked(int keep, v1::CudaIpcImage* described) {
  if (device_versions_.empty() || device_versions_.back().ref().version != version_) {
    model::DeviceImage reuse;
    if (static_cast<int>(device_versions_.size()) >= keep) {
      reuse = std::move(device_versions_.front());
      device_versions_.pop_front();
    }
    absl::StatusOr<model::DeviceImage> image = policy_->ExportDeviceImage(version_, std::move(reuse));
    if (!image.ok()) {
      static std::atomic<int> logged{0};
      if (logged.fetch_add(1) < 3) {
        std::cerr << "rlfleet-trainer: version " << version_
                  << " has no device image (same-host replicas install it from the host copy): " << image.status()
                  << std::endl;
      }
      return;
    }
    device_versions_.push_back(std::move(*image));
  }
  const model::DeviceImage::Ref& ref = device_versions_.back().ref();
  described->set_ipc_handle(ref.ipc_handle);
  described->set_host_id(common::HostId());
  described->set_pci_bus_id(ref.pci_bus_id);
  described->set_layout(ref.layout);
  described->set_length_bytes(ref.length_bytes);
  described->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_BLOCKSUM32_XXH64);
  described->mutable_digest()->set_value(ref.digest);
  described->set_version(ref.version);
}

}  // namespace rlfleet::trainer
