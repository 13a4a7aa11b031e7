// The policy: a decoder-only transformer in libtorch (pre-LayerNorm blocks, fused QKV,
// causal attention with a preallocated KV cache for incremental decoding, GELU MLP,
// learned positions, optional scalar value head for PPO critics).
//
// This header has no libtorch in it (each file that includes torch/torch.h costs ~20 s
// and ~1 GB to compile); the model lives behind a pimpl (policy_impl.h, used by
// policy.cc and decode_batch.cc). Device-agnostic: "cpu" by default, "cuda:0" etc.
// where libtorch was built with CUDA.
//
// Not thread-safe: one thread drives a Policy (the rollout scheduler owns it).
#ifndef RLFLEET_LIBS_MODEL_POLICY_H_
#define RLFLEET_LIBS_MODEL_POLICY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/common/host_buffer.h"
#include "libs/dist/gradient_group.h"

namespace rlfleet::model {

struct TensorBlob;  // safetensors.h
struct TensorView;  // safetensors.h

struct PolicyConfig {
  int vocab_size = 32;
  int d_model = 128;
  int n_layers = 4;
  int n_heads = 4;
  // The KV cache's width: prompt + response tokens. (A Hugging Face model's
  // max_position_embeddings is its limit, not this: a cache that wide would be large.)
  int max_seq_len = 128;
  bool value_head = false;
  // The architecture: "gpt", the built-in character-level model (pre-LayerNorm, fused
  // QKV, learned positions, GELU MLP: the demo's and CI's preset), or the decoder family
  // of Hugging Face checkpoints, by their config.json `model_type`: "llama", "qwen2",
  // "qwen3" (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP; parameters
  // named as transformers names them). hf_model.h fills this from a model directory.
  std::string arch = "gpt";

  // The Llama family's settings (config.json's names in brackets); "gpt" uses none.
  int n_kv_heads = 0;           // key/value heads, dividing n_heads [num_key_value_heads]; 0 = n_heads
  int head_dim = 0;             // [head_dim]; 0 = d_model / n_heads
  int ffn_dim = 0;              // the MLP's width [intermediate_size]
  bool tie_embeddings = false;  // the LM head is the token embedding [tie_word_embeddings]
  bool qkv_bias = false;        // q/k/v projections with biases (qwen2; llama's attention_bias)
  bool o_bias = false;          // the output projection too (llama's and qwen3's attention_bias)
  bool mlp_bias = false;        // [mlp_bias]
  bool qk_norm = false;         // RMSNorm over each head's queries and keys (qwen3)
  double norm_eps = 1e-6;       // [rms_norm_eps]
  double rope_theta = 10000.0;  // [rope_theta]
  // Llama 3's rotary scaling (rope_type "llama3"); rope_factor 0 = none.
  double rope_factor = 0;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int rope_original_max_positions = 8192;
  // Weights, activations and the KV cache: "fp32", "bf16" or "fp16" (fp16 needs a CUDA
  // device). Only fp32 trains (TrainStep); bf16 / fp16 serve generation (a rollout
  // replica): F32 images load by conversion, and the images it writes are F32.
  std::string dtype = "fp32";
  // TrainStep's forward pass in bf16 under libtorch's autocast (matrix products in
  // bf16, reductions and the loss in fp32), with fp32 weights, gradients and AdamW
  // state: the trainer's --precision=bf16.
  bool bf16_autocast = false;
  // On a CUDA device, DecodeBatch's step replays a CUDA graph captured per batch-size
  // bucket (powers of two) instead of launching its kernels one by one; ignored on the
  // CPU and by a backend built without CUDA. Policy::DecodeMode() says which runs.
  bool cuda_graphs = true;
};

struct SamplingOptions {
  // Softmax temperature; 0 = greedy (argmax).
  float temperature = 1.0f;
  int top_k = 0;       // keep the k most likely tokens; 0 = all
  float top_p = 1.0f;  // nucleus mass in (0, 1]
  int max_new_tokens = 48;
  uint64_t seed = 0;  // same seed, same prompts, same weights: same tokens
  int32_t eos_id = 2;
  int32_t pad_id = 0;
  std::vector<int32_t> stop_ids;  // more tokens that end a sequence (kept in the response)
};

struct Generation {
  std::vector<int32_t> tokens;  // response tokens, EOS included if produced
  // log p(token) under the distribution sampled from (logits / temperature; raw
  // logits for greedy), one per token.
  std::vector<float> logprobs;
  bool stopped_by_eos = false;
};

// The model backend this process runs, for a service's startup line: the shared
// library it was loaded from, the libtorch it was built against and the CUDA devices
// that libtorch sees, e.g. "/opt/rlfleet/librlfleet_model.so (libtorch 2.11.0, cuda: 1
// device)". (policy.h is the ABI between the services and a backend built elsewhere:
// //libs/model:librlfleet_model.so here, deploy/gpu on a GPU host.)
std::string ModelBackend();

// A clear error for a device this backend cannot run on: INVALID_ARGUMENT for a name
// that is not cpu / cuda / cuda:N, FAILED_PRECONDITION for CUDA in a backend built
// without it or a GPU index it does not see (naming the backend).
absl::Status CheckDevice(const std::string& device);

// The most device memory libtorch's caching allocator held for tensors on `device`
// (cuda:N) since the process started or the last call with `reset` (which starts a new
// peak): what a benchmark reports as peak GPU memory. FAILED_PRECONDITION on the CPU
// or in a backend built without CUDA.
absl::StatusOr<int64_t> DevicePeakBytes(const std::string& device, bool reset);

// The PCI bus id of CUDA device `device` (cuda:N) as CUDA names it ("0000:3B:00.0"),
// for NUMA binding (common::ApplyNuma); "" for the CPU. FAILED_PRECONDITION in a backend
// built without CUDA.
absl::StatusOr<std::string> DevicePciBusId(const std::string& device);

// Sets libtorch's intra-op threads for the process (pin OPENBLAS_NUM_THREADS=1 too:
// both pools on the same cores run several times slower; DESIGN.md).
void SetComputeThreads(int threads);

// Call first in main of every binary that runs the model. OpenBLAS reads its settings
// when it loads, before main, so when OPENBLAS_NUM_THREADS is not in the environment
// this re-executes the binary (/proc/self/exe, same argv) with
//  - OPENBLAS_NUM_THREADS=1 (torch's threads use the cores; DESIGN.md), and
//  - OPENBLAS_CORETYPE from the CPU's instruction sets (SkylakeX with AVX-512, Haswell
//    with AVX2), unless already set: Debian 12's OpenBLAS 0.3.21 does not know newer
//    Xeons by cpuid model and falls back to its Prescott (SSE3) kernels, 2-3x slower on
//    the small products of a decode step ([32x128]x[128x512]: 174 vs 58-70 us).
// Returns only when OPENBLAS_NUM_THREADS was already set (or the re-exec failed).
void ConfigureBlas(char** argv);

// The OPENBLAS_CORETYPE ConfigureBlas picks for this CPU ("" when it picks none).
const char* BlasCoreTypeForCpu();

// One sequence of a training batch: the prompt, the response the rollout produced,
// its per-token log-probs at the time (behaviour) and the sequence's advantage.
struct TrainSequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  std::vector<float> behaviour_logprobs;  // one per response token
  float advantage = 0;                    // the sequence's advantage (GRPO / RLOO); unused with GAE
  float reward = 0;                       // the sequence's reward, on its last token (GAE)
  // Which response tokens the loss sees (0: a tool's output spliced into the response);
  // empty = all. Masked tokens still condition the tokens after them. Not with GAE.
  std::vector<uint8_t> loss_mask;
};

struct TrainOptions {
  float learning_rate = 5e-4f;  // AdamW
  float weight_decay = 0.0f;
  float beta1 = 0.9f;  // AdamW moment decays, in [0, 1)
  float beta2 = 0.999f;
  float eps = 1e-8f;  // AdamW epsilon, > 0
  // Linear learning-rate warmup: optimizer update t (counted from the optimizer's
  // first update, checkpoints included; t = 0 first) uses learning_rate *
  // min(1, (t + 1) / warmup_steps). 0 = none.
  int64_t warmup_steps = 0;
  float grad_clip = 1.0f;  // max global gradient norm
  double clip = 0.2;       // PPO-clip epsilon
  double clip_high = 0.0;  // upper PPO-clip epsilon (asymmetric); 0 = clip
  int epochs = 1;          // passes over the batch (PPO epochs)
  // Optimizer updates per epoch: the batch is split into this many contiguous
  // mini-batches (sizes differ by at most one), one update each. 1..batch size.
  int mini_batches = 1;
  // Sequences per forward/backward: a mini-batch's gradient is accumulated over
  // micro-batches of this many sequences, weighted by their tokens, so that it equals
  // the mini-batch's token-mean gradient (less memory, same update). 0 = the whole
  // mini-batch.
  int micro_batch_size = 0;
  double entropy_coef = 0.0;  // weight of the entropy bonus (keeps sampling diverse)
  // PPO with a critic: per-token advantages by GAE(gamma, lambda) over the value head's
  // estimates at the start of the step (whitened over the batch's tokens), and a
  // clipped value loss towards the GAE returns weighted by value_coef. Needs
  // PolicyConfig.value_head.
  bool gae = false;
  double gamma = 1.0;
  double gae_lambda = 0.95;
  double value_coef = 0.5;
  double value_clip = 0.2;  // how far a value may move from its start-of-step estimate
  // Data-parallel ranks (not owned); null = this policy alone. Every rank must call
  // TrainStep with the same options (epochs), on its own part of the batch.
  dist::GradientGroup* group = nullptr;
};

struct TrainStats {
  float loss = 0;
  float policy_loss = 0;
  float clip_fraction = 0;
  float approx_kl = 0;
  float grad_norm = 0;          // before clipping, last epoch
  float entropy = 0;            // mean policy entropy over response tokens, nats
  float value_loss = 0;         // GAE only: the clipped value loss, last epoch
  int64_t tokens = 0;           // response tokens in the loss (a loss mask leaves some out)
  int64_t optimizer_steps = 0;  // updates applied (epochs x mini-batches)
  float learning_rate = 0;      // learning rate of the last update (after warmup)
};

// True for TrainStep's error for a non-finite loss or gradient (INTERNAL; nothing was
// applied: weights and optimizer state are as before the step).
bool IsNonFiniteLossError(const absl::Status& status);

class DecodeBatch;

// The seed of sequence `index` of a request seeded with `seed` (each sequence samples
// from its own stream, so its tokens do not depend on its batch).
uint64_t SequenceSeed(uint64_t seed, uint64_t index);

// A weight version in this process's CUDA memory that other processes on the same host
// install from directly (CUDA IPC: no host copy, no network). The image is the policy's
// parameters as F32, in ParameterNames() order, back to back (the policy's own flat
// storage order: Policy keeps its parameters as views of one buffer). Move-only; the
// memory is freed when it is dropped, so an exporter keeps an image for as long as it is
// published. A process that installs from it must be done before then (see
// InstallDeviceImage).
class DeviceImage {
 public:
  DeviceImage();
  ~DeviceImage();
  DeviceImage(DeviceImage&&) noexcept;
  DeviceImage& operator=(DeviceImage&&) noexcept;
  DeviceImage(const DeviceImage&) = delete;
  DeviceImage& operator=(const DeviceImage&) = delete;

  // What another process needs to install it: cudaIpcMemHandle_t's bytes, the GPU's PCI
  // bus id, the length, the digest (BlockSumDigest of the bytes, computed on the GPU)
  // and the layout (LayoutFingerprint of the exporting policy).
  struct Ref {
    uint64_t version = 0;  // what the image holds (its stamp; see InstallDeviceImage)
    std::string ipc_handle;
    std::string pci_bus_id;
    uint64_t length_bytes = 0;
    uint64_t digest = 0;
    uint64_t layout = 0;
  };
  const Ref& ref() const;
  bool empty() const;

  struct Rep;

 private:
  friend class Policy;
  std::unique_ptr<Rep> rep_;
};

// An install from a DeviceImage: where the time went, in microseconds.
struct DeviceInstallReport {
  int64_t open_us = 0;       // mapping the exporter's memory (cudaIpcOpenMemHandle)
  int64_t verify_us = 0;     // the image's digest, checked before the copy (0 without verify)
  int64_t copy_us = 0;       // the copy into this policy's weights (with a cast for bf16 / fp16)
  int64_t copy_gpu_us = -1;  // the same copy on the GPU's clock (CUDA events); -1: not measured
  bool one_copy = false;     // the copy was one operation (the parameters are one flat buffer)
  uint64_t bytes = 0;        // bytes read from the exporter
  bool mapped = false;       // the exporter's memory was mapped by this install (not kept from an earlier one)
  // The copy began, so on an error these weights are neither the old nor the new ones
  // (the exporter rewrote the image during the copy): the caller must not serve them.
  bool weights_changed = false;
};

class Policy {
 public:
  // A randomly initialised policy (deterministic in `init_seed`). INVALID_ARGUMENT for
  // a config that does not make a model (d_model not divisible by n_heads, ...).
  static absl::StatusOr<std::unique_ptr<Policy>> Create(const PolicyConfig& config, const std::string& device = "cpu",
                                                        uint64_t init_seed = 0);
  ~Policy();

  const PolicyConfig& config() const;
  int64_t num_parameters() const;
  // The parameters' names (what SaveSafetensors writes and LoadTensors reads), in order.
  std::vector<std::string> ParameterNames() const;
  // How DecodeBatch steps run on this policy: "cuda graphs" or "eager".
  std::string DecodeMode() const;

  // Logits of every position, [batch][position][vocab] flattened, recomputed from
  // scratch. Sequences must have equal length; PAD tokens are masked as keys.
  absl::StatusOr<std::vector<float>> Logits(const std::vector<std::vector<int32_t>>& tokens);
  // The same logits, computed one position at a time through the KV cache.
  // The value head's scalar at the last token of each sequence (lengths may differ).
  // FAILED_PRECONDITION without a value head; INVALID_ARGUMENT for a token out of the
  // vocabulary or a sequence longer than max_seq_len.
  absl::StatusOr<std::vector<float>> Values(const std::vector<std::vector<int32_t>>& sequences);
  absl::StatusOr<std::vector<float>> IncrementalLogits(const std::vector<std::vector<int32_t>>& tokens);

  // Generates for a batch of prompts (any lengths; left-padded with PAD so the last
  // prompt token sits at the same position in every row). Each sequence stops on EOS
  // or after max_new_tokens. INVALID_ARGUMENT for an empty batch, an empty prompt, a
  // token outside the vocabulary, or prompt + max_new_tokens > max_seq_len.
  absl::StatusOr<std::vector<Generation>> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                                   const SamplingOptions& options);

  // Each response token's log-prob under this policy, computed as TrainStep computes it
  // (what a rollout should have sampled it with; also a reference policy's log-probs for
  // a KL penalty). INVALID_ARGUMENT for an empty batch or response, a token outside the
  // vocabulary or a sequence longer than max_seq_len.
  absl::StatusOr<std::vector<std::vector<float>>> ResponseLogProbs(const std::vector<TrainSequence>& batch);

  // One PPO/GRPO step on `batch`: options.epochs x options.mini_batches AdamW updates
  // (gradient clipping; the optimiser state is kept across calls). INVALID_ARGUMENT
  // naming the sequence for an empty response, mismatched log-probs or a too long
  // sequence, or for options out of range (mini_batches above the batch size);
  // FAILED_PRECONDITION for GAE without a value head; INTERNAL (IsNonFiniteLossError)
  // for a non-finite loss or gradient in any update, and then nothing is applied (the
  // weights and optimizer state are restored to what they were before the step).
  absl::StatusOr<TrainStats> TrainStep(const std::vector<TrainSequence>& batch, const TrainOptions& options);
  // What TrainStep checks before it changes anything (a data-parallel rank 0 checks
  // the whole batch before handing out parts of it).
  absl::Status CheckBatch(const std::vector<TrainSequence>& batch, const TrainOptions& options) const;

  // Weights as named float32 tensors in a safetensors file (PyTorch's safetensors can
  // read it, and we read what it writes). Load: INVALID_ARGUMENT naming a missing or
  // mis-shaped tensor; NOT_FOUND for a missing file.
  absl::Status SaveSafetensors(const std::string& path) const;
  // The image SaveSafetensors writes, in memory.
  std::string SafetensorsBytes() const;
  // The same in memory from `pool` (when a buffer there holds it; back there when
  // dropped): for a publisher writing version after version.
  common::HostBuffer SafetensorsImage(const std::shared_ptr<common::BufferPool>& pool) const;
  absl::Status LoadSafetensors(const std::string& path);
  // The same from a safetensors image in memory (`name` names it in errors).
  absl::Status LoadSafetensorsBytes(const std::string& bytes, const std::string& name);
  // The same from tensors where they are (e.g. a pushed shard): every one checked first,
  // so a bad set changes nothing.
  absl::Status LoadTensors(const std::map<std::string, TensorView>& tensors, const std::string& name);

  // The layout of the weights: XXH64 over every parameter's name and shape, in order.
  // Two policies with the same fingerprint have the same flat F32 image layout.
  uint64_t LayoutFingerprint() const;
  // These weights as a DeviceImage (F32, however this policy is stored) holding
  // `version` (its stamp: 0 while it is being written, `version` once written), written
  // into `reuse` when it is an image of the right size (its memory and IPC handle kept:
  // an installer that mapped it before keeps its mapping), else into fresh device
  // memory. FAILED_PRECONDITION on the CPU or with a backend built without CUDA.
  absl::StatusOr<DeviceImage> ExportDeviceImage(uint64_t version, DeviceImage reuse = DeviceImage());
  // Installs the image `ref` describes, exported by another process on this host (on
  // this GPU or another one it can reach): the image's stamp is checked to hold
  // ref.version before and after one copy from the exporter's memory into these
  // weights (cast to this policy's dtype), and with `verify` its digest is checked
  // first too. The exporter's memory stays mapped for the next install (the latest two
  // images' mappings are kept). Errors before the copy change nothing: INVALID_ARGUMENT
  // for another layout or length; DATA_LOSS for a digest that does not match;
  // UNAVAILABLE when the exporter's memory is gone (it exited or freed the image) or
  // holds another version; FAILED_PRECONDITION on the CPU or without CUDA. After the
  // copy began (report->weights_changed): DATA_LOSS when the stamp changed meanwhile.
  absl::Status InstallDeviceImage(const DeviceImage::Ref& ref, bool verify, DeviceInstallReport* report = nullptr);

  // The AdamW state (per parameter: first and second moments and the step count) as
  // a safetensors file: `<param>.exp_avg`, `<param>.exp_avg_sq`, `<param>.step` (I64).
  // A policy that never trained has none: Save returns false in *saved and writes
  // nothing. Load: INVALID_ARGUMENT naming a missing or mis-shaped tensor (nothing
  // changes); after it TrainStep continues exactly where the saved optimizer was.
  absl::Status SaveOptimizerState(const std::string& path, bool* saved) const;
  absl::Status LoadOptimizerState(const std::string& path);
  // The same from a safetensors image in memory (`name` names it in errors).
  absl::Status LoadOptimizerStateBytes(const std::string& bytes, const std::string& name);
  // Forgets the optimizer state (the next TrainStep starts AdamW afresh).
  void ResetOptimizer();

  class Impl;

 private:
  friend class DecodeBatch;
  explicit Policy(std::unique_ptr<Impl> impl);
  absl::Status InstallOptimizerState(const std::map<std::string, TensorBlob>& tensors, const std::string& name);
  std::unique_ptr<Impl> impl_;
};

// Continuous batching: sequences join and leave a running decode batch between steps.
//
// Every sequence sits in one row of a shared KV cache, right-aligned at the batch's
// current position (a joiner's prompt is prefilled so that its last token is where
// everyone else's is; positions count real tokens, so the placement changes nothing
// it computes). Rows are kept dense (a finished row is replaced by the last one) and
// the cache is shifted left when a joiner needs room, so each step costs the live
// rows only. Each sequence samples from its own RNG (seeded by its options), so what
// it generates does not depend on which others share its batch.
//
// Not thread-safe; one thread (the rollout scheduler) drives it. The Policy must
// outlive it, and its weights may change between calls (then call Refresh).
class DecodeBatch {
 public:
  struct Sequence {
    uint64_t id = 0;              // the caller's handle, reported with every token
    std::vector<int32_t> prompt;  // 1..max_seq_len-1 tokens
    SamplingOptions options;      // options.seed seeds this sequence alone
  };
  struct Token {
    uint64_t id = 0;  // Sequence::id
    int32_t token = 0;
    float logprob = 0;
    bool finished = false;        // the sequence left the batch with this token
    bool stopped_by_eos = false;  // ... because it produced EOS or a stop token
  };

  // `capacity`: sequences decoded together at most.
  DecodeBatch(Policy* policy, int capacity);
  ~DecodeBatch();

  // INVALID_ARGUMENT naming the problem (empty prompt, token outside the vocabulary,
  // prompt + max_new_tokens > max_seq_len, bad sampling options); no state changes.
  absl::Status Validate(const Sequence& sequence) const;
  // Whether these sequences (valid ones) can join now: rows free and cache room.
  bool CanAdd(const std::vector<Sequence>& sequences) const;
  // Prefills `sequences` together and samples each one's first token (a sequence that
  // ends on it leaves at once). FAILED_PRECONDITION if !CanAdd; INVALID_ARGUMENT as
  // Validate; nothing joins on error.
  absl::StatusOr<std::vector<Token>> Add(std::vector<Sequence> sequences);
  // Decodes one token for every sequence in the batch; finished ones leave it.
  absl::StatusOr<std::vector<Token>> Step();
  // Drops a sequence (aborted); false if it is not in the batch.
  bool Remove(uint64_t id);
  // Recomputes the KV cache of every sequence in the batch with the policy's current
  // weights (after a weight swap): tokens decoded from now on see only the new weights.
  absl::Status Refresh();

  int size() const;
  int capacity() const;

  class State;

 private:
  Policy* const policy_;
  std::unique_ptr<State> state_;
};

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_POLICY_H_
