// rlfleet: the command-line interface to a running fleet.
//
//   rlfleet status   [--controller=HOST:PORT]   run state, replicas per role, health
//   rlfleet replicas [--role=rollout]           registered replicas
//   rlfleet health                              the controller's health (exit 0 if SERVING)
//   rlfleet try --rollout=A --reward=B --buffer=C --prompt=reverse:123 [--samples=4]
//                                               one prompt through the fleet: generate,
//                                               score, put into the buffer
//   rlfleet train --trainer=D [--groups=8]      one TrainStep on groups from the buffer
//   rlfleet loop --loop_rollout=A --loop_reward=B --loop_buffer=C --loop_trainer=D
//                                               the RL loop across the services, driven
//                                               from here (metrics.csv, reward_curve.png)
//   rlfleet run [loop flags]                    the controller runs the loop (StartRun);
//                                               progress until it ends
//   rlfleet stop                                StopRun
//   rlfleet doctor [--json] [--fleet]           network checklist on this host (--fleet: and
//                                               across registered replicas); exit 1 on
//                                               any failed check
//   rlfleet nccl-profiles                       the NCCL tuning profiles (--nccl_profile of
//                                               the services), as documented export lines
//   rlfleet nccl-log FILE [--json]              summary of an NCCL_DEBUG=INFO log: version,
//                                               ranks, network, channels, rings / trees,
//                                               transports, warnings and errors
//   rlfleet tokenize --model_dir=DIR --text=T   a checkpoint's token ids for T as a JSON
//                    (or --ids=1,2,3)           array (the text of ids), as the tokenizers
//                                               library gives them
//   rlfleet tokenize --model_dir=DIR --chat=F   the ids of a conversation (F: a JSON array
//                    [--add_generation_prompt]  of messages, or {"messages", "tools", other
//                    [--chat_text]              template variables}) through the model's
//                                               chat template, as transformers'
//                                               apply_chat_template (--chat_text: the text)
//
// Auth flags (--auth_token_file, --tls_ca, --tls_cert, --tls_key) as for every binary.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/common/config.h"
#include "libs/common/files.h"
#include "libs/common/ids.h"
#include "libs/common/run_file.h"
#include "libs/metrics/http_server.h"
#include "libs/model/chat_template.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/tokenizer.h"
#include "libs/nccl_tuning/nccl_env.h"
#include "libs/nccl_tuning/nccl_log.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "rlfleet/v1/common.pb.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"
#include "services/controller/cli_loop.h"
#include "services/controller/controller_client.h"
#include "services/controller/doctor.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:7000", "Controller address (host:port).");
ABSL_FLAG(std::string, role, "", "replicas: only this role (rollout, reward, ...).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "Deadline of each call.");
ABSL_FLAG(std::string, rollout, "", "try: rollout replica address.");
ABSL_FLAG(std::string, reward, "", "try: reward service address.");
ABSL_FLAG(std::string, buffer, "", "try: buffer address (optional).");
ABSL_FLAG(std::string, prompt, "reverse:12345", "try: the prompt.");
ABSL_FLAG(bool, json, false, "doctor, nccl-log: print JSON instead of a table.");
ABSL_FLAG(bool, fleet, false,
          "doctor: also check across the replicas registered with --controller (NCCL_* settings that differ, "
          "clock skew).");
ABSL_FLAG(int, samples, 4, "try: responses to sample.");
ABSL_FLAG(std::string, trainer, "", "train: trainer address.");
ABSL_FLAG(int, groups, 8, "train: groups per step.");
ABSL_FLAG(std::string, model_dir, "",
          "tokenize, and loop / run with --dataset: a Hugging Face model directory (its tokenizer.json), or the "
          "tokenizer.json itself.");
ABSL_FLAG(std::string, text, "", "tokenize: the text to encode (prints its token ids as a JSON array).");
ABSL_FLAG(std::string, ids, "", "tokenize: comma-separated token ids to decode instead (prints the text).");
ABSL_FLAG(std::string, chat, "",
          "tokenize: a JSON file with a conversation to render through --model_dir's chat template: an array of "
          "messages ({\"role\", \"content\", ...}), or an object with \"messages\", optional \"tools\" and any "
          "other template variables (e.g. \"enable_thinking\": false).");
ABSL_FLAG(bool, add_generation_prompt, false,
          "tokenize --chat: end with the template's prompt for the assistant's reply.");
ABSL_FLAG(bool, chat_text, false, "tokenize --chat: print the rendered text instead of its token ids.");

namespace {

using rlfleet::controller::ControllerClient;
namespace v1 = rlfleet::v1;

std::string RoleName(v1::ReplicaRole role) {
  std::string name = v1::ReplicaRole_Name(role);
  const std::string prefix = "REPLICA_ROLE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

int Fail(const absl::Status& status) {
  std::cerr << "rlfleet: " << status << "\n";
  return 1;
}

int Health(ControllerClient& client) {
  auto health = client.CheckHealth();
  if (!health.ok()) return Fail(health.status());
  const bool serving = health->status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::cout << "controller " << client.options().target << ": "
            << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(health->status()) << "\n";
  return serving ? 0 : 1;
}

int Status(ControllerClient& client) {
  if (int rc = Health(client); rc != 0) return rc;
  auto status = client.GetStatus();
  if (!status.ok()) return Fail(status.status());
  std::cout << "run: " << (status->run_id().empty() ? "(none)" : status->run_id())
            << "  state: " << v1::RunState_Name(status->state()) << "  step: " << status->step()
            << "  policy version: " << status->policy_version().version() << "\n";
  if (!status->run_id().empty()) {
    std::cout << "  experiences accepted: " << status->metrics().experiences_accepted() << "\n";
    if (status->metrics().failed_checkpoints() > 0) {
      std::cout << "  periodic checkpoints failed: " << status->metrics().failed_checkpoints()
                << " (the run went on; see the controller's log)\n";
    }
  }
  if (status->replicas().empty()) std::cout << "replicas: none registered\n";
  for (const v1::RoleSummary& role : status->replicas()) {
    std::cout << absl::StrFormat("  %-10s registered %u  admitted %u", RoleName(role.role()), role.registered(),
                                 role.admitted());
    if (role.desired() > 0 || role.registered() == 0) std::cout << "  desired " << role.desired();
    std::cout << "\n";
  }
  return 0;
}

// "rollout" -> REPLICA_ROLE_ROLLOUT (any case); nullopt for a name that is not a role.
std::optional<v1::ReplicaRole> ParseRole(const std::string& name) {
  v1::ReplicaRole role;
  if (!v1::ReplicaRole_Parse("REPLICA_ROLE_" + absl::AsciiStrToUpper(name), &role)) return std::nullopt;
  return role;
}

// Every replica the registry lists for `request`, over all pages.
absl::StatusOr<std::vector<v1::ReplicaInfo>> ListAllReplicas(ControllerClient& client,
                                                             v1::ListReplicasRequest request) {
  std::vector<v1::ReplicaInfo> all;
  for (;;) {
    auto page = client.ListReplicas(request);
    if (!page.ok()) return page.status();
    all.insert(all.end(), page->replicas().begin(), page->replicas().end());
    if (page->next_page_token().empty()) return all;
    request.mutable_page()->set_page_token(page->next_page_token());
  }
}

int Replicas(ControllerClient& client) {
  v1::ListReplicasRequest request;
  if (!absl::GetFlag(FLAGS_role).empty()) {
    std::optional<v1::ReplicaRole> role = ParseRole(absl::GetFlag(FLAGS_role));
    if (!role) return Fail(absl::InvalidArgumentError("--role " + absl::GetFlag(FLAGS_role) + " is not a role"));
    request.set_role(*role);
  }
  auto replicas = ListAllReplicas(client, request);
  if (!replicas.ok()) return Fail(replicas.status());
  for (const v1::ReplicaInfo& r : *replicas) {
    std::cout << absl::StrFormat("%-32s %-10s %-22s version %-6u %s\n", r.replica_id(), RoleName(r.role()),
                                 r.grpc_address(), r.policy_version().version(),
                                 r.admitted() ? "admitted" : "not admitted");
  }
  return 0;
}

// A usage error for `command` (exit code 2): a flag it needs is missing or out of range.
int Usage(absl::string_view command, absl::string_view problem, absl::string_view usage) {
  std::cerr << "rlfleet " << command << ": " << problem << "\nusage: " << usage << "\n";
  return 2;
}

constexpr char kTryUsage[] =
    "rlfleet try --rollout=HOST:PORT --reward=HOST:PORT [--buffer=HOST:PORT] [--prompt=reverse:123] [--samples=4]";
constexpr char kTrainUsage[] = "rlfleet train --trainer=HOST:PORT [--groups=8]";

using rlfleet::rpc::Retry;
using rlfleet::rpc::ServiceClient;

// A client of `Service` at `target` (the value of `flag`), or the error that says why
// there is none. The calls' deadline is --timeout.
template <typename Service>
absl::StatusOr<std::unique_ptr<ServiceClient<Service>>> ClientOf(const rlfleet::rpc::ClientOptions& base,
                                                                 absl::string_view flag, const std::string& target) {
  rlfleet::rpc::ClientOptions o = base;
  o.target = target;
  o.default_timeout = absl::GetFlag(FLAGS_timeout);
  auto client = ServiceClient<Service>::Connect(o);
  if (!client.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", client.status().message()));
  return client;
}

int Try(const rlfleet::rpc::ClientOptions& base) {
  if (absl::GetFlag(FLAGS_rollout).empty()) return Usage("try", "--rollout is required (a rollout replica)", kTryUsage);
  if (absl::GetFlag(FLAGS_reward).empty()) return Usage("try", "--reward is required (the reward service)", kTryUsage);
  const int samples = absl::GetFlag(FLAGS_samples);
  if (samples < 1 || samples > 64) {
    return Usage("try", absl::StrCat("--samples=", samples, " is outside 1..64"), kTryUsage);
  }
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  auto ids = rlfleet::model::Tokenizer::EncodePrompt(prompt);
  if (!ids.ok()) return Fail(ids.status());
  auto rollout = ClientOf<v1::RolloutService>(base, "--rollout", absl::GetFlag(FLAGS_rollout));
  if (!rollout.ok()) return Fail(rollout.status());
  auto reward = ClientOf<v1::RewardService>(base, "--reward", absl::GetFlag(FLAGS_reward));
  if (!reward.ok()) return Fail(reward.status());
  std::unique_ptr<ServiceClient<v1::BufferService>> buffer;
  if (!absl::GetFlag(FLAGS_buffer).empty()) {
    auto connected = ClientOf<v1::BufferService>(base, "--buffer", absl::GetFlag(FLAGS_buffer));
    if (!connected.ok()) return Fail(connected.status());
    buffer = *std::move(connected);
  }
  v1::GenerateBatchRequest gen;
  gen.set_request_id(rlfleet::common::NewId("try"));
  gen.set_num_samples(static_cast<uint32_t>(samples));
  gen.mutable_sampling()->set_temperature(1.0f);
  gen.mutable_sampling()->set_max_new_tokens(12);
  v1::BatchPrompt* bp = gen.add_prompts();
  bp->set_prompt_id(prompt);
  bp->set_task(prompt.substr(0, prompt.find(':')));
  for (int32_t id : *ids) bp->add_prompt_token_ids(id);
  v1::GenerateBatchResponse generated;
  if (auto s =
          (*rollout)->Unary("GenerateBatch", &v1::RolloutService::Stub::GenerateBatch, gen, &generated, Retry::kOnce);
      !s.ok()) {
    return Fail(s);
  }

  v1::ScoreRequest score;
  for (const v1::Experience& e : generated.completions()) {
    v1::ScoreItem* item = score.add_items();
    item->set_item_id(e.experience_id().value());
    item->set_task(e.task());
    item->set_prompt_text(prompt);
    item->set_response_text(rlfleet::model::Tokenizer::DecodeResponse(
        std::vector<int32_t>(e.response_token_ids().begin(), e.response_token_ids().end())));
  }
  v1::ScoreResponse scored;
  if (auto s = (*reward)->Unary("Score", &v1::RewardService::Stub::Score, score, &scored, Retry::kIdempotent);
      !s.ok()) {
    return Fail(s);
  }
  if (scored.results_size() != score.items_size()) {
    return Fail(absl::InternalError(
        absl::StrCat("Score: ", scored.results_size(), " results for ", score.items_size(), " samples")));
  }

  std::cout << "prompt " << prompt << " (policy version "
            << (generated.completions_size() && generated.completions(0).token_policy_versions_size()
                    ? generated.completions(0).token_policy_versions(0)
                    : 0)
            << ")\n";
  v1::PutExperiencesRequest put;
  for (int i = 0; i < generated.completions_size(); ++i) {
    v1::Experience e = generated.completions(i);
    e.set_reward(scored.results(i).reward());
    std::cout << absl::StrFormat("  sample %d: %-14s reward %+.2f\n", i, "\"" + score.items(i).response_text() + "\"",
                                 scored.results(i).reward());
    *put.add_experiences() = std::move(e);
  }
  if (buffer != nullptr) {
    v1::PutExperiencesResponse put_response;
    if (auto s = buffer->Unary("PutExperiences", &v1::BufferService::Stub::PutExperiences, put, &put_response,
                               Retry::kIdempotent);  // (the buffer drops ids it has seen)
        !s.ok()) {
      return Fail(s);
    }
    v1::GetStatsResponse stats;
    if (auto s = buffer->Unary("GetStats", &v1::BufferService::Stub::GetStats, v1::GetStatsRequest(), &stats,
                               Retry::kIdempotent);
        !s.ok()) {
      return Fail(s);
    }
    std::cout << "buffer: accepted " << put_response.accepted() << ", holds " << stats.depth_experiences()
              << " experiences in " << stats.complete_groups() << " complete groups (" << stats.buffer_bytes()
              << " bytes)\n";
  }
  return 0;
}

int Train(const rlfleet::rpc::ClientOptions& base) {
  if (absl::GetFlag(FLAGS_trainer).empty()) return Usage("train", "--trainer is required", kTrainUsage);
  const int groups = absl::GetFlag(FLAGS_groups);
  if (groups < 1 || groups > 1024) {
    return Usage("train", absl::StrCat("--groups=", groups, " is outside 1..1024"), kTrainUsage);
  }
  auto trainer = ClientOf<v1::TrainerService>(base, "--trainer", absl::GetFlag(FLAGS_trainer));
  if (!trainer.ok()) return Fail(trainer.status());
  v1::TrainStepRequest request;
  request.mutable_buffer()->set_num_groups(static_cast<uint32_t>(groups));
  request.mutable_buffer()->set_min_groups(1);
  v1::TrainStepResponse response;
  if (auto s = (*trainer)->Unary("TrainStep", &v1::TrainerService::Stub::TrainStep, request, &response, Retry::kOnce);
      !s.ok()) {
    return Fail(s);
  }
  const v1::TrainMetrics& m = response.metrics();
  std::cout << absl::StrFormat(
      "step %d -> policy version %d: %d sequences, %d tokens, reward %.3f +- %.3f, loss %.4f, grad norm %.3f, "
      "%.0f ms\n",
      response.step(), response.new_policy_version().version(), m.sequences(), m.tokens(), m.reward_mean(),
      m.reward_std(), m.loss(), m.grad_norm(), m.step_time_ms());
  return 0;
}

// `doctor --fleet`: checks across the replicas registered with the controller (their
// NCCL_* labels, and their clocks read from their /metrics).
absl::Status FleetChecks(ControllerClient& client, std::vector<rlfleet::controller::CheckResult>* results) {
  std::vector<rlfleet::controller::ReplicaLabels> replicas;
  std::vector<rlfleet::controller::ClockSample> clocks;
  auto listed = ListAllReplicas(client, {});
  if (!listed.ok()) return listed.status();
  for (const v1::ReplicaInfo& r : *listed) {
    replicas.push_back({r.replica_id(), {r.labels().begin(), r.labels().end()}});
    // Its clock, from its /metrics (the port it registered as a label).
    auto port = r.labels().find("metrics_port");
    int metrics_port = 0;
    if (port == r.labels().end() || !absl::SimpleAtoi(port->second, &metrics_port)) continue;
    const std::string host = r.grpc_address().substr(0, r.grpc_address().rfind(':'));
    rlfleet::controller::ClockSample sample;
    sample.id = r.replica_id();
    sample.sent = absl::Now();
    auto exposition = rlfleet::metrics::FetchMetrics(host, metrics_port, absl::Seconds(5));
    sample.received = absl::Now();
    if (exposition.ok()) sample.unix_seconds = rlfleet::metrics::FindSample(*exposition, "rlfleet_time_seconds");
    if (!sample.unix_seconds) {
      sample.error =
          exposition.ok() ? "no rlfleet_time_seconds in its /metrics" : std::string(exposition.status().message());
    }
    clocks.push_back(std::move(sample));
  }
  for (auto& r : rlfleet::controller::CheckNcclConsistency(replicas)) results->push_back(std::move(r));
  for (auto& r : rlfleet::controller::CheckNumaBinding(replicas)) results->push_back(std::move(r));
  for (auto& r : rlfleet::controller::CheckClockSkew(clocks)) results->push_back(std::move(r));
  return absl::OkStatus();
}

// `rlfleet scale ROLE=N`: the desired count of a role (the launcher acts on it).
int Scale(ControllerClient& client, const std::string& spec) {
  const size_t eq = spec.find('=');
  uint32_t count = 0;
  std::optional<v1::ReplicaRole> role;
  if (eq == std::string::npos || !absl::SimpleAtoi(spec.substr(eq + 1), &count) ||
      !(role = ParseRole(spec.substr(0, eq)))) {
    return Fail(absl::InvalidArgumentError("want ROLE=N, e.g. rollout=3; got `" + spec + "`"));
  }
  v1::ScaleRequest request;
  request.set_role(*role);
  request.set_target_count(count);
  auto scaled = client.Scale(request);
  if (!scaled.ok()) return Fail(scaled.status());
  std::cout << absl::StrFormat("%s: desired %u (was %u), %u registered now\n", RoleName(*role), scaled->target_count(),
                               scaled->previous_count(), scaled->registered());
  return 0;
}

// `rlfleet nccl-log FILE`: what an NCCL_DEBUG=INFO log says (exit 1 when it names a
// problem).
int NcclLog(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", path)));
  std::stringstream text;
  text << in.rdbuf();
  const rlfleet::nccl::NcclLogSummary summary = rlfleet::nccl::ParseNcclLog(text.str());
  if (summary.nccl_lines == 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(path, " has no NCCL lines (run with NCCL_DEBUG=INFO)")));
  }
  std::cout << rlfleet::nccl::FormatNcclLogSummary(summary, absl::GetFlag(FLAGS_json));
  return summary.problems.empty() ? 0 : 1;
}

// `rlfleet doctor [--fleet]`: this machine's checks, and the fleet's with --fleet.
int Doctor(ControllerClient& client) {
  auto results = rlfleet::controller::RunLocalChecks();
  if (absl::GetFlag(FLAGS_fleet)) {
    if (absl::Status fleet = FleetChecks(client, &results); !fleet.ok()) return Fail(fleet);
  }
  std::cout << rlfleet::controller::FormatResults(results, absl::GetFlag(FLAGS_json));
  for (const auto& r : results) {
    if (r.status == rlfleet::controller::CheckStatus::kFail) return 1;
  }
  return 0;
}

// What a command needs before it runs: nothing (local), the client options from the
// flags (it calls the services it is given), or a client of --controller too.
// rlfleet tokenize --model_dir=DIR (--text=T | --ids=1,2,3): a checkpoint's tokenizer
// from the command line, as the `tokenizers` library encodes and decodes.
// The --chat conversation of `rlfleet tokenize` rendered through the model directory's
// chat template.
absl::StatusOr<std::string> RenderChat(const std::string& dir, const std::string& file) {
  auto chat = rlfleet::model::ChatTemplate::FromModelDir(dir);
  if (!chat.ok()) return chat.status();
  auto text = rlfleet::common::ReadRegularFile("--chat", file, /*max_bytes=*/64 << 20);
  if (!text.ok()) return text.status();
  auto json = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("--chat: ", file, " is not JSON"));
  nlohmann::ordered_json messages = json, tools = nullptr, extra = nlohmann::ordered_json::object();
  if (json.is_object()) {
    if (!json.contains("messages")) {
      return absl::InvalidArgumentError(absl::StrCat("--chat: ", file, " is an object without \"messages\""));
    }
    messages = json["messages"];
    for (const auto& [key, value] : json.items()) {
      if (key == "tools") {
        tools = value;
      } else if (key != "messages") {
        extra[key] = value;
      }
    }
  }
  return (*chat)->Apply(messages, absl::GetFlag(FLAGS_add_generation_prompt), tools, extra);
}

int Tokenize() {
  constexpr char kUsage[] =
      "rlfleet tokenize --model_dir=DIR (--text=TEXT | --ids=ID,ID,... | --chat=FILE.json "
      "[--add_generation_prompt] [--chat_text])";
  const std::string dir = absl::GetFlag(FLAGS_model_dir), ids_flag = absl::GetFlag(FLAGS_ids),
                    chat = absl::GetFlag(FLAGS_chat);
  if (dir.empty()) return Usage("tokenize", "--model_dir is required", kUsage);
  if (!chat.empty() && (!ids_flag.empty() || !absl::GetFlag(FLAGS_text).empty())) {
    return Usage("tokenize", "--chat goes alone, without --text or --ids", kUsage);
  }
  std::string text = absl::GetFlag(FLAGS_text);
  if (!chat.empty()) {
    auto rendered = RenderChat(dir, chat);
    if (!rendered.ok()) return Fail(rendered.status());
    if (absl::GetFlag(FLAGS_chat_text)) {
      std::cout << *rendered;
      return 0;
    }
    text = *std::move(rendered);
  }
  auto tokenizer = rlfleet::model::HfTokenizer::FromFile(dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  if (!ids_flag.empty()) {
    std::vector<int32_t> ids;
    for (absl::string_view part : absl::StrSplit(ids_flag, ',')) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id))
        return Usage("tokenize", absl::StrCat("--ids: `", part, "` is not an id"), kUsage);
      ids.push_back(id);
    }
    auto decoded = (*tokenizer)->Decode(ids);
    if (!decoded.ok()) return Fail(decoded.status());
    std::cout << *decoded << "\n";
    return 0;
  }
  auto ids = (*tokenizer)->Encode(text);
  if (!ids.ok()) return Fail(ids.status());
  std::cout << "[" << absl::StrJoin(*ids, ", ") << "]\n";
  return 0;
}

// rlfleet run-file SECTION.KEY --config=run.yaml: one value of a run file (empty when
// the file does not set it), for scripts (deploy/local/launch.sh reads fleet.rollouts).
int RunFileGet(const std::string& key) {
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty() || !rlfleet::common::IsRunFile(path)) {
    return Usage("run-file", "--config=FILE.yaml is required", "rlfleet run-file SECTION.KEY --config=run.yaml");
  }
  auto text = rlfleet::common::ReadConfigFileText(path);
  if (!text.ok()) return Fail(text.status());
  auto value = rlfleet::common::RunFileValue(*text, path, key);
  if (absl::IsNotFound(value.status())) {
    std::cout << "\n";
    return 0;
  }
  if (!value.ok()) return Fail(value.status());
  std::cout << *value << "\n";
  return 0;
}

enum class Needs { kNothing, kOptions, kController };

// What a command is given: its argument (scale's ROLE=N, nccl-log's FILE), the client
// options from the flags and, for the commands that talk to the controller, a client.
struct Invocation {
  std::string argument;
  rlfleet::rpc::ClientOptions options;
  ControllerClient* controller = nullptr;
};

// The CLI: every command once, with its argument, whether it talks to the controller,
// and what it does. The usage line and the unknown-command message come from here.
struct Command {
  const char* name;
  const char* argument;  // e.g. "ROLE=N"; empty: none
  Needs needs;
  int (*run)(Invocation& invocation);
};
constexpr Command kCommands[] = {
    {"status", "", Needs::kController, [](Invocation& c) { return Status(*c.controller); }},
    {"replicas", "", Needs::kController, [](Invocation& c) { return Replicas(*c.controller); }},
    {"health", "", Needs::kController, [](Invocation& c) { return Health(*c.controller); }},
    {"try", "", Needs::kOptions, [](Invocation& c) { return Try(c.options); }},
    {"train", "", Needs::kOptions, [](Invocation& c) { return Train(c.options); }},
    {"loop", "", Needs::kOptions, [](Invocation& c) { return rlfleet::controller::RunLoop(c.options); }},
    {"run", "", Needs::kController, [](Invocation& c) { return rlfleet::controller::StartRunAndWatch(*c.controller); }},
    {"stop", "", Needs::kController, [](Invocation& c) { return rlfleet::controller::StopRun(*c.controller); }},
    {"doctor", "", Needs::kController, [](Invocation& c) { return Doctor(*c.controller); }},
    {"scale", "ROLE=N", Needs::kController, [](Invocation& c) { return Scale(*c.controller, c.argument); }},
    {"nccl-profiles", "", Needs::kNothing,
     [](Invocation&) {
       std::cout << rlfleet::nccl::FormatNcclProfiles();
       return 0;
     }},
    {"nccl-log", "FILE", Needs::kNothing, [](Invocation& c) { return NcclLog(c.argument); }},
    {"tokenize", "", Needs::kNothing, [](Invocation&) { return Tokenize(); }},
    {"run-file", "SECTION.KEY", Needs::kNothing, [](Invocation& c) { return RunFileGet(c.argument); }},
};

std::string UsageLine() {
  std::vector<std::string> names;
  for (const Command& c : kCommands) names.push_back(*c.argument ? absl::StrCat(c.name, " ", c.argument) : c.name);
  return absl::StrCat("usage: rlfleet ", absl::StrJoin(names, "|"), " [--controller=HOST:PORT]");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = rlfleet::common::ParseFlagsWithConfig(argc, argv, UsageLine());
  const Command* command = nullptr;
  if (args.size() >= 2) {
    for (const Command& c : kCommands) {
      if (args[1] == c.name) command = &c;
    }
  }
  if (command == nullptr || args.size() != (*command->argument ? 3u : 2u)) {
    if (args.size() >= 2 && command == nullptr) {
      std::vector<std::string> names;
      for (const Command& c : kCommands) names.push_back(c.name);
      std::cerr << "rlfleet: unknown command `" << args[1] << "` (" << absl::StrJoin(names, ", ") << ")\n";
    }
    std::cerr << UsageLine() << "\n";
    return 2;
  }
  Invocation invocation;
  if (args.size() == 3) invocation.argument = args[2];
  if (command->needs == Needs::kNothing) return command->run(invocation);
  auto options = rlfleet::rpc::ClientOptionsFromFlags(absl::GetFlag(FLAGS_controller));
  if (!options.ok()) return Fail(options.status());
  options->default_timeout = absl::GetFlag(FLAGS_timeout);
  invocation.options = *options;
  std::unique_ptr<ControllerClient> client;
  if (command->needs == Needs::kController) {
    auto connected = ControllerClient::Connect(*options);
    if (!connected.ok()) return Fail(connected.status());
    client = std::move(*connected);
    invocation.controller = client.get();
  }
  return command->run(invocation);
}
