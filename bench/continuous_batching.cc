// continuous_batching: the rollout's scheduler (services/rollout RolloutCore, in
// process: no gRPC) under load from --clients concurrent callers, each sending one
// request after another (GenerateBatch: one prompt, one sample, a response length drawn
// from --min_new..--max_new, ignore_eos so every length is exact), against the same
// requests in waves of --clients (each wave waits for its longest response before the
// next starts: static batching, what a trainer-side generate() loop does), on the same
// replica in the same run. A third row runs waves of equal lengths (the mean): the
// engine's rate with every row busy, the ceiling for continuous batching.
// Tokens/s = response tokens / wall time; medians of per-request latency in the
// continuous mode. Best of --rounds per mode, alternating. Writes a table to --out; last
// lines:
//   continuous_over_static=<tokens/s, continuous / static waves>
//   continuous_over_full_batch=<tokens/s, continuous / equal-length waves>
//   bazel run -c opt //bench:continuous_batching -- --out=$PWD/bench/results/continuous_batching_cpu.md
//   on the GPU host: continuous_batching --device=cuda:0 --clients=256 --requests=2048 --max_new=256 ...
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "libs/model/policy.h"
#include "services/rollout/rollout_core.h"

ABSL_FLAG(std::string, out, "continuous_batching.md", "Where the results table is written.");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda, cuda:N.");
ABSL_FLAG(std::string, dtype, "fp32", "The replica's weights and KV cache: fp32, bf16, fp16 (CUDA).");
ABSL_FLAG(int, clients, 32, "Concurrent callers (and the static waves' size); at most 256.");
ABSL_FLAG(int, requests, 256, "Requests per mode (one prompt, one sample each).");
ABSL_FLAG(int, min_new, 8, "Shortest response, in tokens.");
ABSL_FLAG(int, max_new, 96, "Longest response, in tokens.");
ABSL_FLAG(int, prompt, 16, "Prompt tokens.");
ABSL_FLAG(int, d_model, 128, "The policy's width (4 layers, d_model / 32 heads, vocabulary 32).");
ABSL_FLAG(int, layers, 4, "The policy's layers.");
ABSL_FLAG(int, rounds, 2, "Rounds alternating the modes; the best of each is kept.");
ABSL_FLAG(int, threads, 2, "Intra-op threads (CPU).");
ABSL_FLAG(int, join_group, 0, "RolloutLimits::join_group (0: the default, max_batch / 8; 1: each joins at once).");
ABSL_FLAG(int, join_wait_steps, 8, "RolloutLimits::join_wait_steps.");

namespace {

using rlfleet::rollout::RolloutCore;

struct Result {
  double tokens_per_s = 0, wall_s = 0, p50_ms = 0, p99_ms = 0;
  double busy = 0;  // the scheduler thread's busy fraction (GetInfo's utilization over the mode)
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// One request of `length` response tokens; its latency in ms, or -1 on an error (said).
double Request(RolloutCore& core, int index, int length, int prompt_tokens) {
  rlfleet::v1::GenerateBatchRequest request;
  request.set_request_id(absl::StrCat("cb-", index));
  auto* p = request.add_prompts();
  p->set_prompt_id(absl::StrCat(index));
  for (int i = 0; i < prompt_tokens; ++i) p->add_prompt_token_ids(4 + (index + i) % 28);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_max_new_tokens(length);
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->set_seed(index);
  rlfleet::v1::GenerateBatchResponse response;
  const absl::Time start = absl::Now();
  if (absl::Status s = core.GenerateBatch(request, &response); !s.ok()) {
    std::cerr << "continuous_batching: request " << index << ": " << s << "\n";
    return -1;
  }
  if (response.generated_tokens() != static_cast<uint64_t>(length)) {
    std::cerr << "continuous_batching: request " << index << " generated " << response.generated_tokens()
              << " tokens, asked " << length << "\n";
    return -1;
  }
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

// Every request of `lengths`: `continuous`, by `clients` callers each taking the next
// request as its last one returns; else in waves of `clients`, each wave waiting for
// all of its requests. False on an error.
bool Run(RolloutCore& core, const std::vector<int>& lengths, int clients, bool continuous, int prompt_tokens,
         Result* result) {
  const int n = static_cast<int>(lengths.size());
  std::vector<double> latency(n, 0);
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const absl::Time start = absl::Now();
  if (continuous) {
    std::vector<std::thread> callers;
    for (int c = 0; c < clients; ++c) {
      callers.emplace_back([&] {
        for (int i = next.fetch_add(1); i < n && !failed; i = next.fetch_add(1)) {
          latency[i] = Request(core, i, lengths[i], prompt_tokens);
          if (latency[i] < 0) failed = true;
        }
      });
    }
    for (auto& t : callers) t.join();
  } else {
    for (int wave = 0; wave < n && !failed; wave += clients) {
      std::vector<std::thread> callers;
      for (int i = wave; i < std::min(n, wave + clients); ++i) {
        callers.emplace_back([&, i] {
          latency[i] = Request(core, i, lengths[i], prompt_tokens);
          if (latency[i] < 0) failed = true;
        });
      }
      for (auto& t : callers) t.join();
    }
  }
  if (failed) return false;
  result->wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  result->tokens_per_s = std::accumulate(lengths.begin(), lengths.end(), 0.0) / result->wall_s;
  result->p50_ms = Percentile(latency, 0.5);
  result->p99_ms = Percentile(latency, 0.99);
  rlfleet::v1::GetInfoResponse info;  // (its window: since the last call at least 1 s before, i.e. this mode)
  if (core.GetInfo(&info).ok()) result->busy = info.load().utilization();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // (as the services' mains run)
  rlfleet::model::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  const int clients = absl::GetFlag(FLAGS_clients), requests = absl::GetFlag(FLAGS_requests);
  const int min_new = absl::GetFlag(FLAGS_min_new), max_new = absl::GetFlag(FLAGS_max_new);
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt);
  if (clients < 1 || clients > 256 || requests < clients || min_new < 1 || max_new < min_new || prompt_tokens < 1) {
    std::cerr << "continuous_batching: want 1 <= --clients <= 256 <= ... --requests >= --clients, "
                 "1 <= --min_new <= --max_new, --prompt >= 1\n";
    return 2;
  }
  rlfleet::model::PolicyConfig config;
  config.vocab_size = 32;
  config.d_model = absl::GetFlag(FLAGS_d_model);
  config.n_layers = absl::GetFlag(FLAGS_layers);
  config.n_heads = std::max(1, config.d_model / 32);
  config.max_seq_len = prompt_tokens + max_new;
  config.dtype = absl::GetFlag(FLAGS_dtype);
  rlfleet::rollout::RolloutLimits limits;
  limits.max_batch = clients;
  limits.max_new_tokens = std::max(limits.max_new_tokens, max_new);
  limits.join_group = absl::GetFlag(FLAGS_join_group);
  limits.join_wait_steps = absl::GetFlag(FLAGS_join_wait_steps);
  const std::string device = absl::GetFlag(FLAGS_device);
  auto core = RolloutCore::Create(config, device, limits);
  if (!core.ok()) {
    std::cerr << "continuous_batching: " << core.status() << "\n";
    return 1;
  }
  if (absl::Status s = (*core)->InstallInitial(1); !s.ok()) {
    std::cerr << "continuous_batching: " << s << "\n";
    return 1;
  }
  absl::BitGen gen;
  std::vector<int> lengths(requests), equal(requests);
  for (int& l : lengths) l = absl::Uniform<int>(absl::IntervalClosed, gen, min_new, max_new);
  const int mean = static_cast<int>(std::lround(std::accumulate(lengths.begin(), lengths.end(), 0.0) / requests));
  std::fill(equal.begin(), equal.end(), mean);
  // (a warm-up: the full batch's decode graph captured, memory in place; smaller buckets
  // are captured in the first round, alike for every mode)
  Result warm;
  if (!Run(**core, std::vector<int>(clients, min_new), clients, false, prompt_tokens, &warm)) return 1;
  absl::SleepFor(absl::Seconds(1));  // (so that the first mode's GetInfo window starts after the warm-up)
  rlfleet::v1::GetInfoResponse reset;
  (void)(*core)->GetInfo(&reset);
  Result continuous, waves, full;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    Result r;
    if (!Run(**core, lengths, clients, true, prompt_tokens, &r)) return 1;
    if (r.tokens_per_s > continuous.tokens_per_s) continuous = r;
    if (!Run(**core, lengths, clients, false, prompt_tokens, &r)) return 1;
    if (r.tokens_per_s > waves.tokens_per_s) waves = r;
    if (!Run(**core, equal, clients, false, prompt_tokens, &r)) return 1;
    if (r.tokens_per_s > full.tokens_per_s) full = r;
    std::cerr << absl::StrFormat("round %d: continuous %.0f, static waves %.0f, equal-length waves %.0f tokens/s\n",
                                 round, continuous.tokens_per_s, waves.tokens_per_s, full.tokens_per_s);
  }
  std::string table = absl::StrCat(
      "# continuous_batching: the rollout's scheduler under concurrent load vs static waves\n\n", "device ", device,
      " (", rlfleet::model::ModelBackend(), ", decode ", (*core)->decode_mode(), "), CPU ", rlfleet::bench::CpuModel(),
      "\n",
      absl::StrFormat("policy d_model %d, %d layers, %s; %d requests of one prompt (%d tokens) and one sample, "
                      "responses %d..%d tokens (mean %d, ignore_eos); %d callers; join_group %d, join_wait_steps %d; "
                      "best of %d rounds\n\n",
                      config.d_model, config.n_layers, config.dtype, requests, prompt_tokens, min_new, max_new, mean,
                      clients, limits.join_group, limits.join_wait_steps, absl::GetFlag(FLAGS_rounds)),
      "| mode | tokens/s | wall s | request p50 ms | request p99 ms | scheduler busy "
      "|\n|---|---:|---:|---:|---:|---:|\n");
  auto row = [&](const char* name, const Result& r) {
    absl::StrAppendFormat(&table, "| %s | %.0f | %.2f | %.1f | %.1f | %.2f |\n", name, r.tokens_per_s, r.wall_s,
                          r.p50_ms, r.p99_ms, r.busy);
  };
  row("continuous (each caller's next request joins as its last finishes)", continuous);
  row("static waves (each waits for its longest response)", waves);
  row("equal-length waves (every row busy: the ceiling)", full);
  absl::StrAppendFormat(&table, "\ncontinuous_over_static=%.3f\ncontinuous_over_full_batch=%.3f\n",
                        continuous.tokens_per_s / waves.tokens_per_s, continuous.tokens_per_s / full.tokens_per_s);
  std::ofstream(absl::GetFlag(FLAGS_out)) << table;
  std::cout << table;
  return 0;
}
