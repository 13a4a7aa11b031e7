// The control plane under open-loop load (issue 22, item 5).
//
//   bazel run -c opt //loadtest:control_plane [-- --repeats=3]
//
// In one process: the real services (reward, buffer with its Redis store, trainer,
// rollout with a tiny policy, the controller's registry on Redis) and bare gRPC echo
// servers of the same services answering canned replies of the same shapes. First one
// controller with Redis holds heartbeats from --replicas simulated replicas at their
// real period (TTL / 3): the rate, the latencies and how many are still live after.
// Then for each RPC (rollout Generate, reward Score, buffer PutExperiences and
// StreamExperiences, trainer GetState, registry Heartbeat) it finds the highest arrival
// rate each target sustains (open loop: every call OK, answers keeping up, p99 under
// --max_p99), echo and service alternately, and prints service / echo. Generate, whose
// work is the model's, is also driven into the rollout's core in process (no gRPC),
// and its bound is what gRPC and that model could sustain together on these cores
// (Measured::bound).
//
// The last line is `control_plane_qps_ratio_vs_echo=R`, the lowest service / bound over
// the RPCs.
// Tables (Markdown, CSV of every level) and a plot (gnuplot, when installed) go to
// --out.* (relative paths resolve in the workspace under `bazel run`).
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "libs/common/clock.h"
#include "libs/model/policy.h"
#include "libs/model/test_util.h"
#include "libs/registry/registry.h"
#include "libs/rpc/server_runner.h"
#include "libs/rpc/status_conversion.h"
#include "loadtest/callers.h"
#include "loadtest/echo_services.h"
#include "loadtest/open_loop.h"
#include "services/buffer/buffer_core.h"
#include "services/buffer/buffer_service.h"
#include "services/buffer/buffer_store.h"
#include "services/controller/controller_core.h"
#include "services/controller/controller_service.h"
#include "services/reward/reward_core.h"
#include "services/reward/reward_service.h"
#include "services/rollout/rollout_core.h"
#include "services/rollout/rollout_service.h"
#include "services/trainer/trainer_core.h"
#include "services/trainer/trainer_service.h"
#include "tests/util/redis_for_test.h"

ABSL_FLAG(std::string, rpcs, "Generate,Score,PutExperiences,StreamExperiences,GetState,Heartbeat",
          "the RPCs to measure, comma-separated");
ABSL_FLAG(double, level_seconds, 2, "how long each offered rate runs");
ABSL_FLAG(absl::Duration, max_p99, absl::Milliseconds(50), "a rate is sustained only with p99 at most this");
ABSL_FLAG(double, start_qps, 500, "the first rate each search offers");
ABSL_FLAG(int, repeats, 1, "searches per target and RPC (echo and service alternate); the median counts");
ABSL_FLAG(int, channels, 2, "client channels (each its own connection), used in turn");
ABSL_FLAG(int, replicas, 10000, "simulated replicas heartbeating one controller (0: skip)");
ABSL_FLAG(absl::Duration, heartbeat_duration, absl::Seconds(20), "how long the simulated replicas heartbeat");
ABSL_FLAG(std::string, buffer_store, "redis", "the real buffer's store: redis or memory");
ABSL_FLAG(int, generate_tokens, 1,
          "tokens each Generate call decodes (the tiny policy, ignore_eos); 1 keeps the model's share small: "
          "decode speed is bench/rollout_tokens' subject");
ABSL_FLAG(int, threads, 1,
          "the rollout's and trainer's compute threads (one: the client, the echo and the services share this "
          "machine's cores, and a second model thread only takes the core gRPC needs)");
ABSL_FLAG(std::string, out, "bench/results/control_plane", "prefix of the output files (.md, .csv, .png)");

namespace rlfleet::loadtest {
namespace {

// --- The services ---------------------------------------------------------------------

void Check(const absl::Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}
void Check(const grpc::Status& s, const std::string& what) { Check(rpc::ToAbslStatus(s), what); }

// The fleet's real services on one server, and their echoes on another.
struct Fleet {
  std::unique_ptr<registry::Registry> registry;
  std::unique_ptr<controller::ControllerCore> controller;
  std::unique_ptr<buffer::BufferStore> store;
  std::unique_ptr<buffer::BufferCore> buffer;
  std::unique_ptr<reward::RewardCore> reward;
  std::unique_ptr<trainer::TrainerCore> trainer;
  std::unique_ptr<rollout::RolloutCore> rollout;
  std::vector<std::unique_ptr<grpc::Service>> services;
  std::unique_ptr<rpc::ServerRunner> server;

  EchoReplies replies;
  std::vector<std::unique_ptr<grpc::Service>> echo_services;
  std::unique_ptr<rpc::ServerRunner> echo_server;

  // The trainer's side of the buffer: samples complete groups and acks them, as a
  // trainer would, so that Puts never meet a full buffer.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> consumed_groups{0};
  std::thread consumer;

  ~Fleet() {
    stop = true;
    if (consumer.joinable()) consumer.join();
    if (server) server->Shutdown();
    if (echo_server) echo_server->Shutdown();
  }
};

std::unique_ptr<Fleet> StartFleet(int redis_port) {
  auto fleet = std::make_unique<Fleet>();
  common::Clock* clock = common::Clock::Real();
  const std::string prefix = absl::StrCat("rlfleet-loadtest-", getpid());
  auto reg = registry::OpenRegistry(absl::StrCat("redis://127.0.0.1:", redis_port, "/", prefix, "-registry:"), clock);
  Check(reg.status(), "registry");
  fleet->registry = std::move(*reg);
  fleet->controller = std::make_unique<controller::ControllerCore>(fleet->registry.get(), clock);

  const std::string store_kind = absl::GetFlag(FLAGS_buffer_store);
  if (store_kind == "redis") {
    auto store = buffer::OpenBufferStore(absl::StrCat("redis://127.0.0.1:", redis_port, "/", prefix, "-buffer:"));
    Check(store.status(), "buffer store");
    fleet->store = std::move(*store);
  } else if (store_kind != "memory") {
    Check(absl::InvalidArgumentError("--buffer_store must be redis or memory, got " + store_kind), "flags");
  }
  fleet->buffer = std::make_unique<buffer::BufferCore>(clock, fleet->store.get());
  v1::ConfigureRequest configure;
  configure.set_group_size(kGroupSize);
  configure.set_max_staleness(4);
  configure.set_capacity_bytes(uint64_t{2} << 30);
  v1::ConfigureResponse configured;
  Check(fleet->buffer->Configure(configure, &configured), "buffer Configure");

  fleet->reward = std::make_unique<reward::RewardCore>();
  auto trainer = trainer::TrainerCore::Create(model::TinyConfig(), "cpu", 1);
  Check(trainer.status(), "trainer");
  fleet->trainer = std::move(*trainer);
  auto rollout = rollout::RolloutCore::Create(model::TinyConfig(64), "cpu");
  Check(rollout.status(), "rollout");
  fleet->rollout = std::move(*rollout);
  Check(fleet->rollout->InstallInitial(1), "rollout InstallInitial");

  rpc::ServerOptions options;
  options.host = "127.0.0.1";
  fleet->server = std::make_unique<rpc::ServerRunner>(options);
  fleet->services.push_back(std::make_unique<reward::RewardServiceImpl>(fleet->reward.get(), rpc::CallAuth{}));
  fleet->services.push_back(std::make_unique<buffer::BufferServiceImpl>(fleet->buffer.get(), rpc::CallAuth{}));
  fleet->services.push_back(std::make_unique<trainer::TrainerServiceImpl>(fleet->trainer.get(), rpc::CallAuth{}));
  fleet->services.push_back(std::make_unique<rollout::RolloutServiceImpl>(fleet->rollout.get(), rpc::CallAuth{}));
  fleet->services.push_back(
      std::make_unique<controller::RegistryServiceImpl>(fleet->controller.get(), rpc::CallAuth{}));
  for (auto& s : fleet->services) fleet->server->AddService(s.get());
  Check(fleet->server->Start(), "server");

  fleet->consumer = std::thread([f = fleet.get()] {
    while (!f->stop) {
      v1::SampleBatchRequest sample;
      sample.set_num_groups(256);
      sample.set_min_groups(1);
      sample.set_current_policy_version(1);
      sample.set_wait_ms(50);
      sample.set_consumer_id("loadtest-trainer");
      v1::SampleBatchResponseWire batch;  // (what the service sends a trainer: the stored bytes, unparsed)
      absl::Status s = f->buffer->SampleBatch(sample, &batch);
      if (!s.ok() || batch.lease_id().empty()) continue;
      v1::AckBatchRequest ack;
      ack.set_lease_id(batch.lease_id());
      v1::AckBatchResponse acked;
      if (f->buffer->Ack(ack, &acked).ok()) f->consumed_groups += batch.groups_size();
    }
  });
  return fleet;
}

// Records each RPC's reply from the real service (one call each) and starts the echo
// server that answers with them.
void StartEcho(Fleet* fleet, const Channels& real, int generate_tokens, const std::vector<SimulatedReplica>& replicas) {
  EchoReplies& r = fleet->replies;
  {
    grpc::ClientContext c;
    Check(v1::RewardService::NewStub(real[0])->Score(&c, ScoreShape(), &r.score), "recording Score");
  }
  {
    v1::PutExperiencesRequest put;
    for (v1::Experience& e : Group(NextGroupSerial())) *put.add_experiences() = std::move(e);
    grpc::ClientContext c;
    grpc::Status s = v1::BufferService::NewStub(real[0])->PutExperiences(&c, put, &r.put);
    Check(s, "recording Put");
    if (r.put.accepted() != kGroupSize) Check(absl::InternalError(r.put.DebugString()), "recording Put");
    r.stream = r.put;
  }
  {
    grpc::ClientContext c;
    grpc::Status s = v1::TrainerService::NewStub(real[0])->GetState(&c, v1::GetStateRequest(), &r.get_state);
    Check(s, "recording GetState");
  }
  if (!replicas.empty()) {
    v1::HeartbeatRequest h;
    h.set_replica_id(replicas[0].id);
    h.set_lease_id(replicas[0].lease);
    h.mutable_policy_version()->set_version(1);
    grpc::ClientContext c;
    grpc::Status s = v1::RegistryService::NewStub(real[0])->Heartbeat(&c, h, &r.heartbeat);
    Check(s, "recording Heartbeat");
  }
  {
    grpc::ClientContext c;
    auto reader = v1::RolloutService::NewStub(real[0])->Generate(&c, GenerateShape(generate_tokens));
    v1::GenerateResponse m;
    while (reader->Read(&m)) r.generate.push_back(m);
    grpc::Status s = reader->Finish();
    Check(s, "recording Generate");
  }

  rpc::ServerOptions options;
  options.host = "127.0.0.1";
  fleet->echo_server = std::make_unique<rpc::ServerRunner>(options);
  fleet->echo_services.push_back(std::make_unique<EchoReward>(&r));
  fleet->echo_services.push_back(std::make_unique<EchoBuffer>(&r));
  fleet->echo_services.push_back(std::make_unique<EchoTrainer>(&r));
  fleet->echo_services.push_back(std::make_unique<EchoRollout>(&r));
  fleet->echo_services.push_back(std::make_unique<EchoRegistry>(&r));
  for (auto& s : fleet->echo_services) fleet->echo_server->AddService(s.get());
  Check(fleet->echo_server->Start(), "echo server");
}

// Registers `n` simulated rollout replicas (8 callers at once), each with a verified
// version so that it is admitted, under leases of `ttl`.
std::vector<SimulatedReplica> RegisterReplicas(const Channels& channels, int n, absl::Duration ttl) {
  std::vector<SimulatedReplica> replicas(n);
  absl::Mutex mu;
  int failed = 0;
  std::string first_error;
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::RegistryService::NewStub(channels[t % channels.size()]);
      for (int i = next++; i < n; i = next++) {
        v1::RegisterRequest request;
        v1::ReplicaInfo* info = request.mutable_replica();
        info->set_replica_id(absl::StrFormat("rollout-sim-%05d", i));
        info->set_role(v1::REPLICA_ROLE_ROLLOUT);
        info->set_grpc_address(absl::StrCat("rollout-sim-", i, ".fleet.invalid:7100"));
        info->mutable_policy_version()->set_version(1);
        request.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
        v1::RegisterResponse response;
        grpc::ClientContext c;
        c.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
        const grpc::Status st = stub->Register(&c, request, &response);
        absl::MutexLock lock(&mu);
        if (!st.ok()) {
          if (failed++ == 0) first_error = st.error_message();
          continue;
        }
        replicas[i] = {info->replica_id(), response.lease_id()};
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed > 0) Check(absl::InternalError(absl::StrCat(failed, " registrations failed: ", first_error)), "register");
  return replicas;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string Errors(const std::map<std::string, int64_t>& errors) {
  std::vector<std::string> parts;
  for (const auto& [name, n] : errors) parts.push_back(absl::StrCat(name, " ", n));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

struct RpcTarget {
  std::string rpc;
  IssueFn service;
  IssueFn echo;
  std::function<void()> prepare;  // before each search (may be empty)
  // Generate only: the same calls straight into the rollout's core in this process (no
  // gRPC): the model's own capacity, which no control plane can exceed.
  IssueFn in_process;
};

struct Measured {
  std::string rpc;
  std::vector<double> echo_qps, service_qps, in_process_qps;
  // CPU seconds per call at capacity (this process, every thread), echo and in process.
  std::vector<double> echo_cpu_per_call, in_process_cpu_per_call;
  LevelResult echo_at, service_at;                // at capacity, the last repeat's
  std::map<std::string, int64_t> service_errors;  // over the levels that failed
  std::map<std::string, int64_t> echo_errors;
  // CPU seconds per call of every sustained level, by offered rate (this process:
  // client, servers and, for Generate, the model; Redis is another process).
  std::map<double, std::vector<double>> echo_cpu_at, service_cpu_at;
  // Service / echo CPU per call at the highest rate both sustained (medians over the
  // levels at that rate), and that rate; {0, 0} when they share none. Steadier than the
  // capacities, whose edge moves with the machine's noise: what the service costs
  // beyond gRPC at one load.
  std::pair<double, double> CpuRatio() const {
    for (auto it = service_cpu_at.rbegin(); it != service_cpu_at.rend(); ++it) {
      auto echo = echo_cpu_at.find(it->first);
      if (echo == echo_cpu_at.end() || Median(echo->second) <= 0) continue;
      return {Median(it->second) / Median(echo->second), it->first};
    }
    return {0, 0};
  }
  // What a control plane costing nothing beyond gRPC would sustain: the echo's rate;
  // for a call that also does work (Generate's model step, measured in process), at
  // most the work's own rate, and, the work and gRPC sharing these cores, at most
  // cores / (gRPC's CPU per call + the work's), each measured at its capacity (the
  // work's at its largest batches: its least CPU per call, so the bound is generous).
  double bound() const {
    const double e = Median(echo_qps);
    if (in_process_qps.empty()) return e;
    double b = std::min(e, Median(in_process_qps));
    const double cpu = Median(echo_cpu_per_call) + Median(in_process_cpu_per_call);
    if (!echo_cpu_per_call.empty() && !in_process_cpu_per_call.empty() && cpu > 0) {
      b = std::min(b, static_cast<double>(std::thread::hardware_concurrency()) / cpu);
    }
    return b;
  }
  double ratio() const { return bound() > 0 ? Median(service_qps) / bound() : 0; }
  double ratio_vs_echo() const {
    const double e = Median(echo_qps);
    return e > 0 ? Median(service_qps) / e : 0;
  }
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Generate calls into the rollout's core directly: its scheduler and model, no gRPC.
// Each call ends when its stream's last message is pushed (BAD_REPLY without the
// sample's end, as GenerateReader).
IssueFn InProcessGenerateCalls(rollout::RolloutCore* core, int tokens) {
  auto request = std::make_shared<const v1::GenerateRequest>(GenerateShape(tokens));
  return [core, request](int64_t, Done done) {
    auto finished = std::make_shared<std::atomic<bool>>(false);
    auto sink = [done, finished](std::vector<v1::GenerateResponse> messages, bool last, absl::Status status) {
      for (const v1::GenerateResponse& m : messages) {
        if (m.has_finished()) *finished = true;
      }
      if (!last) return;
      int code = static_cast<int>(status.code());
      if (code == 0 && !finished->load()) code = kBadReply;
      done(code);
    };
    absl::StatusOr<std::shared_ptr<rollout::RolloutCore::Job>> job =
        core->Generate(*request, std::move(sink), absl::Now() + absl::FromChrono(kCallDeadline));
    if (!job.ok()) done(static_cast<int>(job.status().code()));
  };
}

// Where --out's relative paths resolve: the workspace under `bazel run`.
std::string OutPrefix() {
  std::string out = absl::GetFlag(FLAGS_out);
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (!out.empty() && out[0] != '/' && workspace != nullptr) out = absl::StrCat(workspace, "/", out);
  return out;
}

// Runs gnuplot (no shell) on `script`; false when it is not installed or fails.
bool RunGnuplot(const std::string& script) {
  if (access("/usr/bin/gnuplot", X_OK) != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/usr/bin/gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int Main() {
  // As the services' mains run them (libs/service: --mutex_deadlock_checks=false).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const std::string cpu = bench::CpuModel();
  std::printf("control plane load test on %s\n", cpu.c_str());
  auto redis_port = testing::RedisPortForTest();
  Check(redis_port.status(), "redis-server");
  std::unique_ptr<Fleet> fleet = StartFleet(*redis_port);
  const int nch = std::max(1, absl::GetFlag(FLAGS_channels));
  const Channels real = Connect(fleet->server->address(), nch);
  std::printf("services on %s (buffer store: %s, Redis on 127.0.0.1:%d)\n", fleet->server->address().c_str(),
              absl::GetFlag(FLAGS_buffer_store).c_str(), *redis_port);

  // One controller holding heartbeats from many replicas at their real period.
  const int n_replicas = absl::GetFlag(FLAGS_replicas);
  std::string heartbeat_line;
  LevelResult beats;
  int64_t live = -1;
  double register_qps = 0;
  if (n_replicas > 0) {
    const absl::Duration ttl = registry::kDefaultTtl;
    const absl::Time t0 = absl::Now();
    std::vector<SimulatedReplica> replicas = RegisterReplicas(real, n_replicas, ttl);
    register_qps = n_replicas / absl::ToDoubleSeconds(absl::Now() - t0);
    const absl::Duration period = ttl / 3;  // the registrar's heartbeat interval
    LevelOptions level;
    level.qps = n_replicas / absl::ToDoubleSeconds(period);
    level.duration = absl::GetFlag(FLAGS_heartbeat_duration);
    std::printf("%d simulated replicas registered (%.0f/s); heartbeating every %s for %s: %.0f/s\n", n_replicas,
                register_qps, absl::FormatDuration(period).c_str(), absl::FormatDuration(level.duration).c_str(),
                level.qps);
    std::fflush(stdout);
    beats = RunLevel(level, HeartbeatCalls(real, std::make_shared<std::vector<SimulatedReplica>>(replicas)));
    live = 0;
    auto stub = v1::RegistryService::NewStub(real[0]);
    v1::ListReplicasRequest list;
    list.set_role(v1::REPLICA_ROLE_ROLLOUT);
    list.set_only_admitted(true);
    list.mutable_page()->set_page_size(1000);
    for (;;) {
      v1::ListReplicasResponse page;
      grpc::ClientContext c;
      const grpc::Status st = stub->ListReplicas(&c, list, &page);
      Check(st, "ListReplicas");
      live += page.replicas_size();
      if (page.next_page_token().empty()) break;
      list.mutable_page()->set_page_token(page.next_page_token());
    }
    heartbeat_line = absl::StrFormat(
        "%d replicas: %.0f heartbeats/s offered, %.0f/s answered OK; p50 %.2f ms, p99 %.2f ms, p999 %.2f ms, "
        "max %.2f ms; errors: %s; %d of %d admitted replicas live after",
        n_replicas, beats.offered_qps, beats.achieved_qps, Ms(beats.p50), Ms(beats.p99), Ms(beats.p999), Ms(beats.max),
        Errors(beats.errors), live, n_replicas);
    std::printf("%s\n", heartbeat_line.c_str());
  }
  // The capacity searches heartbeat far more slowly per replica than the real period:
  // leases of the longest TTL, taken again before each search (none expires within one).
  const int search_replica_count = std::max(1000, n_replicas);
  auto shared_replicas =
      std::make_shared<std::vector<SimulatedReplica>>(RegisterReplicas(real, search_replica_count, registry::kMaxTtl));
  StartEcho(fleet.get(), real, absl::GetFlag(FLAGS_generate_tokens), *shared_replicas);
  const Channels echo = Connect(fleet->echo_server->address(), nch);

  std::vector<RpcTarget> targets;
  const int tokens = absl::GetFlag(FLAGS_generate_tokens);
  for (absl::string_view rpc : absl::StrSplit(absl::GetFlag(FLAGS_rpcs), ',', absl::SkipEmpty())) {
    if (rpc == "Generate") {
      targets.push_back({"Generate", GenerateCalls(real, tokens), GenerateCalls(echo, tokens), nullptr,
                         InProcessGenerateCalls(fleet->rollout.get(), tokens)});
    } else if (rpc == "Score") {
      targets.push_back({"Score", ScoreCalls(real), ScoreCalls(echo)});
    } else if (rpc == "PutExperiences") {
      targets.push_back({"PutExperiences", PutCalls(real), PutCalls(echo)});
    } else if (rpc == "StreamExperiences") {
      targets.push_back({"StreamExperiences", StreamCalls(real), StreamCalls(echo)});
    } else if (rpc == "GetState") {
      targets.push_back({"GetState", GetStateCalls(real), GetStateCalls(echo)});
    } else if (rpc == "Heartbeat") {
      targets.push_back({"Heartbeat", HeartbeatCalls(real, shared_replicas), HeartbeatCalls(echo, shared_replicas),
                         [&real, shared_replicas, search_replica_count] {
                           *shared_replicas = RegisterReplicas(real, search_replica_count, registry::kMaxTtl);
                         }});
    } else {
      Check(absl::InvalidArgumentError(absl::StrCat("--rpcs: unknown RPC `", rpc, "`")), "flags");
    }
  }

  const std::string out = OutPrefix();
  std::ofstream csv(out + ".csv");
  csv << "rpc,target,repeat,offered_qps,achieved_qps,p50_ms,p99_ms,p999_ms,errors,sustained\n";
  std::map<std::string, std::vector<LevelResult>> curves;  // "rpc/target" -> levels
  SearchOptions search;
  search.start_qps = absl::GetFlag(FLAGS_start_qps);
  search.level_duration = absl::Seconds(absl::GetFlag(FLAGS_level_seconds));
  search.max_p99 = absl::GetFlag(FLAGS_max_p99);
  std::vector<Measured> measured;
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  for (const RpcTarget& target : targets) {
    Measured m;
    m.rpc = target.rpc;
    for (int r = 0; r < repeats; ++r) {
      enum Who { kEcho, kService, kInProcess };
      for (const Who w : {kEcho, kService, kInProcess}) {
        if (w == kInProcess && !target.in_process) continue;
        const bool is_echo = w == kEcho;
        const std::string who = w == kEcho ? "echo" : w == kService ? "service" : "in-process";
        if (target.prepare) target.prepare();
        // Generate: how busy the rollout's scheduler was in model steps during each level
        // (LoadStats.utilization, measured since the previous GetInfo).
        const bool model_bound = target.rpc == "Generate" && !is_echo;
        auto busy = [&] {
          v1::GetInfoResponse info;
          return fleet->rollout->GetInfo(&info).ok() ? info.load().utilization() : -1.0;
        };
        if (model_bound) busy();
        // This process's CPU time over each level (every thread: client, servers, model;
        // Redis is another process): per call answered, and in cores.
        double cpu_mark = ProcessCpuSeconds();
        absl::Time wall_mark = absl::Now();
        std::map<double, double> cpu_per_call;  // offered rate -> CPU seconds per call
        SearchOptions options = search;
        // Each level starts with the buffer drained: an overloaded level leaves groups
        // queued for the simulated trainer, which would otherwise still be taking them
        // (and CPU) in the next level, a state the echo never has.
        options.before_level = [&] {
          const absl::Time give_up = absl::Now() + absl::Seconds(30);
          v1::GetStatsResponse stats;
          while (fleet->buffer->GetStats(&stats).ok() && stats.depth_experiences() > 0 && absl::Now() < give_up) {
            absl::SleepFor(absl::Milliseconds(5));  // (polls the buffer's depth: the condition awaited)
          }
          if (stats.depth_experiences() > 0) {
            std::printf("  (the buffer still holds %llu experiences after 30 s)\n",
                        static_cast<unsigned long long>(stats.depth_experiences()));
          }
          cpu_mark = ProcessCpuSeconds();
          wall_mark = absl::Now();
        };
        options.on_level = [&](const LevelResult& level, bool ok) {
          const double cpu = ProcessCpuSeconds() - cpu_mark;
          const double wall = absl::ToDoubleSeconds(absl::Now() - wall_mark);
          cpu_mark += cpu;
          wall_mark = absl::Now();
          cpu_per_call[level.offered_qps] = cpu / std::max<int64_t>(1, level.ok);
          const std::string note = model_bound ? absl::StrFormat("  rollout busy %.0f%%", 100 * busy()) : "";
          std::printf(
              "  %-17s %-7s offered %8.0f/s answered %8.0f/s  p50 %7.2f ms  p99 %7.2f ms  "
              "cpu %.2f cores, %.0f us/call  errors: %s%s%s\n",
              target.rpc.c_str(), who.c_str(), level.offered_qps, level.achieved_qps, Ms(level.p50), Ms(level.p99),
              cpu / std::max(wall, 1e-3), 1e6 * cpu_per_call[level.offered_qps], Errors(level.errors).c_str(),
              note.c_str(), ok ? "" : "  (not sustained)");
          std::fflush(stdout);
          csv << absl::StrFormat("%s,%s,%d,%.1f,%.1f,%.3f,%.3f,%.3f,%d,%d\n", target.rpc, who, r, level.offered_qps,
                                 level.achieved_qps, Ms(level.p50), Ms(level.p99), Ms(level.p999), level.error_count(),
                                 ok ? 1 : 0);
          curves[target.rpc + "/" + who].push_back(level);
          if (ok && w != kInProcess) {
            (is_echo ? m.echo_cpu_at : m.service_cpu_at)[level.offered_qps].push_back(cpu_per_call[level.offered_qps]);
          }
          if (!ok && w != kInProcess) {
            for (const auto& [name, n] : level.errors) (is_echo ? m.echo_errors : m.service_errors)[name] += n;
          }
        };
        const SearchResult found = SearchCapacity(options, w == kEcho      ? target.echo
                                                           : w == kService ? target.service
                                                                           : target.in_process);
        (w == kEcho ? m.echo_qps : w == kService ? m.service_qps : m.in_process_qps).push_back(found.capacity_qps);
        if (w != kService && cpu_per_call.count(found.capacity_qps)) {
          (is_echo ? m.echo_cpu_per_call : m.in_process_cpu_per_call).push_back(cpu_per_call[found.capacity_qps]);
        }
        if (w != kInProcess) (is_echo ? m.echo_at : m.service_at) = found.at_capacity;
        std::printf("%s %s: %.0f calls/s sustained\n", target.rpc.c_str(), who.c_str(), found.capacity_qps);
      }
    }
    if (m.in_process_qps.empty()) {
      std::printf("%s: service / echo = %.3f\n", m.rpc.c_str(), m.ratio());
    } else {
      std::printf("%s: service / bound (%.0f/s) = %.3f (service / echo %.3f)\n", m.rpc.c_str(), m.bound(), m.ratio(),
                  m.ratio_vs_echo());
    }
    measured.push_back(std::move(m));
  }

  // The table.
  double lowest = measured.empty() ? 0 : 1e9;
  std::string lowest_rpc;
  std::ofstream md(out + ".md");
  md << "# Control plane under open-loop load\n\n"
     << "`bazel run -c opt //loadtest:control_plane` on " << cpu << ", "
     << absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::Now(), absl::UTCTimeZone()) << ". Client, services and "
     << "echo share this machine. Capacity: the highest arrival rate with every call OK, answers >= 95% of the "
     << "offered rate and p99 <= " << absl::FormatDuration(search.max_p99) << " (" << repeats
     << " search(es) each, median; levels of " << absl::GetFlag(FLAGS_level_seconds)
     << " s). Buffer store: " << absl::GetFlag(FLAGS_buffer_store)
     << ". Generate: the tiny policy (d_model 32, 2 layers), " << tokens << " tokens per call, "
     << absl::GetFlag(FLAGS_threads) << " compute thread(s); its bound is the lowest of the echo, the same "
     << "calls made into the rollout's core in process (its scheduler and model, no gRPC), and, gRPC and the "
     << "model sharing this machine's " << std::thread::hardware_concurrency() << " cores, cores / (the echo's CPU "
     << "per call + the in-process calls' CPU per call), each at its capacity.\n\n"
     << "CPU per call: this process's (client, servers, for Generate the model), service over echo at the "
     << "highest offered rate both sustained.\n\n"
     << "| RPC | echo calls/s | in process calls/s | service calls/s | service / bound | service / echo "
        "| service p50 / p99 / p999 at capacity (ms) | echo p99 (ms) | errors above capacity (service) "
        "| CPU per call, service / echo (at calls/s) |\n"
     << "|---|---:|---:|---:|---:|---:|---|---:|---|---:|\n";
  for (const Measured& m : measured) {
    const std::string in_process = m.in_process_qps.empty() ? "-" : absl::StrFormat("%.0f", Median(m.in_process_qps));
    const auto [cpu_ratio, cpu_at] = m.CpuRatio();
    md << absl::StrFormat("| %s | %.0f | %s | %.0f | %.3f | %.3f | %.2f / %.2f / %.2f | %.2f | %s | %.2f (%.0f) |\n",
                          m.rpc, Median(m.echo_qps), in_process, Median(m.service_qps), m.ratio(), m.ratio_vs_echo(),
                          Ms(m.service_at.p50), Ms(m.service_at.p99), Ms(m.service_at.p999), Ms(m.echo_at.p99),
                          Errors(m.service_errors), cpu_ratio, cpu_at);
    if (m.ratio() < lowest) {
      lowest = m.ratio();
      lowest_rpc = m.rpc;
    }
  }
  if (!heartbeat_line.empty()) {
    md << "\nOne controller, registry on Redis, " << heartbeat_line
       << ". Registration: " << absl::StrFormat("%.0f", register_qps) << " replicas/s.\n";
  }
  md << "\ncontrol_plane_qps_ratio_vs_echo=" << absl::StrFormat("%.3f", lowest) << " (" << lowest_rpc << ")\n";
  md.close();

  // The plot: p99 against the offered rate (the mean where repeats offered one rate
  // twice), echo and service, one panel per RPC.
  std::ofstream dat(out + "_levels.dat");
  for (const Measured& m : measured) {
    for (const char* who : {"echo", "service"}) {
      std::vector<LevelResult> levels = curves[m.rpc + "/" + who];
      std::sort(levels.begin(), levels.end(),
                [](const LevelResult& a, const LevelResult& b) { return a.offered_qps < b.offered_qps; });
      dat << "# " << m.rpc << " " << who << "\n";
      for (const LevelResult& l : levels) {
        dat << absl::StrFormat("%.1f %.3f %.1f\n", l.offered_qps, std::max(0.001, Ms(l.p99)), l.achieved_qps);
      }
      dat << "\n\n";
    }
  }
  dat.close();
  const int panels = static_cast<int>(measured.size());
  std::ofstream gp(out + ".gp");
  gp << "set terminal pngcairo size 1500," << (panels > 3 ? 900 : 450) << "\n"
     << "set output '" << out << ".png'\n"
     << "set multiplot layout " << (panels > 3 ? 2 : 1) << "," << std::min(3, std::max(1, panels)) << "\n"
     << "set logscale xy\nset xlabel 'offered calls/s'\nset ylabel 'p99 ms'\nset key top left\n"
     << "set arrow from graph 0, first " << Ms(search.max_p99) << " to graph 1, first " << Ms(search.max_p99)
     << " nohead dt 2\n";
  for (int i = 0; i < panels; ++i) {
    gp << "set title '" << measured[i].rpc << "'\n"
       << "plot '" << out << "_levels.dat' index " << 2 * i
       << " using 1:2 smooth unique with linespoints title 'echo', '' index " << 2 * i + 1
       << " using 1:2 smooth unique with linespoints title 'service'\n";
  }
  gp << "unset multiplot\n";
  gp.close();
  const bool plotted = panels > 0 && RunGnuplot(out + ".gp");

  std::printf("\ntable: %s.md, levels: %s.csv%s\n", out.c_str(), out.c_str(),
              plotted ? absl::StrCat(", plot: ", out, ".png").c_str() : " (no plot: gnuplot missing or failed)");
  if (!heartbeat_line.empty()) std::printf("heartbeats: %s\n", heartbeat_line.c_str());
  for (const Measured& m : measured) {
    const auto [cpu_ratio, cpu_at] = m.CpuRatio();
    std::printf(
        "%-17s echo %8.0f/s  %sservice %8.0f/s  ratio %.3f  CPU per call %.2f x the echo's at %.0f/s\n", m.rpc.c_str(),
        Median(m.echo_qps),
        m.in_process_qps.empty() ? "" : absl::StrFormat("in process %8.0f/s  ", Median(m.in_process_qps)).c_str(),
        Median(m.service_qps), m.ratio(), cpu_ratio, cpu_at);
  }
  std::printf("buffer consumer acked %lld groups\n", static_cast<long long>(fleet->consumed_groups.load()));
  std::printf("control_plane_qps_ratio_vs_echo=%.3f\n", lowest);
  return 0;
}

}  // namespace
}  // namespace rlfleet::loadtest

int main(int argc, char** argv) {
  // The rollout's model as rlfleet-rollout runs it: OpenBLAS single-threaded under
  // torch's threads, its kernels picked for this CPU (an OpenBLAS pool spinning beside
  // torch's took a core's eighth and Generate's capacity fell by a third).
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  rlfleet::model::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  return rlfleet::loadtest::Main();
}
