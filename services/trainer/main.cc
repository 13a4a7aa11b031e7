// rlfleet-trainer: the trainer (one data-parallel rank). Flags + wiring only.
#include <unistd.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "libs/common/config.h"
#include "libs/rpc/server_runner.h"
#include "services/trainer/buffer_client.h"
#include "services/trainer/trainer_core.h"
#include "services/trainer/trainer_service.h"

ABSL_FLAG(int, d_model, 128, "Model width (must match the rollout replicas).");
ABSL_FLAG(int, n_layers, 4, "Transformer blocks.");
ABSL_FLAG(int, n_heads, 4, "Attention heads.");
ABSL_FLAG(int, max_seq_len, 64, "Prompt + response tokens at most.");
ABSL_FLAG(std::string, device, "cpu", "Device: cpu or cuda:N.");
ABSL_FLAG(int, threads, 2, "Compute threads.");
ABSL_FLAG(uint64_t, seed, 1, "Initial weights' seed.");
ABSL_FLAG(bool, value_head, false, "Give the model a value head (the critic PPO's GAE needs).");
ABSL_FLAG(std::string, buffer, "", "Buffer address (host:port) for TrainStep's BufferSource.");
ABSL_FLAG(std::string, publish_dir, "", "PublishWeights writes policy-v<N>.safetensors here (single machine).");

int main(int argc, char** argv) {
  rlfleet::model::PinBlasThreads(argv);
  rlfleet::common::ParseFlagsWithConfig(argc, argv, "rlfleet-trainer: trainer (one rank).");
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-trainer: " << options.status() << "\n";
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
  rlfleet::model::PolicyConfig config;
  config.d_model = absl::GetFlag(FLAGS_d_model);
  config.n_layers = absl::GetFlag(FLAGS_n_layers);
  config.n_heads = absl::GetFlag(FLAGS_n_heads);
  config.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
  config.value_head = absl::GetFlag(FLAGS_value_head);
  auto core = rlfleet::trainer::TrainerCore::Create(config, absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_seed),
                                                    buffer.get());
  if (!core.ok()) {
    std::cerr << "rlfleet-trainer: " << core.status() << "\n";
    return 2;
  }
  rlfleet::trainer::TrainerServiceImpl service(core->get(), rlfleet::rpc::CallAuth{options->auth.token},
                                               absl::GetFlag(FLAGS_publish_dir));
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  if (absl::Status s = runner.Start(); !s.ok()) {
    std::cerr << "rlfleet-trainer: " << s << "\n";
    return 1;
  }
  std::cout << "rlfleet-trainer listening on " << runner.address() << std::endl;
  const int signo = runner.WaitForTermination();
  std::cout << "rlfleet-trainer stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}
