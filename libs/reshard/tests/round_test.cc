// Rounds as the control plane describes them: the plan both sides derive, the shares a
// source computes up front, and ShardReceiver taking a rank's shard from trainer ranks
// or from the replica before it in a relay chain.
#include "libs/reshard/round.h"

#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/reshard/tests/shards.h"
#include "libs/transport/forwarding_transport.h"
#include "libs/transport/loopback/loopback_transport.h"

namespace rlfleet::reshard {
namespace {

using testing::ExpectedShard;
using transport::LoopbackTransport;

const std::vector<TensorSpec> kTensors = {
    {"a", {40, 24}, DType::kF32}, {"b", {24}, DType::kBF16}, {"c", {24, 40}, DType::kF32}};

v1::ReshardRound RoundOf(const Layout& src, const Layout& dst) {
  v1::ReshardRound round;
  *round.mutable_source_layout() = ModelLayoutToProto(kTensors, src);
  *round.mutable_destination_layout() = ModelLayoutToProto(kTensors, dst);
  round.set_chunk_bytes(256);  // many rounds
  round.set_round_timeout_ms(20000);
  return round;
}

TEST(ReshardRound, TheLayoutsRoundTripThroughTheProto) {
  const Layout tp = Layout::Tp(2, {Split::kColumns, Split::kReplicated, Split::kRows});
  auto back = ModelLayoutFromProto(ModelLayoutToProto(kTensors, tp), "layout", 64);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layout.ranks, 2);
  EXPECT_EQ(back->layout.splits, tp.splits);
  ASSERT_EQ(back->tensors.size(), 3u);
  EXPECT_EQ(back->tensors[2].shape, (std::vector<int64_t>{24, 40}));
  EXPECT_EQ(back->tensors[1].dtype, DType::kBF16);
}

TEST(ReshardRound, ARoundThatDoesNotFitIsRefusedNamingTheField) {
  v1::ReshardRound round = RoundOf(Layout::Fsdp(2, 3), Layout::Tp(2, {Split::kRows, Split::kRows, Split::kRows}));
  round.add_source_addresses("a");
  round.add_source_addresses("b");
  round.add_digest_shares(1);
  round.add_digest_shares(2);
  ASSERT_TRUE(PlanOfRound(round).ok());
  auto refused = [](v1::ReshardRound r, const std::string& field) {
    absl::Status s = PlanOfRound(r).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(absl::StrContains(s.message(), field)) << s;
  };
  v1::ReshardRound r = round;
  r.set_rank(2);
  refused(r, "rank");
  r = round;
  r.mutable_digest_shares()->RemoveLast();
  refused(r, "digest_shares");
  r = round;
  r.mutable_source_addresses()->RemoveLast();
  refused(r, "source_addresses");
  r = round;
  r.set_tag_epoch(16);
  refused(r, "tag_epoch");
  r = round;
  r.set_chunk_bytes(8);
  refused(r, "chunk_bytes");
  r = round;
  r.mutable_source_layout()->mutable_tensors(0)->mutable_spec()->set_shape(0, int64_t{1} << 40);
  refused(r, "source_layout.tensors[0].spec.shape");  // (nothing allocated for it)
  r = round;
  r.mutable_destination_layout()->clear_tensors();
  r.mutable_destination_layout()->set_world_size(0xffffffffu);
  refused(r, "destination_layout.world_size");
  r = round;
  r.mutable_destination_layout()->mutable_tensors(2)->mutable_spec()->set_name("z");
  refused(r, "destination_layout.tensors: no tensor `c`");
  r = round;
  r.mutable_destination_layout()->mutable_tensors(0)->mutable_spec()->set_shape(0, 41);
  refused(r, "another shape or dtype");
  r = round;
  r.mutable_source_layout()->mutable_tensors(1)->set_kind(v1::LAYOUT_KIND_UNSPECIFIED);
  refused(r, "source_layout.tensors[1]");
  r = round;
  r.mutable_source_layout()->set_world_size(0);
  refused(r, "source_layout.world_size");
  r = round;
  r.set_round_timeout_ms(-1);
  refused(r, "round_timeout_ms");
}

// A round's planning work is bounded before it is planned: 1024 source ranks x 64
// destination ranks over a column-split tensor of 2^20 rows would be ~2^36 interval
// steps (and as many ranges); it is refused at once, and a big but ordinary layout is
// still planned.
TEST(ReshardRound, APlanTooCostlyToMakeIsRefusedBeforePlanning) {
  const std::vector<TensorSpec> tall = {{"w", {int64_t{1} << 20, 64}, DType::kF32}};
  v1::ReshardRound round;
  *round.mutable_source_layout() = ModelLayoutToProto(tall, Layout::Tp(1024, {Split::kColumns}));
  *round.mutable_destination_layout() = ModelLayoutToProto(tall, Layout::Tp(64, {Split::kColumns}));
  for (int s = 0; s < 1024; ++s) {
    round.add_source_addresses("x");
    round.add_digest_shares(0);
  }
  const absl::Time start = absl::Now();
  absl::Status s = PlanOfRound(round).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "costs")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // The same through MakePlan directly, and with many ranks on both sides.
  EXPECT_EQ(MakePlan(tall, Layout::Tp(1024, {Split::kColumns}), Layout::Tp(64, {Split::kColumns})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(kTensors, Layout::Fsdp(100000, 3), Layout::Fsdp(2, 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Shapes whose product overflows are refused, not wrapped.
  const std::vector<TensorSpec> huge = {{"h", {int64_t{1} << 32, int64_t{1} << 32}, DType::kF32}};
  EXPECT_EQ(MakePlan(huge, Layout::Fsdp(1, 1), Layout::Fsdp(1, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  // An ordinary TP8 -> TP8 column layout of 4096 rows plans.
  const std::vector<TensorSpec> ordinary = {{"o", {4096, 4096}, DType::kF32}};
  EXPECT_TRUE(MakePlan(ordinary, Layout::Tp(8, {Split::kColumns}), Layout::Tp(8, {Split::kColumns})).ok());
}

// A destination rank's transport: remembers the memory its receiver allocates (the
// shard that a same-host sender maps and stores into).
class RecordingTransport : public transport::ForwardingTransport {
 public:
  RecordingTransport() : ForwardingTransport(LoopbackTransport::Create()) {}
  absl::StatusOr<transport::MemoryHandle> AllocateMemory(uint64_t length, transport::MemoryKind kind,
                                                         int device) override {
    absl::StatusOr<transport::MemoryHandle> h = ForwardingTransport::AllocateMemory(length, kind, device);
    if (h.ok()) allocated.push_back(*h);
    return h;
  }
  std::vector<transport::MemoryHandle> allocated;
};

// Two FSDP trainer ranks push to `replicas` replicas of `dst` (rank j of replica r is a
// ShardReceiver of its own); replica r > 0 gets everything relayed from replica r - 1.
struct Push {
  Plan plan;
  std::vector<std::unique_ptr<LoopbackTransport>> trainers;
  std::vector<std::unique_ptr<RecordingTransport>> ranks;
  std::vector<std::unique_ptr<ShardReceiver>> receivers;
  std::vector<absl::StatusOr<ShardReceiver::Received>> received;
  std::vector<std::vector<uint64_t>> shares;  // [source][destination]
  std::vector<ExecutionStats> sent;
};

Push RunPush(const Layout& dst, int replicas, bool mapped, uint64_t corrupt_share = 0) {
  Push p;
  const Layout src = Layout::Fsdp(2, kTensors.size());
  p.plan = *MakePlan(kTensors, src, dst);
  const int D = src.ranks, T = dst.ranks;
  for (int s = 0; s < D; ++s) p.trainers.push_back(LoopbackTransport::Create());
  for (int i = 0; i < replicas * T; ++i) {
    p.ranks.push_back(std::make_unique<RecordingTransport>());
    p.receivers.push_back(std::make_unique<ShardReceiver>(*p.ranks.back()));
  }
  std::vector<std::vector<uint8_t>> src_bufs;
  for (int s = 0; s < D; ++s) {
    src_bufs.push_back(ExpectedShard(p.plan, true, s));
    p.shares.push_back(*SourceDigestShares(p.plan, s, src_bufs[s].data()));
  }
  p.received.resize(replicas * T, absl::UnknownError("not run"));
  p.sent.resize(D);
  std::vector<std::thread> threads;
  for (int s = 0; s < D; ++s) {
    std::vector<transport::PeerId> peers;
    for (int j = 0; j < T; ++j) peers.push_back(*p.trainers[s]->Connect(p.ranks[j]->LocalAddress()));
    threads.emplace_back([&, s, peers] {
      auto ops = NewHostMemoryOps();
      auto shard =
          p.trainers[s]->RegisterMemory(src_bufs[s].data(), src_bufs[s].size(), transport::MemoryKind::kHost, 0);
      ASSERT_TRUE(shard.ok());
      SourceRole role{s, *shard, peers};
      ExecutorOptions options;
      options.chunk_bytes = 256;
      options.map_peer_memory = mapped;
      options.timeout = absl::Seconds(20);
      auto stats = Execute(*p.trainers[s], p.plan, &role, nullptr, *ops, options);
      ASSERT_TRUE(stats.ok()) << stats.status();
      p.sent[s] = *stats;
    });
  }
  for (int r = 0; r < replicas; ++r) {
    for (int j = 0; j < T; ++j) {
      const int i = r * T + j;
      v1::ReshardRound round = RoundOf(src, dst);
      round.set_rank(j);
      round.set_map_peer_memory(mapped);
      if (r == 0) {
        for (int s = 0; s < D; ++s) round.add_source_addresses(p.trainers[s]->LocalAddress());
      } else {
        round.set_relay_from(p.ranks[i - T]->LocalAddress());
      }
      if (r + 1 < replicas) round.set_forward_to(p.ranks[i + T]->LocalAddress());
      for (int s = 0; s < D; ++s) round.add_digest_shares(p.shares[s][j] + corrupt_share);
      threads.emplace_back(
          [&, i, round] { p.received[i] = p.receivers[i]->Receive(round, absl::Now() + absl::Seconds(30)); });
    }
  }
  for (auto& t : threads) t.join();
  return p;
}

TEST(ReshardRound, TheSharesComputedUpFrontAreTheExecutorsShares) {
  Push p = RunPush(Layout::Tp(2, {Split::kColumns, Split::kReplicated, Split::kRows}), 1, true);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(p.shares[s], p.sent[s].digest_shares) << "source " << s;
}

TEST(ReshardRound, EveryRankOfEveryReplicaInAChainGetsExactlyItsShard) {
  for (bool mapped : {true, false}) {
    SCOPED_TRACE(mapped ? "mapped" : "tagged");
    const Layout dst = Layout::Tp(2, {Split::kColumns, Split::kReplicated, Split::kRows});
    Push p = RunPush(dst, 3, mapped);
    uint64_t sent = 0;
    for (const ExecutionStats& s : p.sent) sent += s.bytes_sent;
    EXPECT_EQ(sent, p.plan.BytesNeeded());  // the trainers sent one replica's bytes
    for (size_t i = 0; i < p.received.size(); ++i) {
      ASSERT_TRUE(p.received[i].ok()) << i << ": " << p.received[i].status();
      const int j = static_cast<int>(i % 2);
      const std::vector<uint8_t> want = ExpectedShard(p.plan, false, j);
      EXPECT_EQ(std::vector<uint8_t>(p.received[i]->shard, p.received[i]->shard + want.size()), want) << i;
      uint64_t parts = 0;
      for (size_t t = 0; t < kTensors.size(); ++t) parts += p.received[i]->Part(t).size();
      EXPECT_EQ(p.received[i]->bytes_received, parts);
      EXPECT_LT(parts, p.plan.BytesNeeded());  // a rank gets its part, not the model
    }
  }
}

TEST(ReshardRound, AWholeModelReplicaSeesEveryTensorWhole) {
  Push p = RunPush(Layout::Tp(1, std::vector<Split>(3, Split::kReplicated)), 2, true);
  for (const auto& r : p.received) {
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t t = 0; t < kTensors.size(); ++t) {
      EXPECT_EQ(r->Part(t).size(), kTensors[t].numel() * DTypeSize(kTensors[t].dtype)) << kTensors[t].name;
    }
  }
}

// What is verified is what is used: a sender that mapped a replica's shard (same host)
// keeps its mapping and can store into that memory after the check; the replica
// verified and returns a private copy, which such stores do not reach. Without a
// mapping (tagged messages only) the shard itself is returned, no copy made.
TEST(ReshardRound, AMappedShardStoredIntoAfterTheCheckDoesNotChangeWhatWasReceived) {
  for (bool mapped : {true, false}) {
    SCOPED_TRACE(mapped ? "mapped" : "tagged");
    const Layout dst = Layout::Tp(2, {Split::kColumns, Split::kReplicated, Split::kRows});
    Push p = RunPush(dst, 2, mapped);
    for (size_t i = 0; i < p.received.size(); ++i) {
      ASSERT_TRUE(p.received[i].ok()) << i << ": " << p.received[i].status();
      EXPECT_EQ(p.received[i]->private_copy, mapped) << i;
      // A peer scribbles over every byte this rank's transport ever handed out.
      ASSERT_FALSE(p.ranks[i]->allocated.empty());
      for (const transport::MemoryHandle& h : p.ranks[i]->allocated) std::memset(h.base, 0xA5, h.length);
      const std::vector<uint8_t> want = ExpectedShard(p.plan, false, static_cast<int>(i % 2));
      const std::vector<uint8_t> got(p.received[i]->shard, p.received[i]->shard + want.size());
      if (mapped) {
        EXPECT_EQ(got, want) << i;
      } else {
        EXPECT_NE(got, want) << i << ": the tagged path hands out the shard itself (no copy)";
      }
    }
  }
}

TEST(ReshardRound, AShareThatDoesNotMatchIsDataLoss) {
  Push p = RunPush(Layout::Tp(1, std::vector<Split>(3, Split::kReplicated)), 1, true, /*corrupt_share=*/1);
  ASSERT_FALSE(p.received[0].ok());
  EXPECT_EQ(p.received[0].status().code(), absl::StatusCode::kDataLoss) << p.received[0].status();
}

// A round from `source` (one rank, nothing sent yet) to one rank holding every tensor.
v1::ReshardRound WholeModelRoundFrom(transport::Transport& source) {
  const Layout whole = Layout::Tp(1, std::vector<Split>(3, Split::kReplicated));
  v1::ReshardRound round = RoundOf(whole, whole);
  round.add_source_addresses(source.LocalAddress());
  round.add_digest_shares(0);
  return round;
}

TEST(ReshardRound, AShardOverWhatTheReceiverHoldsIsRefusedBeforeAnythingMoves) {
  auto source = LoopbackTransport::Create();
  auto rank = LoopbackTransport::Create();
  ShardReceiver receiver(*rank);
  v1::ReshardRound round = WholeModelRoundFrom(*source);
  auto received = receiver.Receive(round, absl::Now() + absl::Seconds(30), /*max_shard_bytes=*/1024);
  ASSERT_FALSE(received.ok());
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument) << received.status();
  EXPECT_TRUE(absl::StrContains(received.status().message(), "source_layout")) << received.status();
}

TEST(ReshardRound, ASourceThatNeverComesIsAnErrorAtTheRoundTimeout) {
  auto source = LoopbackTransport::Create();
  auto rank = LoopbackTransport::Create();
  ShardReceiver receiver(*rank);
  v1::ReshardRound round = WholeModelRoundFrom(*source);
  round.set_round_timeout_ms(200);
  const absl::Time start = absl::Now();
  auto received = receiver.Receive(round, absl::Now() + absl::Seconds(30));
  ASSERT_FALSE(received.ok());
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDeadlineExceeded) << received.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The call's deadline bounds it too, whatever the round timeout.
  round.set_round_timeout_ms(600000);
  const absl::Time begin = absl::Now();
  received = receiver.Receive(round, absl::Now() + absl::Milliseconds(300));
  ASSERT_FALSE(received.ok());
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDeadlineExceeded) << received.status();
  EXPECT_LT(absl::Now() - begin, absl::Seconds(10));
  // A source that died is UNAVAILABLE.
  source->Close();
  received = receiver.Receive(round, absl::Now() + absl::Seconds(30));
  ASSERT_FALSE(received.ok());
  EXPECT_NE(received.status().code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace rlfleet::reshard
