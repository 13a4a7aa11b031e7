#include "services/trainer/trainer_core.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/checksum.h"
#include "libs/common/huge_string.h"
#include "libs/model/safetensors.h"
#include "libs/common/status_macros.h"

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

v1::AdvantageEstimator EstimatorFor(const v1::AlgorithmParams& p) {
  if (p.advantage_estimator() != v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED) return p.advantage_estimator();
  switch (p.algorithm()) {
    case v1::ALGORITHM_RLOO:
      return v1::ADVANTAGE_ESTIMATOR_LEAVE_ONE_OUT;
    case v1::ALGORITHM_PPO:
      return v1::ADVANTAGE_ESTIMATOR_GAE;
    default:
      return v1::ADVANTAGE_ESTIMATOR_GROUP_NORM;
  }
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
  Put(&out, o.grad_clip);
  Put(&out, o.clip);
  Put<int32_t>(&out, o.epochs);
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
    Put(&out, s.advantage);
    Put(&out, s.reward);
  }
  return out;
}

absl::Status DecodeStep(absl::string_view in, std::vector<model::TrainSequence>* seqs, model::TrainOptions* o) {
  Reader r(in.substr(1));
  o->learning_rate = r.Get<float>();
  o->weight_decay = r.Get<float>();
  o->grad_clip = r.Get<float>();
  o->clip = r.Get<double>();
  o->epochs = r.Get<int32_t>();
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
                                                                 BufferSource* buffer, model::GradientGroup* group) {
  ASSIGN_OR_RETURN(auto policy, model::Policy::Create(config, device, seed));
  return std::unique_ptr<TrainerCore>(new TrainerCore(std::move(policy), buffer, device, group));
}

TrainerCore::TrainerCore(std::unique_ptr<model::Policy> policy, BufferSource* buffer, std::string device,
                         model::GradientGroup* group)
    : policy_(std::move(policy)),
      buffer_(buffer),
      device_(std::move(device)),
      group_(group),
      step_metric_(metrics::Global().AddHistogram("rlfleet_trainer_step_seconds",
                                                  "Wall time of a TrainStep (batch wait included).", {})),
      steps_metric_(metrics::Global().AddCounter("rlfleet_trainer_steps_total", "Train steps taken.", {})),
      loss_metric_(metrics::Global().AddGauge("rlfleet_trainer_loss", "Loss of the last step.", {})),
      version_metric_(metrics::Global().AddGauge("rlfleet_policy_version", "Installed policy version.",
                                                 {{"service", "trainer"}})) {
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
    group_error_ = absl::UnavailableError(absl::StrCat("data-parallel group failed (restart every rank): ",
                                                       s.message()));
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
  if (!stats.ok()) {
    // The batch was checked whole on rank 0, so this is the group failing mid-step.
    group_error_ = absl::UnavailableError(absl::StrCat("data-parallel step failed (restart every rank): ",
                                                       stats.status().message()));
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
    absl::MutexLock lock(&mu_);
    switch (command[0]) {
      case kKeepalive:
        break;
      case kStop:
        return absl::OkStatus();
      case kLoad: {
        v1::LoadCheckpointResponse response;
        RETURN_IF_ERROR(LoadLocked(command.substr(1), &response));
        break;
      }
      case kTrain: {
        std::vector<model::TrainSequence> seqs;
        model::TrainOptions options;
        RETURN_IF_ERROR(DecodeStep(command, &seqs, &options));
        RETURN_IF_ERROR(TrainPartLocked(seqs, options).status());
        ++step_;
        ++version_;
        break;
      }
      default:
        return absl::DataLossError(absl::StrCat("unknown command `", command.substr(0, 1), "` from rank 0"));
    }
  }
}

absl::Status TrainerCore::TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) {
  const absl::Time start = absl::Now();
  const v1::AlgorithmParams& p = request.params();
  if (p.ppo_epochs() > 16) return absl::InvalidArgumentError("params.ppo_epochs exceeds 16");
  if (p.clip_ratio() < 0) return absl::InvalidArgumentError("params.clip_ratio is negative");
  if (p.has_optimizer() && p.optimizer().learning_rate() < 0) {
    return absl::InvalidArgumentError("params.optimizer.learning_rate is negative");
  }
  absl::MutexLock lock(&mu_);
  if (request.has_expected_step() && request.expected_step() != step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("expected_step ", request.expected_step(),
                                                      " is not the next step (", step_ + 1,
                                                      "): the step already ran or one is missing"));
  }
  // The batch.
  v1::SampleBatchResponse sampled;
  std::vector<const v1::Experience*> exps;
  double wait_ms = 0;
  if (request.has_buffer()) {
    if (buffer_ == nullptr) return absl::FailedPreconditionError("no buffer configured for BufferSource batches");
    v1::SampleBatchRequest sample;
    sample.set_num_groups(request.buffer().num_groups());
    sample.set_min_groups(request.buffer().min_groups() ? request.buffer().min_groups() : request.buffer().num_groups());
    if (request.buffer().has_max_staleness()) sample.set_max_staleness(request.buffer().max_staleness());
    sample.set_wait_ms(request.buffer().wait_ms());
    sample.set_current_policy_version(version_);
    sample.set_consumer_id("trainer-0");
    const absl::Time w = absl::Now();
    RETURN_IF_ERROR(buffer_->Sample(sample, &sampled));
    wait_ms = absl::ToDoubleMilliseconds(absl::Now() - w);
    for (const auto& g : sampled.groups()) {
      for (const auto& e : g.experiences()) exps.push_back(&e);
    }
    if (exps.empty()) return absl::UnavailableError("the buffer had no complete groups within wait_ms; retry");
  } else if (request.has_inline_batch()) {
    if (request.inline_batch().experiences_size() > 1024) {
      return absl::InvalidArgumentError("inline_batch.experiences exceeds 1024");
    }
    for (const auto& e : request.inline_batch().experiences()) exps.push_back(&e);
  }
  if (exps.empty()) return absl::InvalidArgumentError("no batch: set buffer or a non-empty inline_batch");
  auto fail = [&](absl::Status s) {
    if (!sampled.lease_id().empty()) (void)buffer_->Nack(sampled.lease_id(), std::string(s.message()));
    return s;
  };
  std::vector<model::TrainSequence> seqs;
  double rsum = 0, rsq = 0, staleness = 0;
  for (size_t i = 0; i < exps.size(); ++i) {
    const v1::Experience& e = *exps[i];
    if (!e.has_reward()) return fail(absl::InvalidArgumentError(absl::StrCat("experiences[", i, "].reward is not set")));
    if (e.response_logprobs_size() != e.response_token_ids_size()) {
      return fail(absl::InvalidArgumentError(absl::StrCat("experiences[", i, "].response_logprobs has ",
                                                          e.response_logprobs_size(), " entries, want ",
                                                          e.response_token_ids_size())));
    }
    model::TrainSequence s;
    s.prompt.assign(e.prompt_token_ids().begin(), e.prompt_token_ids().end());
    s.response.assign(e.response_token_ids().begin(), e.response_token_ids().end());
    s.behaviour_logprobs.assign(e.response_logprobs().begin(), e.response_logprobs().end());
    seqs.push_back(std::move(s));
    rsum += e.reward();
    rsq += static_cast<double>(e.reward()) * e.reward();
    for (uint64_t v : e.token_policy_versions()) staleness += version_ > v ? version_ - v : 0;
  }
  model::TrainOptions options;
  if (EstimatorFor(p) == v1::ADVANTAGE_ESTIMATOR_GAE) {
    // PPO with the critic: per-token advantages come from the value head in the step.
    if (!policy_->config().value_head) {
      return fail(absl::FailedPreconditionError(
          "GAE (PPO) needs a value head: start the trainer with --value_head, or use GRPO / RLOO"));
    }
    if (p.gamma() < 0 || p.gamma() > 1) return fail(absl::InvalidArgumentError("params.gamma is outside [0, 1]"));
    if (p.gae_lambda() < 0 || p.gae_lambda() > 1) {
      return fail(absl::InvalidArgumentError("params.gae_lambda is outside [0, 1]"));
    }
    if (p.value_loss_coef() < 0) return fail(absl::InvalidArgumentError("params.value_loss_coef is negative"));
    options.gae = true;
    if (p.gamma() > 0) options.gamma = p.gamma();  // 0 = unset: 1.0
    if (p.gae_lambda() > 0) options.gae_lambda = p.gae_lambda();  // 0 = unset: 0.95
    if (p.value_loss_coef() > 0) options.value_coef = p.value_loss_coef();  // 0 = unset: 0.5
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].reward = exps[i]->reward();
  } else {
    auto adv = Advantages(exps, EstimatorFor(p));
    if (!adv.ok()) return fail(adv.status());
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].advantage = (*adv)[i];
  }
  if (p.has_optimizer() && p.optimizer().learning_rate() > 0) options.learning_rate = p.optimizer().learning_rate();
  if (p.has_optimizer()) {
    options.weight_decay = p.optimizer().weight_decay();
    if (p.optimizer().grad_clip_norm() > 0) options.grad_clip = p.optimizer().grad_clip_norm();
  }
  if (p.clip_ratio() > 0) options.clip = p.clip_ratio();
  if (p.ppo_epochs() > 0) options.epochs = p.ppo_epochs();
  if (p.entropy_coef() < 0) return fail(absl::InvalidArgumentError("params.entropy_coef is negative"));
  options.entropy_coef = p.entropy_coef();
  if (group_ != nullptr && group_->world_size() > 1) {
    if (seqs.size() < static_cast<size_t>(group_->world_size())) {
      return fail(absl::FailedPreconditionError(absl::StrCat("a batch of ", seqs.size(), " sequences is smaller than the ",
                                                             group_->world_size(), " data-parallel ranks")));
    }
    // Checked whole here, so that no rank fails its part after the others started.
    if (absl::Status s = policy_->CheckBatch(seqs, options); !s.ok()) return fail(s);
    if (absl::Status s = BroadcastLocked(EncodeStep(seqs, options)); !s.ok()) return fail(s);
  }
  auto stats = TrainPartLocked(seqs, options);
  if (!stats.ok()) return fail(stats.status());
  if (!sampled.lease_id().empty()) RETURN_IF_ERROR(buffer_->Ack(sampled.lease_id()));
  ++step_;
  ++version_;
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
  mc->set_num_parameters(policy_->num_parameters());
  response->mutable_config()->set_device(device_);
  *response->mutable_last_metrics() = last_;
  return absl::OkStatus();
}

namespace {

// FNV-1a 64 of a file's bytes: a checkpoint's state.txt records one per file, so a
// corrupted file is DATA_LOSS instead of a model that loads wrong.
absl::StatusOr<std::string> FileDigest(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  uint64_t h = 1469598103934665603ull;
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof(buffer));
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ static_cast<uint8_t>(buffer[i])) * 1099511628211ull;
  }
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

std::string ConfigLine(const model::PolicyConfig& c) {
  return absl::StrCat(c.vocab_size, ",", c.d_model, ",", c.n_layers, ",", c.n_heads, ",", c.max_seq_len, ",",
                      c.value_head ? 1 : 0);
}

}  // namespace

absl::Status TrainerCore::SaveCheckpoint(const v1::SaveCheckpointRequest& request,
                                         v1::SaveCheckpointResponse* response) {
  const absl::Time start = absl::Now();
  if (request.path().empty() || request.path().size() > 4096) {
    return absl::InvalidArgumentError("path must be 1..4096 bytes");
  }
  absl::MutexLock lock(&mu_);
  const fs::path dir(request.path());
  std::error_code ec;
  if (fs::exists(dir, ec) && !request.overwrite()) {
    return absl::AlreadyExistsError(absl::StrCat(request.path(), " exists (set overwrite)"));
  }
  // Written into a sibling directory, then renamed: a crash mid-write never leaves a
  // checkpoint that loads wrong.
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(absl::ToUnixNanos(absl::Now()));
  fs::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  RETURN_IF_ERROR(policy_->SaveSafetensors((tmp / "weights.safetensors").string()));
  bool optimizer_saved = false;
  RETURN_IF_ERROR(policy_->SaveOptimizerState((tmp / "optimizer.safetensors").string(), &optimizer_saved));
  uint64_t size = 0;
  {
    std::ofstream state(tmp / "state.txt");
    state << "step " << step_ << "\nversion " << version_ << "\nconfig " << ConfigLine(policy_->config()) << "\n";
    for (const char* file : {"weights.safetensors", "optimizer.safetensors"}) {
      if (!fs::exists(tmp / file, ec)) continue;
      ASSIGN_OR_RETURN(std::string digest, FileDigest(tmp / file));
      state << "digest " << file << " " << digest << "\n";
      size += fs::file_size(tmp / file, ec);
    }
    if (!state.flush()) return absl::InternalError("cannot write state.txt");
  }
  if (fs::exists(dir, ec)) fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename into ", request.path(), ": ", ec.message()));
  response->set_path(request.path());
  response->set_step(step_);
  response->mutable_policy_version()->set_version(version_);
  response->set_size_bytes(size);
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status TrainerCore::LoadCheckpoint(const v1::LoadCheckpointRequest& request,
                                         v1::LoadCheckpointResponse* response) {
  if (request.path().empty() || request.path().size() > 4096) {
    return absl::InvalidArgumentError("path must be 1..4096 bytes");
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(LoadLocked(request.path(), response));
  // The other ranks load the same directory (one machine, or a shared filesystem).
  if (group_ != nullptr && group_->world_size() > 1) {
    RETURN_IF_ERROR(BroadcastLocked(std::string(1, kLoad) + request.path()));
  }
  return absl::OkStatus();
}

absl::Status TrainerCore::LoadLocked(const std::string& path, v1::LoadCheckpointResponse* response) {
  const absl::Time start = absl::Now();
  const fs::path dir(path);
  std::ifstream state(dir / "state.txt");
  if (!state) return absl::NotFoundError(absl::StrCat("no checkpoint at ", path));
  // Lines of `key value...`: step, version, config, digest <file> <hex>.
  uint64_t step = 0, version = 0;
  std::string config;
  std::map<std::string, std::string> digests;
  for (std::string key; state >> key;) {
    if (key == "step") {
      state >> step;
    } else if (key == "version") {
      state >> version;
    } else if (key == "config") {
      state >> config;
    } else if (key == "digest") {
      std::string file, hex;
      state >> file >> hex;
      digests[file] = hex;
    } else {
      std::string rest;
      std::getline(state, rest);  // a later version's key: ignored
    }
  }
  if (version == 0) return absl::DataLossError(absl::StrCat(path, "/state.txt is corrupt (no version)"));
  for (const auto& [file, want] : digests) {
    ASSIGN_OR_RETURN(std::string got, FileDigest(dir / file));
    if (got != want) {
      return absl::DataLossError(absl::StrCat(path, "/", file, " is corrupt: digest ", got,
                                              ", state.txt says ", want));
    }
  }
  if (!config.empty() && config != ConfigLine(policy_->config())) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint model config (vocab,d_model,layers,heads,len,value) ",
                                                      config, " differs from this trainer's ",
                                                      ConfigLine(policy_->config())));
  }
  RETURN_IF_ERROR(policy_->LoadSafetensors((dir / "weights.safetensors").string()));
  std::error_code ec;
  if (fs::exists(dir / "optimizer.safetensors", ec)) {
    RETURN_IF_ERROR(policy_->LoadOptimizerState((dir / "optimizer.safetensors").string()));
  } else {
    policy_->ResetOptimizer();  // saved before the first step
  }
  step_ = step;
  version_ = version;
  response->set_step(step_);
  response->mutable_policy_version()->set_version(version_);
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

void TrainerCore::PrefaultPublishMemory() {
  absl::MutexLock lock(&mu_);
  spare_image_ = common::NewHugeString(model::F32ImageBytesBound(static_cast<uint64_t>(policy_->num_parameters())));
}

absl::Status TrainerCore::Publish(const PublishTarget& target, const v1::PublishWeightsRequest&,
                                  v1::PublishWeightsResponse* response) {
  const absl::Time start = absl::Now();
  if (target.dir.empty() && target.data_plane == nullptr) {
    return absl::FailedPreconditionError(
        "this trainer has neither --publish_dir nor a data plane (--data_plane=ucx) to publish weights through");
  }
  absl::MutexLock lock(&mu_);
  v1::TransferDescriptor* where = response->mutable_location();
  uint64_t digest = 0, length = 0;
  if (!target.dir.empty()) {
    const std::string bytes = policy_->SafetensorsBytes();
    digest = common::Xxh64(bytes);  // (of the bytes in hand: nothing is read back)
    length = bytes.size();
    std::error_code ec;
    fs::create_directories(target.dir, ec);
    const std::string path = (fs::path(target.dir) / absl::StrCat("policy-v", version_, ".safetensors")).string();
    RETURN_IF_ERROR(model::WriteFileAtomically(path, bytes));
    where->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
    where->mutable_segment()->set_worker_address(path);
  } else {
    if (published_.empty() || published_.back().version != version_) {  // (else: already in memory)
      // The oldest of the two kept goes first, and its memory takes the new image (or
      // the memory faulted in at start).
      std::string reuse = std::move(spare_image_);
      if (published_.size() >= 2) {
        (void)published_.front().data_plane->DeregisterMemory(published_.front().handle);
        reuse = std::move(published_.front().bytes);
        published_.pop_front();
      }
      Published p;
      p.version = version_;
      p.bytes = policy_->SafetensorsBytes(std::move(reuse));
      p.digest = common::Xxh64(p.bytes);
      p.data_plane = target.data_plane;
      ASSIGN_OR_RETURN(p.handle, target.data_plane->RegisterMemory(p.bytes.data(), p.bytes.size(),
                                                                   transport::MemoryKind::kHost, 0));
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
  return absl::OkStatus();
}

}  // namespace rlfleet::trainer
