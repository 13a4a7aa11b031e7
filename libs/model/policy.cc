// The policy (policy.h) in libtorch; the module itself is in policy_impl.h.
#include "libs/model/policy.h"

#include <fstream>
#include <iterator>

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"
#include "libs/model/policy_impl.h"
#include "libs/rl/rl.h"

namespace rlfleet::model {

void SetComputeThreads(int threads) { torch::set_num_threads(std::max(1, threads)); }

const char* BlasCoreTypeForCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void ConfigureBlas(char** argv) {
  if (getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  if (getenv("OPENBLAS_CORETYPE") == nullptr && *BlasCoreTypeForCpu() != '\0') {
    setenv("OPENBLAS_CORETYPE", BlasCoreTypeForCpu(), 1);
  }
  execv("/proc/self/exe", argv);
}

absl::StatusOr<std::unique_ptr<Policy>> Policy::Create(const PolicyConfig& config, const std::string& device,
                                                       uint64_t init_seed) {
  if (config.vocab_size < 4 || config.d_model < 8 || config.n_layers < 1 || config.n_heads < 1 ||
      config.d_model % config.n_heads != 0 || config.max_seq_len < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad model config: vocab_size ", config.vocab_size, ", d_model ", config.d_model, ", n_layers ",
        config.n_layers, ", n_heads ", config.n_heads, " (d_model must divide by n_heads), max_seq_len ",
        config.max_seq_len));
  }
  try {
    torch::manual_seed(init_seed);
    std::unique_ptr<Impl> impl(new Impl(config, torch::Device(device)));
    impl->eval();
    return std::unique_ptr<Policy>(new Policy(std::move(impl)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create the model on `", device, "`: ", e.what()));
  }
}

Policy::Policy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Policy::~Policy() = default;

const PolicyConfig& Policy::config() const { return impl_->config; }

int64_t Policy::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : impl_->parameters()) n += p.numel();
  return n;
}

absl::StatusOr<std::vector<float>> Policy::Logits(const std::vector<std::vector<int32_t>>& tokens) {
  RETURN_IF_ERROR(CheckTokens(tokens, impl_->config.vocab_size, /*equal_length=*/true));
  if (static_cast<int>(tokens[0].size()) > impl_->config.max_seq_len) {
    return absl::InvalidArgumentError("sequence longer than max_seq_len");
  }
  torch::NoGradGuard no_grad;
  auto cache = impl_->NewCache(tokens.size());
  return ToVector(impl_->Forward(ToTensor(tokens, impl_->device), 0, cache));
}

absl::StatusOr<std::vector<float>> Policy::Values(const std::vector<std::vector<int32_t>>& sequences) {
  if (!impl_->value) {
    return absl::FailedPreconditionError("Values: the model has no value head (PolicyConfig.value_head)");
  }
  RETURN_IF_ERROR(CheckTokens(sequences, impl_->config.vocab_size, /*equal_length=*/false));
  size_t longest = 0;
  for (const auto& s : sequences) longest = std::max(longest, s.size());
  if (static_cast<int>(longest) > impl_->config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("Values: a sequence of ", longest,
                                                   " tokens is longer than max_seq_len ",
                                                   impl_->config.max_seq_len));
  }
  // Left-padded, so every sequence ends at the last position (positions count real
  // tokens only, so padding changes nothing).
  std::vector<std::vector<int32_t>> padded(sequences.size());
  for (size_t b = 0; b < sequences.size(); ++b) {
    padded[b].assign(longest - sequences[b].size(), 0);
    padded[b].insert(padded[b].end(), sequences[b].begin(), sequences[b].end());
  }
  torch::NoGradGuard no_grad;
  torch::Tensor hidden = impl_->Trunk(ToTensor(padded, impl_->device), 0, nullptr);
  return ToVector(impl_->value(hidden.select(1, -1)).squeeze(-1));
}

absl::StatusOr<std::vector<float>> Policy::IncrementalLogits(const std::vector<std::vector<int32_t>>& tokens) {
  RETURN_IF_ERROR(CheckTokens(tokens, impl_->config.vocab_size, /*equal_length=*/true));
  torch::NoGradGuard no_grad;
  auto cache = impl_->NewCache(tokens.size());
  torch::Tensor all = ToTensor(tokens, impl_->device);
  std::vector<torch::Tensor> steps;
  for (int64_t p = 0; p < all.size(1); ++p) steps.push_back(impl_->Forward(all.narrow(1, p, 1), p, cache));
  return ToVector(torch::cat(steps, 1));
}

absl::StatusOr<std::vector<Generation>> Policy::Generate(const std::vector<std::vector<int32_t>>& prompts,
                                                         const SamplingOptions& options) {
  RETURN_IF_ERROR(CheckTokens(prompts, impl_->config.vocab_size, /*equal_length=*/false));
  // One decode algorithm: the whole batch joins a DecodeBatch at once and runs out.
  const int64_t B = prompts.size();
  DecodeBatch batch(this, static_cast<int>(B));
  std::vector<DecodeBatch::Sequence> sequences(B);
  for (int64_t b = 0; b < B; ++b) {
    sequences[b].id = b;
    sequences[b].prompt = prompts[b];
    sequences[b].options = options;
    sequences[b].options.seed = SequenceSeed(options.seed, b);
  }
  std::vector<Generation> out(B);
  auto collect = [&out](const std::vector<DecodeBatch::Token>& tokens) {
    for (const DecodeBatch::Token& t : tokens) {
      out[t.id].tokens.push_back(t.token);
      out[t.id].logprobs.push_back(t.logprob);
      if (t.finished) out[t.id].stopped_by_eos = t.stopped_by_eos;
    }
  };
  ASSIGN_OR_RETURN(std::vector<DecodeBatch::Token> first, batch.Add(std::move(sequences)));
  collect(first);
  while (batch.size() > 0) {
    ASSIGN_OR_RETURN(std::vector<DecodeBatch::Token> step, batch.Step());
    collect(step);
  }
  return out;
}

namespace {

// Replaces every parameter's gradient by the token-weighted mean over the group's
// ranks: sum_r n_r * g_r / sum_r n_r, with n_r the rank's response tokens (its loss
// is a mean over them), in one all-reduce of [n_r * grads..., n_r].
absl::Status SyncGradients(Policy::Impl& impl, const torch::Tensor& mask, GradientGroup* group) {
  const float tokens = mask.sum().item<float>();
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> parts;
  for (auto& p : impl.parameters()) {
    params.push_back(p);
    torch::Tensor g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    parts.push_back((g * tokens).flatten().to(torch::kCPU));
  }
  parts.push_back(torch::full({1}, tokens));
  torch::Tensor flat = torch::cat(parts).contiguous();
  RETURN_IF_ERROR(group->AllReduceSum(flat.data_ptr<float>(), flat.numel()));
  const float total = flat[flat.numel() - 1].item<float>();
  if (total <= 0) return absl::OkStatus();  // no tokens anywhere: nothing to learn
  flat.div_(total);
  int64_t offset = 0;
  for (auto& p : params) {
    torch::Tensor g = flat.narrow(0, offset, p.numel()).view(p.sizes()).to(p.device());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(g);
    } else {
      p.mutable_grad() = g.clone();
    }
    offset += p.numel();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Policy::CheckBatch(const std::vector<TrainSequence>& batch, const TrainOptions& options) const {
  if (batch.empty()) return absl::InvalidArgumentError("empty training batch");
  if (options.gae && !impl_->value) {
    return absl::FailedPreconditionError("PPO with GAE needs the value head (PolicyConfig.value_head)");
  }
  size_t prompt_len = 0, response_len = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const TrainSequence& s = batch[i];
    if (s.prompt.empty() || s.response.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has an empty prompt or response"));
    }
    if (s.behaviour_logprobs.size() != s.response.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has ", s.behaviour_logprobs.size(),
                                                     " behaviour logprobs for ", s.response.size(), " tokens"));
    }
    for (const std::vector<int32_t>* tokens : {&s.prompt, &s.response}) {
      for (int32_t t : *tokens) {
        if (t < 0 || t >= impl_->config.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": token ", t,
                                                         " is outside the vocabulary of ", impl_->config.vocab_size));
        }
      }
    }
    prompt_len = std::max(prompt_len, s.prompt.size());
    response_len = std::max(response_len, s.response.size());
  }
  if (static_cast<int>(prompt_len + response_len) > impl_->config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt + response (", prompt_len + response_len,
                                                   ") exceeds max_seq_len ", impl_->config.max_seq_len));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainStats> Policy::TrainStep(const std::vector<TrainSequence>& batch,
                                             const TrainOptions& options) {
  RETURN_IF_ERROR(CheckBatch(batch, options));
  size_t prompt_len = 0, response_len = 0;
  for (const TrainSequence& s : batch) {
    prompt_len = std::max(prompt_len, s.prompt.size());
    response_len = std::max(response_len, s.response.size());
  }
  const int64_t B = batch.size(), P = prompt_len, R = response_len;
  // Prompts left-padded to P (as in generation), responses right-padded to R.
  std::vector<std::vector<int32_t>> rows(B);
  torch::Tensor targets = torch::zeros({B, R}, torch::kLong);
  torch::Tensor mask = torch::zeros({B, R});
  torch::Tensor old_lp = torch::zeros({B, R});
  torch::Tensor adv = torch::zeros({B});
  torch::Tensor rewards = torch::zeros({B, R});  // the sequence reward on its last token
  for (int64_t b = 0; b < B; ++b) {
    const TrainSequence& s = batch[b];
    for (int32_t t : s.prompt) {
      if (t < 0 || t >= impl_->config.vocab_size) return absl::InvalidArgumentError("token outside the vocabulary");
    }
    rows[b].assign(P - s.prompt.size(), 0);
    rows[b].insert(rows[b].end(), s.prompt.begin(), s.prompt.end());
    for (int64_t j = 0; j < R; ++j) {
      const bool real = j < static_cast<int64_t>(s.response.size());
      const int32_t tok = real ? s.response[j] : 0;
      if (tok < 0 || tok >= impl_->config.vocab_size) return absl::InvalidArgumentError("token outside the vocabulary");
      rows[b].push_back(tok);
      if (real) {
        targets.index_put_({b, j}, tok);
        mask.index_put_({b, j}, 1.0);
        old_lp.index_put_({b, j}, s.behaviour_logprobs[j]);
      }
    }
    adv.index_put_({b}, s.advantage);
    rewards.index_put_({b, static_cast<int64_t>(s.response.size()) - 1}, s.reward);
  }
  const torch::Device dev = impl_->device;
  torch::Tensor input = ToTensor(rows, dev);
  targets = targets.to(dev);
  mask = mask.to(dev);
  old_lp = old_lp.to(dev);
  adv = adv.to(dev);
  // GAE: the critic's estimates at the start of the step give per-token advantages and
  // the value targets. Logits at P-1+j predict response token j, and the value there
  // is that of the state before token j.
  torch::Tensor old_values, returns;
  if (options.gae) {
    torch::NoGradGuard no_grad;
    torch::Tensor hidden = impl_->Trunk(input, 0, nullptr);
    old_values = impl_->value(hidden.narrow(1, P - 1, R)).squeeze(-1) * mask;
    rl::GaeResult g = rl::Gae(rewards.to(dev), old_values, mask, options.gamma, options.gae_lambda);
    returns = g.returns;
    torch::Tensor mean = rl::MaskedMean(g.advantages, mask);
    torch::Tensor var = rl::MaskedMean((g.advantages - mean).pow(2), mask);
    adv = (g.advantages - mean) / (var + 1e-8).sqrt() * mask;
  }
  if (impl_->optimizer == nullptr) {
    impl_->optimizer = std::make_unique<torch::optim::AdamW>(
        impl_->parameters(), torch::optim::AdamWOptions(options.learning_rate).weight_decay(options.weight_decay));
  }
  for (auto& group : impl_->optimizer->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options())
        .lr(options.learning_rate)
        .weight_decay(options.weight_decay);
  }
  impl_->train();
  TrainStats stats;
  for (int epoch = 0; epoch < std::max(1, options.epochs); ++epoch) {
    impl_->optimizer->zero_grad();
    torch::Tensor hidden = impl_->Trunk(input, 0, nullptr);
    torch::Tensor logits = impl_->head(hidden);
    // Logits at P-1+j predict response token j.
    torch::Tensor all_lp = torch::log_softmax(logits.narrow(1, P - 1, R), -1);
    torch::Tensor lp = all_lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    torch::Tensor entropy = -(all_lp.exp() * all_lp).sum(-1);
    rl::PpoOptions po;
    po.clip = options.clip;
    po.entropy_coef = options.entropy_coef;
    rl::PpoLoss loss = rl::PpoPolicyLoss(lp, old_lp, adv, mask, po, {}, {}, entropy);
    torch::Tensor total = loss.loss;
    if (options.gae) {
      torch::Tensor v = impl_->value(hidden.narrow(1, P - 1, R)).squeeze(-1);
      torch::Tensor clipped = old_values + (v - old_values).clamp(-options.value_clip, options.value_clip);
      torch::Tensor value_loss =
          0.5 * rl::MaskedMean(torch::max((v - returns).pow(2), (clipped - returns).pow(2)), mask);
      total = total + options.value_coef * value_loss;
      stats.value_loss = value_loss.item<float>();
    }
    total.backward();
    if (options.group != nullptr) RETURN_IF_ERROR(SyncGradients(*impl_, mask, options.group));
    const double norm = torch::nn::utils::clip_grad_norm_(impl_->parameters(), options.grad_clip);
    impl_->optimizer->step();
    ++impl_->weights_generation;
    stats.loss = total.item<float>();
    stats.policy_loss = loss.policy_loss.item<float>();
    stats.clip_fraction = loss.clip_fraction.item<float>();
    stats.approx_kl = loss.approx_kl.item<float>();
    stats.grad_norm = static_cast<float>(norm);
    stats.entropy = loss.entropy.item<float>();
  }
  impl_->eval();
  stats.tokens = static_cast<int64_t>(mask.sum().item<float>());
  return stats;
}

std::string Policy::SafetensorsBytes(std::string reuse) const {
  // Views of the parameters where they are (a CPU f32 parameter is not copied; others
  // are converted into `kept` first): the image is written with one copy per byte.
  std::vector<torch::Tensor> kept;
  std::map<std::string, TensorView> tensors;
  for (const auto& item : impl_->named_parameters()) {
    torch::Tensor t = item.value().detach().to(torch::kCPU).contiguous().to(torch::kFloat32);
    kept.push_back(t);
    TensorView view;
    view.shape = t.sizes().vec();
    view.bytes = absl::string_view(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
    tensors[item.key()] = std::move(view);
  }
  return SerializeSafetensors(tensors, std::move(reuse));
}

absl::Status Policy::SaveSafetensors(const std::string& path) const {
  return WriteFileAtomically(path, SafetensorsBytes());
}

namespace {

TensorBlob ToBlob(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous().to(torch::kFloat32);
  TensorBlob blob;
  blob.shape = t.sizes().vec();
  blob.bytes.assign(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
  return blob;
}

// The key of a parameter in the optimizer's state map: libtorch 1.13 (Debian) keys it
// by the TensorImpl's address printed as a string, libtorch 2.x by the address itself.
template <typename Map>
typename Map::key_type OptimizerStateKey(const Map&, const torch::Tensor& param) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;
    key << param.unsafeGetTensorImpl();
    return key.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

}  // namespace

absl::Status Policy::SaveOptimizerState(const std::string& path, bool* saved) const {
  *saved = false;
  if (impl_->optimizer == nullptr) return absl::OkStatus();
  auto& state = impl_->optimizer->state();
  std::map<std::string, TensorBlob> tensors;
  for (const auto& item : impl_->named_parameters()) {
    auto it = state.find(OptimizerStateKey(state, item.value()));
    if (it == state.end()) continue;  // (a parameter without a gradient yet)
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    tensors[item.key() + ".exp_avg"] = ToBlob(s.exp_avg());
    tensors[item.key() + ".exp_avg_sq"] = ToBlob(s.exp_avg_sq());
    TensorBlob step;
    step.dtype = "I64";
    step.shape = {1};
    const int64_t n = s.step();
    step.bytes.assign(reinterpret_cast<const char*>(&n), sizeof(n));
    tensors[item.key() + ".step"] = std::move(step);
  }
  RETURN_IF_ERROR(WriteSafetensors(path, tensors));
  *saved = true;
  return absl::OkStatus();
}

void Policy::ResetOptimizer() { impl_->optimizer.reset(); }

absl::Status Policy::LoadOptimizerState(const std::string& path) {
  ASSIGN_OR_RETURN(auto tensors, ReadSafetensors(path));
  torch::NoGradGuard no_grad;
  // Everything is checked before the optimizer changes.
  std::vector<std::pair<torch::Tensor, std::unique_ptr<torch::optim::AdamWParamState>>> loaded;
  for (const auto& item : impl_->named_parameters()) {
    auto avg = tensors.find(item.key() + ".exp_avg");
    auto sq = tensors.find(item.key() + ".exp_avg_sq");
    auto step = tensors.find(item.key() + ".step");
    if (avg == tensors.end() && sq == tensors.end() && step == tensors.end()) continue;
    const std::vector<int64_t> shape = item.value().sizes().vec();
    if (avg == tensors.end() || sq == tensors.end() || step == tensors.end() || avg->second.shape != shape ||
        sq->second.shape != shape || avg->second.dtype != "F32" || sq->second.dtype != "F32" ||
        step->second.dtype != "I64" || step->second.bytes.size() != sizeof(int64_t)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state of `", item.key(),
                                                     "` is missing a part or has the wrong shape; want F32 [",
                                                     absl::StrJoin(shape, ","), "] moments and an I64 step"));
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    auto tensor = [&](const TensorBlob& b) {
      return torch::from_blob(const_cast<char*>(b.bytes.data()), b.shape, torch::kFloat32)
          .clone()
          .to(item.value().device());
    };
    s->exp_avg(tensor(avg->second));
    s->exp_avg_sq(tensor(sq->second));
    int64_t n = 0;
    std::memcpy(&n, step->second.bytes.data(), sizeof(n));
    s->step(n);
    loaded.emplace_back(item.value(), std::move(s));
  }
  if (impl_->optimizer == nullptr) {
    // The learning rate and weight decay are set by every TrainStep.
    impl_->optimizer = std::make_unique<torch::optim::AdamW>(impl_->parameters(), torch::optim::AdamWOptions(1e-3));
  }
  auto& state = impl_->optimizer->state();
  state.clear();
  for (auto& [param, s] : loaded) state[OptimizerStateKey(state, param)] = std::move(s);
  return absl::OkStatus();
}

absl::Status Policy::LoadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return LoadSafetensorsBytes(bytes, path);
}

absl::Status Policy::LoadSafetensorsBytes(const std::string& bytes, const std::string& name) {
  ASSIGN_OR_RETURN(auto tensors, ParseSafetensorsViews(bytes, name));  // (views: nothing copied yet)
  return LoadTensors(tensors, name);
}

absl::Status Policy::LoadTensors(const std::map<std::string, TensorView>& tensors, const std::string& path) {
  torch::NoGradGuard no_grad;
  // Every tensor is checked before any is copied: a bad file changes nothing.
  std::vector<std::pair<torch::Tensor, const TensorView*>> copies;
  for (auto& item : impl_->named_parameters()) {
    auto it = tensors.find(item.key());
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor `", item.key(), "` is missing"));
    }
    const TensorView& blob = it->second;
    if (blob.dtype != "F32" || blob.shape != item.value().sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor `", item.key(), "` is ", blob.dtype,
                                                     " of the wrong shape; want F32 [",
                                                     absl::StrJoin(item.value().sizes().vec(), ","), "]"));
    }
    copies.emplace_back(item.value(), &blob);
  }
  for (auto& [param, blob] : copies) {
    torch::Tensor src = torch::from_blob(const_cast<char*>(blob->bytes.data()), blob->shape, torch::kFloat32);
    param.copy_(src);
  }
  ++impl_->weights_generation;
  return absl::OkStatus();
}

}  // namespace rlfleet::model
