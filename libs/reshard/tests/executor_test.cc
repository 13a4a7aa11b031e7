// The executor over the loopback transport, one thread per rank, on both of its paths
// (pairs through mappings of the destination's shard, and tagged messages) and with the
// two mixed: random plans arrive byte-exact with digests that verify; corruption is
// DATA_LOSS; a dead or missing peer is an error within the deadline; staging stays
// bounded.
#include "libs/reshard/executor.h"

#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/reshard/tests/shards.h"
#include "libs/transport/loopback/loopback_transport.h"

namespace rlfleet::reshard {
namespace {

using testing::ExpectedShard;
using transport::LoopbackTransport;
using transport::MemoryHandle;
using transport::PeerId;

// A loopback transport that takes part in the mapped path's negotiation but cannot map
// a peer's memory (as a UCX rank whose peer is on another host): its pairs as a sender
// fall back to tagged messages.
class CannotMap : public transport::Transport {
 public:
  CannotMap() : inner_(LoopbackTransport::Create()) {}
  LoopbackTransport& inner() { return *inner_; }
  transport::Capabilities GetCapabilities() const override { return inner_->GetCapabilities(); }
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<PeerId> Connect(absl::string_view a) override { return inner_->Connect(a); }
  absl::StatusOr<MemoryHandle> RegisterMemory(void* base, uint64_t length, transport::MemoryKind kind,
                                              int device) override {
    return inner_->RegisterMemory(base, length, kind, device);
  }
  absl::StatusOr<MemoryHandle> AllocateMemory(uint64_t length, transport::MemoryKind kind, int device) override {
    return inner_->AllocateMemory(length, kind, device);
  }
  absl::Status DeregisterMemory(const MemoryHandle& h) override { return inner_->DeregisterMemory(h); }
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(const MemoryHandle& h) override { return inner_->Describe(h); }
  std::unique_ptr<transport::Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                             const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                             uint64_t length) override {
    return inner_->Put(peer, local, local_offset, remote, remote_offset, length);
  }
  std::unique_ptr<transport::Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                             const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                             uint64_t length) override {
    return inner_->Get(peer, local, local_offset, remote, remote_offset, length);
  }
  std::unique_ptr<transport::Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                              uint64_t length) override {
    return inner_->Send(peer, tag, local, offset, length);
  }
  std::unique_ptr<transport::Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                              uint64_t capacity) override {
    return inner_->Recv(peer, tag, local, offset, capacity);
  }
  // MapRemote: the base class's UNIMPLEMENTED.

 private:
  std::unique_ptr<LoopbackTransport> inner_;
};

// D source ranks and T destination ranks, each its own loopback transport; the source
// ranks in `cannot_map` cannot map their destinations' memory.
struct Fleet {
  std::vector<std::unique_ptr<transport::Transport>> src;
  std::vector<std::unique_ptr<LoopbackTransport>> dst;
  std::vector<std::vector<PeerId>> src_to_dst, dst_to_src;  // [rank][peer rank]

  Fleet(int d, int t, std::set<int> cannot_map = {}) {
    for (int i = 0; i < d; ++i) {
      if (cannot_map.count(i)) {
        src.push_back(std::make_unique<CannotMap>());
      } else {
        src.push_back(LoopbackTransport::Create());
      }
    }
    for (int i = 0; i < t; ++i) dst.push_back(LoopbackTransport::Create());
    src_to_dst.assign(d, {});
    dst_to_src.assign(t, {});
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < t; ++j) {
        src_to_dst[i].push_back(*src[i]->Connect(dst[j]->LocalAddress()));
        dst_to_src[j].push_back(*dst[j]->Connect(src[i]->LocalAddress()));
      }
    }
  }
};

MemoryHandle Register(transport::Transport& t, void* base, uint64_t length) { return *t.RegisterMemory(base, length); }

struct Outcome {
  std::vector<absl::Status> src_status, dst_status;
  std::vector<ExecutionStats> src_stats, dst_stats;
  std::vector<absl::Duration> src_took;
  std::vector<std::vector<uint8_t>> dst_bufs;
};

// Runs the whole plan; `skip_src` leaves one source rank out (a peer that never came).
Outcome RunPlan(const Plan& plan, const ExecutorOptions& options, int skip_src = -1,
                std::function<void(Fleet&)> during = nullptr, std::set<int> cannot_map = {}) {
  const int d = plan.src.ranks, t = plan.dst.ranks;
  Fleet fleet(d, t, cannot_map);
  Outcome out;
  out.src_status.resize(d);
  out.dst_status.resize(t);
  out.src_stats.resize(d);
  out.src_took.resize(d);
  out.dst_stats.resize(t);
  std::vector<std::vector<uint8_t>> src_bufs;
  for (int s = 0; s < d; ++s) {
    src_bufs.push_back(ExpectedShard(plan, true, s));
    src_bufs.back().push_back(0);  // so that an empty shard still has an address
  }
  for (int r = 0; r < t; ++r) out.dst_bufs.emplace_back(plan.dst_shard_bytes[r] + 1, 0);
  std::vector<std::thread> threads;
  for (int s = 0; s < d; ++s) {
    if (s == skip_src) continue;
    threads.emplace_back([&, s] {
      auto ops = NewHostMemoryOps();
      MemoryHandle shard = Register(*fleet.src[s], src_bufs[s].data(), src_bufs[s].size());
      SourceRole role{s, shard, fleet.src_to_dst[s]};
      const absl::Time start = absl::Now();
      auto stats = Execute(*fleet.src[s], plan, &role, nullptr, *ops, options);
      out.src_took[s] = absl::Now() - start;
      out.src_status[s] = stats.status();
      if (stats.ok()) out.src_stats[s] = *stats;
    });
  }
  for (int r = 0; r < t; ++r) {
    threads.emplace_back([&, r] {
      auto ops = NewHostMemoryOps();
      MemoryHandle shard = Register(*fleet.dst[r], out.dst_bufs[r].data(), out.dst_bufs[r].size());
      DestinationRole role{r, shard, fleet.dst_to_src[r]};
      auto stats = Execute(*fleet.dst[r], plan, nullptr, &role, *ops, options);
      out.dst_status[r] = stats.status();
      if (stats.ok()) out.dst_stats[r] = *stats;
    });
  }
  if (during) during(fleet);
  for (auto& th : threads) th.join();
  for (auto& buf : out.dst_bufs) buf.pop_back();  // the extra byte gave empty shards an address
  return out;
}

std::vector<uint64_t> SharesFor(const Outcome& out, int dst_rank) {
  std::vector<uint64_t> shares;
  for (const ExecutionStats& s : out.src_stats) shares.push_back(s.digest_shares.at(dst_rank));
  return shares;
}

TEST(CutMessagesTest, BigRangesAreDirectSmallOnesBatched) {
  std::vector<Range> ranges = {{0, 0, 100, 4, 4}, {400, 400, 3, 4, 4}, {412, 412, 3, 4, 4}, {1000, 1000, 10, 4, 2}};
  auto messages = CutMessages(ranges, 64, 32);
  // 400 bytes -> 7 direct messages of <= 64 bytes (16 elements), then 12+12+20 bytes
  // (below 32 bytes, or cast) in one staged message.
  ASSERT_EQ(messages.size(), 8u);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(messages[i].direct);
  EXPECT_EQ(messages[6].wire_bytes, 400u - 6 * 64);
  EXPECT_FALSE(messages[7].direct);
  EXPECT_EQ(messages[7].pieces.size(), 3u);
  EXPECT_EQ(messages[7].wire_bytes, 44u);
}

TEST(CutMessagesTest, RunsEndToEndAtTheDestinationNeedNoUnpacking) {
  // A column split's rows: 16-byte pieces strided at the source, end to end at the
  // destination (128 bytes), then one piece elsewhere and a short run.
  std::vector<Range> ranges;
  for (uint64_t r = 0; r < 8; ++r) ranges.push_back({r * 64, 1000 + r * 16, 4, 4, 4});
  ranges.push_back({5000, 3000, 2, 4, 4});
  ranges.push_back({6000, 4000, 2, 4, 4});
  ranges.push_back({6008, 4008, 2, 4, 4});
  auto messages = CutMessages(ranges, 64, 32);
  // The 128-byte run -> two contiguous messages of 64 bytes; the rest (8 + 16 bytes,
  // below 32) packed together.
  ASSERT_EQ(messages.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(messages[i].direct);
    EXPECT_TRUE(messages[i].dst_contiguous);
    EXPECT_EQ(messages[i].wire_bytes, 64u);
    EXPECT_EQ(messages[i].pieces.front().dst_offset, 1000u + i * 64);
  }
  EXPECT_FALSE(messages[2].dst_contiguous);
  EXPECT_EQ(messages[2].pieces.size(), 3u);
}

TEST(ExecutorTest, RandomPlansArriveExactAndDigestsVerify) {
  std::mt19937_64 rng(3);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iter = 0; iter < 40; ++iter) {
    SCOPED_TRACE(absl::StrCat("iteration ", iter));
    std::vector<TensorSpec> tensors;
    std::vector<Split> src_splits, dst_splits;
    for (int t = 0, n = pick(1, 5); t < n; ++t) {
      TensorSpec spec{absl::StrCat("t", t), {pick(1, 40), pick(1, 40)}, t % 2 ? DType::kBF16 : DType::kF32};
      tensors.push_back(spec);
      const Split choices[] = {Split::kFlat, Split::kRows, Split::kColumns, Split::kReplicated};
      src_splits.push_back(choices[pick(0, 3)]);
      dst_splits.push_back(choices[pick(1, 3)]);
    }
    PlanOptions plan_options;
    plan_options.cast_f32_to_bf16 = iter % 3 == 0;
    auto plan = MakePlan(tensors, Layout{pick(1, 4), src_splits}, Layout{pick(1, 4), dst_splits}, plan_options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExecutorOptions options;
    options.chunk_bytes = 64u << pick(0, 6);  // 64 B .. 4 KiB: many messages, some staged
    options.direct_min_bytes = 32u << pick(0, 6);
    options.depth = pick(1, 4);
    options.timeout = absl::Seconds(20);
    // Mapped, tagged, or mixed (source rank 0 cannot map: its pairs go tagged).
    const int mode = iter % 3;
    options.map_peer_memory = mode != 1;
    options.verify_received = iter % 2 == 0;
    std::set<int> cannot_map;
    if (mode == 2) cannot_map.insert(0);
    SCOPED_TRACE(mode == 0 ? "mapped" : mode == 1 ? "tagged" : "mixed");
    Outcome out = RunPlan(*plan, options, -1, nullptr, cannot_map);
    for (const auto& s : out.src_status) ASSERT_TRUE(s.ok()) << s;
    for (const auto& s : out.dst_status) ASSERT_TRUE(s.ok()) << s;
    auto ops = NewHostMemoryOps();
    uint64_t mapped_pairs = 0;
    for (const ExecutionStats& st : out.src_stats) mapped_pairs += st.mapped_pairs;
    if (mode == 1) EXPECT_EQ(mapped_pairs, 0u);
    if (mode == 0) EXPECT_GT(mapped_pairs, 0u);
    if (mode == 2) EXPECT_EQ(out.src_stats[0].mapped_pairs, 0u);
    for (int r = 0; r < plan->dst.ranks; ++r) {
      ASSERT_EQ(out.dst_bufs[r], ExpectedShard(*plan, false, r)) << "destination " << r;
      EXPECT_TRUE(VerifyDigest(*plan, r, out.dst_bufs[r].data(), *ops, SharesFor(out, r)).ok());
      if (options.verify_received) {
        // Digested on arrival: the same as the shard's digest afterwards, and the shares' sum.
        uint64_t want = 0;
        for (uint64_t share : SharesFor(out, r)) want += share;
        EXPECT_EQ(out.dst_stats[r].received_digest, want) << "destination " << r;
        EXPECT_EQ(out.dst_stats[r].received_digest, *ShardDigest(*plan, r, out.dst_bufs[r].data(), *ops));
      }
      // Staging never exceeds depth x (messages per round) x chunk.
      EXPECT_LE(out.dst_stats[r].staging_bytes,
                static_cast<uint64_t>(options.depth) * plan->src.ranks * options.chunk_bytes);
    }
  }
}

// Trainer ranks -> replica 0 -> replica 1 -> replica 2 (same TP layout), relayed: every
// replica gets its exact shards, the digests verify for all, and each trainer rank
// sends its bytes once however many replicas there are.
TEST(ExecutorTest, RelayChainDeliversEveryReplicaWhileTrainersSendOnce) {
  std::vector<TensorSpec> tensors = {
      {"a", {40, 24}, DType::kF32}, {"b", {24}, DType::kBF16}, {"c", {24, 40}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 3), Layout::Tp(2, {Split::kColumns, Split::kReplicated, Split::kRows}));
  ASSERT_TRUE(plan.ok());
  for (bool mapped : {true, false}) {
    SCOPED_TRACE(mapped ? "mapped" : "tagged");
    constexpr int kReplicas = 3;
    const int D = 2, T = 2;
    std::vector<std::unique_ptr<LoopbackTransport>> trainers, ranks;  // ranks[r * T + j]
    for (int s = 0; s < D; ++s) trainers.push_back(LoopbackTransport::Create());
    for (int i = 0; i < kReplicas * T; ++i) ranks.push_back(LoopbackTransport::Create());
    ExecutorOptions options;
    options.chunk_bytes = 256;  // many rounds, staged and direct messages
    options.direct_min_bytes = 128;
    options.depth = 2;
    options.timeout = absl::Seconds(20);
    options.map_peer_memory = mapped;
    options.verify_received = true;

    std::vector<std::vector<uint8_t>> src_bufs, dst_bufs;
    for (int s = 0; s < D; ++s) src_bufs.push_back(ExpectedShard(*plan, true, s));
    for (int i = 0; i < kReplicas * T; ++i) dst_bufs.emplace_back(plan->dst_shard_bytes[i % T], 0);
    std::vector<ExecutionStats> src_stats(D), dst_stats(kReplicas * T);
    std::vector<absl::Status> status(D + kReplicas * T);
    std::vector<std::thread> threads;
    for (int s = 0; s < D; ++s) {
      std::vector<PeerId> peers;
      for (int j = 0; j < T; ++j) peers.push_back(*trainers[s]->Connect(ranks[j]->LocalAddress()));
      threads.emplace_back([&, s, peers] {
        auto ops = NewHostMemoryOps();
        SourceRole role{s, Register(*trainers[s], src_bufs[s].data(), src_bufs[s].size()), peers};
        auto stats = Execute(*trainers[s], *plan, &role, nullptr, *ops, options);
        status[s] = stats.status();
        if (stats.ok()) src_stats[s] = *stats;
      });
    }
    for (int r = 0; r < kReplicas; ++r) {
      for (int j = 0; j < T; ++j) {
        const int i = r * T + j;
        DestinationRole role;
        role.rank = j;
        role.shard = Register(*ranks[i], dst_bufs[i].data(), dst_bufs[i].size());
        if (r == 0) {
          for (int s = 0; s < D; ++s) role.src_peers.push_back(*ranks[i]->Connect(trainers[s]->LocalAddress()));
        } else {
          role.relay_from = *ranks[i]->Connect(ranks[i - T]->LocalAddress());
        }
        if (r + 1 < kReplicas) role.forward_to = *ranks[i]->Connect(ranks[i + T]->LocalAddress());
        threads.emplace_back([&, i, role] {
          auto ops = NewHostMemoryOps();
          auto stats = Execute(*ranks[i], *plan, nullptr, &role, *ops, options);
          status[D + i] = stats.status();
          if (stats.ok()) dst_stats[i] = *stats;
        });
      }
    }
    for (auto& th : threads) th.join();
    for (const auto& st : status) ASSERT_TRUE(st.ok()) << st;
    auto ops = NewHostMemoryOps();
    for (int i = 0; i < kReplicas * T; ++i) {
      const int j = i % T;
      EXPECT_EQ(dst_bufs[i], ExpectedShard(*plan, false, j)) << "replica " << i / T << " rank " << j;
      std::vector<uint64_t> shares;
      for (int s = 0; s < D; ++s) shares.push_back(src_stats[s].digest_shares[j]);
      EXPECT_TRUE(VerifyDigest(*plan, j, dst_bufs[i].data(), *ops, shares).ok());
      EXPECT_EQ(dst_stats[i].received_digest, shares[0] + shares[1]) << "replica " << i / T << " rank " << j;
      if (i / T + 1 < kReplicas) EXPECT_EQ(dst_stats[i].bytes_forwarded, dst_stats[i].bytes_received);
    }
    // Egress: each trainer rank sent exactly what one replica needs from it.
    uint64_t sent = 0;
    for (int s = 0; s < D; ++s) sent += src_stats[s].bytes_sent;
    EXPECT_EQ(sent, plan->BytesNeeded());
    if (mapped) {
      for (int i = 0; i < kReplicas * T; ++i) EXPECT_GT(dst_stats[i].mapped_pairs, 0u) << i;
    }
  }
}

TEST(ExecutorTest, StagingPoolIsReusedAcrossRuns) {
  auto a = LoopbackTransport::Create();
  StagingPool pool(*a);
  auto first = pool.Get(1000, transport::MemoryKind::kHost, 0);
  ASSERT_TRUE(first.ok());
  auto again = pool.Get(500, transport::MemoryKind::kHost, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->id, again->id);  // big enough: the same registration
  auto bigger = pool.Get(5000, transport::MemoryKind::kHost, 0);
  ASSERT_TRUE(bigger.ok());
  EXPECT_NE(bigger->id, first->id);
  EXPECT_GE(bigger->length, 5000u);
  // The old one was released.
  EXPECT_EQ(a->DeregisterMemory(*first).code(), absl::StatusCode::kNotFound);
}

TEST(ExecutorTest, CorruptionIsDataLoss) {
  std::vector<TensorSpec> tensors = {{"w", {64, 48}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 1), Layout::Tp(2, {Split::kColumns}));
  ASSERT_TRUE(plan.ok());
  Outcome out = RunPlan(*plan, ExecutorOptions{});
  auto ops = NewHostMemoryOps();
  ASSERT_TRUE(VerifyDigest(*plan, 1, out.dst_bufs[1].data(), *ops, SharesFor(out, 1)).ok());
  out.dst_bufs[1][100] ^= 0x10;
  absl::Status s = VerifyDigest(*plan, 1, out.dst_bufs[1].data(), *ops, SharesFor(out, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("destination rank 1"), std::string::npos) << s;
  // Two units swapped is caught too.
  out.dst_bufs[1][100] ^= 0x10;
  std::swap(out.dst_bufs[1][0], out.dst_bufs[1][6]);
  EXPECT_EQ(VerifyDigest(*plan, 1, out.dst_bufs[1].data(), *ops, SharesFor(out, 1)).code(),
            absl::StatusCode::kDataLoss);
}

TEST(ExecutorTest, MissingSourceIsDeadlineExceededWithinTheTimeout) {
  std::vector<TensorSpec> tensors = {{"w", {32, 32}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 1), Layout::Tp(1, {Split::kRows}));
  ASSERT_TRUE(plan.ok());
  for (bool mapped : {true, false}) {
    ExecutorOptions options;
    options.timeout = absl::Milliseconds(300);
    options.map_peer_memory = mapped;
    const absl::Time start = absl::Now();
    Outcome out = RunPlan(*plan, options, /*skip_src=*/1);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_EQ(out.dst_status[0].code(), absl::StatusCode::kDeadlineExceeded) << out.dst_status[0];
    // Mapped: it never answered the hello; tagged: its round never came.
    EXPECT_NE(out.dst_status[0].message().find(mapped ? "answer of source rank 1" : "resharding round"),
              std::string::npos)
        << out.dst_status[0];
  }
}

// A call that failed (a source never came) leaves messages and receives behind; the
// next call between the same processes, under the next tag epoch, still delivers
// everything exactly, on both paths.
TEST(ExecutorTest, AFailedCallLeavesNothingThatDisturbsTheNext) {
  std::vector<TensorSpec> tensors = {{"w", {32, 16}, DType::kF32}, {"v", {16, 32}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 2), Layout::Tp(2, {Split::kRows, Split::kColumns}));
  ASSERT_TRUE(plan.ok());
  for (bool mapped : {true, false}) {
    SCOPED_TRACE(mapped ? "mapped" : "tagged");
    Fleet fleet(2, 2);
    std::vector<std::vector<uint8_t>> src_bufs, dst_bufs;
    std::vector<MemoryHandle> src_h, dst_h;
    for (int s = 0; s < 2; ++s) {
      src_bufs.push_back(ExpectedShard(*plan, true, s));
      src_h.push_back(Register(*fleet.src[s], src_bufs[s].data(), src_bufs[s].size()));
    }
    for (int r = 0; r < 2; ++r) {
      dst_bufs.emplace_back(plan->dst_shard_bytes[r], 0);
      dst_h.push_back(Register(*fleet.dst[r], dst_bufs[r].data(), dst_bufs[r].size()));
    }
    ExecutorOptions options;
    options.chunk_bytes = 256;
    options.direct_min_bytes = 128;
    options.map_peer_memory = mapped;
    options.verify_received = true;
    auto run = [&](bool with_source_1, int epoch, absl::Duration timeout) {
      ExecutorOptions o = options;
      o.tag_epoch = epoch;
      o.timeout = timeout;
      std::vector<absl::StatusOr<ExecutionStats>> out(4, absl::UnknownError("not run"));
      std::vector<std::thread> threads;
      for (int s = 0; s < (with_source_1 ? 2 : 1); ++s) {
        threads.emplace_back([&, s] {
          auto ops = NewHostMemoryOps();
          SourceRole role{s, src_h[s], fleet.src_to_dst[s]};
          out[s] = Execute(*fleet.src[s], *plan, &role, nullptr, *ops, o);
        });
      }
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          auto ops = NewHostMemoryOps();
          DestinationRole role{r, dst_h[r], fleet.dst_to_src[r]};
          out[2 + r] = Execute(*fleet.dst[r], *plan, nullptr, &role, *ops, o);
        });
      }
      for (auto& th : threads) th.join();
      return out;
    };
    auto failed = run(false, 0, absl::Milliseconds(300));
    EXPECT_FALSE(failed[2].ok());
    EXPECT_FALSE(failed[3].ok());
    for (auto& buf : dst_bufs) std::fill(buf.begin(), buf.end(), 0);
    auto again = run(true, 1, absl::Seconds(20));
    for (const auto& st : again) ASSERT_TRUE(st.ok()) << st.status();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(dst_bufs[r], ExpectedShard(*plan, false, r)) << "destination " << r;
      EXPECT_EQ(again[2 + r]->received_digest, again[0]->digest_shares[r] + again[1]->digest_shares[r]);
    }
  }
  // The epoch is checked.
  auto t = LoopbackTransport::Create();
  std::vector<uint8_t> buf(4096);
  auto ops = NewHostMemoryOps();
  SourceRole role{0, Register(*t, buf.data(), buf.size()), {1, 2}};
  ExecutorOptions bad;
  bad.tag_epoch = 16;
  EXPECT_EQ(Execute(*t, *plan, &role, nullptr, *ops, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExecutorTest, DeadDestinationIsUnavailableNotAHang) {
  std::vector<TensorSpec> tensors = {{"w", {256, 256}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(1, 1), Layout::Tp(2, {Split::kRows}));
  ASSERT_TRUE(plan.ok());
  for (bool mapped : {true, false}) {
    ExecutorOptions options;
    options.chunk_bytes = 1024;
    options.timeout = absl::Seconds(3);
    options.map_peer_memory = mapped;
    // Destination 1 dies at once: the source fails with UNAVAILABLE well before its
    // 3 s deadline; destination 0, whose source stopped, times out at its deadline
    // instead of hanging (the weights service then drops or retries the round).
    Outcome out = RunPlan(*plan, options, -1, [](Fleet& fleet) { fleet.dst[1]->Close(); });
    EXPECT_EQ(out.src_status[0].code(), absl::StatusCode::kUnavailable) << out.src_status[0];
    EXPECT_LT(out.src_took[0], absl::Seconds(2));
    EXPECT_TRUE(out.dst_status[0].ok() || absl::IsDeadlineExceeded(out.dst_status[0])) << out.dst_status[0];
  }
}

TEST(ExecutorTest, RejectsRolesThatDoNotFitThePlan) {
  std::vector<TensorSpec> tensors = {{"w", {8, 8}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 1), Layout::Tp(2, {Split::kRows}));
  ASSERT_TRUE(plan.ok());
  auto t = LoopbackTransport::Create();
  std::vector<uint8_t> buf(16);
  MemoryHandle small = Register(*t, buf.data(), buf.size());
  auto ops = NewHostMemoryOps();
  SourceRole bad_rank{5, small, {1, 2}};
  EXPECT_EQ(Execute(*t, *plan, &bad_rank, nullptr, *ops).status().code(), absl::StatusCode::kInvalidArgument);
  SourceRole too_small{0, small, {1, 2}};
  auto s = Execute(*t, *plan, &too_small, nullptr, *ops).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shard is 16 bytes"), std::string::npos) << s;
  EXPECT_EQ(Execute(*t, *plan, nullptr, nullptr, *ops).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::reshard
