// hierarchical_allreduce: flat ring vs hierarchical all-reduce (libs/dist) over 2 "nodes"
// x 4 ranks on loopback, where every inter-node transfer crosses a slow link (a
// FaultTransport: --latency_us + size / --link_gbps) and ranks of one node talk at
// memory speed. Same run, same ranks, same data; median of --repeats. Also the error a
// 16-bit wire introduces (bf16, fp16: max |result - exact sum| over the sum of the
// inputs' magnitudes). Writes a table to --out; last line:
//   hierarchical_over_flat=<flat time / hierarchical time, largest size, fp32>
//   bazel run -c opt //bench:hierarchical_allreduce -- --out=$PWD/bench/results/hierarchical_allreduce.md
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "libs/dist/loopback_cluster.h"
#include "libs/dist/ring_collectives.h"

ABSL_FLAG(std::string, out, "hierarchical_allreduce.md", "Where the table is written.");
ABSL_FLAG(int, nodes, 2, "Nodes.");
ABSL_FLAG(int, ranks_per_node, 4, "Ranks per node.");
ABSL_FLAG(int, latency_us, 1000, "Inter-node link latency per transfer, microseconds.");
ABSL_FLAG(double, link_gbps, 10, "Inter-node link bandwidth, Gbit/s.");
ABSL_FLAG(int, repeats, 5, "Runs of each measurement; the median is kept.");

namespace {

using rlfleet::dist::CollectiveOptions;
using rlfleet::dist::LoopbackCluster;
using rlfleet::dist::WirePrecision;

struct Result {
  double seconds = 0;  // median
  double error = 0;    // max |result - exact| / sum of magnitudes
};

Result Measure(LoopbackCluster& cluster, size_t n, bool hierarchical, WirePrecision precision, int repeats) {
  std::vector<double> times;
  Result result;
  std::vector<int> ring;
  for (int r = 0; r < cluster.size(); ++r) ring.push_back(r);
  for (int rep = 0; rep < repeats; ++rep) {
    std::vector<std::vector<float>> data(cluster.size(), std::vector<float>(n));
    std::vector<double> exact(n, 0), magnitude(n, 0);
    for (int r = 0; r < cluster.size(); ++r) {
      std::mt19937 gen(r + 7 * rep);
      std::normal_distribution<float> dist(0, 1);
      for (size_t i = 0; i < n; ++i) {
        data[r][i] = dist(gen);
        exact[i] += data[r][i];
        magnitude[i] += std::abs(data[r][i]);
      }
    }
    CollectiveOptions options;
    options.precision = precision;
    options.tag = rep + 1;
    const absl::Time start = absl::Now();
    absl::Status s = cluster.RunOnAll([&](int rank) {
      return hierarchical
                 ? HierarchicalAllReduce(absl::MakeSpan(data[rank]), cluster.topology(), cluster.links(rank), options)
                 : RingAllReduce(absl::MakeSpan(data[rank]), ring, cluster.links(rank), options);
    });
    times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    if (!s.ok()) {
      std::cerr << s << "\n";
      std::exit(1);
    }
    for (size_t i = 0; i < n; ++i)
      result.error = std::max(result.error, std::abs(data[0][i] - exact[i]) / magnitude[i]);
  }
  std::sort(times.begin(), times.end());
  result.seconds = times[times.size() / 2];
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  rlfleet::transport::FaultPlan link;
  link.delay = absl::Microseconds(absl::GetFlag(FLAGS_latency_us));
  link.bytes_per_second = absl::GetFlag(FLAGS_link_gbps) * 1e9 / 8;
  LoopbackCluster cluster(absl::GetFlag(FLAGS_nodes), absl::GetFlag(FLAGS_ranks_per_node), link);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# hierarchical_allreduce: flat ring vs hierarchical, " << absl::GetFlag(FLAGS_nodes) << " nodes x "
      << absl::GetFlag(FLAGS_ranks_per_node) << " ranks on loopback\n\n"
      << "CPU: " << rlfleet::bench::CpuModel() << "\n\n"
      << "Inter-node link: " << absl::GetFlag(FLAGS_latency_us) << " us + size / " << absl::GetFlag(FLAGS_link_gbps)
      << " Gbit/s per transfer (FaultTransport); inside a node, memory speed. Median of " << repeats
      << " runs; error = max |result - exact| / sum of the inputs' magnitudes.\n\n"
      << "| size | wire | flat (ms) | hierarchical (ms) | hierarchical / flat speed-up | flat error | hierarchical "
         "error |\n"
      << "|---:|---|---:|---:|---:|---:|---:|\n";
  double headline = 0;
  for (size_t mib : {1, 16}) {
    const size_t n = mib * (1 << 20) / 4;
    for (WirePrecision p : {WirePrecision::kFp32, WirePrecision::kBf16, WirePrecision::kFp16}) {
      const Result flat = Measure(cluster, n, false, p, repeats);
      const Result hier = Measure(cluster, n, true, p, repeats);
      const double speedup = flat.seconds / hier.seconds;
      const std::string row = absl::StrFormat("| %d MiB | %s | %.1f | %.1f | %.2f | %.1e | %.1e |", mib,
                                              rlfleet::dist::WirePrecisionName(p), flat.seconds * 1e3,
                                              hier.seconds * 1e3, speedup, flat.error, hier.error);
      std::cerr << row << "\n";
      out << row << "\n";
      if (mib == 16 && p == WirePrecision::kFp32) headline = speedup;
    }
  }
  out << "\nhierarchical_over_flat=" << absl::StrFormat("%.2f", headline) << "\n";
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << "\n"
            << "hierarchical_over_flat=" << absl::StrFormat("%.2f", headline) << std::endl;
  return 0;
}
