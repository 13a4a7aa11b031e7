// DecodeBatch (policy.h): continuous batching over Policy::Impl's KV cache.
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/model/policy.h"
#include "libs/model/policy_impl.h"

// Built against a CUDA libtorch (deploy/gpu/CMakeLists.txt defines it there; Bazel's
// //libs/model:torch_cuda_compile_check compiles this branch against Debian's headers).
#ifdef RLFLEET_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace rlfleet::model {

// A KV cache (and the tokens at its positions) that outlives one DecodeBatch, on CUDA,
// with the decode step's graphs captured against it: a graph replays fixed addresses,
// so the cache, the step's inputs and its output stay where they were captured, and
// the next DecodeBatch of the policy (Generate makes one per call) replays them too.
struct DecodeSlot {
  int64_t rows = 0;
  Policy::Impl::Cache cache;
  torch::Tensor tokens;
  bool in_use = false;
#ifdef RLFLEET_TORCH_CUDA
  struct Captured {
    at::cuda::CUDAGraph graph;
    torch::Tensor host;    // [3, b] pinned: each row's pending token, its position id; the cache position
    torch::Tensor in;      // the same on the device, read by the graph
    torch::Tensor logits;  // [b, V], written by the graph
    bool ready = false;
  };
  std::map<int64_t, std::unique_ptr<Captured>> graphs;  // by bucket (rows stepped)
#endif
};

bool DecodeGraphsEnabled(const Policy::Impl& impl) {
#ifdef RLFLEET_TORCH_CUDA
  return impl.device.is_cuda() && impl.config.cuda_graphs;
#else
  (void)impl;
  return false;
#endif
}

namespace {

// A zeroed KV cache of `rows` rows x `width` positions in the policy's dtype and device,
// and the tokens at its positions.
std::pair<Policy::Impl::Cache, torch::Tensor> NewDecodeCache(const Policy::Impl& impl, int64_t rows, int64_t width) {
  return {impl.NewCache(rows, width, /*keys_allowed=*/false),
          torch::zeros({rows, width}, torch::TensorOptions().dtype(torch::kLong).device(impl.device))};
}

constexpr size_t kMaxFreeSlots = 2;  // kept for later DecodeBatches besides those in use

// A free slot of at least `rows` rows (the smallest), or a new one.
std::shared_ptr<DecodeSlot> AcquireSlot(Policy::Impl* impl, int64_t rows, int64_t width) {
  absl::MutexLock lock(&impl->decode_slots_mu);
  std::shared_ptr<DecodeSlot> best;
  for (const auto& slot : impl->decode_slots) {
    if (!slot->in_use && slot->rows >= rows && (best == nullptr || slot->rows < best->rows)) best = slot;
  }
  if (best == nullptr) {
    size_t free = 0;
    for (const auto& slot : impl->decode_slots) free += !slot->in_use;
    for (auto it = impl->decode_slots.begin(); free >= kMaxFreeSlots && it != impl->decode_slots.end();) {
      if (!(*it)->in_use) {
        it = impl->decode_slots.erase(it);
        --free;
      } else {
        ++it;
      }
    }
    best = std::make_shared<DecodeSlot>();
    best->rows = rows;
    std::tie(best->cache, best->tokens) = NewDecodeCache(*impl, rows, width);
    impl->decode_slots.push_back(best);
  }
  best->in_use = true;
  return best;
}

void ReleaseSlot(Policy::Impl* impl, DecodeSlot* slot) {
  absl::MutexLock lock(&impl->decode_slots_mu);
  slot->in_use = false;
}

}  // namespace

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

  // A row's pending token's position id: the real tokens before it.
  static int64_t PositionId(const Row& r) { return r.prompt_length + r.generated - 1; }
  // The cache position of a row's first prompt token: its real tokens sit right
  // before the batch position (the pending token is not in the cache yet).
  int64_t Start(const Row& r) const { return position - PositionId(r); }

  State(Policy::Impl* impl, int capacity)
      : impl(impl),
        capacity(std::max(1, capacity)),
        width(2 * int64_t{impl->config.max_seq_len}),
        graphs(DecodeGraphsEnabled(*impl)) {}
  ~State() {
    if (slot != nullptr) ReleaseSlot(impl, slot.get());
  }

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
    if (graphs) {  // the whole capacity at once, from (or into) the policy's slots
      slot = AcquireSlot(impl, capacity, width);
      cache = slot->cache;
      tokens = slot->tokens;
      allocated = slot->rows;
      return;
    }
    const int64_t n = std::min<int64_t>(capacity, std::max<int64_t>({rows_needed, 2 * allocated, 8}));
    auto [grown, grown_tokens] = NewDecodeCache(*impl, n, width);
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
  // own options and RNG; rows with equal options are sampled together). On the
  // policy's device: only each row's uniform goes there and its token and log-prob come
  // back (a step of 256 rows over a 152k vocabulary would otherwise copy 155 MB of
  // logits to the host).
  std::vector<Token> Sample(const torch::Tensor& logits, int64_t r0) {
    const int64_t m = logits.size(0), V = logits.size(1);
    torch::Tensor all = logits.to(torch::kFloat32);
    const torch::Device device = all.device();
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
      torch::Tensor x = g == m ? all : all.index_select(0, torch::tensor(index, torch::kLong).to(device));
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
        u = (u.to(device) * cdf.narrow(-1, V - 1, 1).to(torch::kFloat64)).to(torch::kFloat32);
        chosen = cdf.lt(u).sum(-1).clamp_max(V - 1);
      }
      torch::Tensor chosen_lp = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).to(torch::kCPU).contiguous();
      chosen = chosen.to(torch::kCPU).contiguous();
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

#ifdef RLFLEET_TORCH_CUDA
  // The decode step for the first n rows, as a CUDA graph replayed for a bucket of b >= n
  // rows (the next power of two, at most the slot's rows); captured the first time the
  // bucket steps. The rows past n are free rows: what the step writes into them is never
  // read (a joiner's row is cleared first). Returns the logits of the n rows.
  torch::Tensor GraphStep(int64_t n) {
    int64_t b = 1;
    while (b < n) b *= 2;
    b = std::min(b, slot->rows);
    std::unique_ptr<DecodeSlot::Captured>& g = slot->graphs[b];
    if (g == nullptr) {
      g = std::make_unique<DecodeSlot::Captured>();
      g->host = torch::zeros({3, b}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(true));
      g->in = torch::zeros({3, b}, torch::TensorOptions().dtype(torch::kLong).device(impl->device));
    }
    int64_t* h = g->host.data_ptr<int64_t>();  // (free: the last replay's copy ended with its Sample)
    for (int64_t i = 0; i < b; ++i) {
      h[i] = i < n ? rows[i].pending : 0;
      h[b + i] = i < n ? PositionId(rows[i]) : 0;
      h[2 * b + i] = position;
    }
    g->in.copy_(g->host, /*non_blocking=*/true);
    impl->decode_weights();  // (weights changed since: their transposes are rewritten in place, outside the graph)
    if (!g->ready) {
      // Captured on a side stream after one warm-up run there (cuBLAS and the allocator
      // settle). The step is idempotent (it writes the same keys, values and mask at
      // the same position), so the warm-up and the replay below compute it twice.
      c10::cuda::device_synchronize();
      c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, impl->device.index());
      {
        c10::cuda::CUDAStreamGuard guard(side);
        (void)GraphBody(*g, b);
        side.synchronize();
        g->graph.capture_begin();
        g->logits = GraphBody(*g, b);
        g->graph.capture_end();
      }
      c10::cuda::device_synchronize();
      g->ready = true;
    }
    g->graph.replay();
    return g->logits.narrow(0, 0, n);
  }

  // What the graph runs: the step's writes at the position held in `in` and the
  // step over the cache's whole width, masked to the real keys up to that position.
  torch::Tensor GraphBody(DecodeSlot::Captured& g, int64_t b) {
    torch::Tensor input = g.in[0].view({b, 1}), pos_ids = g.in[1].view({b, 1}), at = g.in[2].narrow(0, 0, 1);
    torch::Tensor key_ok = cache.key_ok.narrow(0, 0, b);
    key_ok.index_fill_(1, at, true);
    tokens.narrow(0, 0, b).index_copy_(1, at, input);
    torch::Tensor allowed = key_ok & torch::arange(width, at.options()).le(at).unsqueeze(0);  // [b, width]
    auto view = View(0, b);
    return impl->DecodeStep(input, pos_ids, impl->KeyBias(allowed), 0, view, at);
  }
#endif

  Policy::Impl* const impl;
  const int capacity;
  const int64_t width;               // cache positions per row
  const bool graphs;                 // decode steps replay CUDA graphs (DecodeGraphsEnabled)
  std::shared_ptr<DecodeSlot> slot;  // with graphs: the cache's storage
  int64_t allocated = 0;
  Policy::Impl::Cache cache;
  torch::Tensor tokens;   // [allocated, width] the token at each cache position (PAD = 0)
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
  if (o.max_new_tokens < 1 || static_cast<int64_t>(sequence.prompt.size()) + o.max_new_tokens > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", sequence.prompt.size(), ") + max_new_tokens (",
                                                   o.max_new_tokens, ") exceeds max_seq_len ", config.max_seq_len));
  }
  return absl::OkStatus();
}

bool DecodeBatch::CanAdd(const std::vector<Sequence>& sequences) const { return state_->Placement(sequences) >= 0; }

absl::StatusOr<std::vector<DecodeBatch::Token>> DecodeBatch::Add(std::vector<Sequence> sequences) {
  return Guarded("DecodeBatch::Add", [&]() -> absl::StatusOr<std::vector<DecodeBatch::Token>> {
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
  });
}

absl::StatusOr<std::vector<DecodeBatch::Token>> DecodeBatch::Step() {
  return Guarded("DecodeBatch::Step", [&]() -> absl::StatusOr<std::vector<DecodeBatch::Token>> {
    State& st = *state_;
    const int64_t n = st.rows.size();
    if (n == 0) return std::vector<Token>{};
    torch::NoGradGuard no_grad;
#ifdef RLFLEET_TORCH_CUDA
    if (st.graphs) {
      torch::Tensor logits = st.GraphStep(n);
      ++st.position;
      return st.Sample(logits, 0);
    }
#endif
    // Each row's pending token and its position id (real tokens before it).
    torch::Tensor host = torch::empty({2, n}, torch::kLong);
    int64_t* h = host.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const State::Row& r = st.rows[i];
      h[i] = r.pending;
      h[n + i] = State::PositionId(r);
    }
    host = host.to(st.impl->device);
    torch::Tensor input = host[0].view({n, 1}), pos_ids = host[1].view({n, 1});
    const int64_t p = st.position;
    st.tokens.narrow(0, 0, n).narrow(1, p, 1).copy_(input);
    st.cache.key_ok.narrow(0, 0, n).narrow(1, p, 1).fill_(true);
    torch::Tensor bias = st.impl->KeyBias(st.cache.key_ok.narrow(0, 0, n).narrow(1, 0, p + 1));
    auto view = st.View(0, n);
    torch::Tensor logits = st.impl->DecodeStep(input, pos_ids, bias, p, view);
    ++st.position;
    return st.Sample(logits, 0);
  });
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
  return Guarded("DecodeBatch::Refresh", [&]() -> absl::Status {
    State& st = *state_;
    const int64_t n = st.rows.size();
    if (n == 0) return absl::OkStatus();
    torch::NoGradGuard no_grad;
    auto view = st.View(0, n);
    // Real tokens are what the cache says (a generated PAD id is real), not the ids.
    torch::Tensor real = st.cache.key_ok.narrow(0, 0, n).narrow(1, 0, st.position).clone();
    st.impl->Forward(st.tokens.narrow(0, 0, n).narrow(1, 0, st.position), 0, view, real);
    return absl::OkStatus();
  });
}

}  // namespace rlfleet::model
