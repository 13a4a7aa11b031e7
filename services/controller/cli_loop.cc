#include "services/controller/cli_loop.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_metrics.h"
#include "services/controller/run_peers_grpc.h"

ABSL_FLAG(std::string, loop_rollout, "", "loop: rollout replica addresses, comma-separated.");
ABSL_FLAG(std::string, loop_reward, "", "loop: reward address.");
ABSL_FLAG(std::string, loop_buffer, "", "loop: buffer address.");
ABSL_FLAG(std::string, loop_trainer, "", "loop: trainer address.");
ABSL_FLAG(std::string, task, "reverse",
          "loop / run: built-in task: reverse, sort, add, or mul (multi-turn, with a calculator tool).");
ABSL_FLAG(std::string, dataset, "",
          "loop / run: a JSONL prompt dataset instead of --task (one object per line: a prompt string and an "
          "answer; for `run` a path under the controller's --data_root), tokenized by --model_dir's tokenizer.");
ABSL_FLAG(std::string, prompt_field, "prompt", "loop / run: the dataset's prompt field.");
ABSL_FLAG(std::string, answer_field, "answer", "loop / run: the dataset's answer field.");
ABSL_FLAG(std::string, dataset_task, "math", "loop / run: the reward task the dataset's records are scored as.");
ABSL_FLAG(bool, apply_chat_template, false,
          "loop / run: render the dataset's prompt strings through --model_dir's chat template as one user message "
          "(records given as chat messages always go through it).");
ABSL_FLAG(std::string, chat_template_kwargs, "",
          "loop / run: further chat-template variables, a JSON object (e.g. '{\"enable_thinking\": false}').");
ABSL_DECLARE_FLAG(std::string, model_dir);
ABSL_FLAG(int, min_len, 3, "loop: shortest task input.");
ABSL_FLAG(int, max_len, 5, "loop: longest task input.");
ABSL_FLAG(int, steps, 200, "loop: training steps.");
ABSL_FLAG(int, loop_prompts, 32, "loop: prompts (groups) per step.");
ABSL_FLAG(int, loop_samples, 8, "loop: samples per prompt (group size).");
ABSL_FLAG(int, eval_every, 10, "loop: held-out greedy evaluation every this many steps.");
ABSL_FLAG(double, stop_at, 1.0, "loop: stop once held-out exact match reaches this.");
ABSL_FLAG(std::string, run_dir, "",
          "loop: folder for metrics.csv and reward_curve.png (created); empty: ./rlfleet-runs/<start time>.");
ABSL_FLAG(double, lr, 5e-4, "loop: AdamW learning rate.");
ABSL_FLAG(int, ppo_epochs, 2, "loop: PPO epochs per batch.");
ABSL_FLAG(double, clip_ratio, 0.2, "loop: PPO clip epsilon, in (0, 1).");
ABSL_FLAG(double, clip_ratio_high, 0.0,
          "loop: upper PPO clip epsilon, in [0, 10]; 0 = --clip_ratio (e.g. 0.28: DAPO's clip-higher, against "
          "entropy collapse).");
ABSL_FLAG(double, entropy_coef, 0.0, "loop: entropy bonus weight.");
ABSL_FLAG(double, temperature, 1.0, "loop: sampling temperature of the training rollouts.");
ABSL_FLAG(int, max_staleness, 0,
          "loop/run: 0 = synchronous; k > 0 = the next step's generation overlaps training, and "
          "experiences up to k versions old are trained on.");
ABSL_FLAG(bool, fully_async, false,
          "loop/run: with --max_staleness=k >= 1: rollouts without a step barrier (each group to the buffer as it "
          "finishes, up to k steps ahead of the trainer; new versions install mid-generation).");

ABSL_FLAG(std::string, checkpoint_dir, "",
          "run: folder on the trainer's machine (under its checkpoint root) for the run's checkpoints; empty: none.");
ABSL_FLAG(int, checkpoint_every, 0, "run: a checkpoint every this many steps (needs --checkpoint_dir); 0: at the end.");
ABSL_FLAG(int, checkpoint_keep_last, 3,
          "run: the trainer keeps the newest this many of the run's checkpoints (the one just saved always); 0: all.");
ABSL_FLAG(bool, checkpoint, false, "stop: save a checkpoint before stopping (the run needs a --checkpoint_dir).");

namespace rlfleet::controller {
namespace {

namespace v1 = rlfleet::v1;

constexpr absl::Duration kCallTimeout = absl::Seconds(120);

int Fail(const absl::Status& s, absl::string_view what) {
  std::cerr << "rlfleet loop: " << what << ": " << s.message() << "\n";
  return 1;
}

}  // namespace

// The loop flags as a v1::RunConfig (what `rlfleet run` sends).
v1::RunConfig RunConfigFromFlags() {
  v1::RunConfig c;
  if (absl::GetFlag(FLAGS_dataset).empty()) {
    c.set_task(absl::GetFlag(FLAGS_task));
  } else {
    c.set_dataset(absl::GetFlag(FLAGS_dataset));
    c.set_tokenizer_dir(absl::GetFlag(FLAGS_model_dir));
    c.set_prompt_field(absl::GetFlag(FLAGS_prompt_field));
    c.set_answer_field(absl::GetFlag(FLAGS_answer_field));
    c.set_dataset_task(absl::GetFlag(FLAGS_dataset_task));
    c.set_apply_chat_template(absl::GetFlag(FLAGS_apply_chat_template));
    c.set_chat_template_kwargs(absl::GetFlag(FLAGS_chat_template_kwargs));
  }
  (*c.mutable_task_params())["min_len"] = absl::StrCat(absl::GetFlag(FLAGS_min_len));
  (*c.mutable_task_params())["max_len"] = absl::StrCat(absl::GetFlag(FLAGS_max_len));
  c.set_algorithm(v1::ALGORITHM_GRPO);
  c.set_group_size(absl::GetFlag(FLAGS_loop_samples));
  c.set_batch_size(absl::GetFlag(FLAGS_loop_prompts));
  c.set_learning_rate(static_cast<float>(absl::GetFlag(FLAGS_lr)));
  c.set_total_steps(absl::GetFlag(FLAGS_steps));
  c.set_eval_interval_steps(absl::GetFlag(FLAGS_eval_every));
  c.set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  c.set_ppo_epochs(absl::GetFlag(FLAGS_ppo_epochs));
  c.set_clip_ratio(static_cast<float>(absl::GetFlag(FLAGS_clip_ratio)));
  c.set_clip_ratio_high(static_cast<float>(absl::GetFlag(FLAGS_clip_ratio_high)));
  c.set_entropy_coef(static_cast<float>(absl::GetFlag(FLAGS_entropy_coef)));
  c.set_stop_at_exact_match(static_cast<float>(absl::GetFlag(FLAGS_stop_at)));
  c.set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  c.set_fully_async(absl::GetFlag(FLAGS_fully_async));
  c.set_checkpoint_dir(absl::GetFlag(FLAGS_checkpoint_dir));
  c.set_checkpoint_interval_steps(absl::GetFlag(FLAGS_checkpoint_every));
  // (a negative value wraps to one the controller refuses, naming the field)
  c.set_checkpoint_keep_last(static_cast<uint32_t>(absl::GetFlag(FLAGS_checkpoint_keep_last)));
  return c;
}

// Prints the text curve of a run folder on this machine, if gnuplot drew one.
static void PrintCurve(const std::filesystem::path& dir) {
  std::ifstream text(dir / "reward_curve.txt");
  if (text) std::cout << text.rdbuf();
}

int StartRunAndWatch(ControllerClient& client) {
  v1::StartRunRequest request;
  *request.mutable_config() = RunConfigFromFlags();
  auto started = client.StartRun(request);
  if (!started.ok()) return Fail(started.status(), "StartRun");
  const std::string run_id = started->run_id();
  std::cout << "run " << run_id << " started\n" << std::flush;
  const int eval_every = absl::GetFlag(FLAGS_eval_every);
  const bool live = isatty(STDOUT_FILENO) != 0;  // plain lines when not a terminal
  uint64_t printed = 0;
  // The controller may restart mid-run (its supervisor brings it back and it resumes
  // the run): an unreachable controller is waited for, up to 5 minutes.
  absl::Time unreachable_since = absl::InfiniteFuture();
  for (;;) {
    auto status = client.GetStatus();
    if (absl::IsUnavailable(status.status()) || absl::IsDeadlineExceeded(status.status())) {
      if (unreachable_since == absl::InfiniteFuture()) {
        unreachable_since = absl::Now();
        std::cout << (live ? "\r\033[K" : "") << "controller unreachable (" << status.status().message()
                  << "); waiting for it (5 min)\n"
                  << std::flush;
      }
      if (absl::Now() - unreachable_since > absl::Minutes(5)) return Fail(status.status(), "GetStatus");
      absl::SleepFor(absl::Seconds(1));
      continue;
    }
    if (!status.ok()) return Fail(status.status(), "GetStatus");
    if (unreachable_since != absl::InfiniteFuture()) {
      std::cout << "controller back after "
                << absl::FormatDuration(absl::Trunc(absl::Now() - unreachable_since, absl::Seconds(1)))
                << (status->resumes() > 0 ? absl::StrCat("; run resumed (", status->resumes(), " time(s))") : "")
                << "\n"
                << std::flush;
      unreachable_since = absl::InfiniteFuture();
    }
    if (status->run_id() != run_id) return Fail(absl::AbortedError("another run replaced this one"), "watch");
    const bool ended = status->state() == v1::RUN_STATE_COMPLETED || status->state() == v1::RUN_STATE_STOPPED ||
                       status->state() == v1::RUN_STATE_FAILED;
    const uint64_t step = status->step();
    const v1::MetricsSummary& m = status->metrics();
    const std::string line = absl::StrFormat(
        "step %4d  %6.1f s  policy v%-4d  train reward %.3f  %5.0f tok/s  staleness %.2f  sync %4.0f ms  "
        "held-out exact %.3f",
        step, m.elapsed_ms() / 1000.0, status->policy_version().version(), m.reward_mean(), m.rollout_tokens_per_s(),
        m.mean_staleness(), m.weight_sync_ms(), m.eval_exact_match());
    if (step != printed && eval_every > 0 && (step % eval_every == 0 || ended)) {
      // A line to keep at every evaluation (and at the end).
      printed = step;
      std::cout << (live ? "\r\033[K" : "") << line << "\n" << std::flush;
    } else if (live && step != 0) {
      // On a terminal, the current step on one line that keeps being rewritten.
      std::cout << "\r\033[K" << line << std::flush;
    }
    if (ended) {
      if (!status->run_dir().empty()) {
        PrintCurve(status->run_dir());
        std::cout << "metrics and curve (on the controller's machine): " << status->run_dir() << "\n";
      }
      std::cout << "run " << run_id << " " << v1::RunState_Name(status->state())
                << (status->error().empty() ? "" : ": " + status->error()) << "\n";
      return status->state() == v1::RUN_STATE_FAILED ? 1 : 0;
    }
    absl::SleepFor(absl::Milliseconds(300));  // GetStatus is a poll; WatchRun would stream
  }
}

int StopRun(ControllerClient& client) {
  v1::StopRunRequest request;
  request.set_checkpoint(absl::GetFlag(FLAGS_checkpoint));
  auto stopped = client.StopRun(request);
  if (!stopped.ok()) return Fail(stopped.status(), "StopRun");
  std::cout << "run " << v1::RunState_Name(stopped->state()) << " after " << stopped->step() << " steps";
  if (!stopped->checkpoint_path().empty()) std::cout << "; checkpoint " << stopped->checkpoint_path();
  std::cout << "\n";
  return 0;
}

int RunLoop(const rpc::ClientOptions& base) {
  LoopConfig config;
  config.task = absl::GetFlag(FLAGS_task);
  config.dataset = absl::GetFlag(FLAGS_dataset);
  config.tokenizer_dir = absl::GetFlag(FLAGS_model_dir);
  config.prompt_field = absl::GetFlag(FLAGS_prompt_field);
  config.answer_field = absl::GetFlag(FLAGS_answer_field);
  config.dataset_task = absl::GetFlag(FLAGS_dataset_task);
  config.apply_chat_template = absl::GetFlag(FLAGS_apply_chat_template);
  config.chat_template_kwargs = absl::GetFlag(FLAGS_chat_template_kwargs);
  config.min_len = absl::GetFlag(FLAGS_min_len);
  config.max_len = absl::GetFlag(FLAGS_max_len);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.prompts = absl::GetFlag(FLAGS_loop_prompts);
  config.samples = absl::GetFlag(FLAGS_loop_samples);
  config.eval_every = absl::GetFlag(FLAGS_eval_every);
  config.stop_at = absl::GetFlag(FLAGS_stop_at);
  config.lr = absl::GetFlag(FLAGS_lr);
  config.ppo_epochs = absl::GetFlag(FLAGS_ppo_epochs);
  config.clip_ratio = absl::GetFlag(FLAGS_clip_ratio);
  config.clip_ratio_high = absl::GetFlag(FLAGS_clip_ratio_high);
  config.entropy_coef = absl::GetFlag(FLAGS_entropy_coef);
  config.temperature = absl::GetFlag(FLAGS_temperature);
  config.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  config.fully_async = absl::GetFlag(FLAGS_fully_async);
  if (absl::Status s = ValidateLoopConfig(config); !s.ok()) {
    std::cerr << "rlfleet loop: " << s.message() << "\n";
    return 2;
  }
  std::vector<std::unique_ptr<RolloutReplica>> replicas;
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_loop_rollout), ',', absl::SkipEmpty())) {
    auto replica = NewGrpcRolloutReplica(base, std::string(a), kCallTimeout);
    if (!replica.ok()) return Fail(replica.status(), "rollout");
    replicas.push_back(std::move(*replica));
  }
  if (replicas.empty()) {
    std::cerr << "rlfleet loop: --loop_rollout names no replica\n";
    return 2;
  }
  RolloutPool rollout(std::move(replicas), [](const std::string& line) { std::cout << line << "\n" << std::flush; });
  auto reward = NewGrpcRewardPeer(base, absl::GetFlag(FLAGS_loop_reward), kCallTimeout);
  auto buffer = NewGrpcBufferPeer(base, absl::GetFlag(FLAGS_loop_buffer), kCallTimeout);
  auto trainer = NewGrpcTrainerPeer(base, absl::GetFlag(FLAGS_loop_trainer), kCallTimeout);
  if (!reward.ok()) return Fail(reward.status(), "reward");
  if (!buffer.ok()) return Fail(buffer.status(), "buffer");
  if (!trainer.ok()) return Fail(trainer.status(), "trainer");

  const absl::Time start = absl::Now();
  std::filesystem::path run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty()) {
    run_dir = std::filesystem::path("rlfleet-runs") / absl::FormatTime("%Y%m%d-%H%M%S", start, absl::LocalTimeZone());
  }
  RunMetrics metrics;
  if (absl::Status s = metrics.Open(run_dir); !s.ok()) {
    std::cerr << "rlfleet loop: " << s.message() << "\n";
    return 2;
  }
  std::cout << "loop: "
            << (config.dataset.empty() ? absl::StrCat(config.task, " n=", config.min_len, "..", config.max_len)
                                       : config.dataset)
            << ", " << config.prompts << " prompts x " << config.samples << " samples per step\n";
  LoopProgress last;
  auto on_progress = [&](const LoopProgress& p) {
    metrics.Add(p);
    last = p;
    if (!p.held_out_exact) return;
    std::cout << absl::StrFormat(
                     "step %4d  %6.1f s  policy v%-4d  train reward %.3f  %5.0f tok/s  "
                     "staleness %.2f  sync %4.0f ms  entropy %.3f  idle steps %d  held-out exact %.3f\n",
                     p.step, p.seconds, p.policy_version, p.train_reward, p.tokens_per_s, p.mean_staleness,
                     p.sync_seconds * 1e3, p.entropy, p.idle_steps, *p.held_out_exact)
              << std::flush;
  };
  std::atomic<bool> stop{false};
  absl::Status run = controller::RunLoop(config, rollout, **reward, **buffer, **trainer, stop, on_progress);
  const std::string files = metrics.Finish();
  if (!run.ok()) return Fail(run, "run");
  std::cout << absl::StrFormat("trained %d sequences in %d steps, %.1f s: %.2f samples/s (%s)\n",
                               last.trained_sequences, last.step, last.seconds,
                               last.seconds > 0 ? last.trained_sequences / last.seconds : 0.0,
                               config.max_staleness == 0 ? "sync"
                               : config.fully_async      ? absl::StrCat("fully async, k=", config.max_staleness)
                                                         : absl::StrCat("async, k=", config.max_staleness));
  PrintCurve(metrics.dir());
  std::cout << files << "\n";
  return 0;
}

}  // namespace rlfleet::controller
