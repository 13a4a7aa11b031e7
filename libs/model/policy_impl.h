// Private to libs/model: the policy's libtorch module (Policy::Impl, its KV cache)
// and the helpers policy.cc and decode_batch.cc share. Only those two files include
// it (each libtorch translation unit costs ~20 s and ~1 GB to compile).
#ifndef RLFLEET_LIBS_MODEL_POLICY_IMPL_H_
#define RLFLEET_LIBS_MODEL_POLICY_IMPL_H_

#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/model/policy.h"

namespace rlfleet::model {
namespace internal {

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

// The Llama family (PolicyConfig::arch llama / qwen2 / qwen3), its modules named as
// transformers names them (model.layers.<i>.self_attn.q_proj, ...), so that a Hugging
// Face checkpoint's tensors load by name and ours save in its layout.

inline int64_t HeadDim(const PolicyConfig& c) { return c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads; }
inline int64_t KvHeads(const PolicyConfig& c) { return c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads; }

// RMSNorm as transformers computes it: normalised in fp32, the weight applied after
// the cast back to the input's dtype.
struct RmsNormImpl : torch::nn::Module {
  RmsNormImpl(int64_t dim, double eps) : eps(eps) { weight = register_parameter("weight", torch::ones({dim})); }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = x.to(torch::kFloat32);
    h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return weight * h.to(x.scalar_type());
  }
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

inline torch::nn::Linear NewLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const PolicyConfig& c) {
    const int64_t dh = HeadDim(c), kv = KvHeads(c);
    q_proj = register_module("q_proj", NewLinear(c.d_model, c.n_heads * dh, c.qkv_bias));
    k_proj = register_module("k_proj", NewLinear(c.d_model, kv * dh, c.qkv_bias));
    v_proj = register_module("v_proj", NewLinear(c.d_model, kv * dh, c.qkv_bias));
    o_proj = register_module("o_proj", NewLinear(c.n_heads * dh, c.d_model, c.o_bias));
    if (c.qk_norm) {
      q_norm = register_module("q_norm", RmsNorm(dh, c.norm_eps));
      k_norm = register_module("k_norm", RmsNorm(dh, c.norm_eps));
    }
  }
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(LlamaAttention);

struct LlamaMlpImpl : torch::nn::Module {
  explicit LlamaMlpImpl(const PolicyConfig& c)
      : gate_proj(register_module("gate_proj", NewLinear(c.d_model, c.ffn_dim, c.mlp_bias))),
        up_proj(register_module("up_proj", NewLinear(c.d_model, c.ffn_dim, c.mlp_bias))),
        down_proj(register_module("down_proj", NewLinear(c.ffn_dim, c.d_model, c.mlp_bias))) {}
  torch::Tensor forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }
  torch::nn::Linear gate_proj, up_proj, down_proj;
};
TORCH_MODULE(LlamaMlp);

struct LlamaLayerImpl : torch::nn::Module {
  explicit LlamaLayerImpl(const PolicyConfig& c)
      : input_layernorm(register_module("input_layernorm", RmsNorm(c.d_model, c.norm_eps))),
        self_attn(register_module("self_attn", LlamaAttention(c))),
        post_attention_layernorm(register_module("post_attention_layernorm", RmsNorm(c.d_model, c.norm_eps))),
        mlp(register_module("mlp", LlamaMlp(c))) {}
  RmsNorm input_layernorm;
  LlamaAttention self_attn;
  RmsNorm post_attention_layernorm;
  LlamaMlp mlp;
};
TORCH_MODULE(LlamaLayer);

struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const PolicyConfig& c) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.d_model));
    list = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < c.n_layers; ++i) {
      layers.push_back(LlamaLayer(c));
      list->push_back(layers.back());
    }
    norm = register_module("norm", RmsNorm(c.d_model, c.norm_eps));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList list{nullptr};  // registers the layers as layers.<i>.*
  std::vector<LlamaLayer> layers;
  RmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

// The rotary embedding's inverse frequencies [head_dim / 2] (fp32), as transformers
// computes them: theta^(-2i/d), with Llama 3's scaling when rope_factor is set.
inline torch::Tensor RopeInverseFrequencies(const PolicyConfig& c) {
  const int64_t dh = HeadDim(c);
  torch::Tensor inv = 1.0 / torch::pow(c.rope_theta, torch::arange(0, dh, 2, torch::kLong).to(torch::kFloat32) / dh);
  if (c.rope_factor > 0) {
    const double old_len = c.rope_original_max_positions;
    const double low_wavelen = old_len / c.rope_low_freq_factor, high_wavelen = old_len / c.rope_high_freq_factor;
    torch::Tensor wavelen = 2 * M_PI / inv;
    torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
    torch::Tensor smooth =
        (old_len / wavelen - c.rope_low_freq_factor) / (c.rope_high_freq_factor - c.rope_low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
    torch::Tensor medium = wavelen.ge(high_wavelen) & wavelen.le(low_wavelen);
    inv = torch::where(medium, smoothed, scaled);
  }
  return inv;
}

// x [..., dh] rotated by the angles whose cos and sin are given ([..., dh], broadcast):
// transformers' rotate_half form (the first and second halves of each head pair up).
inline torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace internal

using internal::Block;

struct DecodeSlot;  // decode_batch.cc

class Policy::Impl : public torch::nn::Module {
 public:
  Impl(const PolicyConfig& c, torch::Device device, torch::ScalarType dtype)
      : config(c), device(device), dtype(dtype), gpt(c.arch == "gpt") {
    if (gpt) {
      tok = register_module("tok_emb", torch::nn::Embedding(c.vocab_size, c.d_model));
      pos = register_module("pos_emb", torch::nn::Embedding(c.max_seq_len, c.d_model));
      list = register_module("blocks", torch::nn::ModuleList());
      for (int i = 0; i < c.n_layers; ++i) {
        blocks.push_back(Block(c.d_model));
        list->push_back(blocks.back());
      }
      ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    } else {
      model = register_module("model", internal::LlamaModel(c));
    }
    if (gpt || !c.tie_embeddings) {
      head = register_module("lm_head", internal::NewLinear(c.d_model, c.vocab_size, /*bias=*/false));
    }
    if (c.value_head) value = register_module("value_head", torch::nn::Linear(c.d_model, 1));
    if (!gpt) {
      // transformers' initialisation (normal, std 0.02; biases 0; norms 1): a random
      // Llama-family policy starts near uniform, as a fresh one there does.
      torch::NoGradGuard no_grad;
      for (auto& item : named_parameters()) {
        if (item.key().find("norm.") != std::string::npos) continue;
        if (absl::EndsWith(item.key(), ".bias")) {
          item.value().zero_();
        } else {
          item.value().normal_(0.0, 0.02);
        }
      }
      rope_inv_freq = internal::RopeInverseFrequencies(c).to(device);
    }
    to(device, dtype);
  }

  // The KV cache: per layer [B, KvHeads, width, HeadDim] keys and values (keys after
  // the rotary embedding), written in place.
  struct Cache {
    std::vector<torch::Tensor> k, v;
    torch::Tensor key_ok;  // [B, width] bool: false for PAD keys
  };

  // A zeroed cache of `batch` rows x `width` positions (every key allowed when
  // `keys_allowed`).
  Cache NewCache(int64_t batch, int64_t width, bool keys_allowed) const {
    Cache cache;
    auto opts = torch::TensorOptions().dtype(dtype).device(device);
    for (int i = 0; i < config.n_layers; ++i) {
      cache.k.push_back(torch::zeros({batch, internal::KvHeads(config), width, internal::HeadDim(config)}, opts));
      cache.v.push_back(torch::zeros({batch, internal::KvHeads(config), width, internal::HeadDim(config)}, opts));
    }
    cache.key_ok = (keys_allowed ? torch::ones({batch, width}, opts.dtype(torch::kBool))
                                 : torch::zeros({batch, width}, opts.dtype(torch::kBool)));
    return cache;
  }
  Cache NewCache(int64_t batch) const { return NewCache(batch, config.max_seq_len, /*keys_allowed=*/true); }

  // The LM head: logits [..., V] of final hidden states [..., d_model].
  torch::Tensor Head(const torch::Tensor& hidden) {
    return head ? head(hidden) : torch::nn::functional::linear(hidden, model->embed_tokens->weight);
  }

  // Runs tokens [B, t] at positions [p0, p0 + t) through the model, writing their
  // keys and values into `cache`; returns logits [B, t, V].
  torch::Tensor Forward(const torch::Tensor& tokens, int64_t p0, Cache& cache, const torch::Tensor& real = {}) {
    return Forward(tokens, p0, &cache, real);
  }

  // Without a cache (training): p0 must be 0 and keys are this call's tokens, so
  // autograd sees no in-place writes.
  torch::Tensor Forward(const torch::Tensor& tokens, int64_t p0, Cache* cache, const torch::Tensor& real = {}) {
    return Head(Trunk(tokens, p0, cache, real));
  }

  // The final hidden states [B, t, d_model] (after ln_f), before the LM head. `real`
  // [B, t] (bool) says which tokens are real: keys attended to and counted by position
  // ids; without it, every token but PAD (id 0) is. A sequence the policy generated can
  // hold the PAD id as a real token (sampling does not exclude it), so code that knows
  // where the padding is (TrainStep, Values, DecodeBatch::Refresh) passes `real`.
  torch::Tensor Trunk(const torch::Tensor& tokens, int64_t p0, Cache* cache, const torch::Tensor& real = {}) {
    const int64_t B = tokens.size(0), t = tokens.size(1);
    const int64_t H = config.n_heads, dh = internal::HeadDim(config);
    torch::Tensor key_ok = real.defined() ? real.to(torch::kBool) : tokens.ne(kPadForMask);
    if (cache != nullptr) {
      cache->key_ok.narrow(1, p0, t).copy_(key_ok);
      key_ok = cache->key_ok.narrow(1, 0, p0 + t);
    }
    auto positions = torch::arange(p0, p0 + t, torch::TensorOptions().dtype(torch::kLong).device(device));
    // Position ids count real tokens only, so a left-padded prompt sees the same
    // positions as it would alone: what a sequence generates must not depend on what
    // else is in its batch. (key_ok here covers slots [0, p0 + t).)
    torch::Tensor pos_ids = (key_ok.to(torch::kLong).cumsum(1).narrow(1, p0, t) - 1).clamp_min(0);
    // Causal mask over keys [0, p0 + t): query i (absolute p0 + i) sees keys <= p0 + i
    // that are not PAD.
    const int64_t T = p0 + t;
    auto kpos = torch::arange(T, positions.options());
    torch::Tensor allowed = kpos.unsqueeze(0).le(positions.unsqueeze(1));  // [t, T]
    allowed = allowed.unsqueeze(0) & key_ok.unsqueeze(1);                  // [B, t, T]
    // A query at a PAD position would see nothing: let every query see itself, which
    // keeps the softmax finite (PAD rows' outputs are never used).
    allowed = allowed | kpos.unsqueeze(0).eq(positions.unsqueeze(1)).unsqueeze(0);
    torch::Tensor bias = torch::zeros({B, 1, t, T}, torch::TensorOptions().dtype(dtype).device(device))
                             .masked_fill(allowed.logical_not().unsqueeze(1), MaskedScore());
    if (!gpt) return LlamaTrunk(tokens, pos_ids, bias, p0, cache);
    torch::Tensor x = tok(tokens) + pos(pos_ids);
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

  // The rotary embedding's cos and sin for position ids `pos_ids` [...] (long):
  // [..., head_dim] each in the policy's dtype, computed in fp32 as transformers does.
  std::pair<torch::Tensor, torch::Tensor> Rope(const torch::Tensor& pos_ids) const {
    torch::Tensor freqs = pos_ids.to(torch::kFloat32).unsqueeze(-1) * rope_inv_freq;
    torch::Tensor angles = torch::cat({freqs, freqs}, -1);
    return {angles.cos().to(dtype), angles.sin().to(dtype)};
  }

  // Queries [.., Hq, dh], keys and values [.., Hkv, dh] of hidden states `h` [..., d],
  // q/k-normed (qwen3) and rotated by cos / sin ([..., dh]).
  struct Qkv {
    torch::Tensor q, k, v;
  };
  Qkv LlamaQkv(internal::LlamaAttention& a, const torch::Tensor& h, const torch::Tensor& cos,
               const torch::Tensor& sin) const {
    const int64_t dh = internal::HeadDim(config), kv = internal::KvHeads(config);
    std::vector<int64_t> lead = h.sizes().vec();
    lead.pop_back();
    auto heads = [&](std::vector<int64_t> shape, int64_t n) {
      shape.push_back(n);
      shape.push_back(dh);
      return shape;
    };
    torch::Tensor q = a->q_proj(h).view(heads(lead, config.n_heads));
    torch::Tensor k = a->k_proj(h).view(heads(lead, kv));
    torch::Tensor v = a->v_proj(h).view(heads(lead, kv));
    if (a->q_norm) {
      q = a->q_norm(q);
      k = a->k_norm(k);
    }
    return {internal::ApplyRope(q, cos.unsqueeze(-2), sin.unsqueeze(-2)),
            internal::ApplyRope(k, cos.unsqueeze(-2), sin.unsqueeze(-2)), v};
  }

  // Trunk for the Llama family: tokens [B, t] at position ids pos_ids [B, t], the
  // additive attention mask `bias` [B, 1, t, p0 + t].
  torch::Tensor LlamaTrunk(const torch::Tensor& tokens, const torch::Tensor& pos_ids, const torch::Tensor& bias,
                           int64_t p0, Cache* cache) {
    const int64_t B = tokens.size(0), t = tokens.size(1), T = p0 + t;
    const int64_t H = config.n_heads, dh = internal::HeadDim(config), group = H / internal::KvHeads(config);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    auto [cos, sin] = Rope(pos_ids);  // [B, t, dh]
    torch::Tensor x = model->embed_tokens(tokens);
    for (size_t l = 0; l < model->layers.size(); ++l) {
      internal::LlamaLayer& layer = model->layers[l];
      Qkv qkv = LlamaQkv(layer->self_attn, layer->input_layernorm(x), cos, sin);
      torch::Tensor q = qkv.q.transpose(1, 2), k = qkv.k.transpose(1, 2), v = qkv.v.transpose(1, 2);  // [B, h, t, dh]
      if (cache != nullptr) {
        cache->k[l].narrow(2, p0, t).copy_(k);
        cache->v[l].narrow(2, p0, t).copy_(v);
        k = cache->k[l].narrow(2, 0, T);
        v = cache->v[l].narrow(2, 0, T);
      }
      if (group > 1) {  // query head i reads key/value head i / group
        k = k.repeat_interleave(group, 1);
        v = v.repeat_interleave(group, 1);
      }
      torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * scale + bias;
      att = torch::softmax(att, -1, torch::kFloat32).to(v.scalar_type());
      torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({B, t, H * dh});
      x = x + layer->self_attn->o_proj(y);
      x = x + layer->mlp(layer->post_attention_layernorm(x));
    }
    return model->norm(x);
  }

  // DecodeStep for the Llama family (its arguments and result as DecodeStep's; `bias`
  // [n * KvHeads, 1, T]). The query heads that share a key/value head are the rows of
  // one product against it.
  torch::Tensor LlamaDecodeStep(const torch::Tensor& tokens, const torch::Tensor& pos_ids, const torch::Tensor& bias,
                                int64_t p, Cache& cache, const torch::Tensor& at) {
    const int64_t n = tokens.size(0), kv = internal::KvHeads(config), dh = internal::HeadDim(config);
    const int64_t group = config.n_heads / kv;
    const int64_t T = at.defined() ? cache.k[0].size(2) : p + 1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    auto [cos, sin] = Rope(pos_ids.view({n}));                // [n, dh]
    torch::Tensor x = model->embed_tokens(tokens.view({n}));  // [n, d]
    for (size_t l = 0; l < model->layers.size(); ++l) {
      internal::LlamaLayer& layer = model->layers[l];
      Qkv qkv = LlamaQkv(layer->self_attn, layer->input_layernorm(x), cos, sin);  // [n, h, dh]
      if (at.defined()) {
        cache.k[l].index_copy_(2, at, qkv.k.unsqueeze(2));
        cache.v[l].index_copy_(2, at, qkv.v.unsqueeze(2));
      } else {
        cache.k[l].select(2, p).copy_(qkv.k);
        cache.v[l].select(2, p).copy_(qkv.v);
      }
      torch::Tensor k = cache.k[l].narrow(2, 0, T).reshape({n * kv, T, dh});
      torch::Tensor v = cache.v[l].narrow(2, 0, T).reshape({n * kv, T, dh});
      torch::Tensor q = qkv.q.reshape({n * kv, group, dh});
      torch::Tensor att = torch::baddbmm(bias, q, k.transpose(1, 2), 1.0, scale);  // [n*kv, group, T]
      att = torch::softmax(att, -1, torch::kFloat32).to(v.scalar_type());
      x = x + layer->self_attn->o_proj(torch::bmm(att, v).view({n, config.n_heads * dh}));
      x = x + layer->mlp(layer->post_attention_layernorm(x));
    }
    return Head(model->norm(x));
  }

  // Each Linear's weight transposed to [in, out] and contiguous, for decoding: a decode
  // step's products run as addmm(bias, x, w_t), where OpenBLAS need not re-pack a
  // transposed operand on every call ([32x128]x[128x512]: 55 vs 74 us here). Rebuilt
  // when the weights change (weights_generation, bumped by every write to them).
  struct DecodeWeights {
    uint64_t generation = 0;
    std::vector<torch::Tensor> qkv, proj, fc1, fc2;
    torch::Tensor head;
  };

  // Rewritten in place once made: a captured CUDA graph reads these very tensors.
  // (The Llama family's steps use the weights as they are: nothing to make.)
  const DecodeWeights& decode_weights() {
    if (!gpt) return decode_cache;
    if (decode_cache.head.defined() && decode_cache.generation == weights_generation) return decode_cache;
    torch::NoGradGuard no_grad;
    auto t = [](const torch::nn::Linear& linear) { return linear->weight.detach().t().contiguous(); };
    if (decode_cache.head.defined()) {
      auto rewrite = [](torch::Tensor& into, const torch::nn::Linear& linear) { into.copy_(linear->weight.t()); };
      for (size_t l = 0; l < blocks.size(); ++l) {
        rewrite(decode_cache.qkv[l], blocks[l]->qkv);
        rewrite(decode_cache.proj[l], blocks[l]->proj);
        rewrite(decode_cache.fc1[l], blocks[l]->fc1);
        rewrite(decode_cache.fc2[l], blocks[l]->fc2);
      }
      rewrite(decode_cache.head, head);
      decode_cache.generation = weights_generation;
      return decode_cache;
    }
    DecodeWeights w;
    w.generation = weights_generation;
    for (Block& b : blocks) {
      w.qkv.push_back(t(b->qkv));
      w.proj.push_back(t(b->proj));
      w.fc1.push_back(t(b->fc1));
      w.fc2.push_back(t(b->fc2));
    }
    w.head = t(head);
    decode_cache = std::move(w);
    return decode_cache;
  }

  // One decode step: token [n, 1] of each of the cache's n rows at cache position p,
  // with position ids pos_ids [n, 1] and the key mask as an additive bias [n*H, 1, p+1]
  // (0 for a real key, MaskedScore() otherwise). For a CUDA graph (decode_batch.cc)
  // the position is a device tensor instead, `at` [1], and the step attends over the
  // cache's whole width (bias [n*H, 1, width]): the same kernels at every position.
  // Fewer, larger operations than Trunk: products
  // against pre-transposed weights, heads batched, scale and mask fused, no mask built
  // per step. On the CPU one query's attention is element-wise products and sums over
  // the cache (three operations for all rows and heads): bmm there is one small GEMM
  // call per (row, head), 2 x n x H calls per layer, and was half of a batch-32 step.
  // Returns logits [n, V].
  torch::Tensor DecodeStep(const torch::Tensor& tokens, const torch::Tensor& pos_ids, const torch::Tensor& bias,
                           int64_t p, Cache& cache, const torch::Tensor& at = {}) {
    if (!gpt) return LlamaDecodeStep(tokens, pos_ids, bias, p, cache, at);
    const int64_t n = tokens.size(0), H = config.n_heads, dh = config.d_model / H;
    const int64_t T = at.defined() ? cache.k[0].size(2) : p + 1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    const DecodeWeights& w = decode_weights();
    const bool cpu = device.is_cpu();
    torch::Tensor x = tok(tokens.view({n})) + pos(pos_ids.view({n}));  // [n, d]
    for (size_t l = 0; l < blocks.size(); ++l) {
      Block& b = blocks[l];
      torch::Tensor qkv = torch::addmm(b->qkv->bias, b->ln1(x), w.qkv[l]).view({n, 3, H, dh});
      if (at.defined()) {
        cache.k[l].index_copy_(2, at, qkv.select(1, 1).unsqueeze(2));
        cache.v[l].index_copy_(2, at, qkv.select(1, 2).unsqueeze(2));
      } else {
        cache.k[l].select(2, p).copy_(qkv.select(1, 1));
        cache.v[l].select(2, p).copy_(qkv.select(1, 2));
      }
      torch::Tensor q = qkv.select(1, 0).reshape({n * H, 1, dh});
      torch::Tensor k = cache.k[l].narrow(2, 0, T).reshape({n * H, T, dh});
      torch::Tensor v = cache.v[l].narrow(2, 0, T).reshape({n * H, T, dh});
      torch::Tensor y;
      if (cpu) {
        torch::Tensor att = (q * k).sum(-1).mul_(scale).add_(bias.view({n * H, T})).softmax(-1);  // [nH, T]
        y = (att.unsqueeze(-1) * v).sum(1).view({n, config.d_model});
      } else {
        torch::Tensor att = torch::softmax(torch::baddbmm(bias, q, k.transpose(1, 2), 1.0, scale), -1);
        y = torch::bmm(att, v).view({n, config.d_model});
      }
      x = x + torch::addmm(b->proj->bias, y, w.proj[l]);
      x = x + torch::addmm(b->fc2->bias, torch::gelu(torch::addmm(b->fc1->bias, b->ln2(x), w.fc1[l])), w.fc2[l]);
    }
    return torch::mm(ln_f(x), w.head);
  }

  // DecodeStep's key mask: `allowed` [n, T] (bool) as the additive bias [n*H, 1, T]
  // (H: key/value heads), 0 for an allowed key and MaskedScore() otherwise.
  torch::Tensor KeyBias(const torch::Tensor& allowed) const {
    const int64_t n = allowed.size(0), T = allowed.size(1), H = internal::KvHeads(config);
    torch::Tensor bias = torch::zeros({n, T}, torch::TensorOptions().dtype(dtype).device(device))
                             .masked_fill_(allowed.logical_not(), MaskedScore());
    return bias.unsqueeze(1).expand({n, H, T}).reshape({n * H, 1, T});
  }

  // The attention score of a masked key: low enough that softmax gives it nothing, and
  // finite in the policy's dtype (-1e9 overflows fp16, whose lowest is -65504).
  double MaskedScore() const { return dtype == torch::kFloat16 ? -6.0e4 : -1e9; }

  static constexpr int64_t kPadForMask = 0;
  PolicyConfig config;
  torch::Device device;
  torch::ScalarType dtype;  // of the weights, activations and KV cache (PolicyConfig::dtype)
  const bool gpt;           // arch "gpt" (the modules below); else the Llama family (`model`)
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList list{nullptr};  // registers the blocks as blocks.<i>.*
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  internal::LlamaModel model{nullptr};
  torch::Tensor rope_inv_freq;  // [head_dim / 2] fp32 on the device (not a parameter)
  // The LM head (null for tied embeddings: Head() uses the token embedding).
  torch::nn::Linear head{nullptr}, value{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  uint64_t weights_generation = 0;  // bumped by every write to the weights
  // Every parameter is a view of this one buffer, in named_parameters() order
  // (FlattenParameters): a DeviceImage installs with one copy.
  torch::Tensor flat;
  // Other processes' DeviceImages this policy mapped (IPC handle bytes, the mapping;
  // unmapped when dropped), the most recently used last (device_image.cc).
  std::deque<std::pair<std::string, std::shared_ptr<void>>> device_mappings;
  uint64_t layout_fingerprint = 0;    // (computed once: shapes never change)
  std::shared_ptr<void> stamps;       // two uint64 in pinned host memory: an install's stamp reads
  std::shared_ptr<void> copy_events;  // two CUDA events: an install's copy on the GPU's clock
  DecodeWeights decode_cache;
  // KV caches kept between DecodeBatches on CUDA with the decode graphs captured
  // against them (decode_batch.cc; a graph replays fixed addresses).
  absl::Mutex decode_slots_mu;
  std::vector<std::shared_ptr<DecodeSlot>> decode_slots ABSL_GUARDED_BY(decode_slots_mu);
};

// Moves every parameter of `impl` into one buffer (`impl.flat`, the parameters' dtype and
// device), each parameter a view of its range in named_parameters() order; values are
// unchanged (device_image.cc).
void FlattenParameters(Policy::Impl& impl);

// Whether DecodeBatch steps on `impl` replay CUDA graphs: a CUDA device, a backend built
// with them (RLFLEET_TORCH_CUDA) and PolicyConfig::cuda_graphs (decode_batch.cc).
bool DecodeGraphsEnabled(const Policy::Impl& impl);

// Runs `body`, turning a libtorch exception into an error status, so that a service
// answers a call that hit one instead of dying: RESOURCE_EXHAUSTED for device memory
// (a CUDA OOM), INTERNAL otherwise, each naming `what` and libtorch's first line.
template <typename Body>
auto Guarded(const char* what, Body&& body) -> decltype(body()) {
  auto first_line = [](const char* text) {
    std::string s(text);
    return s.substr(0, s.find('\n'));
  };
  try {
    return body();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of device memory: ", first_line(e.what())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", first_line(e.what())));
  }
}

inline absl::Status CheckTokens(const std::vector<std::vector<int32_t>>& rows, int vocab, bool equal_length) {
  if (rows.empty()) return absl::InvalidArgumentError("empty batch");
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " is empty"));
    if (equal_length && rows[b].size() != rows[0].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", b, " has length ", rows[b].size(), ", sequence 0 has ", rows[0].size()));
    }
    for (size_t i = 0; i < rows[b].size(); ++i) {
      if (rows[b][i] < 0 || rows[b][i] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", rows[b][i], " at [", b, "][", i, "] is outside the vocabulary of ", vocab));
      }
    }
  }
  return absl::OkStatus();
}

inline torch::Tensor ToTensor(const std::vector<std::vector<int32_t>>& rows, torch::Device device) {
  const int64_t B = rows.size(), T = rows[0].size();
  torch::Tensor t = torch::empty({B, T}, torch::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < T; ++i) a[b][i] = rows[b][i];
  }
  return t.to(device);
}

inline std::vector<float> ToVector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU).contiguous().to(torch::kFloat32);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_POLICY_IMPL_H_
