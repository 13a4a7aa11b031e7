#include "services/controller/cli_loop.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/model/tokenizer.h"
#include "services/controller/cli_util.h"
#include "libs/tasks/tasks.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"

ABSL_FLAG(std::string, loop_rollout, "", "loop: rollout replica addresses, comma-separated.");
ABSL_FLAG(std::string, loop_reward, "", "loop: reward address.");
ABSL_FLAG(std::string, loop_buffer, "", "loop: buffer address.");
ABSL_FLAG(std::string, loop_trainer, "", "loop: trainer address.");
ABSL_FLAG(std::string, task, "reverse", "loop: built-in task.");
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
ABSL_FLAG(double, entropy_coef, 0.0, "loop: entropy bonus weight.");
ABSL_FLAG(double, temperature, 1.0, "loop: sampling temperature of the training rollouts.");

namespace rlfleet::controller {
namespace {

namespace v1 = rlfleet::v1;
using model::Tokenizer;

constexpr absl::Duration kCallTimeout = absl::Seconds(120);

int Fail(const grpc::Status& s, absl::string_view what) { return ReportRpcError(s, absl::StrCat("loop ", what)); }

// The rollout replicas of a run. Prompts are split evenly over the live replicas and
// generated concurrently; a replica that fails (dead: UNAVAILABLE at once; hung: its
// call's deadline) is dropped and its prompts go to the others, so a run survives
// losing replicas as long as one is left.
class RolloutPool {
 public:
  RolloutPool(const rpc::ClientOptions& base, const std::vector<std::string>& addresses) : base_(base) {
    for (const std::string& a : addresses) {
      rpc::ClientOptions o = base;
      o.target = a;
      replicas_.push_back({a, v1::RolloutService::NewStub(*rpc::MakeChannel(o)), true});
    }
  }

  int live() const {
    int n = 0;
    for (const auto& r : replicas_) n += r.alive;
    return n;
  }

  // Generates `samples` completions for each prompt of `gen` (whose request_id is a
  // prefix); the result lists them in prompt order, as one GenerateBatch would.
  grpc::Status Generate(const v1::GenerateBatchRequest& gen, v1::GenerateBatchResponse* out) {
    std::vector<int> pending(gen.prompts_size());
    for (int i = 0; i < gen.prompts_size(); ++i) pending[i] = i;
    std::vector<v1::GenerateBatchResponse> per_prompt(gen.prompts_size());
    int attempt = 0;
    while (!pending.empty()) {
      std::vector<size_t> alive;
      for (size_t r = 0; r < replicas_.size(); ++r) {
        if (replicas_[r].alive) alive.push_back(r);
      }
      if (alive.empty()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no rollout replica left");
      // Contiguous shares of the pending prompts, one per live replica.
      const size_t n = std::min(alive.size(), pending.size());
      std::vector<std::vector<int>> shares(n);
      for (size_t i = 0; i < pending.size(); ++i) shares[i * n / pending.size()].push_back(pending[i]);
      std::vector<grpc::Status> status(n);
      std::vector<v1::GenerateBatchResponse> replies(n);
      std::vector<std::thread> threads;
      for (size_t k = 0; k < n; ++k) {
        threads.emplace_back([&, k] {
          v1::GenerateBatchRequest part = gen;
          part.clear_prompts();
          part.set_request_id(absl::StrCat(gen.request_id(), "-a", attempt, "-r", k));
          for (int i : shares[k]) *part.add_prompts() = gen.prompts(i);
          status[k] = replicas_[alive[k]].stub->GenerateBatch(CallContext(base_, kCallTimeout).get(), part, &replies[k]);
        });
      }
      for (auto& t : threads) t.join();
      std::vector<int> again;
      for (size_t k = 0; k < n; ++k) {
        Replica& replica = replicas_[alive[k]];
        if (!status[k].ok()) {
          if (status[k].error_code() != grpc::StatusCode::UNAVAILABLE &&
              status[k].error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
            return status[k];  // a request the replica rejects: not a replica failure
          }
          replica.alive = false;
          std::cout << "rollout replica " << replica.address << " failed (" << status[k].error_message()
                    << "): dropped; re-dispatching its " << shares[k].size() << " prompts\n";
          again.insert(again.end(), shares[k].begin(), shares[k].end());
          continue;
        }
        const int samples = gen.num_samples();
        for (size_t j = 0; j < shares[k].size(); ++j) {
          for (int s = 0; s < samples; ++s) {
            *per_prompt[shares[k][j]].add_completions() = replies[k].completions(static_cast<int>(j) * samples + s);
          }
        }
      }
      std::sort(again.begin(), again.end());
      pending = std::move(again);
      ++attempt;
    }
    for (auto& p : per_prompt) {
      for (auto& c : *p.mutable_completions()) *out->add_completions() = std::move(c);
    }
    return grpc::Status::OK;
  }

  // Installs a published version on every live replica (FAILED_PRECONDITION: it has
  // it already); a replica that cannot be reached is dropped.
  grpc::Status UpdateWeights(const v1::PrepareWeightsRequest& update) {
    for (Replica& replica : replicas_) {
      if (!replica.alive) continue;
      v1::CommitWeightsResponse committed;
      grpc::Status s = replica.stub->UpdateWeights(CallContext(base_, kCallTimeout).get(), update, &committed);
      if (s.ok() || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) continue;
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        replica.alive = false;
        std::cout << "rollout replica " << replica.address << " failed (" << s.error_message() << "): dropped\n";
        continue;
      }
      return s;
    }
    if (live() == 0) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no rollout replica left");
    return grpc::Status::OK;
  }

 private:
  struct Replica {
    std::string address;
    std::unique_ptr<v1::RolloutService::Stub> stub;
    bool alive = true;
  };
  const rpc::ClientOptions base_;
  std::vector<Replica> replicas_;
};

// Generates for `examples` and returns (experiences, rewards) scored by the reward service.
bool Rollout(const rpc::ClientOptions& o, RolloutPool& rollout, v1::RewardService::Stub* reward,
             const std::vector<tasks::Example>& examples, int samples, float temperature, uint64_t seed,
             const std::string& request_id, v1::GenerateBatchResponse* out, v1::ScoreResponse* scored) {
  v1::GenerateBatchRequest gen;
  gen.set_request_id(request_id);
  gen.set_num_samples(samples);
  gen.mutable_sampling()->set_temperature(temperature);
  gen.mutable_sampling()->set_max_new_tokens(absl::GetFlag(FLAGS_max_len) + 3);
  gen.mutable_sampling()->set_seed(seed);
  for (size_t i = 0; i < examples.size(); ++i) {
    v1::BatchPrompt* p = gen.add_prompts();
    p->set_prompt_id(examples[i].prompt);
    p->set_group_id(absl::StrCat(request_id, "-g", i));
    p->set_task(absl::GetFlag(FLAGS_task));
    const auto ids = Tokenizer::EncodePrompt(examples[i].prompt);  // alive for the loop
    for (int32_t t : *ids) p->add_prompt_token_ids(t);
  }
  if (auto s = rollout.Generate(gen, out); !s.ok()) return Fail(s, "GenerateBatch"), false;
  v1::ScoreRequest score;
  for (int i = 0; i < out->completions_size(); ++i) {
    const v1::Experience& e = out->completions(i);
    v1::ScoreItem* item = score.add_items();
    item->set_task(e.task());
    item->set_prompt_text(examples[i / samples].prompt);
    item->set_reference_answer(examples[i / samples].answer);
    item->set_response_text(Tokenizer::DecodeResponse({e.response_token_ids().begin(), e.response_token_ids().end()}));
  }
  if (auto s = reward->Score(CallContext(o, kCallTimeout).get(), score, scored); !s.ok()) return Fail(s, "Score"), false;
  return true;
}

// Renders the run's curves from metrics.csv with gnuplot: reward_curve.png (training
// reward and held-out exact match over steps and over wall time) and, on stdout, the
// same over steps as text. A missing gnuplot is a hint, not a failure.
void PlotCurves(const std::filesystem::path& dir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::cout << "(no gnuplot: apt-get install gnuplot-nox to get reward_curve.png)\n";
    return;
  }
  const std::filesystem::path script = dir / "reward_curve.gp";
  std::ofstream gp(script);
  gp << "set datafile separator ','\n"
     << "set key autotitle columnhead bottom right\n"
     << "set yrange [-0.2:1.05]\n"
     << "set terminal pngcairo size 1100,450 noenhanced\n"
     << "set output '" << (dir / "reward_curve.png").string() << "'\n"
     << "set multiplot layout 1,2\n"
     << "set xlabel 'step'\n"
     << "plot '" << (dir / "metrics.csv").string() << "' using 1:4 with lines lw 1, '' using 1:7 with linespoints lw 2 pt 7\n"
     << "set xlabel 'seconds'\n"
     << "plot '" << (dir / "metrics.csv").string() << "' using 2:4 with lines lw 1, '' using 2:7 with linespoints lw 2 pt 7\n"
     << "unset multiplot\n"
     << "set terminal dumb size 100,24\n"
     << "set output\n"
     << "set xlabel 'step'\n"
     << "plot '" << (dir / "metrics.csv").string() << "' using 1:4 with lines, '' using 1:7 with points pt '*'\n";
  gp.close();
  const std::string cmd = absl::StrCat("gnuplot '", script.string(), "' 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    // pngcairo missing in some builds: fall back to the plain png terminal.
    std::cout << "(gnuplot could not render; see " << script.string() << ")\n";
  }
}

}  // namespace

int RunLoop(const rpc::ClientOptions& base) {
  auto channel = [&](const std::string& target) {
    rpc::ClientOptions o = base;
    o.target = target;
    return *rpc::MakeChannel(o);
  };
  RolloutPool rollout(base, absl::StrSplit(absl::GetFlag(FLAGS_loop_rollout), ',', absl::SkipEmpty()));
  if (rollout.live() == 0) {
    std::cerr << "rlfleet loop: --loop_rollout names no replica\n";
    return 2;
  }
  auto reward = v1::RewardService::NewStub(channel(absl::GetFlag(FLAGS_loop_reward)));
  auto buffer = v1::BufferService::NewStub(channel(absl::GetFlag(FLAGS_loop_buffer)));
  auto trainer = v1::TrainerService::NewStub(channel(absl::GetFlag(FLAGS_loop_trainer)));
  const tasks::Task* task = tasks::FindTask(absl::GetFlag(FLAGS_task));
  if (task == nullptr) {
    std::cerr << "rlfleet loop: unknown --task\n";
    return 2;
  }
  const int prompts = absl::GetFlag(FLAGS_loop_prompts), samples = absl::GetFlag(FLAGS_loop_samples);
  const tasks::TaskOptions lengths{absl::GetFlag(FLAGS_min_len), absl::GetFlag(FLAGS_max_len)};
  {
    v1::ConfigureRequest config;
    config.set_group_size(samples);
    config.set_filter_zero_variance(true);
    v1::ConfigureResponse configured;
    if (auto s = buffer->Configure(CallContext(base, kCallTimeout).get(), config, &configured); !s.ok()) return Fail(s, "buffer Configure");
  }
  // The rollout replica starts from the trainer's weights (behaviour == policy at step 1).
  auto publish = [&]() -> bool {
    v1::PublishWeightsResponse published;
    if (auto s = trainer->PublishWeights(CallContext(base, kCallTimeout).get(), {}, &published); !s.ok()) return Fail(s, "PublishWeights"), false;
    v1::PrepareWeightsRequest update;
    *update.mutable_manifest() = published.manifest();
    *update.add_chunks()->mutable_source() = published.location();
    if (grpc::Status s = rollout.UpdateWeights(update); !s.ok()) return Fail(s, "UpdateWeights"), false;
    return true;
  };
  if (!publish()) return 1;
  absl::BitGen gen(std::seed_seq{11});
  std::vector<tasks::Example> held_out;
  for (int i = 0; i < 64; ++i) held_out.push_back(task->Make(gen, lengths));
  const absl::Time start = absl::Now();
  std::filesystem::path run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty()) run_dir = std::filesystem::path("rlfleet-runs") / absl::FormatTime("%Y%m%d-%H%M%S", start, absl::LocalTimeZone());
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  std::ofstream csv(run_dir / "metrics.csv");
  if (ec || !csv) {
    std::cerr << "rlfleet loop: cannot write " << (run_dir / "metrics.csv").string() << "\n";
    return 2;
  }
  csv << "step,seconds,policy_version,train_reward,entropy,idle_steps,heldout_exact\n";
  int idle_steps = 0;         // steps whose every group had zero reward variance
  float last_entropy = 0.0f;  // of the last step that trained
  std::cout << "loop: " << task->name() << " n=" << lengths.min_len << ".." << lengths.max_len << ", " << prompts
            << " prompts x " << samples << " samples per step\n";
  for (int step = 1; step <= absl::GetFlag(FLAGS_steps); ++step) {
    std::vector<tasks::Example> examples;
    for (int i = 0; i < prompts; ++i) examples.push_back(task->Make(gen, lengths));
    v1::GenerateBatchResponse generated;
    v1::ScoreResponse scored;
    if (!Rollout(base, rollout, reward.get(), examples, samples,
                 static_cast<float>(absl::GetFlag(FLAGS_temperature)), step, absl::StrCat("s", step),
                 &generated, &scored)) {
      return 1;
    }
    v1::PutExperiencesRequest put;
    double reward_sum = 0;
    for (int i = 0; i < generated.completions_size(); ++i) {
      v1::Experience e = generated.completions(i);
      e.set_reward(scored.results(i).reward());
      reward_sum += e.reward();
      *put.add_experiences() = std::move(e);
    }
    v1::PutExperiencesResponse put_response;
    if (auto s = buffer->PutExperiences(CallContext(base, kCallTimeout).get(), put, &put_response); !s.ok()) return Fail(s, "PutExperiences");
    v1::TrainStepRequest train;
    train.mutable_buffer()->set_num_groups(prompts);
    train.mutable_buffer()->set_min_groups(1);
    train.mutable_params()->set_algorithm(v1::ALGORITHM_GRPO);
    train.mutable_params()->set_ppo_epochs(absl::GetFlag(FLAGS_ppo_epochs));
    train.mutable_params()->set_clip_ratio(0.2f);
    train.mutable_params()->set_entropy_coef(static_cast<float>(absl::GetFlag(FLAGS_entropy_coef)));
    train.mutable_params()->mutable_optimizer()->set_learning_rate(static_cast<float>(absl::GetFlag(FLAGS_lr)));
    train.mutable_params()->mutable_optimizer()->set_grad_clip_norm(1.0f);
    v1::TrainStepResponse trained;
    grpc::Status ts = trainer->TrainStep(CallContext(base, kCallTimeout).get(), train, &trained);
    if (!ts.ok() && ts.error_code() != grpc::StatusCode::UNAVAILABLE) return Fail(ts, "TrainStep");
    // UNAVAILABLE: every group had zero variance; nothing to learn this step.
    if (!ts.ok()) ++idle_steps;
    if (ts.ok()) last_entropy = trained.metrics().entropy();
    if (ts.ok() && !publish()) return 1;
    double heldout = std::nan("");
    const bool eval_now = step % absl::GetFlag(FLAGS_eval_every) == 0;
    auto log_row = [&](uint64_t version) {
      csv << absl::StrFormat("%d,%.2f,%d,%.4f,%.4f,%d,%s\n", step, absl::ToDoubleSeconds(absl::Now() - start),
                             version, reward_sum / generated.completions_size(), last_entropy, idle_steps,
                             std::isnan(heldout) ? "nan" : absl::StrFormat("%.4f", heldout))
          << std::flush;
    };
    if (!eval_now) log_row(generated.completions_size() ? generated.completions(0).token_policy_versions(0) : 0);
    if (eval_now) {
      v1::GenerateBatchResponse eval;
      v1::ScoreResponse eval_scored;
      if (!Rollout(base, rollout, reward.get(), held_out, 1, 0.0f, 0, absl::StrCat("eval", step), &eval,
                   &eval_scored)) {
        return 1;
      }
      int exact = 0;
      for (const auto& r : eval_scored.results()) exact += r.reward() >= 1.0f;
      const double em = static_cast<double>(exact) / held_out.size();
      heldout = em;
      log_row(eval.completions_size() ? eval.completions(0).token_policy_versions(0) : 0);
      std::cout << absl::StrFormat("step %4d  %6.1f s  policy v%-4d  train reward %.3f  entropy %.3f  "
                                   "idle steps %d  held-out exact %.3f\n",
                                   step, absl::ToDoubleSeconds(absl::Now() - start),
                                   eval.completions_size() ? eval.completions(0).token_policy_versions(0) : 0,
                                   reward_sum / generated.completions_size(), last_entropy, idle_steps, em)
                << std::flush;
      if (em >= absl::GetFlag(FLAGS_stop_at)) break;
    }
  }
  csv.close();
  PlotCurves(run_dir);
  std::cout << "metrics: " << (run_dir / "metrics.csv").string() << "\ncurve:   "
            << (run_dir / "reward_curve.png").string() << "\n";
  return 0;
}

}  // namespace rlfleet::controller
