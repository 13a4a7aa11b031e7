// rlfleet-trainer: the trainer, one data-parallel rank (rank 0 serves the API; the
// others follow it). Flags + wiring only.

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "libs/common/config.h"
#include "libs/model/policy.h"
#include "libs/nccl_tuning/nccl_env.h"
#include "libs/rpc/server_runner.h"
#include "libs/service/model_flags.h"
#include "libs/service/numa_flag.h"
#include "libs/service/serve.h"
#include "libs/transport/data_plane.h"
#include "services/trainer/buffer_client.h"
#include "services/trainer/data_parallel.h"
#include "services/trainer/trainer_core.h"
#include "services/trainer/trainer_service.h"

ABSL_FLAG(std::string, model_dir, "",
          "A Hugging Face model directory (config.json, model.safetensors or its shards; Llama, Qwen2, Qwen3) to "
          "train from: the model's shape comes from it (--d_model, --n_layers, --n_heads are refused), its weights "
          "are the start, and checkpoints are Hugging Face directories too (config.json, model.safetensors, its "
          "tokenizer files). --max_seq_len, when given, bounds prompt + response (default: "
          "max_position_embeddings, at most 2048).");
ABSL_FLAG(int, d_model, 128, "Model width (must match the rollout replicas).");
ABSL_FLAG(int, n_layers, 4, "Transformer blocks.");
ABSL_FLAG(int, n_heads, 4, "Attention heads.");
ABSL_FLAG(int, max_seq_len, 64, "Prompt + response tokens at most.");
ABSL_FLAG(std::string, device, "cpu", "Device: cpu or cuda:N.");
ABSL_FLAG(std::string, precision, "fp32",
          "TrainStep's forward pass: fp32, or bf16 (autocast: products in bf16, fp32 weights, gradients and "
          "optimizer state).");
ABSL_FLAG(int, threads, 2, "Compute threads.");
ABSL_FLAG(uint64_t, seed, 1, "Initial weights' seed.");
ABSL_FLAG(bool, value_head, false,
          "Give the model a value head (the critic PPO's GAE needs). With --model_dir it is the directory's own "
          "(a checkpoint this trainer wrote), else it starts at zero.");
ABSL_FLAG(std::string, buffer, "", "Buffer address (host:port) for TrainStep's BufferSource.");
ABSL_FLAG(std::string, weights, "",
          "Weights service address (host:port): PublishWeights hands every version to it (PublishVersion) before "
          "it answers. Empty: whoever calls PublishWeights hands it on.");
ABSL_FLAG(int, dp_world, 1, "Data-parallel ranks (processes); gradients are all-reduced over Gloo (TCP).");
ABSL_FLAG(int, dp_rank, 0, "This process's rank: 0 serves the API and the rendezvous, the others follow it.");
ABSL_FLAG(std::string, dp_host, "127.0.0.1", "Where rank 0's rendezvous listens (and this rank's address).");
ABSL_FLAG(int, dp_port, 0, "Rank 0's rendezvous port (rank 0: 0 picks one and prints it).");
ABSL_FLAG(std::string, dp_allreduce, "gloo",
          "How data-parallel ranks all-reduce gradients: gloo (c10d Gloo, TCP), ring (libs/dist over UCX) or "
          "hierarchical (libs/dist over UCX: inside each --dp_node, across nodes over the rails, inside again; "
          "a ring when the ranks do not split evenly over several nodes).");
ABSL_FLAG(std::string, dp_node, "", "This rank's node for --dp_allreduce=hierarchical; empty: the host name.");
ABSL_FLAG(std::string, dp_wire, "fp32",
          "Gradient precision on the wire (ring: every link; hierarchical: between nodes): fp32, bf16, fp16.");
ABSL_FLAG(absl::Duration, dp_timeout, absl::Seconds(60),
          "Rendezvous and collective deadline: a dead rank is an error after this long.");
ABSL_FLAG(std::string, checkpoint_root, "checkpoints",
          "SaveCheckpoint / LoadCheckpoint paths (absolute, or relative to this directory) must lie inside this "
          "directory (relative: to the working directory; made at the first save); empty: no checkpoints. "
          "Overwrite replaces only checkpoints this trainer wrote.");
ABSL_FLAG(std::string, checkpoint_owner, rlfleet::trainer::kDefaultCheckpointOwner,
          "Tags the directories a save works in (<checkpoint>.tmp-<owner>-<n>, .old-<owner>-<n>; [A-Za-z0-9_], at "
          "most 40): at start and after every save the trainer removes those its own interrupted saves left (a "
          "kill, a full disk) and no one else's. Trainers that share a --checkpoint_root need different owners "
          "(e.g. the run's name); a restarted trainer keeps its own.");
ABSL_FLAG(std::string, resume, "none",
          "At start: \"latest\" loads the checkpoint written last under --checkpoint_root (a trainer "
          "restarted by its supervisor goes on from there; none yet: it starts fresh), \"none\" starts from "
          "the initial weights.");
ABSL_FLAG(std::string, publish_dir, "",
          "PublishWeights writes policy-v<N>.safetensors here (with --model_dir: a Hugging Face directory "
          "policy-v<N>/, config.json, model.safetensors and the tokenizer files; one machine); empty: versions are "
          "kept in memory "
          "on this trainer's data plane (--data_plane) and pulled from there by the weights service or the replicas.");

ABSL_FLAG(int, publish_device_images, 2,
          "With --device=cuda: keep the latest this many published versions in GPU memory too (F32, the model's "
          "size each), so that replicas on CUDA devices of this host install them GPU to GPU (CUDA IPC) instead "
          "of from the host copy; 0: none (0..8).");

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  rlfleet::common::ParseFlagsWithConfig(argc, argv, "rlfleet-trainer: trainer (one rank).");
  if (absl::Status s = rlfleet::nccl::ApplyNcclProfileFromFlags("rlfleet-trainer"); !s.ok()) {
    std::cerr << "rlfleet-trainer: --nccl_profile: " << s << "\n";
    return 2;
  }
  auto options = rlfleet::service::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-trainer: " << options.status() << "\n";
    return 2;
  }
  // (before any thread of the model's or the server's starts: they inherit the binding)
  absl::StatusOr<rlfleet::common::NumaBinding> numa = rlfleet::service::BindNumaFromFlags(
      "rlfleet-trainer", rlfleet::model::DevicePciBusId(absl::GetFlag(FLAGS_device)));
  if (!numa.ok()) {
    std::cerr << "rlfleet-trainer: " << numa.status() << "\n";
    return 2;
  }
  rlfleet::model::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  std::unique_ptr<rlfleet::trainer::GrpcBufferSource> buffer;
  if (!absl::GetFlag(FLAGS_buffer).empty()) {
    auto client_options = rlfleet::rpc::ClientOptionsFromFlags(absl::GetFlag(FLAGS_buffer));
    auto channel = client_options.ok() ? rlfleet::rpc::MakeChannel(*client_options)
                                       : absl::StatusOr<std::shared_ptr<grpc::Channel>>(client_options.status());
    if (!channel.ok()) {
      std::cerr << "rlfleet-trainer: --buffer: " << channel.status() << "\n";
      return 2;
    }
    buffer = std::make_unique<rlfleet::trainer::GrpcBufferSource>(*channel, *client_options);
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  absl::StatusOr<rlfleet::model::PolicyConfig> model = rlfleet::service::PolicyConfigFromFlags(
      model_dir, {absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_n_layers), absl::GetFlag(FLAGS_n_heads),
                  absl::GetFlag(FLAGS_max_seq_len)});
  if (!model.ok()) {
    std::cerr << "rlfleet-trainer: " << model.status() << "\n";
    return 2;
  }
  rlfleet::model::PolicyConfig config = *model;
  config.value_head = absl::GetFlag(FLAGS_value_head);
  if (const std::string precision = absl::GetFlag(FLAGS_precision); precision == "bf16") {
    config.bf16_autocast = true;
  } else if (precision != "fp32") {
    std::cerr << "rlfleet-trainer: --precision=" << precision << ": want fp32 or bf16\n";
    return 2;
  }
  // Data parallelism: rank 0 serves the rendezvous, every rank joins the group.
  rlfleet::trainer::DataParallelOptions dp;
  dp.world = absl::GetFlag(FLAGS_dp_world);
  dp.rank = absl::GetFlag(FLAGS_dp_rank);
  dp.host = absl::GetFlag(FLAGS_dp_host);
  dp.port = absl::GetFlag(FLAGS_dp_port);
  dp.timeout = absl::GetFlag(FLAGS_dp_timeout);
  dp.allreduce = absl::GetFlag(FLAGS_dp_allreduce);
  dp.wire = absl::GetFlag(FLAGS_dp_wire);
  dp.node = absl::GetFlag(FLAGS_dp_node);
  auto data_parallel = rlfleet::trainer::JoinDataParallel(
      dp, [](const std::string& line) { std::cout << "rlfleet-trainer " << line << std::endl; });
  if (!data_parallel.ok()) {
    std::cerr << "rlfleet-trainer: " << data_parallel.status() << "\n";
    return 2;
  }
  const int world = dp.world, rank = dp.rank;
  // (opened before the core, which keeps versions registered with it, and closed after)
  rlfleet::trainer::TrainerCore::PublishTarget publish{absl::GetFlag(FLAGS_publish_dir)};
  publish.device_images = absl::GetFlag(FLAGS_publish_device_images);
  if (publish.device_images < 0 || publish.device_images > 8) {
    std::cerr << "rlfleet-trainer: --publish_device_images=" << publish.device_images << ": want 0..8\n";
    return 2;
  }
  std::unique_ptr<rlfleet::transport::Transport> publish_plane;
  if (publish.dir.empty() && (world <= 1 || rank == 0)) {
    auto plane = rlfleet::transport::OpenDataPlaneFromFlags(options->host, "rlfleet-trainer",
                                                            "PublishWeights needs --publish_dir");
    if (!plane.ok()) {
      std::cerr << "rlfleet-trainer: " << plane.status() << "\n";
      return 2;
    }
    publish_plane = std::move(*plane);
    publish.data_plane = publish_plane.get();
  }
  auto core = rlfleet::trainer::TrainerCore::Create(
      config, absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_seed), buffer.get(), data_parallel->group.get(),
      absl::GetFlag(FLAGS_checkpoint_root), absl::GetFlag(FLAGS_checkpoint_owner));
  if (!core.ok()) {
    std::cerr << "rlfleet-trainer: " << core.status() << "\n";
    return 2;
  }
  std::cerr << "rlfleet-trainer: model on " << absl::GetFlag(FLAGS_device) << " (" << absl::GetFlag(FLAGS_precision)
            << "), backend " << rlfleet::model::ModelBackend() << "\n";
  if (!model_dir.empty()) {
    if (absl::Status s = (*core)->LoadModelDir(model_dir); !s.ok()) {
      std::cerr << "rlfleet-trainer: --model_dir: " << s << "\n";
      return 2;
    }
    std::cerr << "rlfleet-trainer: " << config.arch << " from " << model_dir << " (" << config.n_layers
              << " layers, d_model " << config.d_model << ", vocabulary " << config.vocab_size << ")\n";
  }

  // What saves of this trainer that a kill (or a full disk) interrupted left behind, before
  // the newest checkpoint is looked for (each removal is logged).
  if (world <= 1 || rank == 0) (*core)->CleanCheckpointRoot();
  if (const std::string resume = absl::GetFlag(FLAGS_resume); resume == "latest" && (world <= 1 || rank == 0)) {
    // (rank 0 loads and the other ranks follow it, as for LoadCheckpoint)
    rlfleet::v1::LoadCheckpointResponse loaded;
    absl::StatusOr<std::string> from = (*core)->ResumeLatest(&loaded);
    if (from.ok()) {
      std::cout << "rlfleet-trainer: resumed from " << *from << " (step " << loaded.step() << ", version "
                << loaded.policy_version().version() << ")" << std::endl;
    } else if (absl::IsNotFound(from.status())) {
      std::cout << "rlfleet-trainer: --resume=latest: " << from.status().message() << "; starting fresh" << std::endl;
    } else {
      std::cerr << "rlfleet-trainer: --resume=latest: " << from.status() << "\n";
      return 2;
    }
  } else if (resume != "latest" && resume != "none") {
    std::cerr << "rlfleet-trainer: --resume=" << resume << ": expected latest or none\n";
    return 2;
  }
  if (publish.data_plane != nullptr) (*core)->PrefaultPublishMemory();
  if (world > 1 && rank > 0) {
    const absl::Status s = (*core)->ServeWorker();
    std::cout << "rlfleet-trainer rank " << rank << " stopped: " << s << std::endl;
    return s.ok() ? 0 : 1;
  }
  std::unique_ptr<rlfleet::trainer::GrpcWeightsSink> weights;
  if (!absl::GetFlag(FLAGS_weights).empty()) {
    auto client_options = rlfleet::rpc::ClientOptionsFromFlags(absl::GetFlag(FLAGS_weights));
    auto channel = client_options.ok() ? rlfleet::rpc::MakeChannel(*client_options) : client_options.status();
    if (!channel.ok()) {
      std::cerr << "rlfleet-trainer: --weights: " << channel.status() << "\n";
      return 2;
    }
    weights = std::make_unique<rlfleet::trainer::GrpcWeightsSink>(*channel, *client_options, "rlfleet-trainer");
  }
  rlfleet::trainer::TrainerServiceImpl service(core->get(), rlfleet::rpc::CallAuthFrom(options->auth), publish,
                                               weights.get());
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  rlfleet::trainer::TrainerCore* c = core->get();
  rlfleet::service::ServeSpec spec;
  spec.binary = "rlfleet-trainer";
  spec.role = rlfleet::v1::REPLICA_ROLE_TRAINER;
  spec.labels = rlfleet::service::NumaLabels(*numa);
  spec.started = [c](rlfleet::rpc::ServerRunner& r) { c->SetConsumerName("trainer@" + r.address()); };
  return rlfleet::service::ServeUntilTerminated(runner, spec);
}
