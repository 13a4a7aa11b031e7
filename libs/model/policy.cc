// The policy (policy.h) in libtorch; the module itself is in policy_impl.h.
#include "libs/model/policy.h"

#include <ATen/autocast_mode.h>
#include <dlfcn.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>

#ifdef RLFLEET_TORCH_CUDA  // (a CUDA libtorch: deploy/gpu/CMakeLists.txt)
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/model/policy_impl.h"
#include "libs/model/safetensors.h"
#include "libs/rl/rl.h"

namespace rlfleet::model {
namespace {

// The CUDA devices this backend's libtorch sees (0 for a CPU build).
int VisibleGpus() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

// The device `name` names, if it is cpu, cuda or cuda:N.
std::optional<torch::Device> ParseDevice(const std::string& name) {
  try {
    torch::Device device(name);
    if (device.is_cpu() || device.is_cuda()) return device;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

std::string ModelBackend() {
  Dl_info info{};
  const char* path = dladdr(reinterpret_cast<void*>(&ModelBackend), &info) != 0 && info.dli_fname != nullptr
                         ? info.dli_fname
                         : "(linked in)";
  const int gpus = VisibleGpus();
  return absl::StrCat(path, " (libtorch ", TORCH_VERSION,
                      ", cuda: ", gpus == 0 ? "none" : absl::StrCat(gpus, gpus == 1 ? " device" : " devices"), ")");
}

namespace {

// The CUDA device index `device` names, nullopt for the CPU; CheckDevice's errors (a
// backend built without CUDA refuses every CUDA device there).
absl::StatusOr<std::optional<c10::DeviceIndex>> CudaIndexOf(const std::string& device) {
  RETURN_IF_ERROR(CheckDevice(device));
  const torch::Device where = *ParseDevice(device);
  if (!where.is_cuda()) return std::optional<c10::DeviceIndex>();
  return std::optional<c10::DeviceIndex>(where.has_index() ? where.index() : 0);
}

}  // namespace

absl::StatusOr<std::string> DevicePciBusId(const std::string& device) {
  ASSIGN_OR_RETURN(const std::optional<c10::DeviceIndex> index, CudaIndexOf(device));
  if (!index) return std::string();
#ifdef RLFLEET_TORCH_CUDA
  char bus[32] = {};
  if (cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof(bus), *index); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat(device, ": cudaDeviceGetPCIBusId: ", cudaGetErrorString(e)));
  }
  return std::string(bus);
#else
  return absl::FailedPreconditionError(absl::StrCat("the model backend (", ModelBackend(), ") was built without CUDA"));
#endif
}

absl::StatusOr<int64_t> DevicePeakBytes(const std::string& device, bool reset) {
  ASSIGN_OR_RETURN(const std::optional<c10::DeviceIndex> index, CudaIndexOf(device));
  if (!index) return absl::FailedPreconditionError(absl::StrCat(device, ": peak memory is CUDA's"));
#ifdef RLFLEET_TORCH_CUDA
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const int64_t peak = alloc::getDeviceStats(*index).allocated_bytes[0].peak;  // [0]: all pools (StatType::AGGREGATE)
  if (reset) alloc::resetPeakStats(*index);
  return peak;
#else
  (void)reset;
  return absl::FailedPreconditionError(absl::StrCat("the model backend (", ModelBackend(), ") was built without CUDA"));
#endif
}

absl::Status CheckDevice(const std::string& device) {
  const std::optional<torch::Device> parsed = ParseDevice(device);
  if (!parsed) return absl::InvalidArgumentError(absl::StrCat("device \"", device, "\": want cpu, cuda or cuda:N"));
  if (parsed->is_cpu()) return absl::OkStatus();
  const int gpus = VisibleGpus();
  if (gpus == 0) {
    return absl::FailedPreconditionError(absl::StrCat("device ", device, ": the model backend sees no CUDA device (",
                                                      ModelBackend(),
                                                      "); on a GPU host, load a CUDA build of it (deploy/gpu)"));
  }
  if (parsed->has_index() && parsed->index() >= gpus) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, ": the model backend sees ", gpus, " CUDA device(s) (", ModelBackend(), ")"));
  }
  return absl::OkStatus();
}

void SetComputeThreads(int threads) { torch::set_num_threads(std::max(1, threads)); }

const char* BlasCoreTypeForCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
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

namespace {

// libtorch >= 2.4 sets autocast per device type; 1.13 has one call per device kind.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define RLFLEET_AUTOCAST_PER_DEVICE_TYPE 1
#else
#define RLFLEET_AUTOCAST_PER_DEVICE_TYPE 0
#endif

// bf16 autocast on the policy's device for its scope (when `on`), as it was after.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, bool on) : on_(on), type_(device.type()) {
    if (!on_) return;
#if RLFLEET_AUTOCAST_PER_DEVICE_TYPE
    was_ = at::autocast::is_autocast_enabled(type_);
    dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
#else
    if (type_ == c10::DeviceType::CUDA) {
      was_ = at::autocast::is_enabled();
      dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
      at::autocast::set_enabled(true);
    } else {
      was_ = at::autocast::is_cpu_enabled();
      dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      at::autocast::set_cpu_enabled(true);
    }
#endif
  }
  ~AutocastGuard() {
    if (!on_) return;
#if RLFLEET_AUTOCAST_PER_DEVICE_TYPE
    at::autocast::set_autocast_enabled(type_, was_);
    at::autocast::set_autocast_dtype(type_, dtype_);
#else
    if (type_ == c10::DeviceType::CUDA) {
      at::autocast::set_enabled(was_);
      at::autocast::set_autocast_gpu_dtype(dtype_);
    } else {
      at::autocast::set_cpu_enabled(was_);
      at::autocast::set_autocast_cpu_dtype(dtype_);
    }
#endif
    at::autocast::clear_cache();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  const bool on_;
  const c10::DeviceType type_;
  bool was_ = false;
  at::ScalarType dtype_ = at::kBFloat16;
};

// PolicyConfig::dtype's scalar type, or INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<torch::ScalarType> DtypeOf(const std::string& dtype, const torch::Device& device) {
  if (dtype == "fp32") return torch::kFloat32;
  if (dtype == "bf16") return torch::kBFloat16;
  if (dtype == "fp16") {
    if (!device.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat("dtype fp16 on ", device.str(),
                                                     ": fp16 needs a CUDA device (libtorch's CPU kernels lack "
                                                     "half matrix products); use bf16 or fp32"));
    }
    return torch::kFloat16;
  }
  return absl::InvalidArgumentError(absl::StrCat("dtype \"", dtype, "\": want fp32, bf16 or fp16"));
}

absl::Status CheckConfig(const PolicyConfig& c) {
  const bool gpt = c.arch == "gpt";
  if (!gpt && c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3") {
    return absl::InvalidArgumentError(absl::StrCat("model arch \"", c.arch, "\": want gpt, llama, qwen2 or qwen3"));
  }
  if (c.vocab_size < 4 || c.d_model < 8 || c.n_layers < 1 || c.n_heads < 1 || c.max_seq_len < 2 ||
      (c.head_dim <= 0 && c.d_model % c.n_heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("bad model config: vocab_size ", c.vocab_size, ", d_model ",
                                                   c.d_model, ", n_layers ", c.n_layers, ", n_heads ", c.n_heads,
                                                   " (d_model must divide by n_heads), max_seq_len ", c.max_seq_len));
  }
  if (gpt) {
    if (c.n_kv_heads != 0 || c.head_dim != 0 || c.ffn_dim != 0 || c.tie_embeddings || c.qkv_bias || c.o_bias ||
        c.mlp_bias || c.qk_norm || c.rope_factor != 0) {
      return absl::InvalidArgumentError(
          "bad model config: arch gpt takes none of the Llama family's settings (n_kv_heads, head_dim, ffn_dim, "
          "tie_embeddings, biases, qk_norm, rope scaling)");
    }
    return absl::OkStatus();
  }
  const int kv = c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads;
  const int dh = c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads;
  if (c.n_kv_heads < 0 || c.n_heads % kv != 0 || dh < 2 || dh % 2 != 0 || c.ffn_dim < 1 || !(c.norm_eps > 0) ||
      !(c.rope_theta > 0) || c.rope_factor < 0 ||
      (c.rope_factor > 0 && (c.rope_original_max_positions < 1 || !(c.rope_low_freq_factor > 0) ||
                             !(c.rope_high_freq_factor > c.rope_low_freq_factor)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", c.arch, " config: n_heads ", c.n_heads, " must divide by n_kv_heads ", kv, ", head_dim ",
                     dh, " must be even, ffn_dim ", c.ffn_dim, " >= 1, norm_eps ", c.norm_eps, " and rope_theta ",
                     c.rope_theta, " > 0, rope scaling factor ", c.rope_factor, " >= 0 (with low_freq_factor ",
                     c.rope_low_freq_factor, " < high_freq_factor ", c.rope_high_freq_factor,
                     ", original_max_positions ", c.rope_original_max_positions, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Policy>> Policy::Create(const PolicyConfig& config, const std::string& device,
                                                       uint64_t init_seed) {
  RETURN_IF_ERROR(CheckConfig(config));
  RETURN_IF_ERROR(CheckDevice(device));
  const torch::Device where = *ParseDevice(device);  // (CheckDevice accepted it)
  ASSIGN_OR_RETURN(const torch::ScalarType dtype, DtypeOf(config.dtype, where));
  if (config.bf16_autocast && dtype != torch::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("bf16 autocast trains fp32 weights; dtype is ", config.dtype, " (want fp32)"));
  }
  try {
    torch::manual_seed(init_seed);
    std::unique_ptr<Impl> impl(new Impl(config, where, dtype));
    FlattenParameters(*impl);
    impl->eval();
    return std::unique_ptr<Policy>(new Policy(std::move(impl)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create the model on `", device, "`: ", e.what()));
  }
}

Policy::Policy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Policy::~Policy() = default;

const PolicyConfig& Policy::config() const { return impl_->config; }

std::string Policy::DecodeMode() const { return DecodeGraphsEnabled(*impl_) ? "cuda graphs" : "eager"; }

std::vector<std::string> Policy::ParameterNames() const {
  std::vector<std::string> names;
  for (const auto& item : impl_->named_parameters()) names.push_back(item.key());
  return names;
}

int64_t Policy::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : impl_->parameters()) n += p.numel();
  return n;
}

absl::StatusOr<std::vector<float>> Policy::Logits(const std::vector<std::vector<int32_t>>& tokens) {
  return Guarded("Logits", [&]() -> absl::StatusOr<std::vector<float>> {
    RETURN_IF_ERROR(CheckTokens(tokens, impl_->config.vocab_size, /*equal_length=*/true));
    if (static_cast<int>(tokens[0].size()) > impl_->config.max_seq_len) {
      return absl::InvalidArgumentError("sequence longer than max_seq_len");
    }
    torch::NoGradGuard no_grad;
    auto cache = impl_->NewCache(tokens.size());
    return ToVector(impl_->Forward(ToTensor(tokens, impl_->device), 0, cache));
  });
}

absl::StatusOr<std::vector<float>> Policy::Values(const std::vector<std::vector<int32_t>>& sequences) {
  return Guarded("Values", [&]() -> absl::StatusOr<std::vector<float>> {
    if (!impl_->value) {
      return absl::FailedPreconditionError("Values: the model has no value head (PolicyConfig.value_head)");
    }
    RETURN_IF_ERROR(CheckTokens(sequences, impl_->config.vocab_size, /*equal_length=*/false));
    size_t longest = 0;
    for (const auto& s : sequences) longest = std::max(longest, s.size());
    if (static_cast<int>(longest) > impl_->config.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("Values: a sequence of ", longest,
                                                     " tokens is longer than max_seq_len ", impl_->config.max_seq_len));
    }
    // Left-padded, so every sequence ends at the last position (positions count real
    // tokens only, so padding changes nothing).
    // (every token of a sequence is real, the PAD id included: a response may hold it)
    std::vector<std::vector<int32_t>> padded(sequences.size());
    torch::Tensor real =
        torch::zeros({static_cast<int64_t>(sequences.size()), static_cast<int64_t>(longest)}, torch::kBool);
    for (size_t b = 0; b < sequences.size(); ++b) {
      padded[b].assign(longest - sequences[b].size(), 0);
      padded[b].insert(padded[b].end(), sequences[b].begin(), sequences[b].end());
      real[b].narrow(0, longest - sequences[b].size(), sequences[b].size()).fill_(true);
    }
    torch::NoGradGuard no_grad;
    torch::Tensor hidden = impl_->Trunk(ToTensor(padded, impl_->device), 0, nullptr, real.to(impl_->device));
    return ToVector(impl_->value(hidden.select(1, -1)).squeeze(-1));
  });
}

absl::StatusOr<std::vector<float>> Policy::IncrementalLogits(const std::vector<std::vector<int32_t>>& tokens) {
  return Guarded("IncrementalLogits", [&]() -> absl::StatusOr<std::vector<float>> {
    RETURN_IF_ERROR(CheckTokens(tokens, impl_->config.vocab_size, /*equal_length=*/true));
    torch::NoGradGuard no_grad;
    auto cache = impl_->NewCache(tokens.size());
    torch::Tensor all = ToTensor(tokens, impl_->device);
    std::vector<torch::Tensor> steps;
    for (int64_t p = 0; p < all.size(1); ++p) steps.push_back(impl_->Forward(all.narrow(1, p, 1), p, cache));
    return ToVector(torch::cat(steps, 1));
  });
}

absl::StatusOr<std::vector<Generation>> Policy::Generate(const std::vector<std::vector<int32_t>>& prompts,
                                                         const SamplingOptions& options) {
  return Guarded("Generate", [&]() -> absl::StatusOr<std::vector<Generation>> {
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
  });
}

namespace {

// Replaces every parameter's gradient by the token-weighted mean over the group's
// ranks: sum_r n_r * g_r / sum_r n_r, with n_r the rank's response tokens (its loss
// is a mean over them), in one all-reduce of [n_r * grads..., n_r, nonfinite_r]. The
// last element makes *nonfinite (a rank's non-finite loss) the same on every rank, so
// that every rank skips the update together.
absl::Status SyncGradients(Policy::Impl& impl, float tokens, dist::GradientGroup* group, bool* nonfinite) {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> parts;
  for (auto& p : impl.parameters()) {
    params.push_back(p);
    torch::Tensor g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    parts.push_back((g * tokens).flatten().to(torch::kCPU));
  }
  parts.push_back(torch::full({1}, tokens));
  parts.push_back(torch::full({1}, *nonfinite ? 1.0f : 0.0f));
  torch::Tensor flat = torch::cat(parts).contiguous();
  RETURN_IF_ERROR(group->AllReduceSum(flat.data_ptr<float>(), flat.numel()));
  const float flags = flat[flat.numel() - 1].item<float>();
  if (!(flags == 0)) *nonfinite = true;  // (a NaN sum counts too)
  const float total = flat[flat.numel() - 2].item<float>();
  if (total <= 0) return absl::OkStatus();  // no tokens anywhere: nothing to learn
  flat = flat.narrow(0, 0, flat.numel() - 2);
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

// Optimizer updates taken so far (AdamW's per-parameter step count; 0 before any).
int64_t OptimizerSteps(Policy::Impl& impl) {
  auto& state = impl.optimizer->state();
  int64_t steps = 0;
  for (const auto& p : impl.parameters()) {
    auto it = state.find(OptimizerStateKey(state, p));
    if (it != state.end()) {
      steps = std::max<int64_t>(steps, static_cast<const torch::optim::AdamWParamState&>(*it->second).step());
    }
  }
  return steps;
}

// The parameters with a gradient, and their gradients.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> WithGrads(Policy::Impl& impl) {
  std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> out;
  for (const auto& p : impl.parameters()) {
    if (!p.grad().defined()) continue;
    out.first.push_back(p);
    out.second.push_back(p.grad());
  }
  return out;
}

// Gradients zeroed as the optimizer's zero_grad does (kept, filled with zeros), in a few
// multi-tensor kernels instead of one per parameter.
void ZeroGrads(Policy::Impl& impl) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads = WithGrads(impl).second;
  if (!grads.empty()) at::_foreach_zero_(grads);
}

// torch::nn::utils::clip_grad_norm_ (the global 2-norm, gradients scaled by
// max_norm / (norm + 1e-6) when that is below 1), with multi-tensor kernels. Returns the
// norm before clipping.
double ClipGradNorm(Policy::Impl& impl, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads = WithGrads(impl).second;
  if (grads.empty()) return 0;
  const double norm = torch::stack(at::_foreach_norm(grads)).norm().item<double>();
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) at::_foreach_mul_(grads, coef);
  return norm;
}

// One AdamW update of every parameter with a gradient: torch::optim::AdamW::step's
// arithmetic on its own state (the optimizer's map: checkpoints, snapshots and the step
// count see no difference), in multi-tensor kernels. libtorch's C++ AdamW launches about
// eight kernels per parameter, which on the H200 held a small model's train step to
// 0.70x PyTorch eager, whose AdamW is multi-tensor on CUDA.
void AdamWStep(Policy::Impl& impl, double lr, double weight_decay, double beta1, double beta2, double eps) {
  torch::NoGradGuard no_grad;  // (in-place writes to leaves that require grad)
  auto& state = impl.optimizer->state();
  struct Group {
    std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq;
  };
  std::map<int64_t, Group> by_step;  // (parameters at different counts are updated apart; normally one)
  auto [params, grads] = WithGrads(impl);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto key = OptimizerStateKey(state, params[i]);
    auto it = state.find(key);
    if (it == state.end()) {
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(params[i], torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(params[i], torch::MemoryFormat::Preserve));
      it = state.emplace(key, std::move(fresh)).first;
    }
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    s.step(s.step() + 1);
    Group& g = by_step[s.step()];
    g.params.push_back(params[i]);
    g.grads.push_back(grads[i]);
    g.exp_avg.push_back(s.exp_avg());
    g.exp_avg_sq.push_back(s.exp_avg_sq());
  }
  for (auto& [t, g] : by_step) {
    const double bias_correction1 = 1 - std::pow(beta1, t), bias_correction2 = 1 - std::pow(beta2, t);
    if (weight_decay != 0) at::_foreach_mul_(g.params, 1 - lr * weight_decay);
    at::_foreach_mul_(g.exp_avg, beta1);
    at::_foreach_add_(g.exp_avg, g.grads, 1 - beta1);
    at::_foreach_mul_(g.exp_avg_sq, beta2);
    at::_foreach_addcmul_(g.exp_avg_sq, g.grads, g.grads, 1 - beta2);
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(g.exp_avg_sq);
    at::_foreach_div_(denom, std::sqrt(bias_correction2));
    at::_foreach_add_(denom, eps);
    at::_foreach_addcdiv_(g.params, g.exp_avg, denom, -lr / bias_correction1);
  }
}

// The weights and optimizer state before a step of several updates, so that a
// non-finite loss in a later update leaves nothing applied.
struct TrainSnapshot {
  std::vector<torch::Tensor> params;
  std::vector<std::pair<torch::Tensor, std::unique_ptr<torch::optim::AdamWParamState>>> states;

  static TrainSnapshot Take(Policy::Impl& impl) {
    torch::NoGradGuard no_grad;
    TrainSnapshot s;
    auto& state = impl.optimizer->state();
    for (const auto& p : impl.parameters()) {
      s.params.push_back(p.detach().clone());
      auto it = state.find(OptimizerStateKey(state, p));
      if (it == state.end()) continue;
      const auto& from = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      auto copy = std::make_unique<torch::optim::AdamWParamState>();
      copy->step(from.step());
      copy->exp_avg(from.exp_avg().clone());
      copy->exp_avg_sq(from.exp_avg_sq().clone());
      if (from.max_exp_avg_sq().defined()) copy->max_exp_avg_sq(from.max_exp_avg_sq().clone());
      s.states.emplace_back(p, std::move(copy));
    }
    return s;
  }
  void Restore(Policy::Impl& impl) {
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& p : impl.parameters()) p.copy_(params[i++]);
    auto& state = impl.optimizer->state();
    state.clear();
    for (auto& [param, s] : states) state[OptimizerStateKey(state, param)] = std::move(s);
    states.clear();
    ++impl.weights_generation;
  }
};

constexpr char kNonFinitePayload[] = "type.rlfleet/model.NonFiniteLoss";

absl::Status NonFiniteLossError(int64_t update) {
  absl::Status s = absl::InternalError(
      absl::StrCat("non-finite loss or gradient in update ", update + 1, " of the step; the step is not applied"));
  s.SetPayload(kNonFinitePayload, absl::Cord("1"));
  return s;
}

}  // namespace

bool IsNonFiniteLossError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal && status.GetPayload(kNonFinitePayload).has_value();
}

absl::Status Policy::CheckBatch(const std::vector<TrainSequence>& batch, const TrainOptions& options) const {
  if (impl_->dtype != torch::kFloat32) {
    return absl::FailedPreconditionError(
        absl::StrCat("a ", impl_->config.dtype, " policy does not train: TrainStep needs dtype fp32"));
  }
  if (batch.empty()) return absl::InvalidArgumentError("empty training batch");
  if (options.mini_batches < 1 || static_cast<size_t>(options.mini_batches) > batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mini_batches is ", options.mini_batches, "; it must be in [1, ",
                                                   batch.size(), "] (the sequences of this batch)"));
  }
  if (options.micro_batch_size < 0 || options.epochs < 1 || options.warmup_steps < 0) {
    return absl::InvalidArgumentError("micro_batch_size, epochs and warmup_steps must not be negative");
  }
  for (double v :
       {static_cast<double>(options.learning_rate), static_cast<double>(options.weight_decay),
        static_cast<double>(options.grad_clip), static_cast<double>(options.beta1), static_cast<double>(options.beta2),
        static_cast<double>(options.eps), options.clip, options.clip_high, options.entropy_coef, options.gamma,
        options.gae_lambda, options.value_coef, options.value_clip}) {
    if (!std::isfinite(v) || v < 0) return absl::InvalidArgumentError("a training option is negative or not finite");
  }
  if (options.beta1 >= 1 || options.beta2 >= 1 || options.eps <= 0) {
    return absl::InvalidArgumentError("AdamW betas must be in [0, 1) and eps > 0");
  }
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
    if (!s.loss_mask.empty()) {
      if (s.loss_mask.size() != s.response.size()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has a loss mask of ", s.loss_mask.size(),
                                                       " entries for ", s.response.size(), " tokens"));
      }
      if (std::none_of(s.loss_mask.begin(), s.loss_mask.end(), [](uint8_t m) { return m != 0; })) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": its loss mask leaves no token in the loss"));
      }
      if (options.gae) {
        return absl::UnimplementedError(absl::StrCat(
            "sequence ", i, ": a loss mask (a multi-turn trajectory) with GAE is not supported; use GRPO or RLOO"));
      }
    }
    for (const std::vector<int32_t>* tokens : {&s.prompt, &s.response}) {
      for (int32_t t : *tokens) {
        if (t < 0 || t >= impl_->config.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("sequence ", i, ": token ", t, " is outside the vocabulary of ", impl_->config.vocab_size));
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

namespace {

// A training batch as tensors on the host: prompts left-padded to P (as in generation),
// responses right-padded to R; `real` marks the tokens that are not padding (a response
// may hold the PAD id as a token the policy generated: it is real).
struct PackedBatch {
  int64_t B = 0, P = 0, R = 0;
  std::vector<std::vector<int32_t>> rows;  // [B][P + R]
  torch::Tensor real;                      // [B, P + R] bool
  torch::Tensor targets, mask, old_lp, adv, rewards;
  std::vector<double> response_tokens;  // real tokens per sequence (known here: no device reads)
};

absl::StatusOr<PackedBatch> Pack(const std::vector<TrainSequence>& batch, int vocab_size) {
  PackedBatch pb;
  size_t prompt_len = 0, response_len = 0;
  for (const TrainSequence& s : batch) {
    prompt_len = std::max(prompt_len, s.prompt.size());
    response_len = std::max(response_len, s.response.size());
  }
  const int64_t B = batch.size(), P = prompt_len, R = response_len;
  pb.B = B;
  pb.P = P;
  pb.R = R;
  pb.rows.resize(B);
  pb.real = torch::zeros({B, P + R}, torch::kBool);
  pb.targets = torch::zeros({B, R}, torch::kLong);
  pb.mask = torch::zeros({B, R});
  pb.old_lp = torch::zeros({B, R});
  pb.adv = torch::zeros({B});
  pb.rewards = torch::zeros({B, R});  // the sequence reward on its last token
  // (filled through accessors on the host: an indexing op per token costs ~5 us)
  auto real_a = pb.real.accessor<bool, 2>();
  auto targets_a = pb.targets.accessor<int64_t, 2>();
  auto mask_a = pb.mask.accessor<float, 2>(), old_lp_a = pb.old_lp.accessor<float, 2>();
  auto rewards_a = pb.rewards.accessor<float, 2>();
  auto adv_a = pb.adv.accessor<float, 1>();
  pb.response_tokens.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    const TrainSequence& s = batch[b];
    for (int32_t t : s.prompt) {
      if (t < 0 || t >= vocab_size) return absl::InvalidArgumentError("token outside the vocabulary");
    }
    const int64_t pad = P - static_cast<int64_t>(s.prompt.size());
    pb.rows[b].assign(pad, 0);
    pb.rows[b].insert(pb.rows[b].end(), s.prompt.begin(), s.prompt.end());
    for (int64_t i = pad; i < P; ++i) real_a[b][i] = true;
    for (int64_t j = 0; j < R; ++j) {
      const bool real = j < static_cast<int64_t>(s.response.size());
      const int32_t tok = real ? s.response[j] : 0;
      if (tok < 0 || tok >= vocab_size) return absl::InvalidArgumentError("token outside the vocabulary");
      pb.rows[b].push_back(tok);
      if (real) {
        real_a[b][P + j] = true;
        targets_a[b][j] = tok;
        mask_a[b][j] =
            s.loss_mask.empty() || (j < static_cast<int64_t>(s.loss_mask.size()) && s.loss_mask[j] != 0) ? 1.0f : 0.0f;
        if (j < static_cast<int64_t>(s.behaviour_logprobs.size())) old_lp_a[b][j] = s.behaviour_logprobs[j];
      }
    }
    adv_a[b] = s.advantage;
    if (!s.response.empty()) rewards_a[b][static_cast<int64_t>(s.response.size()) - 1] = s.reward;
    // (the tokens in the loss: what a micro-batch's share of the mean is weighted by)
    pb.response_tokens[b] = s.loss_mask.empty()
                                ? static_cast<double>(s.response.size())
                                : static_cast<double>(std::count_if(s.loss_mask.begin(), s.loss_mask.end(),
                                                                    [](uint8_t m) { return m != 0; }));
  }
  return pb;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<float>>> Policy::ResponseLogProbs(const std::vector<TrainSequence>& batch) {
  return Guarded("ResponseLogProbs", [&]() -> absl::StatusOr<std::vector<std::vector<float>>> {
    if (batch.empty()) return absl::InvalidArgumentError("empty batch");
    for (size_t b = 0; b < batch.size(); ++b) {
      if (batch[b].response.empty())
        return absl::InvalidArgumentError(absl::StrCat("sequence ", b, ": empty response"));
      if (batch[b].prompt.size() + batch[b].response.size() > static_cast<size_t>(impl_->config.max_seq_len)) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " is longer than max_seq_len"));
      }
    }
    ASSIGN_OR_RETURN(PackedBatch pb, Pack(batch, impl_->config.vocab_size));
    torch::NoGradGuard no_grad;
    const torch::Device dev = impl_->device;
    torch::Tensor logits = impl_->Forward(ToTensor(pb.rows, dev), 0, nullptr, pb.real.to(dev));
    torch::Tensor lp = torch::log_softmax(logits.narrow(1, pb.P - 1, pb.R).to(torch::kFloat32), -1)
                           .gather(-1, pb.targets.to(dev).unsqueeze(-1))
                           .squeeze(-1)
                           .to(torch::kCPU)
                           .contiguous();
    std::vector<std::vector<float>> out(pb.B);
    for (int64_t b = 0; b < pb.B; ++b) {
      const float* row = lp.data_ptr<float>() + b * pb.R;
      out[b].assign(row, row + batch[b].response.size());
    }
    return out;
  });
}

absl::StatusOr<TrainStats> Policy::TrainStep(const std::vector<TrainSequence>& batch, const TrainOptions& options) {
  return Guarded("TrainStep", [&]() -> absl::StatusOr<TrainStats> {
    RETURN_IF_ERROR(CheckBatch(batch, options));
    ASSIGN_OR_RETURN(PackedBatch pb, Pack(batch, impl_->config.vocab_size));
    const int64_t B = pb.B, P = pb.P, R = pb.R;
    const std::vector<double>& response_tokens = pb.response_tokens;
    torch::Tensor targets = pb.targets, mask = pb.mask, old_lp = pb.old_lp, adv = pb.adv, rewards = pb.rewards;
    std::vector<std::vector<int32_t>>& rows = pb.rows;
    torch::Tensor real = pb.real.to(impl_->device);
    auto tokens_in = [&](int64_t begin, int64_t n) {
      double sum = 0;
      for (int64_t b = begin; b < begin + n; ++b) sum += response_tokens[b];
      return sum;
    };
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
    const int64_t micro = options.micro_batch_size > 0 ? std::min<int64_t>(options.micro_batch_size, B) : B;
    if (options.gae) {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> values;
      for (int64_t begin = 0; begin < B; begin += micro) {
        const int64_t n = std::min(micro, B - begin);
        torch::Tensor hidden = impl_->Trunk(input.narrow(0, begin, n), 0, nullptr, real.narrow(0, begin, n));
        values.push_back(impl_->value(hidden.narrow(1, P - 1, R)).squeeze(-1));
      }
      old_values = torch::cat(values) * mask;
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
    const int64_t epochs = std::max(1, options.epochs), mini_batches = options.mini_batches;
    // A step of several updates can be undone (a non-finite loss in a later update).
    std::optional<TrainSnapshot> snapshot;
    if (epochs * mini_batches > 1) snapshot = TrainSnapshot::Take(*impl_);
    impl_->train();
    TrainStats stats;
    const double batch_tokens = tokens_in(0, B);
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      double loss_sum = 0, policy_sum = 0, clip_sum = 0, kl_sum = 0, entropy_sum = 0, value_sum = 0;
      for (int64_t k = 0; k < mini_batches; ++k) {
        const int64_t first = B * k / mini_batches, last = B * (k + 1) / mini_batches;
        ZeroGrads(*impl_);
        const float mini_tokens = static_cast<float>(tokens_in(first, last - first));
        bool nonfinite = false;
        // Gradient accumulation: each micro-batch's token-mean loss weighted by its share
        // of the mini-batch's tokens sums to the mini-batch's token-mean loss.
        for (int64_t begin = first; begin < last; begin += micro) {
          const int64_t n = std::min(micro, last - begin);
          torch::Tensor m = mask.narrow(0, begin, n);
          const float tokens = static_cast<float>(tokens_in(begin, n));
          torch::Tensor hidden, logits;
          {
            // (--precision=bf16: the forward pass under autocast; the loss in fp32)
            AutocastGuard autocast(impl_->device, impl_->config.bf16_autocast);
            hidden = impl_->Trunk(input.narrow(0, begin, n), 0, nullptr, real.narrow(0, begin, n));
            logits = impl_->Head(hidden).to(torch::kFloat32);
          }
          // Logits at P-1+j predict response token j.
          torch::Tensor all_lp = torch::log_softmax(logits.narrow(1, P - 1, R), -1);
          torch::Tensor lp = all_lp.gather(-1, targets.narrow(0, begin, n).unsqueeze(-1)).squeeze(-1);
          torch::Tensor entropy = -(all_lp.exp() * all_lp).sum(-1);
          rl::PpoOptions po;
          po.clip = options.clip;
          po.clip_high = options.clip_high;
          po.entropy_coef = options.entropy_coef;
          rl::PpoLoss loss =
              rl::PpoPolicyLoss(lp, old_lp.narrow(0, begin, n), adv.narrow(0, begin, n), m, po, {}, {}, entropy);
          torch::Tensor total = loss.loss;
          torch::Tensor value_loss = torch::zeros({}, total.options());
          if (options.gae) {
            torch::Tensor v = impl_->value(hidden.narrow(1, P - 1, R).to(torch::kFloat32)).squeeze(-1);
            torch::Tensor old_v = old_values.narrow(0, begin, n), ret = returns.narrow(0, begin, n);
            torch::Tensor clipped = old_v + (v - old_v).clamp(-options.value_clip, options.value_clip);
            value_loss = 0.5 * rl::MaskedMean(torch::max((v - ret).pow(2), (clipped - ret).pow(2)), m);
            total = total + options.value_coef * value_loss;
          }
          if (mini_tokens > 0) (total * (tokens / mini_tokens)).backward();
          // The statistics in one read from the device (each .item() waits for it: six
          // waits per update held a small model's GPU step back). A non-finite loss
          // has non-finite gradients too: nothing is applied (below).
          torch::Tensor read = torch::stack({total.detach(), loss.policy_loss.detach(), loss.clip_fraction,
                                             loss.approx_kl, loss.entropy.detach(), value_loss.detach()})
                                   .to(torch::kCPU, torch::kDouble);
          const double* r = read.data_ptr<double>();
          if (!std::isfinite(r[0])) nonfinite = true;
          loss_sum += r[0] * tokens;
          policy_sum += r[1] * tokens;
          clip_sum += r[2] * tokens;
          kl_sum += r[3] * tokens;
          entropy_sum += r[4] * tokens;
          value_sum += r[5] * tokens;
        }
        if (options.group != nullptr) RETURN_IF_ERROR(SyncGradients(*impl_, mini_tokens, options.group, &nonfinite));
        const double norm = ClipGradNorm(*impl_, options.grad_clip);
        if (nonfinite || !std::isfinite(norm)) {
          ZeroGrads(*impl_);
          if (snapshot.has_value()) snapshot->Restore(*impl_);
          impl_->eval();
          return NonFiniteLossError(epoch * mini_batches + k);
        }
        const int64_t t = OptimizerSteps(*impl_);
        const double lr = options.warmup_steps > 0
                              ? options.learning_rate * std::min(1.0, static_cast<double>(t + 1) / options.warmup_steps)
                              : options.learning_rate;
        AdamWStep(*impl_, lr, options.weight_decay, options.beta1, options.beta2, options.eps);
        ++impl_->weights_generation;
        ++stats.optimizer_steps;
        stats.grad_norm = static_cast<float>(norm);
        stats.learning_rate = static_cast<float>(lr);
      }
      // The last epoch's token means over the whole batch.
      const double d = std::max(1.0, batch_tokens);
      stats.loss = static_cast<float>(loss_sum / d);
      stats.policy_loss = static_cast<float>(policy_sum / d);
      stats.clip_fraction = static_cast<float>(clip_sum / d);
      stats.approx_kl = static_cast<float>(kl_sum / d);
      stats.entropy = static_cast<float>(entropy_sum / d);
      stats.value_loss = static_cast<float>(value_sum / d);
    }
    impl_->eval();
    stats.tokens = static_cast<int64_t>(batch_tokens);
    return stats;
  });
}

std::string Policy::SafetensorsBytes() const { return SafetensorsImage(nullptr).Release(); }

common::HostBuffer Policy::SafetensorsImage(const std::shared_ptr<common::BufferPool>& pool) const {
  if (impl_->flat.defined() && impl_->flat.scalar_type() == torch::kFloat32) {
    // Every parameter is a view of `flat`, in named_parameters() order (FlattenParameters):
    // the image lists them in that order and its data is flat's bytes, one copy (one
    // device-to-host copy on a GPU, into memory from the pool).
    std::vector<TensorSlot> slots;
    for (const auto& item : impl_->named_parameters()) {
      const torch::Tensor& p = item.value();
      slots.push_back({item.key(), "F32", p.sizes().vec(), static_cast<uint64_t>(p.numel()) * sizeof(float)});
    }
    char* data = nullptr;
    common::HostBuffer image = AllocateSafetensors(slots, pool, &data);
    torch::NoGradGuard no_grad;
    torch::from_blob(data, {impl_->flat.numel()}, torch::TensorOptions().dtype(torch::kFloat32))
        .copy_(impl_->flat.detach());
    return image;
  }
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
  return SerializeSafetensors(tensors, pool);
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
  return InstallOptimizerState(tensors, path);
}

absl::Status Policy::LoadOptimizerStateBytes(const std::string& bytes, const std::string& name) {
  ASSIGN_OR_RETURN(auto tensors, ParseSafetensors(bytes, name));
  return InstallOptimizerState(tensors, name);
}

absl::Status Policy::InstallOptimizerState(const std::map<std::string, TensorBlob>& tensors, const std::string& path) {
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
  return Guarded("LoadTensors", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    // Every tensor is checked before any is copied: a bad file changes nothing.
    std::vector<std::pair<torch::Tensor, const TensorView*>> copies;
    for (auto& item : impl_->named_parameters()) {
      auto it = tensors.find(item.key());
      if (it == tensors.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor `", item.key(), "` is missing"));
      }
      const TensorView& blob = it->second;
      if ((blob.dtype != "F32" && blob.dtype != "BF16" && blob.dtype != "F16") ||
          blob.shape != item.value().sizes().vec()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor `", item.key(), "` is ", blob.dtype, " [",
                                                       absl::StrJoin(blob.shape, ","), "]; want F32, BF16 or F16 [",
                                                       absl::StrJoin(item.value().sizes().vec(), ","), "]"));
      }
      copies.emplace_back(item.value(), &blob);
    }
    for (auto& [param, blob] : copies) {
      const torch::ScalarType type = blob->dtype == "F32"    ? torch::kFloat32
                                     : blob->dtype == "BF16" ? torch::kBFloat16
                                                             : torch::kFloat16;
      param.copy_(torch::from_blob(const_cast<char*>(blob->bytes.data()), blob->shape, type));
    }
    ++impl_->weights_generation;
    return absl::OkStatus();
  });
}

}  // namespace rlfleet::model
