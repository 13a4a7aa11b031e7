// A reward function that hangs (issue 43, item 6): the Python reward worker
// (python/rlfleet/reward_worker.py) scores in child processes, an item past
// --item_timeout_s scores --error_reward as a parse failure and its process is replaced,
// the other items of the call score normally, the call answers by its gRPC deadline, and
// the worker serves the next call. Against a real worker process.
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "tests/python/python_package.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

// Hangs on "regex" (a catastrophic backtracking regex: 2^40 steps) and "sleep"; "alloc"
// asks for 1 GiB; "exit" ends its process; otherwise the response's length / 10.
constexpr char kFunction[] = R"(
import os, re, time
def reward(prompt, completion, **fields):
    if completion == "regex":
        return float(bool(re.match(r"(a+)+$", "a" * 40 + "b")))
    if completion == "sleep":
        time.sleep(3600)
    if completion == "alloc":
        return float(len(bytearray(1 << 30)))
    if completion == "exit":
        os._exit(3)
    return len(completion) / 10.0
)";

// The package, with the reward function as a module beside it (for PYTHONPATH).
std::string PreparePackage() { return testing::PreparePythonPackage("hanging_reward", kFunction); }

// A worker for task "t" (error reward -1) with `flags`, and a stub to it.
struct Worker {
  explicit Worker(const std::vector<std::string>& flags) {
    const std::string package = PreparePackage();
    setenv("PYTHONPATH", package.c_str(), 1);
    std::vector<std::string> argv = {"/usr/bin/python3",
                                     "-m",
                                     "rlfleet.reward_worker",
                                     "--function",
                                     package + "/hanging_reward.py:reward",
                                     "--tasks",
                                     "t",
                                     "--error_reward",
                                     "-1",
                                     "--port",
                                     "0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    EXPECT_TRUE(process.Start(argv).ok());
    absl::StatusOr<std::string> line = process.WaitForLine(
        [](const std::string& l) { return absl::StrContains(l, "rlfleet-reward-worker: serving"); }, absl::Seconds(60));
    EXPECT_TRUE(line.ok()) << line.status() << process.output();
    if (!line.ok()) return;
    const size_t at = line->find(" on ") + 4;
    stub = v1::RewardService::NewStub(
        grpc::CreateChannel(line->substr(at, line->find(' ', at) - at), grpc::InsecureChannelCredentials()));
  }
  ~Worker() {
    EXPECT_TRUE(process.Signal(SIGTERM).ok());
    EXPECT_TRUE(process.Wait(absl::Seconds(30)).ok()) << process.output();
  }
  // Scores `responses` (item i: "x<i>") within `deadline`; the status, and in
  // `elapsed` the call's wall time.
  grpc::Status Score(const std::vector<std::string>& responses, absl::Duration deadline, v1::ScoreResponse* response,
                     absl::Duration* elapsed) {
    v1::ScoreRequest request;
    for (size_t i = 0; i < responses.size(); ++i) {
      v1::ScoreItem* item = request.add_items();
      item->set_item_id(absl::StrCat("x", i));
      item->set_task("t");
      item->set_prompt_text("p");
      item->set_response_text(responses[i]);
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    const absl::Time begin = absl::Now();
    grpc::Status s = stub->Score(&context, request, response);
    *elapsed = absl::Now() - begin;
    return s;
  }
  // Whether the worker logs (or logged) a line holding `text`, within 10 s.
  bool Logged(const std::string& text) {
    if (absl::StrContains(process.output(), text)) return true;
    return process.WaitForLine([&](const std::string& l) { return absl::StrContains(l, text); }, absl::Seconds(10))
        .ok();
  }
  testing::Subprocess process;
  std::unique_ptr<v1::RewardService::Stub> stub;
};

// Item i of `response` scored normally as `reward`.
void ExpectScored(const v1::ScoreResponse& response, int i, float reward) {
  ASSERT_GT(response.results_size(), i);
  EXPECT_EQ(response.results(i).item_id(), absl::StrCat("x", i));
  EXPECT_TRUE(response.results(i).parsed()) << i;
  EXPECT_FLOAT_EQ(response.results(i).reward(), reward) << i;
}

// Item i of `response` a parse failure with the error reward.
void ExpectFailed(const v1::ScoreResponse& response, int i) {
  ASSERT_GT(response.results_size(), i);
  EXPECT_EQ(response.results(i).item_id(), absl::StrCat("x", i));
  EXPECT_FALSE(response.results(i).parsed()) << i;
  EXPECT_EQ(response.results(i).reward(), -1.0f) << i;
  EXPECT_EQ(response.results(i).components().at("error"), 1.0f) << i;
}

TEST(RewardTimeout, HangingItemsTimeOutTheOthersScoreAndTheWorkerServesOn) {
  Worker worker({"--item_timeout_s=1", "--threads=2"});
  ASSERT_NE(worker.stub, nullptr);
  v1::ScoreResponse response;
  absl::Duration elapsed;
  grpc::Status s =
      worker.Score({"ab", "regex", "abc", "sleep", "abcd", "exit", "a"}, absl::Seconds(60), &response, &elapsed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::cout << "7 items, 3 of them hanging or dying, item timeout 1 s: " << absl::FormatDuration(elapsed) << "\n";
  // Two hanging items on two processes: about one timeout (plus the processes' start).
  EXPECT_LT(elapsed, absl::Seconds(8)) << elapsed;
  ASSERT_EQ(response.results_size(), 7);
  ExpectScored(response, 0, 0.2f);
  ExpectFailed(response, 1);
  ExpectScored(response, 2, 0.3f);
  ExpectFailed(response, 3);
  ExpectScored(response, 4, 0.4f);
  ExpectFailed(response, 5);  // (its process ended: replaced too)
  ExpectScored(response, 6, 0.1f);
  EXPECT_TRUE(worker.Logged("item x1 (task t): python:reward timed out after 1 s")) << worker.process.output();
  EXPECT_TRUE(worker.Logged("item x3 (task t): python:reward timed out after 1 s")) << worker.process.output();
  // The next calls score on the processes that replaced them, promptly.
  for (int call = 0; call < 3; ++call) {
    response.Clear();
    s = worker.Score({"ab", "abc", "abcde", "a"}, absl::Seconds(60), &response, &elapsed);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(elapsed, absl::Seconds(3)) << elapsed;
    ASSERT_EQ(response.results_size(), 4);
    ExpectScored(response, 0, 0.2f);
    ExpectScored(response, 1, 0.3f);
    ExpectScored(response, 2, 0.5f);
    ExpectScored(response, 3, 0.1f);
  }
}

TEST(RewardTimeout, TheCallsDeadlineIsHonoured) {
  // The item limit is longer than the call's deadline: the deadline decides.
  Worker worker({"--item_timeout_s=120", "--threads=2"});
  ASSERT_NE(worker.stub, nullptr);
  v1::ScoreResponse response;
  absl::Duration elapsed;
  // (warm: the processes have started)
  ASSERT_TRUE(worker.Score({"a"}, absl::Seconds(60), &response, &elapsed).ok());
  response.Clear();
  grpc::Status s = worker.Score({"ab", "sleep", "abc"}, absl::Seconds(2), &response, &elapsed);
  std::cout << "a hanging item, call deadline 2 s: " << absl::FormatDuration(elapsed) << " (" << s.error_code()
            << ")\n";
  EXPECT_LT(elapsed, absl::Seconds(3)) << elapsed;
  // Answered before the deadline (the hanging item failed), or DEADLINE_EXCEEDED.
  if (s.ok()) {
    ASSERT_EQ(response.results_size(), 3);
    ExpectScored(response, 0, 0.2f);
    ExpectFailed(response, 1);
    ExpectScored(response, 2, 0.3f);
  } else {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  // The process that held the hanging item was replaced: both serve the next call.
  response.Clear();
  s = worker.Score({"ab", "abc", "abcd", "a"}, absl::Seconds(60), &response, &elapsed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(elapsed, absl::Seconds(3)) << elapsed;
  ExpectScored(response, 0, 0.2f);
  ExpectScored(response, 3, 0.1f);
}

TEST(RewardTimeout, AnItemOverTheMemoryLimitFailsAlone) {
  Worker worker({"--item_memory_mb=512"});
  ASSERT_NE(worker.stub, nullptr);
  v1::ScoreResponse response;
  absl::Duration elapsed;
  grpc::Status s = worker.Score({"ab", "alloc", "abc"}, absl::Seconds(60), &response, &elapsed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectScored(response, 0, 0.2f);
  ExpectFailed(response, 1);
  ExpectScored(response, 2, 0.3f);
  EXPECT_TRUE(worker.Logged("item x1 (task t): python:reward raised MemoryError")) << worker.process.output();
}

}  // namespace
}  // namespace rlfleet
