#include <grpcpp/create_channel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/model/policy.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"
#include "libs/rpc/server_runner.h"
#include "services/rollout/rollout_core.h"
#include "services/rollout/rollout_service.h"

namespace rlfleet::rollout {
namespace {

model::PolicyConfig Small() { return model::TinyConfig(); }

v1::GenerateBatchRequest Request(int samples = 2) {
  v1::GenerateBatchRequest r;
  r.set_request_id("req-1");
  r.set_num_samples(samples);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_max_new_tokens(8);
  r.mutable_sampling()->set_seed(5);
  for (const char* p : {"reverse:123", "add:1+2"}) {
    v1::BatchPrompt* bp = r.add_prompts();
    bp->set_prompt_id(p);
    bp->set_task(std::string(p).substr(0, std::string(p).find(':')));
    const auto ids = model::Tokenizer::EncodePrompt(p);  // kept alive for the loop
    for (int32_t id : *ids) bp->add_prompt_token_ids(id);
  }
  return r;
}

TEST(RolloutCore, WaitsForWeightsThenGeneratesTaggedExperiences) {
  auto core = RolloutCore::Create(Small(), model::TestDevice());
  ASSERT_TRUE(core.ok()) << core.status();
  v1::GenerateBatchResponse response;
  EXPECT_EQ((*core)->GenerateBatch(Request(), &response).code(), absl::StatusCode::kFailedPrecondition);
  v1::GetInfoResponse info;
  ASSERT_TRUE((*core)->GetInfo(&info).ok());
  EXPECT_EQ(info.state(), v1::REPLICA_SERVING_STATE_WAITING_FOR_WEIGHTS);

  ASSERT_TRUE((*core)->InstallInitial(3).ok());
  {
    absl::Status gs = (*core)->GenerateBatch(Request(), &response);
    ASSERT_TRUE(gs.ok()) << gs;
  }
  ASSERT_EQ(response.completions_size(), 4);  // 2 prompts x 2 samples
  for (const v1::Experience& e : response.completions()) {
    ASSERT_FALSE(e.response_token_ids().empty());
    EXPECT_EQ(e.response_logprobs_size(), e.response_token_ids_size());
    ASSERT_EQ(e.token_policy_versions_size(), e.response_token_ids_size());
    for (uint64_t v : e.token_policy_versions()) EXPECT_EQ(v, 3u);
    EXPECT_NE(e.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  }
  EXPECT_EQ(response.completions(3).experience_id().value(), "req-1:1:1");
  EXPECT_EQ(response.completions(2).group_id(), "add:1+2");
  // Same seed, same tokens.
  v1::GenerateBatchResponse again;
  ASSERT_TRUE((*core)->GenerateBatch(Request(), &again).ok());
  const auto& a = again.completions(0).response_token_ids();
  const auto& b = response.completions(0).response_token_ids();
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.end()), std::vector<int32_t>(b.begin(), b.end()));
}

// A bf16 replica (--dtype=bf16) says so in GetInfo, installs the trainer's F32 image by
// conversion and generates from it.
TEST(RolloutCore, ABf16ReplicaInstallsAnF32ImageAndGenerates) {
  model::PolicyConfig c = Small();
  c.dtype = "bf16";
  auto core = RolloutCore::Create(c, model::TestDevice());
  ASSERT_TRUE(core.ok()) << core.status();
  v1::GetInfoResponse info;
  ASSERT_TRUE((*core)->GetInfo(&info).ok());
  EXPECT_EQ(info.model().dtype(), v1::DTYPE_BFLOAT16);
  auto source = model::Policy::Create(Small(), model::TestDevice());
  ASSERT_TRUE(source.ok()) << source.status();
  common::HostBuffer back;
  auto report = (*core)->InstallFromBytes(common::HostBuffer((*source)->SafetensorsBytes()), "f32 image", 2,
                                          absl::Now() + absl::Seconds(30), &back);
  ASSERT_TRUE(report.ok()) << report.status();
  v1::GenerateBatchResponse response;
  absl::Status gs = (*core)->GenerateBatch(Request(), &response);
  ASSERT_TRUE(gs.ok()) << gs;
  ASSERT_EQ(response.completions_size(), 4);
  for (const v1::Experience& e : response.completions()) {
    ASSERT_FALSE(e.response_token_ids().empty());
    for (uint64_t v : e.token_policy_versions()) EXPECT_EQ(v, 2u);
  }
}

// A pulled image is installed and, when asked, handed back unchanged (a relay then
// serves it without a copy); a version not newer hands nothing back.
TEST(RolloutCore, InstallFromBytesHandsTheImageBack) {
  auto core = RolloutCore::Create(Small(), model::TestDevice());
  ASSERT_TRUE(core.ok()) << core.status();
  auto source = model::Policy::Create(Small(), model::TestDevice());
  ASSERT_TRUE(source.ok()) << source.status();
  const std::string image = (*source)->SafetensorsBytes();
  common::HostBuffer back;
  auto report =
      (*core)->InstallFromBytes(common::HostBuffer(image), "test image", 4, absl::Now() + absl::Seconds(30), &back);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->version, 4u);
  EXPECT_EQ((*core)->installed_version(), 4u);
  EXPECT_EQ(back.str(), image);
  common::HostBuffer none;
  EXPECT_EQ((*core)
                ->InstallFromBytes(common::HostBuffer(image), "test image", 4, absl::Now() + absl::Seconds(30), &none)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(none.empty());
}

TEST(RolloutCore, LimitsAndStatesAreClearErrors) {
  auto core = RolloutCore::Create(Small(), model::TestDevice(), RolloutLimits{2, 4, 16});
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  EXPECT_EQ((*core)->InstallInitial(1).code(), absl::StatusCode::kFailedPrecondition);
  v1::GenerateBatchResponse r;
  auto too_many = Request(3);  // 2 x 3 = 6 > 4 sequences
  absl::Status s = (*core)->GenerateBatch(too_many, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "limit of 4 sequences")) << s;
  auto long_gen = Request();
  long_gen.mutable_sampling()->set_max_new_tokens(17);
  EXPECT_TRUE(absl::StrContains((*core)->GenerateBatch(long_gen, &r).message(), "sampling.max_new_tokens is 17"));
  auto newer = Request();
  newer.set_min_policy_version(2);
  EXPECT_EQ((*core)->GenerateBatch(newer, &r).code(), absl::StatusCode::kFailedPrecondition);
  v1::DrainResponse drained;
  ASSERT_TRUE((*core)->Drain({}, &drained).ok());
  EXPECT_EQ((*core)->GenerateBatch(Request(), &r).code(), absl::StatusCode::kUnavailable);
  v1::ResumeResponse resumed;
  ASSERT_TRUE((*core)->Resume(&resumed).ok());
  EXPECT_EQ(resumed.state(), v1::REPLICA_SERVING_STATE_SERVING);
  EXPECT_TRUE((*core)->GenerateBatch(Request(), &r).ok());
}

TEST(RolloutService, GeneratesOverGrpcAndHealthFollowsTheState) {
  auto core = RolloutCore::Create(Small(), model::TestDevice());
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  rpc::ServerRunner runner(rpc::ServerOptions{});
  RolloutServiceImpl service(core->get(), rpc::CallAuth{}, [&](bool serving) { runner.SetServing(serving); });
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::RolloutService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  {  // RPCs not offered say so, with a message (gRPC's default has none)
    grpc::ClientContext c0;
    c0.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::CommitWeightsResponse committed;
    grpc::Status refused = stub->CommitWeights(&c0, v1::CommitWeightsRequest(), &committed);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED);
    EXPECT_TRUE(absl::StrContains(refused.error_message(), "use UpdateWeights")) << refused.error_message();
  }
  grpc::ClientContext c1;
  c1.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GenerateBatchResponse response;
  grpc::Status status = stub->GenerateBatch(&c1, Request(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.completions_size(), 4);
  EXPECT_GT(response.generated_tokens(), 0u);
  grpc::ClientContext c2;
  c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub->GetInfo(&c2, {}, &info).ok());
  EXPECT_EQ(info.model().d_model(), 32u);
  EXPECT_GT(info.model().num_parameters(), 0u);
  EXPECT_EQ(info.installed_version().version(), 1u);
  auto bad = Request();
  bad.mutable_prompts(0)->add_prompt_token_ids(77);
  grpc::ClientContext c3;
  c3.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  status = stub->GenerateBatch(&c3, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "vocabulary")) << status.error_message();
}

v1::GenerateRequest Stream(const std::string& id, int samples, int max_new) {
  v1::GenerateRequest r;
  r.set_request_id(id);
  r.set_num_samples(samples);
  r.set_chunk_tokens(4);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_ignore_eos(true);  // every sample runs to max_new_tokens
  r.mutable_sampling()->set_max_new_tokens(max_new);
  r.mutable_sampling()->set_seed(9);
  const auto prompt = model::Tokenizer::EncodePrompt("reverse:12");  // kept alive for the loop
  for (int32_t id : *prompt) r.add_prompt_token_ids(id);
  return r;
}

model::PolicyConfig Long() { return model::TinyConfig(/*max_seq_len=*/64); }

// Everything one Generate job streamed, with the order events arrived in.
struct Recorded {
  absl::Mutex mu;
  std::vector<v1::GenerateResponse> messages;
  bool done = false;
  absl::Status status;
  absl::Notification finished;
  int tokens() {
    absl::MutexLock lock(&mu);
    int n = 0;
    for (const auto& m : messages) n += m.chunk().token_ids_size();
    return n;
  }
};

RolloutCore::StreamSink Record(std::shared_ptr<Recorded> r, std::function<void()> on_event = {}) {
  return [r, on_event](std::vector<v1::GenerateResponse> messages, bool done, absl::Status status) {
    {
      absl::MutexLock lock(&r->mu);
      for (auto& m : messages) r->messages.push_back(std::move(m));
      r->done = done;
      r->status = status;
    }
    if (on_event) on_event();
    if (done) r->finished.Notify();
  };
}

// The tokens of sample 0 in order, with their versions.
std::vector<std::pair<int32_t, uint64_t>> Sample0(Recorded& r) {
  absl::MutexLock lock(&r.mu);
  std::vector<std::pair<int32_t, uint64_t>> out;
  for (const auto& m : r.messages) {
    if (!m.has_chunk() || m.chunk().sample_index() != 0) continue;
    EXPECT_EQ(m.chunk().token_offset(), out.size());
    for (int i = 0; i < m.chunk().token_ids_size(); ++i) {
      out.emplace_back(m.chunk().token_ids(i), m.chunk().policy_versions(i));
    }
  }
  return out;
}

// Waits (with a deadline) until GetInfo satisfies `pred`.
bool AwaitInfo(RolloutCore* core, std::function<bool(const v1::GetInfoResponse&)> pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    v1::GetInfoResponse info;
    if (core->GetInfo(&info).ok() && pred(info)) return true;
    std::this_thread::yield();
  }
  return false;
}

// Job "a" (2 samples x 40 tokens) into `first`, and job "b" (1 x 4) into `second`,
// queued while a is mid-decode: a's first event holds the scheduler until b is queued.
// Returns once b finished (OK).
void ShortBehindLong(RolloutCore* core, std::shared_ptr<Recorded> first, std::shared_ptr<Recorded> second) {
  // (shared with a's sink, which outlives this call)
  auto first_event = std::make_shared<absl::Notification>(), second_queued = std::make_shared<absl::Notification>();
  auto a = core->Generate(Stream("a", 2, 40), Record(first, [first_event, second_queued] {
                            if (!first_event->HasBeenNotified()) {
                              first_event->Notify();
                              second_queued->WaitForNotificationWithTimeout(absl::Seconds(20));
                            }
                          }));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(first_event->WaitForNotificationWithTimeout(absl::Seconds(20)));
  auto b = core->Generate(Stream("b", 1, 4), Record(second));
  ASSERT_TRUE(b.ok()) << b.status();
  second_queued->Notify();
  ASSERT_TRUE(second->finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_TRUE(second->status.ok()) << second->status;
}

TEST(RolloutCore, ARequestJoinsTheRunningBatchBetweenDecodeSteps) {
  auto core = RolloutCore::Create(Long(), model::TestDevice());
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  auto first = std::make_shared<Recorded>();
  auto second = std::make_shared<Recorded>();
  ASSERT_NO_FATAL_FAILURE(ShortBehindLong(core->get(), first, second));
  // The short request finished while the long one was still decoding.
  EXPECT_LT(first->tokens(), 2 * 40) << "the second request waited for the first to finish";
  ASSERT_TRUE(first->finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(first->tokens(), 2 * 40);
  int finished = 0;
  for (const auto& m : first->messages) {
    if (!m.has_finished()) continue;
    ++finished;
    EXPECT_EQ(m.finished().response_tokens(), 40u);
    EXPECT_EQ(m.finished().finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(m.finished().experience_id().value(), absl::StrCat("a:", m.finished().sample_index()));
  }
  EXPECT_EQ(finished, 2);
}

// Into a batch at least half full, queued sequences join a group at a time
// (join_group) or after join_wait_steps: a lone short request queued behind a running
// one waits for a partner (here: for the batch to empty), or for its steps.
TEST(RolloutCore, ALoneJoinerWaitsForItsGroupOrItsStepsWhenTheBatchIsHalfFull) {
  for (const int wait_steps : {1000, 3}) {
    RolloutLimits limits;
    limits.max_batch = 4;
    limits.join_group = 2;
    limits.join_wait_steps = wait_steps;
    auto core = RolloutCore::Create(Long(), model::TestDevice(), limits);
    ASSERT_TRUE((*core)->InstallInitial(1).ok());
    auto first = std::make_shared<Recorded>();
    auto second = std::make_shared<Recorded>();
    ASSERT_NO_FATAL_FAILURE(ShortBehindLong(core->get(), first, second));
    if (wait_steps == 1000) {
      EXPECT_TRUE(first->finished.HasBeenNotified()) << "the lone joiner did not wait for a group";
    } else {
      EXPECT_LT(first->tokens(), 2 * 40) << "the lone joiner waited past its " << wait_steps << " steps";
    }
    ASSERT_TRUE(first->finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
    EXPECT_EQ(first->tokens(), 2 * 40);
    EXPECT_EQ(second->tokens(), 4);
  }
}

TEST(RolloutCore, AWeightSwapMidDecodeTagsLaterTokensWithTheNewVersion) {
  auto core = RolloutCore::Create(Long(), model::TestDevice());
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  auto other = model::Policy::Create(Long(), model::TestDevice(), /*init_seed=*/77);
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/v2.safetensors");
  ASSERT_TRUE((*other)->SaveSafetensors(path).ok());
  auto rec = std::make_shared<Recorded>();
  absl::Notification mid_decode, install_queued;
  auto job = (*core)->Generate(Stream("swap", 1, 40), Record(rec, [&] {
                                 if (rec->tokens() >= 8 && !mid_decode.HasBeenNotified()) {
                                   mid_decode.Notify();
                                   install_queued.WaitForNotificationWithTimeout(absl::Seconds(20));
                                 }
                               }));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(mid_decode.WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::StatusOr<InstallReport> report;
  std::thread installer([&] { report = (*core)->InstallFromFile(path, 2, absl::Now() + absl::Seconds(20)); });
  EXPECT_TRUE(AwaitInfo(core->get(), [](const auto& i) { return i.staged_version().version() == 2; }));
  install_queued.Notify();
  installer.join();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->version, 2u);
  EXPECT_EQ(report->inflight_sequences, 1u);
  ASSERT_TRUE(rec->finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
  auto tokens = Sample0(*rec);
  ASSERT_EQ(tokens.size(), 40u);
  // Versions never go back, and both are there: 1 before the swap, 2 after.
  size_t v1_tokens = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].second == 1) {
      ++v1_tokens;
      EXPECT_EQ(i + 1, v1_tokens) << "a version-1 token after a version-2 one";
    } else {
      EXPECT_EQ(tokens[i].second, 2u);
    }
  }
  EXPECT_GE(v1_tokens, 8u);
  EXPECT_LT(v1_tokens, 40u);
  v1::GetInfoResponse info;
  ASSERT_TRUE((*core)->GetInfo(&info).ok());
  EXPECT_EQ(info.installed_version().version(), 2u);
  EXPECT_EQ(info.weight_swaps(), 1u);
  // A file that does not fit changes nothing.
  auto wrong = model::Policy::Create(Small(), model::TestDevice());
  ASSERT_TRUE((*wrong)->SaveSafetensors(path).ok());
  EXPECT_EQ((*core)->InstallFromFile(path, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*core)->installed_version(), 2u);
}

TEST(RolloutCore, DrainAbortsWhatOutlivesTheGraceAndDeadlinesAndQueueLimitsHold) {
  RolloutLimits limits;
  limits.max_queued = 8;
  auto core = RolloutCore::Create(Long(), model::TestDevice(), limits);
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  // More than the queue holds: RESOURCE_EXHAUSTED at once.
  EXPECT_EQ((*core)->Generate(Stream("big", 9, 4), [](auto, bool, absl::Status) {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A deadline that passes aborts the batch with DEADLINE_EXCEEDED.
  v1::GenerateBatchResponse r;
  EXPECT_EQ((*core)->GenerateBatch(Request(), &r, absl::Now() - absl::Seconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
  // Drain with no grace aborts the running job; its stream ends UNAVAILABLE.
  auto rec = std::make_shared<Recorded>();
  absl::Notification running, draining;
  auto job = (*core)->Generate(Stream("long", 2, 40), Record(rec, [&] {
                                 if (!running.HasBeenNotified()) {
                                   running.Notify();
                                   draining.WaitForNotificationWithTimeout(absl::Seconds(20));
                                 }
                               }));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(absl::Seconds(20)));
  v1::DrainResponse drained;
  std::thread drainer([&] { EXPECT_TRUE((*core)->Drain({}, &drained).ok()); });
  EXPECT_TRUE(AwaitInfo(core->get(), [](const auto& i) {
    return i.state() == v1::REPLICA_SERVING_STATE_DRAINING || i.state() == v1::REPLICA_SERVING_STATE_DRAINED;
  }));
  draining.Notify();
  drainer.join();
  EXPECT_EQ(drained.aborted_sequences(), 2u);
  ASSERT_TRUE(rec->finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(rec->status.code(), absl::StatusCode::kUnavailable);
  int aborted = 0;
  for (const auto& m : rec->messages)
    aborted += m.has_finished() && m.finished().finish_reason() == v1::FINISH_REASON_ABORTED;
  EXPECT_EQ(aborted, 2);
  v1::DrainRequest bad;
  bad.set_grace_ms(-1);
  EXPECT_EQ((*core)->Drain(bad, &drained).code(), absl::StatusCode::kInvalidArgument);
}

// Inference (Generate) may hold only part of the queue: past it, RESOURCE_EXHAUSTED
// while the run's GenerateBatch still finds room (the queue is held still here by a
// sink that blocks the scheduler).
TEST(RolloutCore, InferenceLeavesQueueRoomForTraining) {
  RolloutLimits limits;
  limits.max_queued = 8;
  limits.max_queued_generate = 4;
  auto core = RolloutCore::Create(Long(), model::TestDevice(), limits);
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  absl::Notification running, release;
  auto rec = std::make_shared<Recorded>();
  auto holder = (*core)->Generate(Stream("hold", 1, 40), Record(rec, [&] {
                                    if (!running.HasBeenNotified()) {
                                      running.Notify();
                                      release.WaitForNotificationWithTimeout(absl::Seconds(30));
                                    }
                                  }));
  ASSERT_TRUE(holder.ok());
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(absl::Seconds(20)));  // the scheduler waits in the sink
  auto noop = [](auto, bool, absl::Status) {};
  auto queued = (*core)->Generate(Stream("a", 3, 4), noop);
  ASSERT_TRUE(queued.ok()) << queued.status();
  const auto refused = (*core)->Generate(Stream("b", 2, 4), noop);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("kept for training"), std::string::npos) << refused.status();
  // The run's batch (2 prompts x 2 samples) still fits: 3 + 4 <= 8.
  v1::GenerateBatchResponse batch;
  absl::Status batch_status = absl::UnknownError("not run");
  std::thread trainer(
      [&] { batch_status = (*core)->GenerateBatch(Request(2), &batch, absl::Now() + absl::Seconds(60)); });
  EXPECT_TRUE(AwaitInfo(core->get(), [](const auto& i) { return i.load().queued_requests() >= 2; }));
  release.Notify();
  trainer.join();
  EXPECT_TRUE(batch_status.ok()) << batch_status;
  EXPECT_EQ(batch.completions_size(), 4);
  ASSERT_TRUE(rec->finished.WaitForNotificationWithTimeout(absl::Seconds(20)));
}

TEST(RolloutService, GenerateStreamsChunksAndEndsEachSample) {
  auto core = RolloutCore::Create(Long(), model::TestDevice());
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  rpc::ServerRunner runner(rpc::ServerOptions{});
  RolloutServiceImpl service(core->get(), rpc::CallAuth{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::RolloutService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->Generate(&context, Stream("s", 3, 10));
  v1::GenerateResponse m;
  std::map<uint32_t, int> tokens, chunks;
  std::map<uint32_t, v1::SampleFinished> ends;
  while (reader->Read(&m)) {
    if (m.has_chunk()) {
      EXPECT_FALSE(ends.count(m.chunk().sample_index())) << "tokens after the sample ended";
      EXPECT_EQ(m.chunk().token_offset(), tokens[m.chunk().sample_index()]);
      EXPECT_LE(m.chunk().token_ids_size(), 4);
      EXPECT_EQ(m.chunk().logprobs_size(), m.chunk().token_ids_size());
      tokens[m.chunk().sample_index()] += m.chunk().token_ids_size();
      ++chunks[m.chunk().sample_index()];
    } else {
      ends[m.finished().sample_index()] = m.finished();
    }
  }
  grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(ends.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tokens[i], 10);
    EXPECT_EQ(chunks[i], 3);  // 4 + 4 + 2
    EXPECT_EQ(ends[i].response_tokens(), 10u);
    EXPECT_EQ(ends[i].experience_id().value(), absl::StrCat("s:", i));
  }
  // Bad input ends the stream with INVALID_ARGUMENT naming the field.
  auto bad = Stream("bad", 1, 10);
  bad.add_prompt_token_ids(99);
  grpc::ClientContext c2;
  c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto bad_reader = stub->Generate(&c2, bad);
  EXPECT_FALSE(bad_reader->Read(&m));
  status = bad_reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "prompt_token_ids")) << status.error_message();
  // A client that cancels mid-stream aborts its job on the replica.
  grpc::ClientContext c3;
  c3.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto cancelled = stub->Generate(&c3, Stream("c", 4, 50));
  ASSERT_TRUE(cancelled->Read(&m));
  c3.TryCancel();
  while (cancelled->Read(&m)) {
  }
  EXPECT_EQ(cancelled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(AwaitInfo(core->get(), [](const auto& i) { return i.load().inflight_requests() == 0; }));
}

// A replica on a loopback port, FILE descriptors allowed under `root`.
struct ServedReplica {
  explicit ServedReplica(const std::string& root, model::PolicyConfig config = Long())
      : core(*RolloutCore::Create(config, model::TestDevice())),
        fetcher(nullptr, FileOptions(root)),
        runner(rpc::ServerOptions{}),
        service(core.get(), rpc::CallAuth{}, {}, root.empty() ? nullptr : &fetcher) {
    EXPECT_TRUE(core->InstallInitial(1).ok());
    runner.AddService(&service);
    EXPECT_TRUE(runner.Start().ok());
    stub = v1::RolloutService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  }
  static transport::DescriptorFetcher::Options FileOptions(const std::string& root) {
    transport::DescriptorFetcher::Options o;
    o.max_bytes = uint64_t{1} << 30;
    o.file_root = root;
    o.file_root_flag = "--publish_dir";
    return o;
  }
  std::unique_ptr<grpc::ClientContext> Context() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return c;
  }
  grpc::Status Batch(const v1::GenerateBatchRequest& r, v1::GenerateBatchResponse* out = nullptr) {
    v1::GenerateBatchResponse ignored;
    return stub->GenerateBatch(Context().get(), r, out != nullptr ? out : &ignored);
  }
  grpc::Status Update(const v1::PrepareWeightsRequest& r) {
    v1::CommitWeightsResponse ignored;
    return stub->UpdateWeights(Context().get(), r, &ignored);
  }
  grpc::Status Stream(const v1::GenerateRequest& r) {
    auto context = Context();
    auto reader = stub->Generate(context.get(), r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  }
  std::unique_ptr<RolloutCore> core;
  transport::DescriptorFetcher fetcher;
  rpc::ServerRunner runner;
  RolloutServiceImpl service;
  std::unique_ptr<v1::RolloutService::Stub> stub;
};

void ExpectRefused(const grpc::Status& s, grpc::StatusCode code, const std::string& field) {
  EXPECT_EQ(s.error_code(), code) << field << ": " << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), field)) << s.error_message();
}

v1::PrepareWeightsRequest FileUpdate(uint64_t version, const std::string& path, const std::string& bytes) {
  v1::PrepareWeightsRequest r;
  r.mutable_manifest()->mutable_version()->set_version(version);
  v1::TransferDescriptor* source = r.add_chunks()->mutable_source();
  source->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
  source->mutable_segment()->set_worker_address(path);
  source->set_length_bytes(bytes.size());
  source->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  source->mutable_digest()->set_value(common::Xxh64(bytes));
  return r;
}

// UpdateWeights by FILE: only regular files under --publish_dir, with the descriptor's
// digest; /dev/zero, a FIFO or a directory are refused at once and the replica keeps
// serving; a host file is no policy version.
TEST(RolloutService, FileWeightsComeOnlyFromRegularFilesUnderThePublishDir) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string root = tmp + "/rollout-publish";
  ASSERT_TRUE(mkdir(root.c_str(), 0755) == 0 || errno == EEXIST);
  auto other = model::Policy::Create(Long(), model::TestDevice(), /*init_seed=*/5);
  ASSERT_TRUE((*other)->SaveSafetensors(root + "/policy-v2.safetensors").ok());
  std::ifstream in(root + "/policy-v2.safetensors", std::ios::binary);
  const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE((*other)->SaveSafetensors(tmp + "/outside.safetensors").ok());
  ASSERT_EQ(mkfifo((root + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(mkdir((root + "/dir").c_str(), 0755), 0);
  {
    ServedReplica no_root("");
    ExpectRefused(no_root.Update(FileUpdate(2, root + "/policy-v2.safetensors", image)),
                  grpc::StatusCode::INVALID_ARGUMENT, "--publish_dir");
  }
  ServedReplica replica(root);
  const absl::Time start = absl::Now();
  for (const std::string& path : {tmp + "/outside.safetensors", std::string("/dev/zero"), root + "/fifo", root + "/dir",
                                  std::string("/etc/passwd")}) {
    ExpectRefused(replica.Update(FileUpdate(2, path, image)), grpc::StatusCode::INVALID_ARGUMENT, "worker_address");
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "a FIFO or /dev/zero held the replica";
  EXPECT_TRUE(replica.Batch(Request()).ok()) << "the scheduler stopped serving";
  // A digest that does not match is DATA_LOSS; the trainer's file installs.
  v1::PrepareWeightsRequest wrong = FileUpdate(2, root + "/policy-v2.safetensors", image);
  wrong.mutable_chunks(0)->mutable_source()->mutable_digest()->set_value(1);
  EXPECT_EQ(replica.Update(wrong).error_code(), grpc::StatusCode::DATA_LOSS);
  grpc::Status ok = replica.Update(FileUpdate(2, "policy-v2.safetensors", image));
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(replica.core->installed_version(), 2u);
}

// Every number of every request is checked in its own type: num_samples 2^32-1,
// top_k 2^31, NaN temperature or top_p, max_new_tokens 2^32-1 are refused by name, and
// other clients' requests are unaffected.
TEST(RolloutService, EveryNumberIsRangeCheckedInItsOwnType) {
  ServedReplica replica("");
  auto refuse = [&](std::function<void(v1::GenerateBatchRequest&)> change, const std::string& field) {
    v1::GenerateBatchRequest r = Request();
    change(r);
    ExpectRefused(replica.Batch(r), grpc::StatusCode::INVALID_ARGUMENT, field);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  refuse([](auto& r) { r.set_num_samples(0xffffffffu); }, "num_samples");
  refuse([](auto& r) { r.mutable_sampling()->set_top_k(0x80000000u); }, "sampling.top_k");
  refuse([&](auto& r) { r.mutable_sampling()->set_temperature(nan); }, "sampling.temperature");
  refuse([](auto& r) { r.mutable_sampling()->set_temperature(-1); }, "sampling.temperature");
  refuse([&](auto& r) { r.mutable_sampling()->set_top_p(nan); }, "sampling.top_p");
  refuse([](auto& r) { r.mutable_sampling()->set_top_p(INFINITY); }, "sampling.top_p");
  refuse([](auto& r) { r.mutable_sampling()->set_max_new_tokens(0xffffffffu); }, "sampling.max_new_tokens");
  refuse([](auto& r) { r.mutable_sampling()->add_stop_token_ids(-5); }, "sampling.stop_token_ids[0]");
  refuse([](auto& r) { r.mutable_prompts(0)->set_task(std::string(1000, 't')); }, "prompts[0].task");
  // The same through the stream.
  v1::GenerateRequest g = Stream("s", 1, 4);
  g.set_num_samples(0xffffffffu);
  ExpectRefused(replica.Stream(g), grpc::StatusCode::INVALID_ARGUMENT, "num_samples");
  g = Stream("s", 1, 4);
  g.mutable_sampling()->set_top_k(0x80000000u);
  ExpectRefused(replica.Stream(g), grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_k");
  g = Stream("s", 1, 4);
  g.set_chunk_tokens(0xffffffffu);
  ExpectRefused(replica.Stream(g), grpc::StatusCode::INVALID_ARGUMENT, "chunk_tokens");
  // A top_k above the vocabulary keeps every token (as 0 does), and a request next to a
  // refused one is served.
  v1::GenerateBatchRequest wide = Request();
  wide.mutable_sampling()->set_top_k(100000);
  grpc::Status s = replica.Batch(wide);
  EXPECT_TRUE(s.ok()) << s.error_message();
  v1::DrainRequest drain;
  drain.set_grace_ms(-1);
  v1::DrainResponse drained;
  ExpectRefused(replica.stub->Drain(replica.Context().get(), drain, &drained), grpc::StatusCode::INVALID_ARGUMENT,
                "grace_ms");
  // UpdateWeights: fields not supported are refused by name, sizes before allocation.
  v1::PrepareWeightsRequest update = FileUpdate(2, "x", "image");
  update.set_transfer_timeout_ms(-1);
  ExpectRefused(replica.Update(update), grpc::StatusCode::INVALID_ARGUMENT, "transfer_timeout_ms");
  update = FileUpdate(2, "x", "image");
  update.mutable_chunks(0)->mutable_source()->set_length_bytes(uint64_t{2} << 30);
  ExpectRefused(replica.Update(update), grpc::StatusCode::INVALID_ARGUMENT, "chunks[0].source.length_bytes");
  update = FileUpdate(2, "x", "image");
  update.mutable_manifest()->set_wire_dtype(v1::DTYPE_BFLOAT16);
  ExpectRefused(replica.Update(update), grpc::StatusCode::UNIMPLEMENTED, "manifest.wire_dtype");
  update = FileUpdate(2, "x", "image");
  update.mutable_chunks(0)->set_already_pushed(true);
  ExpectRefused(replica.Update(update), grpc::StatusCode::UNIMPLEMENTED, "already_pushed");
  update = FileUpdate(2, "x", "image");
  update.mutable_chunks(0)->set_dst_rank(0x80000000u);
  ExpectRefused(replica.Update(update), grpc::StatusCode::UNIMPLEMENTED, "dst_rank");
  *update.add_chunks() = update.chunks(0);
  ExpectRefused(replica.Update(update), grpc::StatusCode::UNIMPLEMENTED, "chunks");
  update = FileUpdate(2, "x", "image");
  update.mutable_manifest()->set_total_bytes(7);
  ExpectRefused(replica.Update(update), grpc::StatusCode::INVALID_ARGUMENT, "manifest.total_bytes");
}

// A libtorch exception on the scheduler thread fails the requests of that step with
// INTERNAL naming the cause; the replica keeps serving.
TEST(RolloutService, AnExceptionOnTheSchedulerFailsItsRequestsAndTheReplicaServesOn) {
  ServedReplica replica("");
  std::atomic<int> throws{1};
  replica.core->SetFaultHookForTest([&] {
    if (throws.fetch_sub(1) > 0) throw std::runtime_error("c10::Error: shape mismatch (injected)");
  });
  grpc::Status failed = replica.Batch(Request());
  ExpectRefused(failed, grpc::StatusCode::INTERNAL, "shape mismatch (injected)");
  v1::GenerateBatchResponse response;
  grpc::Status after = replica.Batch(Request(), &response);
  ASSERT_TRUE(after.ok()) << after.error_message();
  EXPECT_EQ(response.completions_size(), 4);
  EXPECT_TRUE(AwaitInfo(replica.core.get(), [](const auto& i) { return i.load().inflight_requests() == 0; }));
}

}  // namespace
}  // namespace rlfleet::rollout
