// weight_sync: the weight path on one machine over UCX (issue 6's benchmark).
//
// A model of --model_mib MiB (bf16 2048x2048 matrices + replicated norms) goes from
// 2 trainer ranks (FSDP) to R rollout replicas of TP 2 (R = 1, 2, 4), every rank its own
// process with its own UcxTransport (this binary spawns itself), through the planner and
// the executor. Each destination checks its shard by digest (== the sum of the sources'
// shares) and byte for byte. Reported per R: bytes moved / needed, what each trainer
// rank sends as a multiple of its shard, effective GB/s (bytes needed / slowest rank's
// time, median of --repeats) and the same against `ucx_perftest -t ucp_put_bw` with the
// same UCX_TLS run by this binary, moving one sync's bytes per iteration. Last line:
//   weight_sync_ratio_vs_ucx_perftest=<ratio at R=1>
//
// By default the replicas relay in a chain (trainer egress 1.0 x shard for every R);
// --relay=false feeds every replica from the trainers (egress R x) for comparison.
// Every pair here shares the host, so the executor takes its mapped path: each sender
// stores its bytes straight into the destination's UCX shared-memory shard (the digest
// share in the same pass, column splits gathered on the way); --mapped=false measures
// the tagged-message path (UCX rendezvous, what crosses hosts) instead.
//
//   bazel run -c opt //bench:weight_sync -- --out=$PWD/bench/results/weight_sync.md
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ucx_perftest.h"
#include "libs/reshard/executor.h"
#include "libs/reshard/plan.h"
#include "libs/reshard/tests/shards.h"
#include "libs/transport/ucx/ucx_transport.h"
#include "tests/util/subprocess.h"

ABSL_FLAG(std::string, role, "driver", "driver (runs everything) or rank (spawned by it).");
ABSL_FLAG(std::string, tls, "posix,cma,self", "UCX_TLS for every rank and for ucx_perftest.");
ABSL_FLAG(int, model_mib, 256, "Model size in MiB (bf16).");
ABSL_FLAG(std::string, replicas, "1,2,4", "Replica counts R to measure.");
ABSL_FLAG(int, repeats, 3, "Timed runs per R (after a warm-up); the median is reported.");
ABSL_FLAG(int, chunk_mib, 16, "Executor chunk size.");
ABSL_FLAG(std::string, out, "weight_sync.md", "Where the table is written.");
ABSL_FLAG(bool, columns, true, "Split every other matrix by columns (else all by rows).");
ABSL_FLAG(bool, relay, true,
          "Replicas form a chain: trainers feed replica 0, each replica forwards to the next "
          "(trainer egress 1x). false: trainers feed every replica (egress R x).");
ABSL_FLAG(bool, digests, true, "Sources compute digest shares (destinations always check).");
ABSL_FLAG(bool, verify_on_arrival, false,
          "Destinations digest each round as it arrives, inside the timed sync (else only a separate pass "
          "after it, untimed; that pass runs either way as a cross-check and its time is reported). On two "
          "cores it competes with the senders' copies: R=1 38-48 ms against 16 ms + a 14 ms pass after.");
ABSL_FLAG(bool, mapped, true,
          "Same-host pairs store straight into the destination's shared-memory shard (UCX "
          "rkey_ptr); false: tagged messages (UCX rendezvous) for every pair.");
// rank role
ABSL_FLAG(int, src_rank, -1, "rank role: trainer rank (0 or 1), or -1.");
ABSL_FLAG(int, replica, -1, "rank role: replica index.");
ABSL_FLAG(int, tp_rank, -1, "rank role: TP rank within the replica.");
ABSL_FLAG(int, num_replicas, 1, "rank role: R.");

namespace rlfleet::reshard {
namespace {

using transport::MemoryHandle;
using transport::PeerId;
using transport::UcxOptions;
using transport::UcxTransport;

constexpr int kTrainerRanks = 2;
constexpr int kTp = 2;
constexpr absl::Duration kTimeout = absl::Seconds(120);

void Die(const std::string& message) {
  std::cerr << "weight_sync: " << message << std::endl;
  std::exit(1);
}

Plan ModelPlan() {
  const uint64_t per_matrix = 2048ull * 2048 * 2;
  const uint64_t matrices =
      std::max<uint64_t>(1, (static_cast<uint64_t>(absl::GetFlag(FLAGS_model_mib)) << 20) / per_matrix);
  std::vector<TensorSpec> tensors;
  std::vector<Split> dst;
  for (uint64_t i = 0; i < matrices; ++i) {
    tensors.push_back({absl::StrCat("layers.", i, ".weight"), {2048, 2048}, DType::kBF16});
    dst.push_back(i % 2 == 1 && absl::GetFlag(FLAGS_columns) ? Split::kColumns : Split::kRows);
    tensors.push_back({absl::StrCat("layers.", i, ".norm"), {2048}, DType::kBF16});
    dst.push_back(Split::kReplicated);
  }
  auto plan = MakePlan(tensors, Layout::Fsdp(kTrainerRanks, tensors.size()), Layout::Tp(kTp, dst));
  if (!plan.ok()) Die(plan.status().ToString());
  return *plan;
}

// ---- one rank (a process) ----
int Rank() {
  const Plan plan = ModelPlan();
  const int src = absl::GetFlag(FLAGS_src_rank);
  const int tp = absl::GetFlag(FLAGS_tp_rank);
  const int R = absl::GetFlag(FLAGS_num_replicas);
  UcxOptions options;
  options.tls = absl::GetFlag(FLAGS_tls);
  auto t = UcxTransport::Create(options);
  if (!t.ok()) Die(t.status().ToString());
  const uint64_t bytes = src >= 0 ? plan.src_shard_bytes[src] : plan.dst_shard_bytes[tp];
  auto shard = (*t)->AllocateMemory(std::max<uint64_t>(bytes, 16), transport::MemoryKind::kHost, 0);
  if (!shard.ok()) Die(shard.status().ToString());
  if (src >= 0) {
    const std::vector<uint8_t> pattern = testing::ExpectedShard(plan, true, src);
    std::memcpy(shard->base, pattern.data(), pattern.size());
  } else {
    std::memset(shard->base, 0, bytes);
  }
  std::cout << "ADDR " << absl::BytesToHexString((*t)->LocalAddress()) << std::endl;

  // PEERS <trainer0> <trainer1> <replica0.tp0> <replica0.tp1> ...
  std::vector<PeerId> trainers;               // as a destination
  PeerId relay_from = 0, forward_to = 0;      // as a destination in a chain
  std::vector<std::vector<PeerId>> replicas;  // as a source: [replica][tp]
  const bool relay = absl::GetFlag(FLAGS_relay);
  const int replica = absl::GetFlag(FLAGS_replica);
  ExecutorOptions exec;
  exec.chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  exec.timeout = kTimeout;
  exec.digests = absl::GetFlag(FLAGS_digests);
  exec.map_peer_memory = absl::GetFlag(FLAGS_mapped);
  exec.verify_received = absl::GetFlag(FLAGS_verify_on_arrival);
  // Staging kept across runs (one pool per concurrent executor), as a weights service would.
  std::vector<std::unique_ptr<StagingPool>> pools;
  for (int r = 0; r < std::max(R, 1); ++r) pools.push_back(std::make_unique<StagingPool>(**t));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> a = absl::StrSplit(line, ' ');
    if (a[0] == "PEERS") {
      auto connect = [&](const std::string& hex) {
        auto id = (*t)->Connect(absl::HexStringToBytes(hex));
        if (!id.ok()) Die(id.status().ToString());
        return *id;
      };
      auto rank_address = [&](int r, int j) { return a[1 + kTrainerRanks + r * kTp + j]; };
      if (src >= 0) {
        for (int r = 0; r < (relay ? 1 : R); ++r) {
          replicas.push_back({connect(rank_address(r, 0)), connect(rank_address(r, 1))});
        }
      } else if (relay && replica > 0) {
        relay_from = connect(rank_address(replica - 1, tp));
      } else {
        trainers = {connect(a[1]), connect(a[2])};
      }
      if (src < 0 && relay && replica + 1 < R) forward_to = connect(rank_address(replica + 1, tp));
      std::cout << "OK" << std::endl;
    } else if (a[0] == "RUN") {
      auto ops = NewHostMemoryOps();
      const absl::Time start = absl::Now();
      if (src >= 0) {
        // One executor per replica, concurrently (each its own digest accumulators).
        const int feeds = static_cast<int>(replicas.size());
        std::vector<absl::StatusOr<ExecutionStats>> results(feeds);
        std::vector<std::thread> threads;
        for (int r = 0; r < feeds; ++r) {
          threads.emplace_back([&, r] {
            auto own_ops = NewHostMemoryOps();
            SourceRole role{src, *shard, replicas[r]};
            ExecutorOptions mine = exec;
            mine.staging_pool = pools[r].get();
            results[r] = Execute(**t, plan, &role, nullptr, *own_ops, mine);
          });
        }
        for (auto& th : threads) th.join();
        const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
        uint64_t sent = 0;
        std::vector<std::string> shares;
        for (auto& r : results) {
          if (!r.ok()) Die(r.status().ToString());
          sent += r->bytes_sent;
          shares.push_back(absl::StrJoin(r->digest_shares, ","));
        }
        std::cout << "DONE " << seconds << " " << sent << " " << absl::StrJoin(shares, ";") << std::endl;
      } else {
        DestinationRole role{tp, *shard, trainers, relay_from, forward_to};
        ExecutorOptions mine = exec;
        mine.staging_pool = pools[0].get();
        auto stats = Execute(**t, plan, nullptr, &role, *ops, mine);
        if (!stats.ok()) Die(stats.status().ToString());
        const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
        const absl::Time verify_start = absl::Now();
        auto digest = ShardDigest(plan, tp, shard->base, *ops);  // what VerifyDigest computes
        const double verify_seconds = absl::ToDoubleSeconds(absl::Now() - verify_start);
        static const std::vector<uint8_t> expected = testing::ExpectedShard(plan, false, tp);  // (the same each run)
        // On arrival, the digest is the one computed while receiving; it must also equal
        // the separate pass's.
        bool exact = std::memcmp(shard->base, expected.data(), bytes) == 0;
        if (mine.verify_received) {
          exact &= stats->received_digest == *digest;
          *digest = stats->received_digest;
        }
        std::memset(shard->base, 0, bytes);  // the next run must deliver everything again
        // (before DONE: every rank is idle when the driver starts the next run)
        std::cout << "DONE " << seconds << " " << *digest << " " << (exact ? 1 : 0) << " " << verify_seconds
                  << std::endl;
      }
    }
  }
  return 0;
}

// ---- driver ----
double PerftestPutGbps(const std::string& tls, uint64_t size) {
  absl::StatusOr<double> gbps =
      bench::UcxPerftestGbps(tls, "ucp_put_bw", size, std::max<uint64_t>(8, (1ull << 30) / size));
  if (!gbps.ok()) Die(gbps.status().ToString());
  return *gbps;
}

struct Row {
  int replicas = 0;
  double moved_over_needed = 0;
  double egress_multiple = 0;  // bytes a trainer rank sends / its shard bytes
  double seconds = 0;
  double gbps = 0;
  double verify_seconds = 0;  // a destination checking its digest (after the transfer): median
  bool verified = true;
};

Row Measure(const std::string& self, const Plan& plan, int R) {
  std::vector<std::unique_ptr<rlfleet::testing::Subprocess>> ranks;
  const std::string tls = absl::GetFlag(FLAGS_tls);
  const std::vector<std::string> common = {"--role=rank",
                                           "--tls=" + tls,
                                           absl::StrCat("--model_mib=", absl::GetFlag(FLAGS_model_mib)),
                                           absl::StrCat("--chunk_mib=", absl::GetFlag(FLAGS_chunk_mib)),
                                           absl::StrCat("--num_replicas=", R),
                                           absl::StrCat("--columns=", absl::GetFlag(FLAGS_columns)),
                                           absl::StrCat("--digests=", absl::GetFlag(FLAGS_digests)),
                                           absl::StrCat("--mapped=", absl::GetFlag(FLAGS_mapped)),
                                           absl::StrCat("--verify_on_arrival=", absl::GetFlag(FLAGS_verify_on_arrival)),
                                           absl::StrCat("--relay=", absl::GetFlag(FLAGS_relay))};
  auto start = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {self};
    argv.insert(argv.end(), common.begin(), common.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    ranks.push_back(std::make_unique<rlfleet::testing::Subprocess>());
    if (!ranks.back()->Start(argv).ok()) Die("cannot start a rank");
  };
  for (int s = 0; s < kTrainerRanks; ++s) start({absl::StrCat("--src_rank=", s)});
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kTp; ++j) start({absl::StrCat("--replica=", r), absl::StrCat("--tp_rank=", j)});
  }
  auto wait_for = [&](rlfleet::testing::Subprocess& p, const std::string& prefix) {
    auto l = p.WaitForLine([&](const std::string& s) { return absl::StartsWith(s, prefix); }, kTimeout);
    if (!l.ok()) Die(absl::StrCat("rank: ", l.status().ToString()));
    return l->substr(prefix.size());
  };
  std::vector<std::string> addresses;
  for (auto& p : ranks) addresses.push_back(wait_for(*p, "ADDR "));
  const std::string peers = "PEERS " + absl::StrJoin(addresses, " ");
  for (auto& p : ranks) {
    if (!p->WriteLine(peers).ok()) Die("rank died");
  }
  for (auto& p : ranks) wait_for(*p, "OK");

  Row row;
  row.replicas = R;
  std::vector<double> times, verify;
  uint64_t sent_per_rank = 0;
  for (int rep = 0; rep <= absl::GetFlag(FLAGS_repeats); ++rep) {
    for (auto& p : ranks) {
      if (!p->WriteLine("RUN").ok()) Die("rank died");
    }
    double slowest = 0;
    std::vector<uint64_t> want(R * kTp, 0), got(R * kTp, 0);
    for (size_t i = 0; i < ranks.size(); ++i) {
      std::vector<std::string> f = absl::StrSplit(wait_for(*ranks[i], "DONE "), ' ');
      double s = 0;
      (void)absl::SimpleAtod(f[0], &s);
      slowest = std::max(slowest, s);
      if (i < kTrainerRanks) {
        (void)absl::SimpleAtoi(f[1], &sent_per_rank);
        if (!absl::GetFlag(FLAGS_digests)) continue;
        std::vector<std::string> per_replica = absl::StrSplit(f[2], ';');
        for (int r = 0; r < R; ++r) {
          // Relayed replicas hold the same bytes as replica 0: the same shares check them.
          std::vector<std::string> shares = absl::StrSplit(per_replica[absl::GetFlag(FLAGS_relay) ? 0 : r], ',');
          for (int j = 0; j < kTp; ++j) {
            uint64_t v = 0;
            (void)absl::SimpleAtoi(shares[j], &v);
            want[r * kTp + j] += v;
          }
        }
      } else {
        const size_t d = i - kTrainerRanks;
        (void)absl::SimpleAtoi(f[1], &got[d]);
        row.verified &= f[2] == "1";
        double v = 0;
        if (f.size() > 3 && absl::SimpleAtod(f[3], &v) && rep > 0) verify.push_back(v);
      }
    }
    if (absl::GetFlag(FLAGS_digests)) row.verified &= want == got;
    if (rep > 0) times.push_back(slowest);
  }
  std::sort(times.begin(), times.end());
  row.seconds = times[times.size() / 2];
  if (!verify.empty()) {
    std::sort(verify.begin(), verify.end());
    row.verify_seconds = verify[verify.size() / 2];
  }
  const uint64_t needed = plan.BytesNeeded() * R;
  row.moved_over_needed = static_cast<double>(plan.BytesMoved() * R) / needed;
  row.egress_multiple = static_cast<double>(sent_per_rank) / plan.src_shard_bytes[0];
  row.gbps = needed / row.seconds / 1e9;
  for (auto& p : ranks) (void)p->Signal(SIGTERM);
  for (auto& p : ranks) (void)p->Wait(absl::Seconds(30));
  return row;
}

int Driver(const std::string& self) {
  const Plan plan = ModelPlan();
  const std::string tls = absl::GetFlag(FLAGS_tls);
  const uint64_t chunk = static_cast<uint64_t>(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  std::vector<Row> rows;
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_replicas), ',')) {
    int R = 1;
    (void)absl::SimpleAtoi(r, &R);
    std::cerr << "R=" << R << " ..." << std::endl;
    rows.push_back(Measure(self, plan, R));
    const Row& row = rows.back();
    std::cerr << absl::StrFormat("R=%d  %.3f s  %.3f GB/s  moved/needed %.2f  egress %.2fx  verified %s\n",
                                 row.replicas, row.seconds, row.gbps, row.moved_over_needed, row.egress_multiple,
                                 row.verified ? "yes" : "NO");
  }
  // The reference moves the same bytes as one sync (a replica's model, far beyond the
  // caches); at the chunk size its buffers stay cache-resident (this VM reports a 256 MiB
  // L3) and it runs at twice memory bandwidth, so that figure is shown, not compared with.
  const uint64_t sync_bytes = plan.BytesNeeded();
  const double ref = PerftestPutGbps(tls, sync_bytes);
  const double ref_chunk = PerftestPutGbps(tls, chunk);
  // Our R=1 sync has two senders (the trainer ranks) copying at once, one per core here;
  // ucx_perftest is one pair. The same with two pairs at once, each half the bytes:
  double ref_pairs = 0;
  {
    std::vector<double> each(2, 0);
    std::vector<std::thread> pair_threads;
    for (int i = 0; i < 2; ++i) pair_threads.emplace_back([&, i] { each[i] = PerftestPutGbps(tls, sync_bytes / 2); });
    for (auto& th : pair_threads) th.join();
    ref_pairs = each[0] + each[1];
  }
  const double ratio = rows.empty() || ref <= 0 ? 0 : rows.front().gbps / ref;
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# weight_sync: 2 trainer ranks (FSDP) -> R replicas (TP 2) over UCX\n\n"
      << "Model " << absl::GetFlag(FLAGS_model_mib) << " MiB bf16 (2048x2048 matrices split by rows "
      << "and columns alternately, replicated norms), UCX_TLS=" << tls << ", chunk " << absl::GetFlag(FLAGS_chunk_mib)
      << " MiB, median of " << absl::GetFlag(FLAGS_repeats)
      << " after a warm-up; every destination verified by digest and byte for byte. "
      << (absl::GetFlag(FLAGS_mapped) ? "Mapped path: every sender stores into the destination's shared-memory shard "
                                        "(UCX posix segment, ucp_rkey_ptr), digest share in the same pass, one small "
                                        "tagged notice per round. "
                                      : "Tagged-message path (UCX rendezvous) for every pair. ")
      << "Sources' digest shares: " << (absl::GetFlag(FLAGS_digests) ? "on" : "off") << "; destinations "
      << (absl::GetFlag(FLAGS_verify_on_arrival) ? "digest each round as it arrives (inside the timed sync); "
                                                 : "digest only after the sync (untimed); ")
      << "the last column is what a separate digest pass after the sync takes. "
      << (absl::GetFlag(FLAGS_relay)
              ? "Replicas relay in a chain: the trainers feed replica 0, each replica forwards "
                "every message to the next as soon as it arrived.\n\n"
              : "Each replica is fed directly by the trainer ranks (trainer egress = R x shard).\n\n")
      << "| R | moved / needed | trainer egress (x shard) | seconds | GB/s | destination digest check (s, after) | "
         "verified |\n"
      << "|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& row : rows) {
    out << absl::StrFormat("| %d | %.2f | %.2f | %.3f | %.3f | %.3f | %s |\n", row.replicas, row.moved_over_needed,
                           row.egress_multiple, row.seconds, row.gbps, row.verify_seconds, row.verified ? "yes" : "NO");
  }
  out << absl::StrFormat(
             "\nucx_perftest -t ucp_put_bw -s %d (one sync's bytes, same UCX_TLS): %.3f GB/s "
             "(the reference)\n",
             sync_bytes, ref)
      << absl::StrFormat("ucx_perftest -t ucp_put_bw -s %d (the chunk size: cache-resident): %.3f GB/s\n", chunk,
                         ref_chunk)
      << absl::StrFormat(
             "two ucx_perftest pairs at once, -s %d each (as many senders as our R=1): %.3f GB/s "
             "together; R=1 / that = %.3f\n",
             sync_bytes / 2, ref_pairs, rows.empty() || ref_pairs <= 0 ? 0 : rows.front().gbps / ref_pairs);
  if (rows.size() > 1) {
    out << absl::StrFormat(
        "time(R=%d) / time(R=%d) = %.2f (one 2-core machine: every copy shares "
        "the same memory bandwidth)\n",
        rows.back().replicas, rows.front().replicas, rows.back().seconds / rows.front().seconds);
  }
  out << absl::StrFormat("weight_sync_ratio_vs_ucx_perftest=%.3f\n", ratio);
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << "\n";
  std::cout << absl::StrFormat("weight_sync_ratio_vs_ucx_perftest=%.3f", ratio) << std::endl;
  bool ok = true;
  for (const Row& row : rows) ok &= row.verified;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace rlfleet::reshard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "rank") return rlfleet::reshard::Rank();
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  return rlfleet::reshard::Driver(self);
}
