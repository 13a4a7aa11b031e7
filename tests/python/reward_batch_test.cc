// The reward path carries a step's batch whatever its size (issue 47): the Python
// reward worker (python/rlfleet/reward_worker.py) takes Score calls up to the fleet's
// --max_message_bytes, and the controller's reward peer (run_peers_grpc.h) splits a
// batch into calls of at most that many bytes and kMaxScoreItems items. Scored here
// through the controller's own peer against a real worker process: 1024 responses of
// 8 KiB (8 MiB in one call: over gRPC's 4 MiB default) and 64 of 1 MiB (64 MiB: more
// than one message carries), with the fleet's default limit and with a smaller one.
#include <signal.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/rpc/client.h"
#include "services/controller/run_peers_grpc.h"
#include "tests/python/python_package.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

// The reward: the response's length in MiB (exact in a float for these sizes), so that
// each result says which item it scored.
constexpr char kFunction[] = R"(
def reward(prompt, completion, **fields):
    return len(completion) / float(1 << 20)
)";

// The package, with the reward function as a module beside it (for PYTHONPATH).
std::string PreparePackage() { return testing::PreparePythonPackage("batch_reward", kFunction); }

// Starts a worker for task "long" with `flags`; its address.
std::string StartWorker(testing::Subprocess& worker, const std::vector<std::string>& flags) {
  const std::string package = PreparePackage();
  setenv("PYTHONPATH", package.c_str(), 1);
  std::vector<std::string> argv = {"/usr/bin/python3",
                                   "-m",
                                   "rlfleet.reward_worker",
                                   "--function",
                                   package + "/batch_reward.py:reward",
                                   "--tasks",
                                   "long",
                                   "--port",
                                   "0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  EXPECT_TRUE(worker.Start(argv).ok());
  absl::StatusOr<std::string> line = worker.WaitForLine(
      [](const std::string& l) { return absl::StrContains(l, "rlfleet-reward-worker: serving"); }, absl::Seconds(60));
  EXPECT_TRUE(line.ok()) << line.status() << worker.output();
  if (!line.ok()) return "";
  const size_t at = line->find(" on ") + 4;
  return line->substr(at, line->find(' ', at) - at);
}

// `count` items of task "long", item i's response `bytes` + i bytes long.
v1::ScoreRequest Batch(int count, size_t bytes) {
  v1::ScoreRequest request;
  for (int i = 0; i < count; ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id(absl::StrCat("x", i));
    item->set_task("long");
    item->set_prompt_text("reverse:1234");
    item->set_response_text(std::string(bytes + i, 'a' + i % 26));
  }
  return request;
}

void ExpectScored(controller::RewardPeer& peer, int count, size_t bytes) {
  SCOPED_TRACE(absl::StrCat(count, " x ", bytes, " bytes"));
  const v1::ScoreRequest request = Batch(count, bytes);
  v1::ScoreResponse response;
  const absl::Status s = peer.Score(request, &response);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(response.results_size(), count);
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(response.results(i).item_id(), absl::StrCat("x", i));
    EXPECT_TRUE(response.results(i).parsed()) << i;
    EXPECT_EQ(response.results(i).reward(), static_cast<float>(bytes + i) / (1 << 20)) << i;
  }
}

TEST(RewardBatch, TheWorkerScores1024x8KiBAnd64x1MiBThroughTheControllersPeer) {
  testing::Subprocess worker;
  const std::string address = StartWorker(worker, {});  // (the fleet's default limit, 16 MiB)
  ASSERT_FALSE(address.empty());
  rpc::ClientOptions options;  // (16 MiB, as the controller's --max_message_bytes by default)
  auto peer = controller::NewGrpcRewardPeer(options, address, absl::Seconds(120));
  ASSERT_TRUE(peer.ok()) << peer.status();
  ExpectScored(**peer, 1024, 8 << 10);  // 8 MiB: one call
  ExpectScored(**peer, 64, 1 << 20);    // 64 MiB: split by bytes
  ExpectScored(**peer, 2500, 100);      // split by count (1024 a call)
  ASSERT_TRUE(worker.Signal(SIGTERM).ok());
  EXPECT_TRUE(worker.Wait(absl::Seconds(30)).ok());
}

TEST(RewardBatch, TheWorkerAndTheSplitFollowTheFleetsMaxMessageBytes) {
  testing::Subprocess worker;
  constexpr int kLimit = 3 << 20;
  const std::string address = StartWorker(worker, {absl::StrCat("--max_message_bytes=", kLimit)});
  ASSERT_FALSE(address.empty());
  EXPECT_TRUE(absl::StrContains(worker.output(), absl::StrCat("messages up to ", kLimit, " bytes")));
  rpc::ClientOptions options;
  options.max_message_bytes = kLimit;
  auto peer = controller::NewGrpcRewardPeer(options, address, absl::Seconds(120));
  ASSERT_TRUE(peer.ok()) << peer.status();
  ExpectScored(**peer, 1024, 8 << 10);  // 8 MiB in calls of at most 3 MiB
  ExpectScored(**peer, 64, 1 << 20);
  // An item that alone is over the limit: refused by the controller, naming it.
  v1::ScoreRequest huge = Batch(2, 4 << 20);
  v1::ScoreResponse response;
  const absl::Status s = (*peer)->Score(huge, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "items[0] (x0)")) << s;
  ASSERT_TRUE(worker.Signal(SIGTERM).ok());
  EXPECT_TRUE(worker.Wait(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace rlfleet
