// The weight path GPU to GPU (issue 8, run 2): trainer shards (FSDP over D GPUs) ->
// rollout layout (TP over T GPUs) with the planner and the executor over the NCCL
// transport, one process per GPU (D + T GPUs). Every destination verifies byte for
// byte against the pattern it should hold and by digest (its digest == the sum of the
// sources' shares). Prints one result line per configuration and writes a JSON file
// with the pairs' bytes, for bench/weight_sync_torch.py to move the same bytes with
// torch.distributed on the same GPUs.
//
//   weight_sync_nccl --src_ranks=1 --dst_ranks=1 --model_mib=1024 --json=out.json
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/reshard/cuda/cuda_memory_ops.h"
#include "libs/reshard/cuda/kernels.h"
#include "libs/reshard/executor.h"
#include "libs/reshard/plan.h"
#include "libs/transport/nccl/nccl_transport.h"

ABSL_FLAG(int, src_ranks, 1, "D: trainer ranks (FSDP), GPUs 0..D-1.");
ABSL_FLAG(int, dst_ranks, 1, "T: rollout ranks (TP), GPUs D..D+T-1.");
ABSL_FLAG(int, model_mib, 1024, "Model size in MiB (bf16 4096x4096 matrices + norms).");
ABSL_FLAG(std::string, dst_split, "rows", "TP split of the matrices: rows or columns.");
ABSL_FLAG(bool, cast, false, "Model in f32 at the trainer, cast to bf16 on the way.");
ABSL_FLAG(int, chunk_mib, 512, "Executor chunk size (NVLink: 512 MiB reached 0.97x torch on 1 -> 1, 64 MiB 0.82x).");
ABSL_FLAG(int, depth, 4, "Executor rounds in flight.");
ABSL_FLAG(int, repeats, 5, "Timed runs (after one warm-up); the median is reported.");
ABSL_FLAG(bool, digests, true, "Sources compute digest shares while sending.");
ABSL_FLAG(bool, raw, false,
          "Instead of the plan, each pair's byte count as one NCCL send / recv in one group "
          "(the NCCL floor on this communicator; contents not verified).");
ABSL_FLAG(std::string, json, "", "Where to write the result (pairs, bytes, times) as JSON.");

namespace rlfleet::reshard {
namespace {

using transport::MemoryHandle;
using transport::MemoryKind;
using transport::NcclOptions;
using transport::NcclTransport;

absl::StatusOr<Plan> ModelPlan() {
  const bool cast = absl::GetFlag(FLAGS_cast);
  const DType dtype = cast ? DType::kF32 : DType::kBF16;
  const uint64_t per_matrix = 4096ull * 4096 * DTypeSize(dtype);
  const uint64_t matrices =
      std::max<uint64_t>(1, (static_cast<uint64_t>(absl::GetFlag(FLAGS_model_mib)) << 20) / per_matrix);
  std::vector<TensorSpec> tensors;
  std::vector<Split> dst_splits;
  const Split split = absl::GetFlag(FLAGS_dst_split) == "columns" ? Split::kColumns : Split::kRows;
  for (uint64_t i = 0; i < matrices; ++i) {
    tensors.push_back({absl::StrCat("layers.", i, ".weight"), {4096, 4096}, dtype});
    dst_splits.push_back(split);
    tensors.push_back({absl::StrCat("layers.", i, ".norm"), {4096}, dtype});
    dst_splits.push_back(Split::kReplicated);
  }
  PlanOptions options;
  options.cast_f32_to_bf16 = cast;
  return MakePlan(tensors, Layout::Fsdp(absl::GetFlag(FLAGS_src_ranks), tensors.size()),
                  Layout::Tp(absl::GetFlag(FLAGS_dst_ranks), dst_splits), options);
}

// Writes the pattern into the parts that `layout` gives `rank` (values as produced at
// the source dtype; a cast destination compares after casting its expected copy).
void FillParts(const Plan& plan, bool src, int rank, uint8_t* base, cudaStream_t stream) {
  const Layout& layout = src ? plan.src : plan.dst;
  const auto& parts = src ? plan.src_parts[rank] : plan.dst_parts[rank];
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const uint32_t elem = DTypeSize(parts[t].dtype);
    for (const Interval& iv : PartIntervals(plan.tensors[t], layout.splits[t], layout.ranks, rank)) {
      cuda::LaunchFillPattern(base + parts[t].offset + iv.local * elem, iv.count, elem, static_cast<uint32_t>(t),
                              iv.global, stream);
    }
  }
}

#define CHILD_CHECK(cond, what)                                  \
  do {                                                           \
    if (!(cond)) {                                               \
      std::cerr << "rank " << rank << ": " << what << std::endl; \
      return 1;                                                  \
    }                                                            \
  } while (0)

// One GPU's process. Reports lines "time <rep> <seconds>", "share <d> <value>",
// "digest <d> <value>", "mismatches <d> <n>" to `report`.
int Child(const Plan& plan, const std::vector<std::array<int, 2>>& pipes, int rank, FILE* report) {
  const int D = plan.src.ranks, T = plan.dst.ranks;
  // Rank 0 makes the communicator id (its process hosts NCCL's bootstrap root) and hands
  // it to the others: no process touches CUDA or NCCL before fork().
  std::string id;
  if (rank == 0) {
    auto made = NcclTransport::NewUniqueId();
    CHILD_CHECK(made.ok(), made.status());
    id = *made;
    for (int r = 1; r < D + T; ++r) {
      CHILD_CHECK(write(pipes[r][1], id.data(), id.size()) == static_cast<ssize_t>(id.size()), "writing the NCCL id");
    }
  } else {
    char buf[4096];
    ssize_t n = read(pipes[rank][0], buf, sizeof(buf));
    CHILD_CHECK(n > 0, "reading the NCCL id");
    id.assign(buf, n);
  }
  const bool is_src = rank < D;
  NcclOptions options;
  options.unique_id = id;
  options.world_size = D + T;
  options.rank = rank;
  options.device = rank;
  options.op_timeout = absl::Seconds(120);
  cudaSetDevice(rank);
  auto t = NcclTransport::Create(options);
  CHILD_CHECK(t.ok(), t.status());
  NcclTransport& nccl = **t;
  std::vector<transport::PeerId> peers;
  for (int r = 0; r < D + T; ++r) peers.push_back(*nccl.Connect(absl::StrCat("nccl:", r)));
  auto ops = NewCudaMemoryOps(rank);
  CHILD_CHECK(ops.ok(), ops.status());

  const int my = is_src ? rank : rank - D;
  const uint64_t shard_bytes = is_src ? plan.src_shard_bytes[my] : plan.dst_shard_bytes[my];
  auto shard = nccl.AllocateMemory(std::max<uint64_t>(shard_bytes, 16), MemoryKind::kCuda, rank);
  CHILD_CHECK(shard.ok(), shard.status());
  auto flag = nccl.AllocateMemory(16, MemoryKind::kCuda, rank);
  CHILD_CHECK(flag.ok(), flag.status());
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (is_src) FillParts(plan, true, my, static_cast<uint8_t*>(shard->base), stream);
  cudaStreamSynchronize(stream);

  SourceRole source;
  DestinationRole destination;
  if (is_src) {
    source.rank = my;
    source.shard = *shard;
    source.dst_peers.assign(peers.begin() + D, peers.end());
  } else {
    destination.rank = my;
    destination.shard = *shard;
    destination.src_peers.assign(peers.begin(), peers.begin() + D);
  }
  ExecutorOptions exec;
  exec.chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  exec.depth = absl::GetFlag(FLAGS_depth);
  exec.timeout = absl::Seconds(120);
  exec.digests = absl::GetFlag(FLAGS_digests);
  ExecutionStats last;
  for (int rep = 0; rep <= absl::GetFlag(FLAGS_repeats); ++rep) {
    // A barrier: a one-byte broadcast from rank 0 reaches everyone.
    absl::Status b = nccl.Broadcast(0, *flag, 0, *flag, 0, 1)->Wait(absl::Seconds(120));
    CHILD_CHECK(b.ok(), "barrier: " << b);
    absl::StatusOr<ExecutionStats> stats;
    if (absl::GetFlag(FLAGS_raw)) {
      const absl::Time start = absl::Now();
      std::vector<transport::Transport::TwoSidedOp> batch;
      for (int other = 0; other < (is_src ? T : D); ++other) {
        const int s = is_src ? my : other, d = is_src ? other : my;
        uint64_t bytes = 0;
        for (const Range& range : plan.Between(s, d)) bytes += range.dst_bytes();
        if (bytes == 0) continue;
        batch.push_back({is_src, is_src ? peers[D + d] : peers[s], 0, *shard, 0, bytes});
      }
      absl::Status st = nccl.SendRecvBatch(batch)->Wait(absl::Seconds(120));
      CHILD_CHECK(st.ok(), st);
      ExecutionStats raw;
      raw.elapsed = absl::Now() - start;
      raw.digest_shares.assign(T, 0);
      stats = raw;
    } else {
      stats = Execute(nccl, plan, is_src ? &source : nullptr, is_src ? nullptr : &destination, **ops, exec);
    }
    CHILD_CHECK(stats.ok(), stats.status());
    if (rep > 0) std::fprintf(report, "time %d %.9f\n", rep, absl::ToDoubleSeconds(stats->elapsed));
    last = *stats;
  }
  if (absl::GetFlag(FLAGS_raw)) {
    // nothing to verify
  } else if (is_src) {
    for (int d = 0; d < T && exec.digests; ++d) {
      std::fprintf(report, "share %d %llu\n", d, static_cast<unsigned long long>(last.digest_shares[d]));
    }
  } else {
    auto digest = ShardDigest(plan, my, shard->base, **ops);
    CHILD_CHECK(digest.ok(), digest.status());
    std::fprintf(report, "digest %d %llu\n", my, static_cast<unsigned long long>(*digest));
    // Byte for byte against what this destination should hold.
    void* expected = nullptr;
    cudaMalloc(&expected, std::max<uint64_t>(shard_bytes, 16));
    cudaMemset(expected, 0, shard_bytes);
    if (plan.options.cast_f32_to_bf16) {
      // The pattern at f32, then cast: fill an f32 copy of each part and cast it.
      for (size_t t = 0; t < plan.tensors.size(); ++t) {
        const ShardPart& part = plan.dst_parts[my][t];
        if (part.elements == 0) continue;
        void* f32 = nullptr;
        cudaMalloc(&f32, part.elements * 4);
        for (const Interval& iv : PartIntervals(plan.tensors[t], plan.dst.splits[t], T, my)) {
          cuda::LaunchFillPattern(static_cast<uint8_t*>(f32) + iv.local * 4, iv.count, 4, static_cast<uint32_t>(t),
                                  iv.global, stream);
        }
        cuda::LaunchCastF32ToBf16(static_cast<uint8_t*>(expected) + part.offset, f32, part.elements, stream);
        cudaStreamSynchronize(stream);
        cudaFree(f32);
      }
    } else {
      FillParts(plan, false, my, static_cast<uint8_t*>(expected), stream);
    }
    uint64_t* count = nullptr;
    cudaMalloc(&count, 8);
    cudaMemsetAsync(count, 0, 8, stream);
    cuda::LaunchCountMismatches(count, expected, shard->base, shard_bytes, stream);
    uint64_t mismatches = 0;
    cudaMemcpyAsync(&mismatches, count, 8, cudaMemcpyDeviceToHost, stream);
    CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "verification kernels failed");
    std::fprintf(report, "mismatches %d %llu\n", my, static_cast<unsigned long long>(mismatches));
  }
  std::fflush(report);
  return 0;
}

int Main() {
  auto plan = ModelPlan();
  if (!plan.ok()) {
    std::cerr << plan.status() << "\n";
    return 2;
  }
  const int D = plan->src.ranks, T = plan->dst.ranks;
  std::vector<std::array<int, 2>> pipes(D + T);
  for (auto& p : pipes) {
    if (pipe(p.data()) != 0) return 2;
  }
  char path[] = "/tmp/weight_sync_nccl_XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < D + T; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      FILE* report = std::fopen(path, "a");
      setvbuf(report, nullptr, _IOLBF, 0);
      _exit(Child(*plan, pipes, rank, report));
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::ifstream in(path);
  std::string kind;
  std::vector<double> worst(absl::GetFlag(FLAGS_repeats) + 1, 0.0);
  std::vector<uint64_t> want(T, 0), got(T, 0), bad(T, 0);
  int rep, r;
  while (in >> kind) {
    if (kind == "time") {
      double s;
      in >> rep >> s;
      worst[rep] = std::max(worst[rep], s);
    } else {
      unsigned long long v;
      in >> r >> v;
      if (kind == "share") want[r] += v;
      if (kind == "digest") got[r] = v;
      if (kind == "mismatches") bad[r] = v;
    }
  }
  unlink(path);
  std::vector<double> times(worst.begin() + 1, worst.end());
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0 : times[times.size() / 2];
  const uint64_t needed = plan->BytesNeeded();
  bool verified = ok;
  for (int d = 0; d < T && !absl::GetFlag(FLAGS_raw); ++d) {
    const bool digest_ok = !absl::GetFlag(FLAGS_digests) || want[d] == got[d];
    if (bad[d] != 0 || !digest_ok) {
      std::fprintf(stderr, "destination %d: %llu bytes differ from the expected pattern; digest %s\n", d,
                   static_cast<unsigned long long>(bad[d]), digest_ok ? "ok" : "MISMATCH");
    }
    verified &= bad[d] == 0 && digest_ok;
  }
  const double gbps = median > 0 ? needed / median / 1e9 : 0;
  std::printf(
      "weight_sync_nccl%s D=%d T=%d %s%s bytes_needed=%llu bytes_moved=%llu median_s=%.6f "
      "GBps=%.2f verified=%s\n",
      absl::GetFlag(FLAGS_raw) ? " raw" : "", D, T, absl::GetFlag(FLAGS_dst_split).c_str(),
      absl::GetFlag(FLAGS_cast) ? " cast" : "", static_cast<unsigned long long>(needed),
      static_cast<unsigned long long>(plan->BytesMoved()), median, gbps, verified ? "yes" : "NO");
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream json(absl::GetFlag(FLAGS_json));
    json << "{\"D\": " << D << ", \"T\": " << T << ", \"bytes_needed\": " << needed << ", \"median_s\": " << median
         << ", \"GBps\": " << gbps << ", \"verified\": " << (verified ? "true" : "false") << ", \"pairs\": [";
    bool first = true;
    for (int s = 0; s < D; ++s) {
      for (int d = 0; d < T; ++d) {
        uint64_t bytes = 0;
        for (const Range& range : plan->Between(s, d)) bytes += range.dst_bytes();
        if (bytes == 0) continue;
        json << (first ? "" : ", ") << "[" << s << ", " << D + d << ", " << bytes << "]";
        first = false;
      }
    }
    json << "]}\n";
  }
  return verified ? 0 : 1;
}

}  // namespace
}  // namespace rlfleet::reshard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlfleet::reshard::Main();
}
