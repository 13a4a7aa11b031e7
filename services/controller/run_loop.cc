#include "services/controller/run_loop.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/metrics/metrics.h"
#include "libs/tasks/tasks.h"
#include "services/controller/prompt_source.h"
#include "services/controller/tool_episodes.h"

namespace rlfleet::controller {
namespace {

// Reward standard deviation at or below which a group has no learning signal (what the
// loop configures the buffer with).
constexpr float kZeroVarianceEpsilon = 1e-6f;
// Longest task input (digits) and response a run may ask for.
constexpr int kMaxTaskLen = 64;
constexpr int kMaxNewTokens = 4096;

// Weight sync end to end, as the Prometheus histogram (sync runs and pipelined installs).
metrics::Histogram* WeightSyncMetric() {
  static metrics::Histogram* metric = metrics::Global().AddHistogram(
      "rlfleet_weight_sync_seconds", "Weight sync end to end: PublishWeights until every replica installed.", {});
  return metric;
}

// Periodic checkpoints that failed, as the Prometheus counter.
metrics::Counter* CheckpointFailureMetric() {
  static metrics::Counter* metric =
      metrics::Global().AddCounter("rlfleet_checkpoint_failures_total",
                                   "Periodic checkpoints that failed (the run went on; the next interval saves).", {});
  return metric;
}

// Calls `call` again while it answers UNAVAILABLE (a peer restarting: its supervisor
// brings it back on the same address), with back-off, until config.unavailable_retry
// has passed or `stop` is set; returns its last answer. *retried: whether it was called
// more than once (an earlier attempt may have landed).
absl::Status RetryUnavailable(const LoopConfig& config, const std::atomic<bool>& stop,
                              const std::function<absl::Status()>& call, bool* retried = nullptr) {
  const absl::Time begin = absl::Now();
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Status s = call();
  if (retried != nullptr) *retried = false;
  while (absl::IsUnavailable(s) && !stop.load() && absl::Now() + backoff - begin <= config.unavailable_retry) {
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
    if (retried != nullptr) *retried = true;
    s = call();
  }
  return s;
}

// Generates for `examples` and scores the completions with the reward service.
absl::Status RolloutAndScore(const LoopConfig& config, const std::atomic<bool>& stop, RolloutPool& rollout,
                             RewardPeer& reward, const PromptSource& source, const std::vector<RunPrompt>& examples,
                             int samples, float temperature, uint64_t seed, const std::string& request_id,
                             v1::GenerateBatchResponse* out, v1::ScoreResponse* scored, int min_prompts_per_call = 1) {
  v1::GenerateBatchRequest gen;
  gen.set_request_id(request_id);
  gen.set_num_samples(samples);
  gen.mutable_sampling()->set_temperature(temperature);
  gen.mutable_sampling()->set_max_new_tokens(config.max_new_tokens > 0 ? config.max_new_tokens
                                                                       : source.default_max_new_tokens());
  gen.mutable_sampling()->set_seed(seed);
  for (size_t i = 0; i < examples.size(); ++i) {
    v1::BatchPrompt* p = gen.add_prompts();
    // (a prompt id is bounded: a dataset's prompt text may be long)
    p->set_prompt_id(examples[i].text.size() <= 120 ? examples[i].text : absl::StrCat(request_id, "-p", i));
    p->set_group_id(absl::StrCat(request_id, "-g", i));
    p->set_task(source.task());
    for (int32_t t : examples[i].ids) p->add_prompt_token_ids(t);
  }
  // (no replica left: one may be admitted meanwhile, e.g. the launcher's replacement)
  auto generate = [&](const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response) {
    return common::Annotate(RetryUnavailable(config, stop,
                                             [&] {
                                               response->Clear();
                                               return rollout.Generate(request, response, min_prompts_per_call);
                                             }),
                            "GenerateBatch");
  };
  if (source.tools() != nullptr) {
    RETURN_IF_ERROR(GenerateEpisodes(*source.tools(), gen, generate, out));
  } else {
    RETURN_IF_ERROR(generate(gen, out));
  }
  v1::ScoreRequest score;
  for (int i = 0; i < out->completions_size(); ++i) {
    const v1::Experience& e = out->completions(i);
    v1::ScoreItem* item = score.add_items();
    item->set_task(e.task());
    item->set_prompt_text(examples[i / samples].text);
    item->set_reference_answer(examples[i / samples].answer);
    ASSIGN_OR_RETURN(std::string response,
                     source.Decode({e.response_token_ids().begin(), e.response_token_ids().end()}));
    item->set_response_text(std::move(response));
  }
  RETURN_IF_ERROR(common::Annotate(RetryUnavailable(config, stop,
                                                    [&] {
                                                      scored->Clear();
                                                      return reward.Score(score, scored);
                                                    }),
                                   "Score"));
  if (scored->results_size() != score.items_size()) {
    return absl::InternalError(absl::StrCat("Score: the reward service returned ", scored->results_size(),
                                            " results for ", score.items_size(), " items"));
  }
  return absl::OkStatus();
}

// Puts experiences into the buffer (UNAVAILABLE retried as RetryUnavailable does) and
// returns how many it stored: those it accepted, and its duplicates when an earlier
// attempt may have stored them (a retry of this put, or `earlier_attempt`: a resumed
// run's first step). FAILED_PRECONDITION with the buffer's first reasons when it stored
// none. *reply: the buffer's last answer.
absl::StatusOr<uint64_t> StoreExperiences(const LoopConfig& config, const std::atomic<bool>& stop, BufferPeer& buffer,
                                          const v1::PutExperiencesRequest& put, bool earlier_attempt,
                                          v1::PutExperiencesResponse* reply) {
  bool retried = false;
  RETURN_IF_ERROR(common::Annotate(RetryUnavailable(
                                       config, stop,
                                       [&] {
                                         reply->Clear();
                                         return buffer.PutExperiences(put, reply);
                                       },
                                       &retried),
                                   "PutExperiences"));
  const uint64_t stored = reply->accepted() + (retried || earlier_attempt ? reply->duplicates() : 0);
  if (stored == 0 && put.experiences_size() > 0) {
    const v1::PutExperiencesResponse& r = *reply;
    std::string why =
        absl::StrCat("the buffer accepted none of them (", r.duplicates(), " duplicates, ", r.rejected(), " rejected");
    if (r.rejections_size() > 0) absl::StrAppend(&why, "; first: ", r.rejections(0).ShortDebugString());
    return absl::FailedPreconditionError(
        absl::StrCat("PutExperiences: ", put.experiences_size(), " experiences, ", why, ")"));
  }
  return stored;
}

uint64_t VersionOf(const v1::GenerateBatchResponse& r) {
  return r.completions_size() > 0 && r.completions(0).token_policy_versions_size() > 0
             ? r.completions(0).token_policy_versions(0)
             : 0;
}

// The version a PublishWeights answer names, as the replicas install it.
v1::PrepareWeightsRequest UpdateFor(const v1::PublishWeightsResponse& published) {
  v1::PrepareWeightsRequest update;
  *update.mutable_manifest() = published.manifest();
  *update.add_chunks()->mutable_source() = published.location();
  // (replicas on CUDA devices of the trainer's host take it GPU to GPU from here)
  if (published.has_device_image()) *update.mutable_device_image() = published.device_image();
  return update;
}

// How many groups of `samples` consecutive rewards vary (the buffer drops groups whose
// rewards are all equal: nothing to learn from them).
int SignalGroups(const v1::PutExperiencesRequest& put, int samples) {
  int n = 0;
  for (int g = 0; g + samples <= put.experiences_size(); g += samples) {
    double sum = 0, sq = 0;
    for (int i = g; i < g + samples; ++i) {
      sum += put.experiences(i).reward();
      sq += static_cast<double>(put.experiences(i).reward()) * put.experiences(i).reward();
    }
    const double mean = sum / samples;
    n += std::sqrt(std::max(0.0, sq / samples - mean * mean)) > kZeroVarianceEpsilon;
  }
  return n;
}

bool HasLearningSignal(const v1::PutExperiencesRequest& put, int samples) { return SignalGroups(put, samples) > 0; }

// The scored completions as experiences for the buffer; returns their reward sum.
double ScoredExperiences(const LoopConfig& config, const v1::GenerateBatchResponse& generated,
                         const v1::ScoreResponse& scored, v1::PutExperiencesRequest* put) {
  put->set_run_id(config.run_id);
  put->set_producer_id("controller");
  double reward_sum = 0;
  for (int i = 0; i < generated.completions_size(); ++i) {
    v1::Experience* e = put->add_experiences();
    *e = generated.completions(i);
    e->set_reward(scored.results(i).reward());
    reward_sum += e->reward();
  }
  return reward_sum;
}

// A GRPO step on up to config.prompts groups from the buffer.
v1::TrainStepRequest TrainRequest(const LoopConfig& config) {
  v1::TrainStepRequest train;
  train.mutable_buffer()->set_num_groups(config.prompts);
  train.mutable_buffer()->set_min_groups(1);
  if (config.max_staleness > 0) train.mutable_buffer()->set_max_staleness(config.max_staleness);
  train.mutable_params()->set_algorithm(v1::ALGORITHM_GRPO);
  train.mutable_params()->set_ppo_epochs(config.ppo_epochs);
  train.mutable_params()->set_clip_ratio(static_cast<float>(config.clip_ratio));
  train.mutable_params()->set_clip_ratio_high(static_cast<float>(config.clip_ratio_high));
  train.mutable_params()->set_entropy_coef(static_cast<float>(config.entropy_coef));
  train.mutable_params()->mutable_optimizer()->set_learning_rate(static_cast<float>(config.lr));
  train.mutable_params()->mutable_optimizer()->set_grad_clip_norm(1.0f);
  return train;
}

void TakeTrainMetrics(const v1::TrainStepResponse& trained, LoopProgress* progress) {
  progress->entropy = trained.metrics().entropy();
  progress->loss = trained.metrics().loss();
  progress->approx_kl = trained.metrics().approx_kl_old();
  progress->grad_norm = trained.metrics().grad_norm();
  progress->mean_staleness = trained.metrics().mean_staleness();
  progress->trained_sequences += trained.metrics().sequences();
}

// Held-out greedy evaluation: progress->held_out_exact and the version it ran on.
absl::Status Evaluate(const LoopConfig& config, const std::atomic<bool>& stop, RolloutPool& rollout, RewardPeer& reward,
                      const PromptSource& source, int step, LoopProgress* progress) {
  v1::GenerateBatchResponse eval;
  v1::ScoreResponse eval_scored;
  RETURN_IF_ERROR(RolloutAndScore(config, stop, rollout, reward, source, source.held_out(), 1, 0.0f, 0,
                                  absl::StrCat("eval", step), &eval, &eval_scored));
  int exact = 0;
  for (const auto& r : eval_scored.results()) exact += r.reward() >= 1.0f;
  progress->held_out_exact = static_cast<double>(exact) / source.held_out().size();
  progress->policy_version = VersionOf(eval);
  return absl::OkStatus();
}

// What the fully asynchronous steps share with RunLoop.
struct StreamContext {
  const LoopConfig& config;
  const std::atomic<bool>& stop;
  RolloutPool& rollout;
  RewardPeer& reward;
  BufferPeer& buffer;
  TrainerPeer& trainer;
  PromptSource& source;
  const std::string& tag;
  const std::string& name;
  // Publishes the trainer's weights (asking for at least the version given) and
  // installs them on the replicas; the newest version installed and the time it took.
  const std::function<absl::Status(uint64_t)>& publish;
  // The trainer's part of it alone: the version to install.
  const std::function<absl::StatusOr<v1::PrepareWeightsRequest>(uint64_t)>& publish_only;
  uint64_t& installed;
  const double& sync_seconds;
  const std::function<void(const LoopProgress&)>& on_progress;
  absl::Time start;
  int first_step;
};

// LoopConfig::fully_async: producer threads generate, score and put groups without a
// step barrier while this thread trains, publishes and evaluates. Step s's prompts are
// groups (s-1)*prompts .. s*prompts-1 of the prompt sequence; producers take them in
// chunks in order and may run up to config.max_staleness steps ahead of the last step
// the trainer finished; step s trains once all of its groups are in the buffer (on up
// to config.prompts groups, the oldest first: the buffer's order), and the version it
// publishes installs on the replicas mid-generation.
// A periodic checkpoint at `step`. One that fails (a full disk, a trainer that cannot
// write) is logged and counted, and the run goes on: the next interval saves again,
// and checkpointed_step stays as it was so that the save at the end is made.
void PeriodicCheckpoint(TrainerPeer& trainer, const LoopConfig& config, const std::atomic<bool>& stop,
                        const std::string& name, int step, LoopProgress& progress, int& checkpointed_step) {
  const absl::StatusOr<std::string> saved = SaveStepCheckpoint(trainer, config, stop, name, step);
  if (saved.ok()) {
    progress.last_checkpoint = *saved;
    checkpointed_step = step;
    return;
  }
  ++progress.failed_checkpoints;
  CheckpointFailureMetric()->Add();
  std::cerr << "rlfleet-controller: step " << step << ": checkpoint failed (" << progress.failed_checkpoints
            << " so far; the run goes on and saves again at the next interval): " << saved.status().message()
            << std::endl;
}

absl::Status StreamSteps(const StreamContext& c, LoopProgress& progress, int& checkpointed_step, bool& reached_target) {
  const LoopConfig& config = c.config;
  const int64_t prompts = config.prompts;
  const int64_t end_group = static_cast<int64_t>(config.steps) * prompts;  // (steps may be INT_MAX)
  struct StepData {
    int64_t put_groups = 0;
    int64_t signal_groups = 0;
    int64_t samples = 0;
    double reward_sum = 0;
    uint64_t tokens = 0;
    uint64_t oldest_version = std::numeric_limits<uint64_t>::max();
    uint64_t stored = 0;
  };
  absl::Mutex mu;
  int64_t next_group = static_cast<int64_t>(c.first_step - 1) * prompts;
  int finished_step = c.first_step - 1;  // the last step the trainer finished (trained or idle)
  std::map<int, StepData> steps;
  int64_t untrained_signal = 0;  // groups with a learning signal put and not trained yet
  absl::Status fatal;
  bool finished = false;
  const int workers = std::clamp(2 * c.rollout.live(), 2, 64);
  const int64_t chunk = std::max<int64_t>(1, (prompts + workers - 1) / workers);
  auto producer = [&] {
    while (true) {
      int64_t begin = 0, count = 0;
      int step = 0;
      std::vector<RunPrompt> examples;
      {
        absl::MutexLock lock(&mu);
        auto can_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return finished || !fatal.ok() || next_group >= end_group ||
                 next_group / prompts < finished_step + 1 + config.max_staleness;
        };
        while (!mu.AwaitWithTimeout(absl::Condition(&can_go), absl::Milliseconds(200))) {
          if (c.stop.load()) return;
        }
        if (finished || !fatal.ok() || next_group >= end_group || c.stop.load()) return;
        begin = next_group;
        step = static_cast<int>(begin / prompts) + 1;
        count = std::min(chunk, static_cast<int64_t>(step) * prompts - begin);
        next_group += count;
        examples = c.source.Next(static_cast<int>(count));  // (in order: under mu)
      }
      const uint64_t seed =
          config.seed * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull * static_cast<uint64_t>(begin + 1);
      v1::GenerateBatchResponse generated;
      v1::ScoreResponse scored;
      v1::PutExperiencesRequest put;
      v1::PutExperiencesResponse put_reply;
      double reward_sum = 0;
      uint64_t stored = 0;
      absl::Status s = RolloutAndScore(config, c.stop, c.rollout, c.reward, c.source, examples, config.samples,
                                       static_cast<float>(config.temperature), seed, absl::StrCat(c.tag, "-g", begin),
                                       &generated, &scored, static_cast<int>(count));
      if (s.ok()) {
        reward_sum = ScoredExperiences(config, generated, scored, &put);
        absl::StatusOr<uint64_t> stored_or =
            StoreExperiences(config, c.stop, c.buffer, put, /*earlier_attempt=*/false, &put_reply);
        s = stored_or.status();
        if (s.ok()) stored = *stored_or;
      }
      absl::MutexLock lock(&mu);
      if (!s.ok()) {
        if (!c.stop.load() && fatal.ok()) fatal = common::Annotate(s, absl::StrCat("step ", step));
        return;
      }
      StepData& d = steps[step];
      const int signal = SignalGroups(put, config.samples);
      d.put_groups += count;
      d.signal_groups += signal;
      d.samples += put.experiences_size();
      d.reward_sum += reward_sum;
      d.stored += stored;
      for (const v1::Experience& e : put.experiences()) {
        d.tokens += e.response_token_ids_size();
        for (uint64_t v : e.token_policy_versions()) d.oldest_version = std::min(d.oldest_version, v);
      }
      untrained_signal += signal;
    }
  };
  // Pipelined installs: the version a step publishes installs on the replicas while the
  // next step trains (the trainer's copy of it is its own: PublishWeights returned). One
  // install at a time: it is joined before the next publish and before an evaluation.
  // The step counts as finished for the producers once its version is installed.
  std::thread installing;
  absl::Status install_status;  // (written by `installing`, read after it is joined)
  uint64_t install_version = 0;
  int install_step = 0;
  auto join_install = [&]() -> absl::Status {
    if (!installing.joinable()) return absl::OkStatus();
    installing.join();
    if (install_status.ok()) {
      c.installed = std::max(c.installed, install_version);
      return absl::OkStatus();
    }
    if (!absl::IsUnavailable(install_status)) return install_status;
    // (the weights service restarted and lost the version, or the replicas are gone for
    // now: publish the trainer's weights again and install them, retried as a sync run does)
    RETURN_IF_ERROR(c.publish(c.installed + 1));
    absl::MutexLock lock(&mu);
    finished_step = std::max(finished_step, install_step);
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(producer);
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{[&] {
    {
      absl::MutexLock lock(&mu);
      finished = true;
    }
    for (auto& t : threads) t.join();
    threads.clear();
    if (installing.joinable()) installing.join();
  }};
  absl::Time last_step_end = absl::Now();
  for (int step = c.first_step; step <= config.steps && !c.stop.load(); ++step) {
    auto at_step = [&](const absl::Status& s) { return common::Annotate(s, absl::StrCat("step ", step)); };
    const absl::Time wait_begin = absl::Now();
    StepData data;
    int64_t signal = 0;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        auto it = steps.find(step);
        return !fatal.ok() || (it != steps.end() && it->second.put_groups >= prompts);
      };
      while (!mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200))) {
        if (c.stop.load()) return absl::OkStatus();
      }
      if (!fatal.ok()) return fatal;
      data = steps[step];
      steps.erase(step);
      signal = untrained_signal;
    }
    progress.generate_seconds = absl::ToDoubleSeconds(absl::Now() - wait_begin);  // the trainer's wait for rollouts
    progress.accepted_experiences += data.stored;
    progress.train_seconds = 0;
    progress.sync_seconds = 0;
    bool trained = false;
    if (signal > 0) {
      const v1::TrainStepRequest train = TrainRequest(config);
      v1::TrainStepResponse reply;
      bool nothing_held = false;
      const absl::Time train_begin = absl::Now();
      // UNAVAILABLE: the trainer is restarting, or the buffer has nothing for it (its
      // groups were too stale, or an attempt whose reply was lost consumed them). The
      // buffer's count tells which; the former is retried.
      const absl::Status ts = RetryUnavailable(config, c.stop, [&]() -> absl::Status {
        reply.Clear();
        absl::Status s = c.trainer.TrainStep(train, &reply);
        if (absl::IsUnavailable(s)) {
          absl::StatusOr<v1::GetStatsResponse> held = c.buffer.Stats();
          if (held.ok() && held->complete_groups() == 0 && held->leased_experiences() == 0) {
            nothing_held = true;
            return absl::OkStatus();
          }
        }
        return s;
      });
      progress.train_seconds = absl::ToDoubleSeconds(absl::Now() - train_begin);
      if (!ts.ok()) return at_step(common::Annotate(ts, "TrainStep"));
      absl::MutexLock lock(&mu);
      if (nothing_held) {
        untrained_signal = 0;
      } else {
        trained = true;
        untrained_signal = std::max<int64_t>(0, untrained_signal - reply.metrics().sequences() / config.samples);
        TakeTrainMetrics(reply, &progress);
      }
    }
    if (trained) {
      const absl::Time sync_begin = absl::Now();
      RETURN_IF_ERROR(at_step(join_install()));
      absl::StatusOr<v1::PrepareWeightsRequest> update = c.publish_only(c.installed + 1);
      if (!update.ok()) return at_step(update.status());
      install_version = update->manifest().version().version();
      install_step = step;
      installing = std::thread([&, update = *std::move(update), step] {
        const absl::Time begin = absl::Now();
        install_status = common::Annotate(c.rollout.UpdateWeights(update), "UpdateWeights");
        if (!install_status.ok()) return;
        WeightSyncMetric()->Observe(absl::ToDoubleSeconds(absl::Now() - begin));
        absl::MutexLock lock(&mu);
        finished_step = std::max(finished_step, step);
      });
      // (the part of the weight sync on the trainer's path: the last install's wait and
      // this publish; the install itself overlaps the next step)
      progress.sync_seconds = absl::ToDoubleSeconds(absl::Now() - sync_begin);
      if (config.checkpoint_every > 0 && step % config.checkpoint_every == 0) {
        PeriodicCheckpoint(c.trainer, config, c.stop, c.name, step, progress, checkpointed_step);
      }
    } else {
      ++progress.idle_steps;
      absl::MutexLock lock(&mu);
      finished_step = std::max(finished_step, step);  // (the producers may go one step further)
    }
    const absl::Time now = absl::Now();
    progress.tokens_per_s = data.tokens / std::max(1e-9, absl::ToDoubleSeconds(now - last_step_end));
    last_step_end = now;
    progress.step = step;
    progress.train_reward = data.samples > 0 ? data.reward_sum / data.samples : 0;
    progress.policy_version = data.oldest_version == std::numeric_limits<uint64_t>::max() ? 0 : data.oldest_version;
    progress.held_out_exact.reset();
    const bool last = step == config.steps || c.stop.load();
    if ((config.eval_every > 0 && step % config.eval_every == 0) || last) {
      RETURN_IF_ERROR(at_step(join_install()));  // (evaluate the step's version; the run ends installed)
    }
    if (config.eval_every > 0 && step % config.eval_every == 0) {
      RETURN_IF_ERROR(at_step(Evaluate(config, c.stop, c.rollout, c.reward, c.source, step, &progress)));
    }
    progress.seconds = absl::ToDoubleSeconds(absl::Now() - c.start);
    progress.published_version = c.installed;
    if (c.on_progress) c.on_progress(progress);
    if (progress.held_out_exact && *progress.held_out_exact >= config.stop_at) {
      reached_target = true;
      break;
    }
  }
  return join_install();
}

}  // namespace

absl::Status ValidateLoopConfig(const LoopConfig& c) {
  if (!c.dataset.empty()) {
    if (c.tokenizer_dir.empty()) {
      return absl::InvalidArgumentError("tokenizer_dir: a dataset needs the model directory whose tokenizer to use");
    }
    if (c.dataset_task.empty()) return absl::InvalidArgumentError("dataset_task: empty (e.g. math)");
    if (c.prompt_field.empty()) return absl::InvalidArgumentError("prompt_field: empty");
  } else if (tasks::FindTask(c.task) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("task: unknown task '", c.task, "'"));
  }
  if (c.min_len < 1 || c.max_len < c.min_len || c.max_len > kMaxTaskLen) {
    return absl::InvalidArgumentError(absl::StrCat("min_len / max_len: need 1 <= min_len <= max_len <= ", kMaxTaskLen,
                                                   ", got ", c.min_len, " / ", c.max_len));
  }
  if (c.prompts < 1 || c.prompts > 1024) return absl::InvalidArgumentError("prompts: must be in 1..1024");
  if (c.samples < 2 || c.samples > 64) return absl::InvalidArgumentError("samples: must be in 2..64 (GRPO groups)");
  if (c.steps < 1) return absl::InvalidArgumentError("steps: must be >= 1");
  if (c.eval_every < 0) return absl::InvalidArgumentError("eval_every: must be >= 0");
  if (c.held_out < 1 || c.held_out > 4096) return absl::InvalidArgumentError("held_out: must be in 1..4096");
  if (!std::isfinite(c.lr) || !(c.lr > 0) || c.lr > 1) return absl::InvalidArgumentError("lr: must be in (0, 1]");
  if (c.ppo_epochs < 1 || c.ppo_epochs > 16) return absl::InvalidArgumentError("ppo_epochs: must be in 1..16");
  RETURN_IF_ERROR(common::CheckFiniteInRange("entropy_coef", c.entropy_coef, 0, 10));
  RETURN_IF_ERROR(common::CheckFiniteInRange("temperature", c.temperature, 0, 10));
  RETURN_IF_ERROR(common::CheckFiniteInRange("clip_ratio", c.clip_ratio, 0, 1));
  RETURN_IF_ERROR(common::CheckFiniteInRange("clip_ratio_high", c.clip_ratio_high, 0, 10));
  if (std::isnan(c.stop_at)) return absl::InvalidArgumentError("stop_at: is nan");
  if (c.max_staleness < 0 || c.max_staleness > 64) {
    return absl::InvalidArgumentError("max_staleness: must be in 0..64");
  }
  if (c.fully_async && c.max_staleness < 1) {
    return absl::InvalidArgumentError(
        "fully_async: needs max_staleness >= 1 (how many steps the rollouts may run ahead of the trainer)");
  }
  RETURN_IF_ERROR(common::CheckInRange("max_new_tokens", c.max_new_tokens, 0, kMaxNewTokens));
  RETURN_IF_ERROR(common::CheckInRange("checkpoint_every", c.checkpoint_every, 0, std::numeric_limits<int>::max()));
  RETURN_IF_ERROR(common::CheckInRange("checkpoint_keep_last", c.checkpoint_keep_last, 0, kMaxCheckpointKeepLast));
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint_every: set, but there is no checkpoint_dir");
  }
  if (c.unavailable_retry < absl::ZeroDuration()) return absl::InvalidArgumentError("unavailable_retry: negative");
  return absl::OkStatus();
}

absl::StatusOr<std::string> SaveStepCheckpoint(TrainerPeer& trainer, const LoopConfig& config,
                                               const std::atomic<bool>& stop, const std::string& name, int step,
                                               bool dry_run) {
  const std::string& dir = config.checkpoint_dir;
  v1::SaveCheckpointRequest request;
  request.set_path(absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", name, "-step-", step));
  request.set_dry_run(dry_run);
  if (!dry_run) request.set_keep_last(static_cast<uint32_t>(config.checkpoint_keep_last));  // (validated)
  // (a retry finds the step's checkpoint written when the first attempt landed: the
  // same step's state, so it is replaced; a dry run wrote nothing to replace)
  v1::SaveCheckpointResponse response;
  bool retried = false;
  RETURN_IF_ERROR(common::Annotate(RetryUnavailable(config, stop,
                                                    [&] {
                                                      if (retried && !dry_run) request.set_overwrite(true);
                                                      retried = true;
                                                      response.Clear();
                                                      return trainer.SaveCheckpoint(request, &response);
                                                    }),
                                   absl::StrCat("SaveCheckpoint ", request.path())));
  return response.path().empty() ? request.path() : response.path();
}

absl::Status RunLoop(const LoopConfig& config, RolloutPool& rollout, RewardPeer& reward, BufferPeer& buffer,
                     TrainerPeer& trainer, const std::atomic<bool>& stop,
                     const std::function<void(const LoopProgress&)>& on_progress) {
  RETURN_IF_ERROR(ValidateLoopConfig(config));
  ASSIGN_OR_RETURN(std::unique_ptr<PromptSource> source, NewPromptSource(config));
  // New to this call: in every request id, so in every group and experience id. The
  // buffer remembers the ids it has seen (durably, with Redis) and refuses them again:
  // without this a second run on the same buffer sent the first run's ids, every
  // experience was a duplicate and no step trained.
  // A resumed run keeps its tag: the steps it runs again make the same ids, so what an
  // earlier attempt stored is not stored twice.
  const std::string tag = config.resume && !config.resume->tag.empty() ? config.resume->tag : common::NewId("r");
  const std::string name = config.run_id.empty() ? tag : config.run_id;
  {
    v1::ConfigureRequest configure;
    configure.set_run_id(config.run_id);
    configure.set_group_size(config.samples);
    configure.set_filter_zero_variance(true);
    configure.set_zero_variance_epsilon(kZeroVarianceEpsilon);
    RETURN_IF_ERROR(common::Annotate(RetryUnavailable(config, stop, [&] { return buffer.Configure(configure); }),
                                     "buffer Configure"));
  }
  // The trainer checks the run's checkpoint folder (a dry run of a checkpoint) before the
  // first step, so that a folder it cannot write fails the run at once, not at its first
  // checkpoint many steps in.
  if (!config.checkpoint_dir.empty()) {
    RETURN_IF_ERROR(common::Annotate(
        SaveStepCheckpoint(trainer, config, stop, name, 0, /*dry_run=*/true).status(),
        absl::StrCat("checkpoint_dir ", config.checkpoint_dir, ": the trainer cannot save checkpoints there")));
  }
  // The newest version this run installed on its replicas. Every publish after a step
  // that trained asks for a number above it (PublishWeightsRequest.min_version): a
  // trainer restarted from an older checkpoint must not reuse a number the replicas
  // hold for other weights.
  uint64_t installed = config.resume ? config.resume->published_version : 0;
  double sync_seconds = 0;  // the last publish's
  auto publish = [&](uint64_t min_version) -> absl::Status {
    const absl::Time begin = absl::Now();
    auto timed = [&](absl::Status s) {
      sync_seconds = absl::ToDoubleSeconds(absl::Now() - begin);
      if (s.ok()) WeightSyncMetric()->Observe(sync_seconds);
      return s;
    };
    v1::PublishWeightsRequest request;
    request.set_idempotent(true);  // (a retry, or a run's start, finds it published)
    request.set_min_version(min_version);
    v1::PublishWeightsResponse published;
    // Publish and install are retried together: a weights service that restarted
    // mid-sync lost the version (replicas joining again were told "version N is not
    // published"), so a retry publishes it again (idempotent on the trainer) before
    // installing it.
    RETURN_IF_ERROR(timed(RetryUnavailable(config, stop, [&]() -> absl::Status {
      published.Clear();
      RETURN_IF_ERROR(common::Annotate(trainer.PublishWeights(request, &published), "PublishWeights"));
      return common::Annotate(rollout.UpdateWeights(UpdateFor(published)), "UpdateWeights");
    })));
    installed = std::max(installed, published.manifest().version().version());
    return absl::OkStatus();
  };
  // Only the trainer's part: the version to install (UNAVAILABLE retried).
  auto publish_only = [&](uint64_t min_version) -> absl::StatusOr<v1::PrepareWeightsRequest> {
    v1::PublishWeightsRequest request;
    request.set_idempotent(true);
    request.set_min_version(min_version);
    v1::PublishWeightsResponse published;
    RETURN_IF_ERROR(common::Annotate(RetryUnavailable(config, stop,
                                                      [&] {
                                                        published.Clear();
                                                        return trainer.PublishWeights(request, &published);
                                                      }),
                                     "PublishWeights"));
    return UpdateFor(published);
  };
  // The rollout replicas start from the trainer's weights (behaviour == policy at step
  // 1). Their number is new unless the replicas' newest is the trainer's own: a number
  // names one set of weights, so then they are the same.
  {
    const uint64_t newest = std::max(installed, rollout.NewestInstalledVersion());
    absl::StatusOr<uint64_t> current = trainer.PolicyVersion();
    RETURN_IF_ERROR(publish(current.ok() && *current >= newest ? 0 : newest + 1));
  }
  LoopProgress progress;
  if (config.resume) {
    progress = *config.resume;
    progress.held_out_exact.reset();
  }
  progress.tag = tag;
  const int first_step = progress.step + 1;
  // (the time a resumed run had run before counts on)
  const absl::Time start = absl::Now() - absl::Seconds(progress.seconds);
  int checkpointed_step = -1;
  bool reached_target = false;
  // One step's rollouts: made on this thread (prompts come from one RNG in order),
  // generated and scored on this thread (sync) or on a helper thread (async).
  struct Produced {
    v1::GenerateBatchResponse generated;
    v1::ScoreResponse scored;
    absl::Status status;
    double seconds = 0;
  };
  auto produce = [&](int step, std::vector<RunPrompt> examples) {
    auto p = std::make_shared<Produced>();
    const absl::Time begin = absl::Now();
    // The sampling seed: the run's, mixed with the step's number.
    const uint64_t seed = config.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step);
    p->status = RolloutAndScore(config, stop, rollout, reward, *source, examples, config.samples,
                                static_cast<float>(config.temperature), seed, absl::StrCat(tag, "-s", step),
                                &p->generated, &p->scored);
    p->seconds = absl::ToDoubleSeconds(absl::Now() - begin);
    return p;
  };
  auto make_examples = [&]() { return source->Next(config.prompts); };
  std::shared_ptr<Produced> next;
  std::thread ahead;
  auto join_ahead = [&] {
    if (ahead.joinable()) ahead.join();
  };
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{join_ahead};
  // A resumed run's prompts go on where they were: the steps done drew theirs first.
  for (int step = 1; step < first_step; ++step) (void)make_examples();
  if (config.fully_async) {
    const std::function<absl::Status(uint64_t)> publish_fn = publish;
    const std::function<absl::StatusOr<v1::PrepareWeightsRequest>(uint64_t)> publish_only_fn = publish_only;
    const StreamContext context{config,       stop,        rollout, reward,     buffer,          trainer,
                                *source,      tag,         name,    publish_fn, publish_only_fn, installed,
                                sync_seconds, on_progress, start,   first_step};
    RETURN_IF_ERROR(StreamSteps(context, progress, checkpointed_step, reached_target));
  }
  for (int step = first_step; !config.fully_async && step <= config.steps && !stop.load(); ++step) {
    auto at_step = [&](const absl::Status& s) { return common::Annotate(s, absl::StrCat("step ", step)); };
    std::shared_ptr<Produced> now;
    if (config.max_staleness == 0) {
      now = produce(step, make_examples());
    } else {
      if (step == first_step) next = produce(step, make_examples());
      join_ahead();
      now = next;
      if (step < config.steps && !stop.load()) {
        // The next step's generation runs while this step trains.
        ahead = std::thread(
            [&, s = step + 1, examples = make_examples()]() mutable { next = produce(s, std::move(examples)); });
      }
    }
    RETURN_IF_ERROR(at_step(now->status));
    const v1::GenerateBatchResponse& generated = now->generated;
    const v1::ScoreResponse& scored = now->scored;
    v1::PutExperiencesRequest put;
    const double reward_sum = ScoredExperiences(config, generated, scored, &put);
    v1::PutExperiencesResponse put_reply;
    // Duplicates of a retried put, or of a resumed run's first step, are this step's
    // own experiences stored by the earlier attempt.
    absl::StatusOr<uint64_t> stored = StoreExperiences(
        config, stop, buffer, put, /*earlier_attempt=*/step == first_step && config.resume.has_value(), &put_reply);
    if (!stored.ok()) return at_step(stored.status());
    progress.accepted_experiences += *stored;
    // Whether this step's batch can teach anything: TrainStep's UNAVAILABLE then means
    // the trainer (or its buffer) is unreachable, not "nothing to learn". A resumed
    // step's stored batch may have been trained already: its UNAVAILABLE is idle.
    const bool signal = HasLearningSignal(put, config.samples) &&
                        !(step == first_step && config.resume.has_value() && put_reply.accepted() == 0);
    const v1::TrainStepRequest train = TrainRequest(config);
    v1::TrainStepResponse trained;
    const absl::Time train_begin = absl::Now();
    // UNAVAILABLE for a batch with a signal: the trainer is restarting or unreachable,
    // or its buffer was slow. Retried (with back-off) until unavailable_retry, then the
    // run fails. Without a signal it is the expected "nothing to learn" (idle step).
    // Unless the buffer holds no group any more, ready or leased: an attempt whose reply
    // was lost consumed the batch (a trainer killed after its ack, before its reply), and
    // no retry could ever find it. The step then publishes what the trainer holds.
    bool consumed_unanswered = false;
    auto train_step = [&]() -> absl::Status {
      trained.Clear();
      absl::Status s = trainer.TrainStep(train, &trained);
      if (signal && absl::IsUnavailable(s)) {
        absl::StatusOr<v1::GetStatsResponse> held = buffer.Stats();
        if (held.ok() && held->complete_groups() == 0 && held->leased_experiences() == 0) {
          consumed_unanswered = true;
          std::cerr << "rlfleet-controller: step " << step << ": TrainStep " << s.message()
                    << ", and the buffer holds none of the batch any more: an earlier attempt consumed it (its "
                       "reply was lost); publishing the trainer's weights as they are"
                    << std::endl;
          return absl::OkStatus();
        }
      }
      return s;
    };
    const absl::Status ts = signal ? RetryUnavailable(config, stop, train_step) : train_step();
    progress.train_seconds = absl::ToDoubleSeconds(absl::Now() - train_begin);
    if (!ts.ok() && !(absl::IsUnavailable(ts) && !signal)) {
      return at_step(common::Annotate(
          ts, signal && absl::IsUnavailable(ts)
                  ? absl::StrCat("TrainStep (the batch had a learning signal; still unavailable after ",
                                 absl::FormatDuration(config.unavailable_retry), ")")
                  : "TrainStep"));
    }
    progress.sync_seconds = 0;
    if (ts.ok()) {
      if (!consumed_unanswered) TakeTrainMetrics(trained, &progress);
      RETURN_IF_ERROR(at_step(publish(installed + 1)));
      progress.sync_seconds = sync_seconds;
      if (config.checkpoint_every > 0 && step % config.checkpoint_every == 0) {
        PeriodicCheckpoint(trainer, config, stop, name, step, progress, checkpointed_step);
      }
    } else {
      ++progress.idle_steps;
    }
    uint64_t response_tokens = 0;
    for (const v1::Experience& e : generated.completions()) response_tokens += e.response_token_ids_size();
    progress.generate_seconds = now->seconds;
    progress.tokens_per_s = now->seconds > 0 ? response_tokens / now->seconds : 0;
    progress.step = step;
    progress.train_reward = generated.completions_size() ? reward_sum / generated.completions_size() : 0;
    progress.policy_version = VersionOf(generated);
    progress.held_out_exact.reset();
    if (config.eval_every > 0 && step % config.eval_every == 0) {
      RETURN_IF_ERROR(at_step(Evaluate(config, stop, rollout, reward, *source, step, &progress)));
    }
    progress.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    progress.published_version = installed;
    if (on_progress) on_progress(progress);
    if (progress.held_out_exact && *progress.held_out_exact >= config.stop_at) {
      reached_target = true;
      break;
    }
  }
  if (stop.load()) return absl::OkStatus();  // (StopRun decides about a checkpoint)
  // Every step of a run that went its length idle: nothing was trained. Not a success.
  if (!reached_target && progress.step > 0 && progress.idle_steps == progress.step) {
    return absl::FailedPreconditionError(
        absl::StrCat("every one of the ", progress.step,
                     " steps was idle: no group had a learning signal (each group's rewards "
                     "were all equal), so nothing was trained (policy version ",
                     progress.policy_version, "); try a higher temperature, a larger group_size or an easier task"));
  }
  // Periodic checkpoints end with the final state (interval 0: only at StopRun).
  if (config.checkpoint_every > 0 && checkpointed_step != progress.step && progress.step > 0) {
    ASSIGN_OR_RETURN(progress.last_checkpoint, SaveStepCheckpoint(trainer, config, stop, name, progress.step));
    if (on_progress) on_progress(progress);
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::controller
