// The only file of libs/model that includes libtorch.
#include "libs/model/policy.h"

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

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

  // One decode step: token [n, 1] of each of the cache's n rows at cache position p,
  // with position ids pos_ids [n, 1] and the key mask as an additive bias [n*H, 1, p+1]
  // (0 for a real key, -1e9 otherwise). Fewer, larger operations than Trunk: heads
  // batched into one baddbmm (scale and mask fused), no mask built per step, and the
  // attention output needs no transpose for one query. Returns logits [n, V].
  torch::Tensor DecodeStep(const torch::Tensor& tokens, const torch::Tensor& pos_ids, const torch::Tensor& bias,
                           int64_t p, Cache& cache) {
    const int64_t n = tokens.size(0), H = config.n_heads, dh = config.d_model / H, T = p + 1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    torch::Tensor x = tok(tokens.view({n})) + pos(pos_ids.view({n}));  // [n, d]
    for (size_t l = 0; l < blocks.size(); ++l) {
      Block& b = blocks[l];
      torch::Tensor qkv = b->qkv(b->ln1(x)).view({n, 3, H, dh});
      cache.k[l].select(2, p).copy_(qkv.select(1, 1));
      cache.v[l].select(2, p).copy_(qkv.select(1, 2));
      torch::Tensor q = qkv.select(1, 0).reshape({n * H, 1, dh});
      torch::Tensor k = cache.k[l].narrow(2, 0, T).reshape({n * H, T, dh});
      torch::Tensor v = cache.v[l].narrow(2, 0, T).reshape({n * H, T, dh});
      torch::Tensor att = torch::softmax(torch::baddbmm(bias, q, k.transpose(1, 2), 1.0, scale), -1);
      x = x + b->proj(torch::bmm(att, v).view({n, config.d_model}));
      x = x + b->fc2(torch::gelu(b->fc1(b->ln2(x))));
    }
    return head(ln_f(x));
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

uint64_t SequenceSeed(uint64_t seed, uint64_t index) {
  // splitmix64 of the pair: neighbouring indices get unrelated streams.
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- DecodeBatch ----

class DecodeBatch::State {
 public:
  struct Row {
    uint64_t id = 0;
    SamplingOptions options;
    std::mt19937_64 rng;
    int generated = 0;    // tokens sampled so far (the last one is `pending`)
    int32_t pending = 0;  // sampled, not yet fed through the model
    int64_t prompt_length = 0;
  };

  // The cache position of a row's first prompt token: its real tokens sit right
  // before the batch position (the pending token is not in the cache yet).
  int64_t Start(const Row& r) const { return position - (r.prompt_length + r.generated - 1); }

  State(Policy::Impl* impl, int capacity)
      : impl(impl), capacity(std::max(1, capacity)), width(2 * int64_t{impl->config.max_seq_len}) {}

  Policy::Impl::Cache View(int64_t r0, int64_t n) {
    Policy::Impl::Cache view;
    for (size_t l = 0; l < cache.k.size(); ++l) {
      view.k.push_back(cache.k[l].narrow(0, r0, n));
      view.v.push_back(cache.v[l].narrow(0, r0, n));
    }
    view.key_ok = cache.key_ok.narrow(0, r0, n);
    return view;
  }

  // Makes room for `rows_needed` rows (doubling, up to capacity), keeping live rows.
  void Grow(int64_t rows_needed) {
    if (rows_needed <= allocated) return;
    const int64_t n = std::min<int64_t>(capacity, std::max<int64_t>({rows_needed, 2 * allocated, 8}));
    Policy::Impl::Cache grown;
    const int64_t dh = impl->config.d_model / impl->config.n_heads;
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(impl->device);
    for (int l = 0; l < impl->config.n_layers; ++l) {
      grown.k.push_back(torch::zeros({n, impl->config.n_heads, width, dh}, opts));
      grown.v.push_back(torch::zeros({n, impl->config.n_heads, width, dh}, opts));
    }
    grown.key_ok = torch::zeros({n, width}, opts.dtype(torch::kBool));
    torch::Tensor grown_tokens = torch::zeros({n, width}, opts.dtype(torch::kLong));
    const int64_t live = rows.size();
    if (live > 0) {
      for (size_t l = 0; l < grown.k.size(); ++l) {
        grown.k[l].narrow(0, 0, live).copy_(cache.k[l].narrow(0, 0, live));
        grown.v[l].narrow(0, 0, live).copy_(cache.v[l].narrow(0, 0, live));
      }
      grown.key_ok.narrow(0, 0, live).copy_(cache.key_ok.narrow(0, 0, live));
      grown_tokens.narrow(0, 0, live).copy_(tokens.narrow(0, 0, live));
    }
    cache = std::move(grown);
    tokens = grown_tokens;
    allocated = n;
  }

  // Moves every live row's cache so the batch's position becomes `target` (left to
  // reclaim leading padding, right to make room for a longer prompt).
  void Reposition(int64_t target) {
    const int64_t n = rows.size(), d = target - position;
    if (n > 0 && d != 0) {
      auto shift = [&](torch::Tensor all, int64_t dim) {
        torch::Tensor x = all.narrow(0, 0, n);
        if (d > 0) {
          torch::Tensor moved = x.narrow(dim, 0, position).clone();
          x.narrow(dim, d, position).copy_(moved);
        } else {
          torch::Tensor moved = x.narrow(dim, -d, position + d).clone();
          x.narrow(dim, 0, position + d).copy_(moved);
        }
      };
      for (size_t l = 0; l < cache.k.size(); ++l) {
        shift(cache.k[l], 2);
        shift(cache.v[l], 2);
      }
      shift(cache.key_ok, 1);
      shift(tokens, 1);
      if (d > 0) {
        cache.key_ok.narrow(0, 0, n).narrow(1, 0, d).fill_(false);
        tokens.narrow(0, 0, n).narrow(1, 0, d).fill_(0);
      }
    }
    position = target;
  }

  // Where the batch's position must be for `sequences` to join, or -1 if they cannot
  // now (no free rows, or not enough cache width for everyone's remaining tokens).
  int64_t Placement(const std::vector<Sequence>& sequences) const {
    if (sequences.empty() || rows.size() + sequences.size() > static_cast<size_t>(capacity)) return -1;
    int64_t longest = 0, remaining = 0;
    for (const Sequence& s : sequences) {
      longest = std::max<int64_t>(longest, s.prompt.size());
      remaining = std::max<int64_t>(remaining, s.options.max_new_tokens);
    }
    if (rows.empty()) return longest + remaining <= width ? longest : -1;
    int64_t earliest = position;
    for (const Row& r : rows) {
      earliest = std::min(earliest, Start(r));
      remaining = std::max<int64_t>(remaining, r.options.max_new_tokens - r.generated);
    }
    if (position >= longest && position + remaining <= width) return position;  // no move
    const int64_t target = std::max(longest, position - earliest);
    return target + remaining <= width ? target : -1;
  }

  // Samples one token per row of `logits` [m, V] for rows r0 .. r0+m-1 (each with its
  // own options and RNG; rows with equal options are sampled together).
  std::vector<Token> Sample(const torch::Tensor& logits, int64_t r0) {
    const int64_t m = logits.size(0), V = logits.size(1);
    torch::Tensor all = logits.to(torch::kCPU).to(torch::kFloat32);
    std::map<std::tuple<float, int, float>, std::vector<int64_t>> groups;
    for (int64_t i = 0; i < m; ++i) {
      const SamplingOptions& o = rows[r0 + i].options;
      groups[{o.temperature, o.top_k, o.top_p}].push_back(i);
    }
    std::vector<int64_t> next(m);
    std::vector<float> logprob(m);
    for (const auto& [key, index] : groups) {
      const auto [temperature, top_k, top_p] = key;
      const int64_t g = index.size();
      torch::Tensor x = g == m ? all : all.index_select(0, torch::tensor(index, torch::kLong));
      torch::Tensor logp = torch::log_softmax(temperature > 0 ? x / temperature : x, -1);
      torch::Tensor chosen;
      if (temperature == 0) {
        chosen = logp.argmax(-1);
      } else {
        const bool filter = (top_k > 0 && top_k < V) || top_p < 1;
        torch::Tensor filtered = filter ? logp.clone() : logp;
        if (top_k > 0 && top_k < V) {
          auto kth = std::get<0>(filtered.topk(top_k, -1)).select(-1, -1).unsqueeze(-1);
          filtered.masked_fill_(filtered < kth, -INFINITY);
        }
        if (top_p < 1) {
          auto [sorted, order] = filtered.sort(-1, /*descending=*/true);
          auto drop = (sorted.exp().cumsum(-1) - sorted.exp()) > top_p;  // smallest set reaching top_p
          filtered.scatter_(-1, order, sorted.masked_fill(drop, -INFINITY));
        }
        // Inverse CDF with one uniform in (0, 1] per row from the row's own RNG.
        torch::Tensor cdf = filtered.exp().cumsum(-1);  // unnormalised: u is scaled by the total
        torch::Tensor u = torch::empty({g, 1}, torch::kFloat64);
        auto ua = u.accessor<double, 2>();
        for (int64_t j = 0; j < g; ++j) ua[j][0] = ((rows[r0 + index[j]].rng() >> 11) + 1) * 0x1.0p-53;
        u = (u * cdf.narrow(-1, V - 1, 1).to(torch::kFloat64)).to(torch::kFloat32);
        chosen = cdf.lt(u).sum(-1).clamp_max(V - 1);
      }
      torch::Tensor chosen_lp = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).contiguous();
      chosen = chosen.contiguous();
      const int64_t* c = chosen.data_ptr<int64_t>();
      const float* lp = chosen_lp.data_ptr<float>();
      for (int64_t j = 0; j < g; ++j) {
        next[index[j]] = c[j];
        logprob[index[j]] = lp[j];
      }
    }
    std::vector<Token> out(m);
    std::vector<int64_t> leaving;
    for (int64_t i = 0; i < m; ++i) {
      Row& r = rows[r0 + i];
      Token& t = out[i];
      t.id = r.id;
      t.token = static_cast<int32_t>(next[i]);
      t.logprob = logprob[i];
      r.pending = t.token;
      ++r.generated;
      const std::vector<int32_t>& stop = r.options.stop_ids;
      t.stopped_by_eos = t.token == r.options.eos_id || std::find(stop.begin(), stop.end(), t.token) != stop.end();
      t.finished = t.stopped_by_eos || r.generated >= r.options.max_new_tokens;
      if (t.finished) leaving.push_back(r0 + i);
    }
    for (auto it = leaving.rbegin(); it != leaving.rend(); ++it) RemoveRow(*it);
    return out;
  }

  // Drops row i, moving the last row into its place so live rows stay dense.
  void RemoveRow(int64_t i) {
    const int64_t last = static_cast<int64_t>(rows.size()) - 1;
    if (i != last) {
      for (size_t l = 0; l < cache.k.size(); ++l) {
        cache.k[l].narrow(0, i, 1).copy_(cache.k[l].narrow(0, last, 1));
        cache.v[l].narrow(0, i, 1).copy_(cache.v[l].narrow(0, last, 1));
      }
      cache.key_ok.narrow(0, i, 1).copy_(cache.key_ok.narrow(0, last, 1));
      tokens.narrow(0, i, 1).copy_(tokens.narrow(0, last, 1));
      rows[i] = std::move(rows[last]);
    }
    rows.pop_back();
    if (rows.empty()) position = 0;
  }

  Policy::Impl* const impl;
  const int capacity;
  const int64_t width;  // cache positions per row
  int64_t allocated = 0;
  Policy::Impl::Cache cache;
  torch::Tensor tokens;  // [allocated, width] the token at each cache position (PAD = 0)
  std::vector<Row> rows;  // live rows, dense: row i is cache row i
  int64_t position = 0;   // the cache position the next Step writes
};

DecodeBatch::DecodeBatch(Policy* policy, int capacity)
    : policy_(policy), state_(std::make_unique<State>(policy->impl_.get(), capacity)) {}
DecodeBatch::~DecodeBatch() = default;

int DecodeBatch::size() const { return static_cast<int>(state_->rows.size()); }
int DecodeBatch::capacity() const { return state_->capacity; }

absl::Status DecodeBatch::Validate(const Sequence& sequence) const {
  const PolicyConfig& config = policy_->config();
  RETURN_IF_ERROR(CheckTokens({sequence.prompt}, config.vocab_size, /*equal_length=*/true));
  const SamplingOptions& o = sequence.options;
  if (o.temperature < 0) return absl::InvalidArgumentError("temperature is negative");
  if (o.top_p <= 0 || o.top_p > 1) return absl::InvalidArgumentError("top_p is outside (0, 1]");
  if (o.top_k < 0) return absl::InvalidArgumentError("top_k is negative");
  if (o.max_new_tokens < 1 ||
      static_cast<int64_t>(sequence.prompt.size()) + o.max_new_tokens > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", sequence.prompt.size(), ") + max_new_tokens (",
                                                   o.max_new_tokens, ") exceeds max_seq_len ", config.max_seq_len));
  }
  return absl::OkStatus();
}

bool DecodeBatch::CanAdd(const std::vector<Sequence>& sequences) const {
  return state_->Placement(sequences) >= 0;
}

absl::StatusOr<std::vector<DecodeBatch::Token>> DecodeBatch::Add(std::vector<Sequence> sequences) {
  if (sequences.empty()) return absl::InvalidArgumentError("no sequences to add");
  for (const Sequence& s : sequences) RETURN_IF_ERROR(Validate(s));
  State& st = *state_;
  const int64_t target = st.Placement(sequences);
  if (target < 0) {
    return absl::FailedPreconditionError(absl::StrCat("no room for ", sequences.size(), " more sequences (",
                                                      st.rows.size(), " of ", st.capacity, " rows live)"));
  }
  torch::NoGradGuard no_grad;
  const int64_t k = sequences.size(), r0 = st.rows.size();
  int64_t longest = 0;
  for (const Sequence& s : sequences) longest = std::max<int64_t>(longest, s.prompt.size());
  st.Grow(r0 + k);
  st.Reposition(target);
  // The joiners' rows: no keys before their prompts (the cache may hold a departed
  // row's), prompts left-padded to end at the batch position.
  st.cache.key_ok.narrow(0, r0, k).fill_(false);
  st.tokens.narrow(0, r0, k).fill_(0);
  std::vector<std::vector<int32_t>> padded(k);
  for (int64_t j = 0; j < k; ++j) {
    padded[j].assign(longest - sequences[j].prompt.size(), sequences[j].options.pad_id);
    padded[j].insert(padded[j].end(), sequences[j].prompt.begin(), sequences[j].prompt.end());
    State::Row row;
    row.id = sequences[j].id;
    row.options = std::move(sequences[j].options);
    row.rng.seed(row.options.seed);
    row.prompt_length = sequences[j].prompt.size();
    st.rows.push_back(std::move(row));
  }
  torch::Tensor input = ToTensor(padded, st.impl->device);
  st.tokens.narrow(0, r0, k).narrow(1, target - longest, longest).copy_(input);
  auto view = st.View(r0, k);
  torch::Tensor logits = st.impl->Forward(input, target - longest, view).select(1, -1);
  return st.Sample(logits, r0);
}

absl::StatusOr<std::vector<DecodeBatch::Token>> DecodeBatch::Step() {
  State& st = *state_;
  const int64_t n = st.rows.size();
  if (n == 0) return std::vector<Token>{};
  torch::NoGradGuard no_grad;
  // Each row's pending token and its position id (real tokens before it).
  torch::Tensor host = torch::empty({2, n}, torch::kLong);
  int64_t* h = host.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const State::Row& r = st.rows[i];
    h[i] = r.pending;
    h[n + i] = r.prompt_length + r.generated - 1;
  }
  host = host.to(st.impl->device);
  torch::Tensor input = host[0].view({n, 1}), pos_ids = host[1].view({n, 1});
  const int64_t p = st.position, H = st.impl->config.n_heads;
  st.tokens.narrow(0, 0, n).narrow(1, p, 1).copy_(input);
  st.cache.key_ok.narrow(0, 0, n).narrow(1, p, 1).fill_(true);
  torch::Tensor bias = torch::zeros({n, p + 1}, torch::TensorOptions().device(st.impl->device))
                           .masked_fill_(st.cache.key_ok.narrow(0, 0, n).narrow(1, 0, p + 1).logical_not(), -1e9);
  bias = bias.unsqueeze(1).expand({n, H, p + 1}).reshape({n * H, 1, p + 1});
  auto view = st.View(0, n);
  torch::Tensor logits = st.impl->DecodeStep(input, pos_ids, bias, p, view);
  ++st.position;
  return st.Sample(logits, 0);
}

bool DecodeBatch::Remove(uint64_t id) {
  State& st = *state_;
  for (size_t i = 0; i < st.rows.size(); ++i) {
    if (st.rows[i].id == id) {
      st.RemoveRow(i);
      return true;
    }
  }
  return false;
}

absl::Status DecodeBatch::Refresh() {
  State& st = *state_;
  const int64_t n = st.rows.size();
  if (n == 0) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  auto view = st.View(0, n);
  st.impl->Forward(st.tokens.narrow(0, 0, n).narrow(1, 0, st.position), 0, view);
  return absl::OkStatus();
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

namespace {

TensorBlob ToBlob(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous().to(torch::kFloat32);
  TensorBlob blob;
  blob.shape = t.sizes().vec();
  blob.bytes.assign(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
  return blob;
}

}  // namespace

absl::Status Policy::SaveOptimizerState(const std::string& path, bool* saved) const {
  *saved = false;
  if (impl_->optimizer == nullptr) return absl::OkStatus();
  auto& state = impl_->optimizer->state();
  std::map<std::string, TensorBlob> tensors;
  for (const auto& item : impl_->named_parameters()) {
    auto it = state.find(c10::guts::to_string(item.value().unsafeGetTensorImpl()));
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
  for (auto& [param, s] : loaded) state[c10::guts::to_string(param.unsafeGetTensorImpl())] = std::move(s);
  return absl::OkStatus();
}

absl::Status Policy::LoadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(auto tensors, ReadSafetensors(path));
  torch::NoGradGuard no_grad;
  // Every tensor is checked before any is copied: a bad file changes nothing.
  std::vector<std::pair<torch::Tensor, const TensorBlob*>> copies;
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
    copies.emplace_back(item.value(), &blob);
  }
  for (auto& [param, blob] : copies) {
    torch::Tensor src = torch::from_blob(const_cast<char*>(blob->bytes.data()), blob->shape, torch::kFloat32);
    param.copy_(src);
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::model
