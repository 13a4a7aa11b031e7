// transport_bw: bandwidth of libs/transport's UCX backend against ucx_perftest, in the
// same run, with the same UCX_TLS.
//
// For each transport (tcp; shared memory = posix,cma,self), primitive (send = tagged
// send/recv, reference `ucx_perftest -t tag_bw`; put = RMA put with remote completion,
// reference `ucx_perftest -t ucp_put_bw`) and size (64 KiB .. 256 MiB), it runs the
// transfer between two processes (this binary spawns itself as the server), runs the
// reference, keeps the best of --repeats runs of each (these machines are noisy), and
// writes a Markdown table to --out. Its last line is
//   transport_ratio_vs_ucx_perftest=<min over transports, primitives, sizes >= 1 MiB>
//
//   bazel run //bench:transport_bw -- --out=$PWD/bench/results/transport_bw.md
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ucx_perftest.h"
#include "libs/transport/ucx/ucx_transport.h"
#include "tests/util/subprocess.h"

ABSL_FLAG(std::string, role, "client", "client (runs everything) or server (spawned by it).");
ABSL_FLAG(std::string, tls, "tcp", "server role: UCX_TLS.");
ABSL_FLAG(std::string, out, "transport_bw.md", "Where the results table is written.");
ABSL_FLAG(int, repeats, 3, "Runs of each measurement; the best is kept.");
ABSL_FLAG(std::string, transports, "tcp,posix+cma", "Transports to measure (tcp, posix+cma).");
ABSL_FLAG(std::string, primitives, "send,put", "Primitives to measure (send, put).");
ABSL_FLAG(int64_t, max_size, 256 << 20, "Largest message in bytes.");
ABSL_FLAG(int64_t, bytes_per_point, int64_t{1} << 30, "Bytes moved per measurement.");

namespace rlfleet::bench {
namespace {

using transport::Completion;
using transport::MemoryHandle;
using transport::PeerId;
using transport::UcxOptions;
using transport::UcxTransport;

constexpr uint64_t kBufferBytes = 256ull << 20;
constexpr int kWindow = 16;
// Sends in flight: kWindow, but at most ~64 MiB (at least 2): a window of 16 huge
// messages only queues memory (ucx_perftest keeps one in flight).
size_t SendWindow(uint64_t size) {
  return static_cast<size_t>(std::clamp<uint64_t>((uint64_t{64} << 20) / size, 2, kWindow));
}
constexpr absl::Duration kTimeout = absl::Seconds(120);

void Die(const std::string& message) {
  std::cerr << "transport_bw: " << message << std::endl;
  std::exit(1);
}

// ---- server: receives what the client sends; its buffer is the put target ----
int Server() {
  UcxOptions options;
  options.tls = absl::GetFlag(FLAGS_tls);
  auto t = UcxTransport::Create(options);
  if (!t.ok()) Die(t.status().ToString());
  // Transport-allocated memory: on shared-memory transports peers map it directly.
  auto allocated = (*t)->AllocateMemory(kBufferBytes, transport::MemoryKind::kHost, 0);
  if (!allocated.ok()) Die(allocated.status().ToString());
  MemoryHandle h = *allocated;
  std::memset(h.base, 1, kBufferBytes);
  auto desc = (*t)->Describe(h);
  std::cout << "ADDR " << absl::BytesToHexString((*t)->LocalAddress()) << "\n"
            << "DESC " << absl::BytesToHexString(desc->SerializeAsString()) << std::endl;
  std::string line;
  PeerId client = 0;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> a = absl::StrSplit(line, ' ');
    if (a[0] == "CONNECT") {
      auto id = (*t)->Connect(absl::HexStringToBytes(a[1]));
      if (!id.ok()) Die(id.status().ToString());
      client = *id;
      std::cout << "OK" << std::endl;
    } else if (a[0] == "RECV") {
      uint64_t size = 0, count = 0;
      (void)absl::SimpleAtoi(a[1], &size);
      (void)absl::SimpleAtoi(a[2], &count);
      std::deque<std::unique_ptr<Completion>> pending;
      uint64_t posted = 0;
      absl::Status status;
      while (posted < count || !pending.empty()) {
        while (posted < count && pending.size() < kWindow) {
          pending.push_back((*t)->Recv(client, 5, h, 0, size));
          ++posted;
        }
        status.Update(pending.front()->Wait(kTimeout));
        pending.pop_front();
      }
      std::cout << (status.ok() ? "OK" : "ERR " + status.ToString()) << std::endl;
    }
  }
  return 0;
}

// ---- client ----
struct Point {
  std::string transport;
  std::string primitive;
  uint64_t size;
  double ours_gbps = 0;
  double ref_gbps = 0;
};

std::string TlsFor(const std::string& transport) { return transport == "tcp" ? "tcp" : "posix,cma,self"; }

class ServerProcess {
 public:
  explicit ServerProcess(const std::string& self, const std::string& tls) {
    if (!process_.Start({self, "--role=server", "--tls=" + tls}).ok()) Die("cannot start server");
    address_ = absl::HexStringToBytes(Field("ADDR "));
    if (!descriptor_.ParseFromString(absl::HexStringToBytes(Field("DESC ")))) Die("bad descriptor");
  }
  std::string Field(const std::string& prefix) {
    auto line =
        process_.WaitForLine([&](const std::string& l) { return absl::StartsWith(l, prefix); }, absl::Seconds(60));
    if (!line.ok()) Die(line.status().ToString());
    return line->substr(prefix.size());
  }
  void Command(const std::string& command) {
    if (!process_.WriteLine(command).ok()) Die("server died");
    auto line =
        process_.WaitForLine([](const std::string& l) { return l == "OK" || absl::StartsWith(l, "ERR"); }, kTimeout);
    if (!line.ok() || *line != "OK") Die(absl::StrCat("server: ", line.ok() ? *line : line.status().ToString()));
  }
  void Send(const std::string& command) {
    if (!process_.WriteLine(command).ok()) Die("server died");
  }
  std::string address_;
  v1::RemoteMemoryDescriptor descriptor_;
  testing::Subprocess process_;
};

uint64_t Iterations(uint64_t size) {
  const uint64_t n = static_cast<uint64_t>(absl::GetFlag(FLAGS_bytes_per_point)) / size;
  return std::max<uint64_t>(n, 4);
}

double MeasureOurs(UcxTransport& t, ServerProcess& server, PeerId peer, const MemoryHandle& h,
                   const std::string& primitive, uint64_t size) {
  const uint64_t iters = Iterations(size);
  std::deque<std::unique_ptr<Completion>> pending;
  absl::Status status;
  absl::Time start;
  if (primitive == "send") {
    server.Send(absl::StrCat("RECV ", size, " ", iters));
    start = absl::Now();
    for (uint64_t i = 0; i < iters; ++i) {
      if (pending.size() == SendWindow(size)) {
        status.Update(pending.front()->Wait(kTimeout));
        pending.pop_front();
      }
      pending.push_back(t.Send(peer, 5, h, 0, size));
    }
  } else {
    // Puts in batches of kWindow with one remote completion each (PutBatch), two
    // batches in flight: how the weight path moves chunks.
    start = absl::Now();
    for (uint64_t i = 0; i < iters; i += kWindow) {
      if (pending.size() == 2) {
        status.Update(pending.front()->Wait(kTimeout));
        pending.pop_front();
      }
      std::vector<transport::Transport::PutOp> ops;
      for (uint64_t j = i; j < std::min<uint64_t>(iters, i + kWindow); ++j) {
        ops.push_back({h, 0, &server.descriptor_, 0, size});
      }
      pending.push_back(t.PutBatch(peer, ops));
    }
  }
  while (!pending.empty()) {
    status.Update(pending.front()->Wait(kTimeout));
    pending.pop_front();
  }
  if (primitive == "send") {
    auto line = server.process_.WaitForLine(
        [](const std::string& l) { return l == "OK" || absl::StartsWith(l, "ERR"); }, kTimeout);
    if (!line.ok() || *line != "OK") Die("server receive failed");
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok()) Die(status.ToString());
  return static_cast<double>(size) * iters / seconds / 1e9;
}

// ucx_perftest with the same transports: tag_bw for send, ucp_put_bw for put.
double MeasureReference(const std::string& tls, const std::string& primitive, uint64_t size) {
  absl::StatusOr<double> gbps =
      UcxPerftestGbps(tls, primitive == "send" ? "tag_bw" : "ucp_put_bw", size, Iterations(size));
  if (!gbps.ok()) Die(gbps.status().ToString());
  return *gbps;
}

int Client(const std::string& self) {
  std::vector<Point> points;
  const int repeats = absl::GetFlag(FLAGS_repeats);
  for (absl::string_view transport : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',')) {
    const std::string tls = TlsFor(std::string(transport));
    UcxOptions options;
    options.tls = tls;
    auto t = UcxTransport::Create(options);
    if (!t.ok()) Die(t.status().ToString());
    std::cerr << "== " << transport << ": " << (*t)->GetCapabilities().detail << std::endl;
    ServerProcess server(self, tls);
    auto peer = (*t)->Connect(server.address_);
    if (!peer.ok()) Die(peer.status().ToString());
    server.Command("CONNECT " + absl::BytesToHexString((*t)->LocalAddress()));
    auto allocated = (*t)->AllocateMemory(kBufferBytes, transport::MemoryKind::kHost, 0);
    if (!allocated.ok()) Die(allocated.status().ToString());
    MemoryHandle h = *allocated;
    std::memset(h.base, 2, kBufferBytes);
    for (absl::string_view primitive : absl::StrSplit(absl::GetFlag(FLAGS_primitives), ',')) {
      for (uint64_t size = 64 << 10; size <= static_cast<uint64_t>(absl::GetFlag(FLAGS_max_size)); size *= 4) {
        Point p{std::string(transport), std::string(primitive), size};
        for (int r = 0; r < repeats; ++r) {
          p.ours_gbps = std::max(p.ours_gbps, MeasureOurs(**t, server, *peer, h, p.primitive, size));
          p.ref_gbps = std::max(p.ref_gbps, MeasureReference(tls, p.primitive, size));
        }
        std::cerr << absl::StrFormat("%-8s %-5s %9d B  ours %6.3f GB/s  ucx_perftest %6.3f GB/s  ratio %.3f\n",
                                     p.transport, p.primitive, size, p.ours_gbps, p.ref_gbps,
                                     p.ref_gbps > 0 ? p.ours_gbps / p.ref_gbps : 0);
        points.push_back(p);
      }
    }
  }
  double min_ratio = 1e9;
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# transport_bw: libs/transport (UCX backend) vs ucx_perftest\n\n"
      << "Best of " << repeats << " runs each; GB/s = 1e9 bytes/s; sends in flight " << kWindow
      << " up to 64 MiB in flight (at least 2)"
      << "; send = tag send/recv (reference tag_bw), put = RMA puts in batches of the window "
         "size, each batch remotely complete (PutBatch: puts + one flush; reference "
         "ucp_put_bw).\n\n"
      << "| transport | primitive | size (bytes) | ours (GB/s) | ucx_perftest (GB/s) | ratio |\n"
      << "|---|---|---:|---:|---:|---:|\n";
  for (const Point& p : points) {
    const double ratio = p.ref_gbps > 0 ? p.ours_gbps / p.ref_gbps : 0;
    out << absl::StrFormat("| %s | %s | %d | %.3f | %.3f | %.3f |\n", p.transport, p.primitive, p.size, p.ours_gbps,
                           p.ref_gbps, ratio);
    if (p.size >= (1u << 20)) min_ratio = std::min(min_ratio, ratio);
  }
  out << "\ntransport_ratio_vs_ucx_perftest=" << absl::StrFormat("%.3f", min_ratio)
      << " (min over transports, primitives and sizes >= 1 MiB)\n";
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << "\n";
  std::cout << "transport_ratio_vs_ucx_perftest=" << absl::StrFormat("%.3f", min_ratio) << std::endl;
  return 0;
}

}  // namespace
}  // namespace rlfleet::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "server") return rlfleet::bench::Server();
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  return rlfleet::bench::Client(self);
}
