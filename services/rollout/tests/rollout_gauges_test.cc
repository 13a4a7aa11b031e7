// The rollout's in-flight gauges (queued / active sequences, open streams) return to
// exactly 0 after work ends on every path: a client that cancels, a client process
// killed with its streams open, a deadline, a drain, a failed decode step, shutdown;
// and no path retires the same work twice (rlfleet_inflight_underflows_total stays 0).
//
// The replicas' -1744 (issue 47): a Generate job cancelled while at the front of the
// queue was retired twice, once by the scheduler's admission loop (which dropped it
// from the queue and subtracted its unadmitted samples) and again by Abort (which
// found next_sample unchanged and subtracted them again).
#include <grpcpp/create_channel.h>
#include <signal.h>

#include <atomic>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/metrics/inflight_gauge.h"
#include "libs/metrics/metrics.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"
#include "libs/rpc/server_runner.h"
#include "services/rollout/rollout_core.h"
#include "services/rollout/rollout_service.h"
#include "tests/util/subprocess.h"

namespace rlfleet::rollout {
namespace {

constexpr char kQueued[] = "rlfleet_rollout_queued_sequences";
constexpr char kActive[] = "rlfleet_rollout_active_sequences";
constexpr char kOpenStreams[] = "rlfleet_rollout_open_streams";

double GaugeValue(const char* name) { return metrics::Global().AddGauge(name, "", {})->value(); }

// The gauges and underflow counters as one line, for failure messages.
std::string Gauges() {
  std::string out;
  for (const char* name : {kQueued, kActive, kOpenStreams}) {
    absl::StrAppend(&out, name, "=", GaugeValue(name), " (underflows ", metrics::InflightGauge::UnderflowsOf(name),
                    ") ");
  }
  return out;
}

// Waits (with a deadline) until every in-flight gauge reads exactly 0.
// Whether gauge `name` reaches `value` within 30 s.
bool AwaitGauge(const char* name, double value) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (GaugeValue(name) == value) return true;
    std::this_thread::yield();
  }
  return false;
}

bool AwaitGaugesAtZero() {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (GaugeValue(kQueued) == 0 && GaugeValue(kActive) == 0 && GaugeValue(kOpenStreams) == 0) return true;
    std::this_thread::yield();
  }
  return false;
}

// Each test counts the underflows of its own (the counters are the process's).
class RolloutGauges : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {kQueued, kActive, kOpenStreams})
      before_[name] = metrics::InflightGauge::UnderflowsOf(name);
  }
  void ExpectNoUnderflow() {
    for (const char* name : {kQueued, kActive, kOpenStreams}) {
      EXPECT_EQ(metrics::InflightGauge::UnderflowsOf(name) - before_[name], 0)
          << name << " was decremented past zero: " << Gauges();
    }
  }

 private:
  std::map<std::string, double> before_;
};

bool AwaitInfo(RolloutCore* core, const std::function<bool(const v1::GetInfoResponse&)>& pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    v1::GetInfoResponse info;
    if (core->GetInfo(&info).ok() && pred(info)) return true;
    std::this_thread::yield();
  }
  return false;
}

std::vector<int32_t> Prompt() { return *model::Tokenizer::EncodePrompt("reverse:12"); }

v1::GenerateRequest Stream(const std::string& id, int samples, int max_new) {
  v1::GenerateRequest r;
  r.set_request_id(id);
  r.set_num_samples(samples);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_ignore_eos(true);  // every sample runs to max_new_tokens
  r.mutable_sampling()->set_max_new_tokens(max_new);
  for (int32_t id : Prompt()) r.add_prompt_token_ids(id);
  return r;
}

// How one job's stream ended.
struct Ended {
  absl::Notification done;
  absl::Status status;
};

RolloutCore::StreamSink Until(std::shared_ptr<Ended> ended, std::function<void()> on_event = {}) {
  return [ended, on_event](std::vector<v1::GenerateResponse>, bool done, absl::Status status) {
    if (on_event) on_event();
    if (done) {
      ended->status = status;
      ended->done.Notify();
    }
  };
}

// A replica of 2 batch rows whose scheduler is held inside the first event of a
// running job (2 samples x 40 tokens) until release(): work submitted meanwhile queues.
struct HeldReplica {
  HeldReplica() {
    RolloutLimits limits;
    limits.max_batch = 2;
    core = *RolloutCore::Create(model::TinyConfig(/*max_seq_len=*/64), model::TestDevice(), limits);
    EXPECT_TRUE(core->InstallInitial(1).ok());
    auto first = std::make_shared<absl::Notification>();
    auto gate = release_;
    running = Submit("running", 2, 40, absl::InfiniteFuture(), [first, gate] {
      if (!first->HasBeenNotified()) {
        first->Notify();
        gate->WaitForNotificationWithTimeout(absl::Seconds(30));
      }
    });
    EXPECT_TRUE(first->WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  ~HeldReplica() { release(); }

  std::shared_ptr<RolloutCore::Job> Submit(const std::string& id, int samples, int max_new, absl::Time deadline,
                                           std::function<void()> on_event = {}) {
    ends.push_back(std::make_shared<Ended>());
    auto job = core->Generate(Stream(id, samples, max_new), Until(ends.back(), std::move(on_event)), deadline);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : nullptr;
  }
  void release() {
    if (!release_->HasBeenNotified()) release_->Notify();
  }
  // Waits for every job's end; their statuses.
  std::vector<absl::StatusCode> AwaitEnds() {
    std::vector<absl::StatusCode> codes;
    for (const auto& e : ends) {
      EXPECT_TRUE(e->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
      codes.push_back(e->status.code());
    }
    return codes;
  }

  const std::shared_ptr<absl::Notification> release_ = std::make_shared<absl::Notification>();
  std::unique_ptr<RolloutCore> core;
  std::shared_ptr<RolloutCore::Job> running;
  std::vector<std::shared_ptr<Ended>> ends;
};

TEST_F(RolloutGauges, CancelledQueuedJobsLeaveTheQueueOnce) {
  HeldReplica r;
  std::vector<std::shared_ptr<RolloutCore::Job>> queued;
  for (int i = 0; i < 6; ++i) queued.push_back(r.Submit(absl::StrCat("q", i), 3, 40, absl::InfiniteFuture()));
  EXPECT_EQ(GaugeValue(kQueued), 18) << Gauges();
  // Every client goes away at once (a gateway killed): the running job and the queued ones.
  r.core->Cancel(r.running);
  for (const auto& job : queued) r.core->Cancel(job);
  r.release();
  for (absl::StatusCode code : r.AwaitEnds()) EXPECT_EQ(code, absl::StatusCode::kCancelled);
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
  // The queue's limit still counts right: a full queue's worth is accepted again.
  auto again = std::make_shared<Ended>();
  ASSERT_TRUE(r.core->Generate(Stream("after", 2, 4), Until(again)).ok());
  ASSERT_TRUE(again->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(again->status.ok()) << again->status;
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
}

TEST_F(RolloutGauges, QueuedJobsPastTheirDeadlineLeaveTheQueueOnce) {
  HeldReplica r;
  for (int i = 0; i < 5; ++i) r.Submit(absl::StrCat("late", i), 2, 40, absl::Now() - absl::Seconds(1));
  r.Submit("in-time", 1, 4, absl::InfiniteFuture());
  EXPECT_EQ(GaugeValue(kQueued), 11) << Gauges();
  r.release();
  const std::vector<absl::StatusCode> codes = r.AwaitEnds();
  EXPECT_EQ(codes.front(), absl::StatusCode::kOk);  // the running job
  for (int i = 1; i <= 5; ++i) EXPECT_EQ(codes[i], absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(codes.back(), absl::StatusCode::kOk);
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
}

TEST_F(RolloutGauges, ADrainAbortsQueuedWorkOnce) {
  HeldReplica r;
  for (int i = 0; i < 4; ++i) r.Submit(absl::StrCat("q", i), 3, 40, absl::InfiniteFuture());
  v1::DrainResponse drained;
  std::thread drainer([&] { EXPECT_TRUE(r.core->Drain({}, &drained).ok()); });  // grace 0
  EXPECT_TRUE(AwaitInfo(r.core.get(), [](const auto& i) {
    return i.state() == v1::REPLICA_SERVING_STATE_DRAINING || i.state() == v1::REPLICA_SERVING_STATE_DRAINED;
  }));
  r.release();
  drainer.join();
  EXPECT_EQ(drained.aborted_sequences(), 2u + 4 * 3);
  for (absl::StatusCode code : r.AwaitEnds()) EXPECT_EQ(code, absl::StatusCode::kUnavailable);
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
}

TEST_F(RolloutGauges, AFailedDecodeStepAndShutdownLeaveNothingCounted) {
  {
    HeldReplica r;
    std::atomic<int> throws{1};
    r.core->SetFaultHookForTest([&] {
      if (throws.fetch_sub(1) > 0) throw std::runtime_error("c10::Error: injected");
    });
    for (int i = 0; i < 3; ++i) r.Submit(absl::StrCat("q", i), 2, 4, absl::InfiniteFuture());
    r.release();
    const std::vector<absl::StatusCode> codes = r.AwaitEnds();
    EXPECT_EQ(codes.front(), absl::StatusCode::kInternal);  // in the batch when the step failed
    for (size_t i = 1; i < codes.size(); ++i) EXPECT_EQ(codes[i], absl::StatusCode::kOk);
    EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
    ExpectNoUnderflow();
    // Work still queued and running when the replica shuts down.
    for (int i = 0; i < 3; ++i) r.Submit(absl::StrCat("s", i), 2, 40, absl::InfiniteFuture());
  }
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
}

// A served replica whose decode steps wait for `gate` (until it opens), so that the
// streams a test opens are queued, not finished, when their clients go away.
struct GatedServer {
  GatedServer() {
    RolloutLimits limits;
    limits.max_batch = 4;
    core = *RolloutCore::Create(model::TinyConfig(/*max_seq_len=*/64), model::TestDevice(), limits);
    EXPECT_TRUE(core->InstallInitial(1).ok());
    auto g = gate;
    core->SetFaultHookForTest([g] { g->WaitForNotificationWithTimeout(absl::Seconds(30)); });
    service = std::make_unique<RolloutServiceImpl>(core.get(), rpc::CallAuth{});
    runner.AddService(service.get());
    EXPECT_TRUE(runner.Start().ok());
    stub = v1::RolloutService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  }
  ~GatedServer() { open(); }
  void open() {
    if (!gate->HasBeenNotified()) gate->Notify();
  }
  int64_t inflight() {
    v1::GetInfoResponse info;
    EXPECT_TRUE(core->GetInfo(&info).ok());
    return info.load().inflight_requests();
  }

  std::shared_ptr<absl::Notification> gate = std::make_shared<absl::Notification>();
  std::unique_ptr<RolloutCore> core;
  std::unique_ptr<RolloutServiceImpl> service;
  rpc::ServerRunner runner{rpc::ServerOptions{}};
  std::unique_ptr<v1::RolloutService::Stub> stub;
};

TEST_F(RolloutGauges, AClientProcessKilledWithItsStreamsOpenLeavesEveryGaugeAtZero) {
  GatedServer server;
  constexpr int kStreams = 24, kSamples = 4;  // 96 sequences for 4 rows: most are queued
  testing::Subprocess clients;
  ASSERT_TRUE(clients
                  .Start({testing::RunfilePath("services/rollout/tests/generate_clients"), server.runner.address(),
                          std::to_string(kStreams), std::to_string(kSamples), "40", absl::StrJoin(Prompt(), ",")})
                  .ok());
  ASSERT_TRUE(clients.WaitForLine([](const std::string& l) { return l == "started 24"; }, absl::Seconds(30)).ok())
      << clients.output();
  ASSERT_TRUE(AwaitInfo(server.core.get(), [](const auto& i) { return i.load().inflight_requests() == kStreams; }));
  // (a stream is counted open just after its job is queued: await it, not assume it)
  EXPECT_TRUE(AwaitGauge(kOpenStreams, kStreams)) << Gauges();
  EXPECT_GE(GaugeValue(kQueued), kStreams * kSamples - 4) << Gauges();
  // kill -9: the connection drops with every stream open.
  ASSERT_TRUE(clients.Signal(SIGKILL).ok());
  ASSERT_TRUE(clients.Wait(absl::Seconds(30)).ok());
  server.open();
  EXPECT_TRUE(AwaitInfo(server.core.get(), [](const auto& i) { return i.load().inflight_requests() == 0; }))
      << server.inflight() << " requests still in flight";
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
}

TEST_F(RolloutGauges, StreamsCancelledOrPastTheirDeadlineMidStreamLeaveEveryGaugeAtZero) {
  GatedServer server;
  // Half the clients cancel with their streams open; the others' deadlines pass.
  constexpr int kClients = 8;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int i = 0; i < kClients; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                  (i % 2 == 0 ? std::chrono::seconds(30) : std::chrono::seconds(1)));
  }
  std::vector<grpc::StatusCode> codes(kClients, grpc::StatusCode::OK);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto reader = server.stub->Generate(contexts[i].get(), Stream(absl::StrCat("c", i), 4, 40));
      v1::GenerateResponse m;
      while (reader->Read(&m)) {
      }
      codes[i] = reader->Finish().error_code();
    });
  }
  ASSERT_TRUE(AwaitInfo(server.core.get(), [](const auto& i) { return i.load().inflight_requests() == kClients; }));
  for (int i = 0; i < kClients; i += 2) contexts[i]->TryCancel();
  for (auto& t : clients) t.join();  // (the cancelled at once, the others at their deadline)
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(codes[i], i % 2 == 0 ? grpc::StatusCode::CANCELLED : grpc::StatusCode::DEADLINE_EXCEEDED) << i;
  }
  server.open();
  EXPECT_TRUE(AwaitInfo(server.core.get(), [](const auto& i) { return i.load().inflight_requests() == 0; }))
      << server.inflight() << " requests still in flight";
  EXPECT_TRUE(AwaitGaugesAtZero()) << Gauges();
  ExpectNoUnderflow();
}

}  // namespace
}  // namespace rlfleet::rollout
