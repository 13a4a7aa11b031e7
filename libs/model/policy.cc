// The only file of libs/model that includes libtorch.
#include "libs/model/policy.h"

#include <torch/torch.h>

#include <unistd.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"
#include "libs/rl/rl.h"

namespace rlfleet::model {
namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int d_model)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        qkv(register_module("qkv", torch::nn::Linear(d_model, 3 * d_model))),
        proj(register_module("proj", torch::nn::Linear(d_model, d_model))),
        fc1(register_module("fc1", torch::nn::Linear(d_model, 4 * d_model))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d_model, d_model))) {}
  torch::nn::LayerNorm ln1, ln2;
  torch::nn::Linear qkv, proj, fc1, fc2;
};
TORCH_MODULE(Block);

}  // namespace

class Policy::Impl : public torch::nn::Module {
 public:
  Impl(const PolicyConfig& c, torch::Device device) : config(c), device(device) {
    tok = register_module("tok_emb", torch::nn::Embedding(c.vocab_size, c.d_model));
    pos = register_module("pos_emb", torch::nn::Embedding(c.max_seq_len, c.d_model));
    list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < c.n_layers; ++i) {
      blocks.push_back(Block(c.d_model));
      list->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab_size).bias(false)));
    if (c.value_head) value = register_module("value_head", torch::nn::Linear(c.d_model, 1));
    to(device);
  }

  // The KV cache: per layer [B, H, max_seq_len, Dh] keys and values, written in place.
  struct Cache {
    std::vector<torch::Tensor> k, v;
    torch::Tensor key_ok;  // [B, max_seq_len] bool: false for PAD keys
  };

  Cache NewCache(int64_t batch) {
    Cache cache;
    const int64_t dh = config.d_model / config.n_heads;
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    for (int i = 0; i < config.n_layers; ++i) {
      cache.k.push_back(torch::zeros({batch, config.n_heads, config.max_seq_len, dh}, opts));
      cache.v.push_back(torch::zeros({batch, config.n_heads, config.max_seq_len, dh}, opts));
    }
    cache.key_ok = torch::ones({batch, config.max_seq_len}, opts.dtype(torch::kBool));
    return cache;
  }

  // Runs tokens [B, t] at positions [p0, p0 + t) through the model, writing their
  // keys and values into `cache`; returns logits [B, t, V].
  torch::Tensor Forward(const torch::Tensor& tokens, int64_t p0, Cache& cache) {
    return Forward(tokens, p0, &cache);
  }

  // Without a cache (training): p0 must be 0 and keys are this call's tokens, so
  // autograd sees no in-place writes.
  torch::Tensor Forward(const torch::Tensor& tokens, int64_t p0, Cache* cache) {
    return head(Trunk(tokens, p0, cache));
  }

  // The final hidden states [B, t, d_model] (after ln_f), before the LM head.
  torch::Tensor Trunk(const torch::Tensor& tokens, int64_t p0, Cache* cache) {
    const int64_t B = tokens.size(0), t = tokens.size(1);
    const int64_t H = config.n_heads, dh = config.d_model / H;
    torch::Tensor key_ok = tokens.ne(kPadForMask);
    if (cache != nullptr) {
      cache->key_ok.narrow(1, p0, t).copy_(key_ok);
      key_ok = cache->key_ok.narrow(1, 0, p0 + t);
    }
    auto positions = torch::arange(p0, p0 + t, torch::TensorOptions().dtype(torch::kLong).device(device));
    // Position embeddings count real tokens only, so a left-padded prompt sees the same
    // positions as it would alone: what a sequence generates must not depend on what
    // else is in its batch. (key_ok here covers slots [0, p0 + t).)
    torch::Tensor pos_ids = (key_ok.to(torch::kLong).cumsum(1).narrow(1, p0, t) - 1).clamp_min(0);
    torch::Tensor x = tok(tokens) + pos(pos_ids);
    // Causal mask over keys [0, p0 + t): query i (absolute p0 + i) sees keys <= p0 + i
    // that are not PAD.
    const int64_t T = p0 + t;
    auto kpos = torch::arange(T, positions.options());
    torch::Tensor allowed = kpos.unsqueeze(0).le(positions.unsqueeze(1));       // [t, T]
    allowed = allowed.unsqueeze(0) & key_ok.unsqueeze(1);  // [B, t, T]
    // A query at a PAD position would see nothing: let every query see itself, which
    // keeps the softmax finite (PAD rows' outputs are never used).
    allowed = allowed | kpos.unsqueeze(0).eq(positions.unsqueeze(1)).unsqueeze(0);
    torch::Tensor bias = torch::zeros({B, 1, t, T}, x.options()).masked_fill(allowed.logical_not().unsqueeze(1), -1e9);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    for (size_t l = 0; l < blocks.size(); ++l) {
      Block& b = blocks[l];
      torch::Tensor h = b->ln1(x);
      auto qkv = b->qkv(h).view({B, t, 3, H, dh}).permute({2, 0, 3, 1, 4});  // [3, B, H, t, dh]
      torch::Tensor k = qkv[1], v = qkv[2];
      if (cache != nullptr) {
        cache->k[l].narrow(2, p0, t).copy_(qkv[1]);
        cache->v[l].narrow(2, p0, t).copy_(qkv[2]);
        k = cache->k[l].narrow(2, 0, T);
        v = cache->v[l].narrow(2, 0, T);
      }
      torch::Tensor att = torch::matmul(qkv[0], k.transpose(-2, -1)) * scale + bias;
      att = torch::softmax(att, -1);
      torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({B, t, config.d_model});
      x = x + b->proj(y);
      x = x + b->fc2(torch::gelu(b->fc1(b->ln2(x))));
    }
    return ln_f(x);
  }

  static constexpr int64_t kPadForMask = 0;
  PolicyConfig config;
  torch::Device device;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList list{nullptr};  // registers the blocks as blocks.<i>.*
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr}, value{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

namespace {

absl::Status CheckTokens(const std::vector<std::vector<int32_t>>& rows, int vocab, bool equal_length) {
  if (rows.empty()) return absl::InvalidArgumentError("empty batch");
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " is empty"));
    if (equal_length && rows[b].size() != rows[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has length ", rows[b].size(),
                                                     ", sequence 0 has ", rows[0].size()));
    }
    for (size_t i = 0; i < rows[b].size(); ++i) {
      if (rows[b][i] < 0 || rows[b][i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token ", rows[b][i], " at [", b, "][", i,
                                                       "] is outside the vocabulary of ", vocab));
      }
    }
  }
  return absl::OkStatus();
}

torch::Tensor ToTensor(const std::vector<std::vector<int32_t>>& rows, torch::Device device) {
  const int64_t B = rows.size(), T = rows[0].size();
  torch::Tensor t = torch::empty({B, T}, torch::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < T; ++i) a[b][i] = rows[b][i];
  }
  return t.to(device);
}

std::vector<float> ToVector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU).contiguous().to(torch::kFloat32);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace

void SetComputeThreads(int threads) { torch::set_num_threads(std::max(1, threads)); }

void PinBlasThreads(char** argv) {
  if (getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
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
  if (options.temperature < 0) return absl::InvalidArgumentError("temperature is negative");
  if (options.top_p <= 0 || options.top_p > 1) return absl::InvalidArgumentError("top_p is outside (0, 1]");
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  if (options.max_new_tokens < 1 ||
      static_cast<int>(longest) + options.max_new_tokens > impl_->config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", longest, ") + max_new_tokens (",
                                                   options.max_new_tokens, ") exceeds max_seq_len ",
                                                   impl_->config.max_seq_len));
  }
  torch::NoGradGuard no_grad;
  const int64_t B = prompts.size();
  std::vector<std::vector<int32_t>> padded(B);
  for (int64_t b = 0; b < B; ++b) {
    padded[b].assign(longest - prompts[b].size(), options.pad_id);
    padded[b].insert(padded[b].end(), prompts[b].begin(), prompts[b].end());
  }
  auto cache = impl_->NewCache(B);
  torch::Tensor logits = impl_->Forward(ToTensor(padded, impl_->device), 0, cache).select(1, -1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::vector<Generation> out(B);
  std::vector<bool> done(B, false);
  int64_t position = longest;
  for (int step = 0; step < options.max_new_tokens; ++step) {
    torch::Tensor scaled = options.temperature > 0 ? logits / options.temperature : logits;
    torch::Tensor logp = torch::log_softmax(scaled.to(torch::kCPU).to(torch::kFloat32), -1);
    torch::Tensor next;
    if (options.temperature == 0) {
      next = logp.argmax(-1);
    } else {
      torch::Tensor filtered = logp.clone();
      if (options.top_k > 0 && options.top_k < filtered.size(-1)) {
        auto kth = std::get<0>(filtered.topk(options.top_k, -1)).select(-1, -1).unsqueeze(-1);
        filtered.masked_fill_(filtered < kth, -INFINITY);
      }
      if (options.top_p < 1) {
        auto [sorted, index] = filtered.sort(-1, /*descending=*/true);
        auto cum = sorted.exp().cumsum(-1);
        auto drop = (cum - sorted.exp()) > options.top_p;  // keep the smallest set reaching top_p
        filtered.scatter_(-1, index, sorted.masked_fill(drop, -INFINITY));
      }
      next = torch::multinomial(filtered.softmax(-1), 1, /*replacement=*/false, gen).squeeze(-1);
    }
    auto next_a = next.accessor<int64_t, 1>();
    auto logp_chosen = logp.gather(-1, next.unsqueeze(-1)).squeeze(-1);
    auto lp = logp_chosen.accessor<float, 1>();
    std::vector<std::vector<int32_t>> feed(B, std::vector<int32_t>(1, options.pad_id));
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      const int32_t token = static_cast<int32_t>(next_a[b]);
      out[b].tokens.push_back(token);
      out[b].logprobs.push_back(lp[b]);
      feed[b][0] = token;
      if (token == options.eos_id) {
        done[b] = true;
        out[b].stopped_by_eos = true;
      }
      all_done = all_done && done[b];
    }
    if (all_done || step + 1 == options.max_new_tokens) break;
    logits = impl_->Forward(ToTensor(feed, impl_->device), position, cache).select(1, -1);
    ++position;
  }
  return out;
}

absl::StatusOr<TrainStats> Policy::TrainStep(const std::vector<TrainSequence>& batch,
                                             const TrainOptions& options) {
  if (batch.empty()) return absl::InvalidArgumentError("empty training batch");
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
    prompt_len = std::max(prompt_len, s.prompt.size());
    response_len = std::max(response_len, s.response.size());
  }
  if (static_cast<int>(prompt_len + response_len) > impl_->config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt + response (", prompt_len + response_len,
                                                   ") exceeds max_seq_len ", impl_->config.max_seq_len));
  }
  const int64_t B = batch.size(), P = prompt_len, R = response_len;
  // Prompts left-padded to P (as in generation), responses right-padded to R.
  std::vector<std::vector<int32_t>> rows(B);
  torch::Tensor targets = torch::zeros({B, R}, torch::kLong);
  torch::Tensor mask = torch::zeros({B, R});
  torch::Tensor old_lp = torch::zeros({B, R});
  torch::Tensor adv = torch::zeros({B});
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
  }
  const torch::Device dev = impl_->device;
  torch::Tensor input = ToTensor(rows, dev);
  targets = targets.to(dev);
  mask = mask.to(dev);
  old_lp = old_lp.to(dev);
  adv = adv.to(dev);
  if (impl_->optimizer == nullptr) {
    impl_->optimizer = std::make_unique<torch::optim::AdamW>(
        impl_->parameters(), torch::optim::AdamWOptions(options.learning_rate).weight_decay(options.weight_decay));
  }
  for (auto& group : impl_->optimizer->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(options.learning_rate);
  }
  impl_->train();
  TrainStats stats;
  for (int epoch = 0; epoch < std::max(1, options.epochs); ++epoch) {
    impl_->optimizer->zero_grad();
    torch::Tensor logits = impl_->Forward(input, 0, static_cast<Impl::Cache*>(nullptr));
    // Logits at P-1+j predict response token j.
    torch::Tensor all_lp = torch::log_softmax(logits.narrow(1, P - 1, R), -1);
    torch::Tensor lp = all_lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    torch::Tensor entropy = -(all_lp.exp() * all_lp).sum(-1);
    rl::PpoOptions po;
    po.clip = options.clip;
    po.entropy_coef = options.entropy_coef;
    rl::PpoLoss loss = rl::PpoPolicyLoss(lp, old_lp, adv, mask, po, {}, {}, entropy);
    loss.loss.backward();
    const double norm = torch::nn::utils::clip_grad_norm_(impl_->parameters(), options.grad_clip);
    impl_->optimizer->step();
    stats.loss = loss.loss.item<float>();
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

absl::Status Policy::SaveSafetensors(const std::string& path) const {
  std::map<std::string, TensorBlob> tensors;
  for (const auto& item : impl_->named_parameters()) {
    torch::Tensor t = item.value().detach().to(torch::kCPU).contiguous().to(torch::kFloat32);
    TensorBlob blob;
    blob.shape = t.sizes().vec();
    blob.bytes.assign(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
    tensors[item.key()] = std::move(blob);
  }
  return WriteSafetensors(path, tensors);
}

absl::Status Policy::LoadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(auto tensors, ReadSafetensors(path));
  torch::NoGradGuard no_grad;
  for (auto& item : impl_->named_parameters()) {
    auto it = tensors.find(item.key());
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor `", item.key(), "` is missing"));
    }
    const TensorBlob& blob = it->second;
    if (blob.dtype != "F32" || blob.shape != item.value().sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor `", item.key(), "` is ", blob.dtype,
                                                     " of the wrong shape; want F32 [",
                                                     absl::StrJoin(item.value().sizes().vec(), ","), "]"));
    }
    torch::Tensor src = torch::from_blob(const_cast<char*>(blob.bytes.data()), blob.shape, torch::kFloat32);
    item.value().copy_(src);
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::model
