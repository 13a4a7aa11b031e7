// learn_local: the RL loop's math end to end in one process, with the real components
// (libs/model Policy generate + TrainStep, services/reward RewardCore, services/buffer
// BufferCore, GRPO advantages): GRPO on the reverse task until held-out greedy exact
// match reaches --target or --max_seconds pass. Prints a curve and writes it to --out;
// last line: learn_local_seconds_to_target=<s> (or "not reached").
// DESIGN.md's PyTorch GRPO loop reached 1.0 on reverse n=3..5 in 110-122 s here.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/model/policy.h"
#include "libs/model/tokenizer.h"
#include "libs/tasks/tasks.h"
#include "services/buffer/buffer_core.h"
#include "services/reward/reward_core.h"

ABSL_FLAG(std::string, task, "reverse", "Built-in task.");
ABSL_FLAG(int, min_len, 3, "Shortest input.");
ABSL_FLAG(int, max_len, 5, "Longest input.");
ABSL_FLAG(int, prompts, 32, "Prompts (groups) per step.");
ABSL_FLAG(int, samples, 8, "Samples per prompt (group size).");
ABSL_FLAG(double, lr, 5e-4, "AdamW learning rate.");
ABSL_FLAG(int, epochs, 2, "PPO epochs per batch.");
ABSL_FLAG(double, entropy_coef, 0.0, "Entropy bonus weight.");
ABSL_FLAG(double, target, 0.9, "Held-out greedy exact match to reach.");
ABSL_FLAG(int, max_seconds, 300, "Time budget.");
ABSL_FLAG(int, threads, 2, "Compute threads.");
ABSL_FLAG(std::string, out, "learn_local.md", "Where the curve is written.");

namespace v1 = rlfleet::v1;
using rlfleet::model::Tokenizer;

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  rlfleet::model::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  const rlfleet::tasks::Task* task = rlfleet::tasks::FindTask(absl::GetFlag(FLAGS_task));
  if (task == nullptr) return 2;
  const rlfleet::tasks::TaskOptions lengths{absl::GetFlag(FLAGS_min_len), absl::GetFlag(FLAGS_max_len)};
  rlfleet::model::PolicyConfig config;  // d 128, 4 layers, 4 heads (DESIGN.md's 0.8M model)
  config.max_seq_len = 32;
  auto policy = rlfleet::model::Policy::Create(config, "cpu", 1);
  if (!policy.ok()) return 1;
  rlfleet::reward::RewardCore reward;
  rlfleet::buffer::BufferCore buffer;
  v1::ConfigureRequest bc;
  bc.set_group_size(absl::GetFlag(FLAGS_samples));
  bc.set_filter_zero_variance(true);
  v1::ConfigureResponse bcr;
  if (!buffer.Configure(bc, &bcr).ok()) return 1;

  absl::BitGen gen(std::seed_seq{7});
  std::vector<rlfleet::tasks::Example> held_out;
  for (int i = 0; i < 128; ++i) held_out.push_back(task->Make(gen, lengths));
  auto evaluate = [&]() {
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& e : held_out) prompts.push_back(*Tokenizer::EncodePrompt(e.prompt));
    rlfleet::model::SamplingOptions greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = absl::GetFlag(FLAGS_max_len) + 3;
    auto out = (*policy)->Generate(prompts, greedy);
    int exact = 0;
    for (size_t i = 0; i < held_out.size(); ++i) {
      exact += Tokenizer::DecodeResponse((*out)[i].tokens) == held_out[i].answer;
    }
    return static_cast<double>(exact) / held_out.size();
  };

  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# learn_local: GRPO on " << task->name() << " n=" << lengths.min_len << ".." << lengths.max_len << ", "
      << absl::GetFlag(FLAGS_prompts) << " prompts x " << absl::GetFlag(FLAGS_samples) << " samples, lr "
      << absl::GetFlag(FLAGS_lr) << ", " << absl::GetFlag(FLAGS_epochs) << " PPO epochs, d_model 128, 4 layers\n\n"
      << "| step | seconds | train reward | held-out exact match |\n|---:|---:|---:|---:|\n";
  const absl::Time start = absl::Now();
  double reached = -1;
  rlfleet::model::TrainOptions train;
  train.learning_rate = absl::GetFlag(FLAGS_lr);
  train.epochs = absl::GetFlag(FLAGS_epochs);
  train.entropy_coef = absl::GetFlag(FLAGS_entropy_coef);
  for (int step = 1; absl::Now() - start < absl::Seconds(absl::GetFlag(FLAGS_max_seconds)); ++step) {
    // Rollout.
    std::vector<rlfleet::tasks::Example> examples;
    std::vector<std::vector<int32_t>> prompts;
    for (int p = 0; p < absl::GetFlag(FLAGS_prompts); ++p) {
      examples.push_back(task->Make(gen, lengths));
      for (int s = 0; s < absl::GetFlag(FLAGS_samples); ++s) {
        prompts.push_back(*Tokenizer::EncodePrompt(examples.back().prompt));
      }
    }
    rlfleet::model::SamplingOptions sampling;
    sampling.max_new_tokens = absl::GetFlag(FLAGS_max_len) + 3;
    sampling.seed = step;
    auto gens = (*policy)->Generate(prompts, sampling);
    if (!gens.ok()) return 1;
    // Reward.
    v1::ScoreRequest score;
    for (size_t i = 0; i < gens->size(); ++i) {
      v1::ScoreItem* item = score.add_items();
      item->set_task(task->name());
      item->set_prompt_text(examples[i / absl::GetFlag(FLAGS_samples)].prompt);
      item->set_response_text(Tokenizer::DecodeResponse((*gens)[i].tokens));
    }
    v1::ScoreResponse scored;
    if (!reward.Score(score, &scored).ok()) return 1;
    // Buffer: groups, zero-variance filter.
    v1::PutExperiencesRequest put;
    double reward_sum = 0;
    for (size_t i = 0; i < gens->size(); ++i) {
      v1::Experience* e = put.add_experiences();
      e->mutable_experience_id()->set_value(absl::StrCat("s", step, "-", i));
      e->set_group_id(absl::StrCat("s", step, "-g", i / absl::GetFlag(FLAGS_samples)));
      for (int32_t t : prompts[i]) e->add_prompt_token_ids(t);
      for (size_t j = 0; j < (*gens)[i].tokens.size(); ++j) {
        e->add_response_token_ids((*gens)[i].tokens[j]);
        e->add_response_logprobs((*gens)[i].logprobs[j]);
        e->add_token_policy_versions(step);
      }
      e->set_reward(scored.results(i).reward());
      reward_sum += scored.results(i).reward();
    }
    v1::PutExperiencesResponse put_response;
    if (!buffer.Put(put, &put_response).ok()) return 1;
    v1::SampleBatchRequest sample;
    sample.set_num_groups(absl::GetFlag(FLAGS_prompts));
    sample.set_current_policy_version(step);
    v1::SampleBatchResponse batch;
    if (!buffer.SampleBatch(sample, &batch).ok()) return 1;
    // Train on the surviving groups with GRPO advantages.
    std::vector<rlfleet::model::TrainSequence> seqs;
    for (const v1::ExperienceGroup& g : batch.groups()) {
      for (const v1::Experience& e : g.experiences()) {
        rlfleet::model::TrainSequence s;
        s.prompt.assign(e.prompt_token_ids().begin(), e.prompt_token_ids().end());
        s.response.assign(e.response_token_ids().begin(), e.response_token_ids().end());
        s.behaviour_logprobs.assign(e.response_logprobs().begin(), e.response_logprobs().end());
        s.advantage = (e.reward() - g.reward_mean()) / (g.reward_std() + 1e-6f);
        seqs.push_back(std::move(s));
      }
    }
    if (!seqs.empty()) {
      auto stats = (*policy)->TrainStep(seqs, train);
      if (!stats.ok()) {
        std::cerr << stats.status() << "\n";
        return 1;
      }
    }
    v1::AckBatchRequest ack;
    ack.set_lease_id(batch.lease_id());
    v1::AckBatchResponse acked;
    if (!batch.lease_id().empty()) (void)buffer.Ack(ack, &acked);
    if (step % 10 == 0) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      const double exact = evaluate();
      const double mean_reward = reward_sum / gens->size();
      std::cout << absl::StrFormat("step %4d  %6.1f s  train reward %.3f  held-out exact %.3f  (%zu groups trained)\n",
                                   step, seconds, mean_reward, exact, batch.groups().size())
                << std::flush;
      out << absl::StrFormat("| %d | %.1f | %.3f | %.3f |\n", step, seconds, mean_reward, exact);
      if (exact >= absl::GetFlag(FLAGS_target)) {
        reached = seconds;
        break;
      }
    }
  }
  const std::string result = reached >= 0 ? absl::StrFormat("%.1f", reached) : "not reached";
  out << "\nlearn_local_seconds_to_target=" << result << " (target " << absl::GetFlag(FLAGS_target) << ")\n";
  std::cout << "learn_local_seconds_to_target=" << result << std::endl;
  return 0;
}
