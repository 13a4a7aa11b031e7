// The reference the UCX benchmarks measure against: ucx_perftest, server and client on
// loopback with the given UCX_TLS, in the same run as ours.
#ifndef RLFLEET_BENCH_UCX_PERFTEST_H_
#define RLFLEET_BENCH_UCX_PERFTEST_H_

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace rlfleet::bench {

// Runs `ucx_perftest -t <test> -s <size> -n <iterations>` (test: tag_bw, ucp_put_bw, ...)
// and returns its overall bandwidth in GB/s (1e9 bytes/s). INTERNAL if it cannot start.
inline absl::StatusOr<double> UcxPerftestGbps(const std::string& tls, const std::string& test, uint64_t size,
                                              uint64_t iterations) {
  static std::atomic<int> next_port{20000 + (getpid() % 20000)};
  const int port = ++next_port;  // (callers may run several at once)
  const std::string env = absl::StrCat("UCX_TLS=", tls, " UCX_NET_DEVICES=lo ");
  const std::string server = absl::StrCat(env, "ucx_perftest -p ", port, " >/dev/null 2>&1 &");
  if (std::system(server.c_str()) != 0) return absl::InternalError("cannot start the ucx_perftest server");
  absl::SleepFor(absl::Milliseconds(300));  // the server has no readiness signal to await
  const std::string client = absl::StrCat(env, "timeout 300 ucx_perftest 127.0.0.1 -p ", port, " -t ", test, " -s ",
                                          size, " -n ", iterations, " 2>&1");
  FILE* pipe = popen(client.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen ucx_perftest failed");
  char buf[4096];
  double mbps = 0;
  while (fgets(buf, sizeof(buf), pipe) != nullptr) {
    std::string line(buf);
    if (absl::StartsWith(line, "Final:")) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
      if (f.size() >= 7) (void)absl::SimpleAtod(f[6], &mbps);
    }
  }
  pclose(pipe);
  return mbps * 1048576.0 / 1e9;  // ucx_perftest's MB is 2^20 bytes
}

}  // namespace rlfleet::bench

#endif  // RLFLEET_BENCH_UCX_PERFTEST_H_
