// rlfleet-rollout: a policy replica. Flags + wiring only.
#include <unistd.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/config.h"
#include "libs/model/hf_model.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"
#include "libs/nccl_tuning/nccl_env.h"
#include "libs/rpc/server_runner.h"
#include "libs/service/model_flags.h"
#include "libs/service/numa_flag.h"
#include "libs/service/serve.h"
#include "libs/transport/data_plane.h"
#include "libs/transport/descriptor_fetcher.h"
#include "services/rollout/rollout_core.h"
#include "services/rollout/rollout_service.h"

ABSL_FLAG(std::string, model_dir, "",
          "A Hugging Face model directory (config.json, model.safetensors or its shards; Llama, Qwen2, Qwen3): "
          "the model's shape comes from it (--d_model, --n_layers, --n_heads are refused) and its weights are "
          "served as --weights_version. --max_seq_len, when given, sets the KV cache width (default: "
          "max_position_embeddings, at most 2048).");
ABSL_FLAG(int, d_model, 128, "Model width.");
ABSL_FLAG(int, n_layers, 4, "Transformer blocks.");
ABSL_FLAG(int, n_heads, 4, "Attention heads.");
ABSL_FLAG(int, max_seq_len, 64, "Prompt + response tokens at most.");
ABSL_FLAG(std::string, dtype, "fp32",
          "Weights, activations and KV cache: fp32, bf16 or fp16 (fp16: CUDA only). Versions arrive as F32 and "
          "are converted when installed.");
ABSL_FLAG(std::string, device, "cpu", "Device: cpu or cuda:N.");
ABSL_FLAG(bool, cuda_graphs, true,
          "On a CUDA device, replay each decode step as a CUDA graph captured per batch-size bucket (false: "
          "launch its kernels one by one).");
ABSL_FLAG(int, threads, 2, "Compute threads.");
ABSL_FLAG(std::string, weights, "",
          "Safetensors file to serve at --weights_version; empty: wait for weights "
          "(or serve the random init with --serve_initial_weights).");
ABSL_FLAG(uint64_t, weights_version, 1, "Policy version of --weights / the initial weights.");
ABSL_FLAG(int, max_batch, 256, "Sequences decoded together at most (continuous batching).");
ABSL_FLAG(int, max_queued_generate, 0,
          "Generate (inference, e.g. the gateway's) sequences queued at most, of the 4096 the queue holds; the rest "
          "is kept for GenerateBatch (the run's rollouts). 0: half the queue.");
ABSL_FLAG(int, join_group, 0,
          "While the batch decodes, queued sequences join it in groups of at least this many (or as many as there "
          "are free rows), one prefill pass per group; 0: --max_batch / 8; 1: each as soon as it arrives.");
ABSL_FLAG(int, join_wait_steps, 8, "A queued sequence joins after at most this many decode steps (0..1000).");
ABSL_FLAG(bool, serve_initial_weights, false, "Serve the randomly initialised model as --weights_version.");
ABSL_FLAG(bool, prefault_staging, true,
          "Fault in memory for one pulled weight version at start (the model's f32 size), so that the first "
          "sync does not: a fresh buffer can cost more than the pull itself.");

ABSL_FLAG(bool, verify_device_images, false,
          "On CUDA: also check the digest of each version taken from the trainer's GPU copy on this host (one "
          "more read pass over it); its version stamp is always checked before and after the copy.");

ABSL_FLAG(std::string, publish_dir, "",
          "Directory the trainer publishes version files into (its --publish_dir): a FILE descriptor "
          "(UpdateWeights) must name a regular file under it. Empty: FILE descriptors are refused (versions "
          "come over the data plane). --weights is read at start whatever this says.");

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  rlfleet::common::ParseFlagsWithConfig(argc, argv, "rlfleet-rollout: policy replica.");
  if (absl::Status s = rlfleet::nccl::ApplyNcclProfileFromFlags("rlfleet-rollout"); !s.ok()) {
    std::cerr << "rlfleet-rollout: --nccl_profile: " << s << "\n";
    return 2;
  }
  auto options = rlfleet::service::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-rollout: " << options.status() << "\n";
    return 2;
  }
  // (before any thread of the model's or the server's starts: they inherit the binding)
  absl::StatusOr<rlfleet::common::NumaBinding> numa = rlfleet::service::BindNumaFromFlags(
      "rlfleet-rollout", rlfleet::model::DevicePciBusId(absl::GetFlag(FLAGS_device)));
  if (!numa.ok()) {
    std::cerr << "rlfleet-rollout: " << numa.status() << "\n";
    return 2;
  }
  rlfleet::model::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  if (!model_dir.empty() && (!absl::GetFlag(FLAGS_weights).empty() || absl::GetFlag(FLAGS_serve_initial_weights))) {
    std::cerr << "rlfleet-rollout: --model_dir serves the directory's weights: drop --weights / "
                 "--serve_initial_weights\n";
    return 2;
  }
  absl::StatusOr<rlfleet::model::PolicyConfig> model = rlfleet::service::PolicyConfigFromFlags(
      model_dir, {absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_n_layers), absl::GetFlag(FLAGS_n_heads),
                  absl::GetFlag(FLAGS_max_seq_len)});
  if (!model.ok()) {
    std::cerr << "rlfleet-rollout: " << model.status() << "\n";
    return 2;
  }
  rlfleet::model::PolicyConfig config = *model;
  config.dtype = absl::GetFlag(FLAGS_dtype);
  config.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  rlfleet::rollout::RolloutLimits limits;
  limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  limits.join_group = absl::GetFlag(FLAGS_join_group);
  limits.join_wait_steps = absl::GetFlag(FLAGS_join_wait_steps);
  limits.max_queued_generate = absl::GetFlag(FLAGS_max_queued_generate);
  if (limits.max_queued_generate < 0 || limits.max_queued_generate > limits.max_queued) {
    std::cerr << "rlfleet-rollout: --max_queued_generate wants 0..." << limits.max_queued << ", got "
              << limits.max_queued_generate << "\n";
    return 2;
  }
  if (limits.join_group < 0 || limits.join_group > limits.max_batch || limits.join_wait_steps < 0 ||
      limits.join_wait_steps > 1000) {
    std::cerr << "rlfleet-rollout: --join_group wants 0..--max_batch (" << limits.max_batch << "), got "
              << limits.join_group << "; --join_wait_steps 0..1000, got " << limits.join_wait_steps << "\n";
    return 2;
  }
  if (!model_dir.empty()) {
    auto eos = rlfleet::model::ReadHfEosIds(model_dir);
    if (!eos.ok()) {
      std::cerr << "rlfleet-rollout: --model_dir: " << eos.status() << "\n";
      return 2;
    }
    for (int32_t id : *eos) {
      if (id >= config.vocab_size) {
        std::cerr << "rlfleet-rollout: --model_dir: eos_token_id " << id << " is outside the vocabulary of "
                  << config.vocab_size << "\n";
        return 2;
      }
    }
    limits.eos_ids = *eos;
  }
  auto core = rlfleet::rollout::RolloutCore::Create(config, absl::GetFlag(FLAGS_device), limits);
  if (!core.ok()) {
    std::cerr << "rlfleet-rollout: " << core.status() << "\n";
    return 2;
  }
  std::cerr << "rlfleet-rollout: model on " << absl::GetFlag(FLAGS_device) << " (" << config.dtype << ", decode "
            << (*core)->decode_mode() << "), backend " << rlfleet::model::ModelBackend() << "\n";

  absl::Status installed = absl::OkStatus();
  if (!model_dir.empty()) {
    installed = (*core)->InstallFromModelDir(model_dir, absl::GetFlag(FLAGS_weights_version)).status();
    if (installed.ok()) {
      std::cerr << "rlfleet-rollout: " << config.arch << " from " << model_dir << " (" << config.n_layers
                << " layers, d_model " << config.d_model << ", vocabulary " << config.vocab_size << ", KV cache "
                << config.max_seq_len << " tokens, end of sequence "
                << (limits.eos_ids.empty() ? "none named" : absl::StrJoin(limits.eos_ids, ", ")) << ") as version "
                << absl::GetFlag(FLAGS_weights_version) << "\n";
    }
  } else if (!absl::GetFlag(FLAGS_weights).empty()) {
    installed = (*core)->InstallFromFile(absl::GetFlag(FLAGS_weights), absl::GetFlag(FLAGS_weights_version)).status();
  } else if (absl::GetFlag(FLAGS_serve_initial_weights)) {
    installed = (*core)->InstallInitial(absl::GetFlag(FLAGS_weights_version));
  }
  if (!installed.ok()) {
    std::cerr << "rlfleet-rollout: " << (model_dir.empty() ? "--weights: " : "--model_dir: ") << installed << "\n";
    return 2;
  }
  rlfleet::rpc::ServerRunner runner(*options);
  // The data plane weight versions are pulled over.
  auto data_plane =
      rlfleet::transport::OpenDataPlaneFromFlags(options->host, "rlfleet-rollout", "weights by FILE only");
  if (!data_plane.ok()) {
    std::cerr << "rlfleet-rollout: " << data_plane.status() << "\n";
    return 2;
  }
  rlfleet::transport::DescriptorFetcher::Options fetch;
  fetch.max_bytes = uint64_t{16} << 30;  // a whole model version
  fetch.timeout = absl::Minutes(5);
  fetch.file_root = absl::GetFlag(FLAGS_publish_dir);
  fetch.file_root_flag = "--publish_dir";
  rlfleet::transport::DescriptorFetcher fetcher(data_plane->get(), fetch);
  rlfleet::rollout::RolloutServiceImpl service(
      core->get(), rlfleet::rpc::CallAuthFrom(options->auth), [&runner](bool serving) { runner.SetServing(serving); },
      &fetcher, data_plane->get());
  service.SetVerifyDeviceImages(absl::GetFlag(FLAGS_verify_device_images));
  if (absl::GetFlag(FLAGS_prefault_staging) && *data_plane != nullptr) {
    rlfleet::v1::GetInfoResponse info;
    if ((*core)->GetInfo(&info).ok()) {
      service.PrefaultStaging(rlfleet::model::F32ImageBytesBound(static_cast<uint64_t>(info.model().num_parameters())));
    }
  }
  runner.AddService(&service);
  rlfleet::rollout::RolloutCore* c = core->get();
  rlfleet::service::ServeSpec spec;
  spec.binary = "rlfleet-rollout";
  spec.role = rlfleet::v1::REPLICA_ROLE_ROLLOUT;
  spec.labels = rlfleet::service::NumaLabels(*numa);
  // Health is SERVING only with verified weights.
  spec.started = [c](rlfleet::rpc::ServerRunner& r) { r.SetServing(c->serving()); };
  spec.note = [c] { return absl::StrCat(" (policy version ", c->installed_version(), ")"); };
  spec.fill = [c](rlfleet::v1::ReplicaInfo* r) {
    rlfleet::v1::GetInfoResponse info;
    if (!c->GetInfo(&info).ok()) return;
    *r->mutable_policy_version() = info.installed_version();
    *r->mutable_load() = info.load();
  };
  // The lease was lost (e.g. during a Redis outage) and the controller drained this
  // replica; registered again, it takes work again (issue 18).
  spec.rejoined = [c, &runner] {
    rlfleet::v1::ResumeResponse resumed;
    if (c->Resume(&resumed).ok()) runner.SetServing(c->serving());
  };
  return rlfleet::service::ServeUntilTerminated(runner, spec);
}
