// fetch_bw: pulling a registered buffer from another process the way the weights
// service pulls a trainer's version and a replica pulls the weights service's
// (transport::DescriptorFetcher over UCX Get, XXH64 checked), against the same pull's
// steps one by one into a fresh transport-allocated buffer and `ucx_perftest -t
// ucp_get` of the same size with the same UCX_TLS (its buffers warm).
//
//   bazel run -c opt //bench:fetch_bw -- --mib=400 [--tls=posix,cma,self]
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ucx_perftest.h"
#include "libs/common/checksum.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/ucx/ucx_transport.h"
#include "tests/util/subprocess.h"

ABSL_FLAG(std::string, role, "driver", "driver, or owner (spawned by it)");
ABSL_FLAG(int, mib, 400, "Buffer size in MiB.");
ABSL_FLAG(std::string, tls, "", "UCX_TLS for both sides and ucx_perftest; empty: UCX's choice (all).");
ABSL_FLAG(int, repeats, 3, "Pulls (the best is reported).");

namespace rlfleet::bench {
namespace {

void Die(const std::string& m) {
  std::cerr << "fetch_bw: " << m << std::endl;
  std::exit(1);
}

int Owner() {
  transport::UcxOptions o;
  o.tls = absl::GetFlag(FLAGS_tls);
  auto t = transport::UcxTransport::Create(o);
  if (!t.ok()) Die(t.status().ToString());
  const uint64_t n = static_cast<uint64_t>(absl::GetFlag(FLAGS_mib)) << 20;
  auto h = (*t)->AllocateMemory(n, transport::MemoryKind::kHost, 0);
  if (!h.ok()) Die(h.status().ToString());
  std::memset(h->base, 7, n);
  auto d = (*t)->Describe(*h);
  if (!d.ok()) Die(d.status().ToString());
  std::cout << "DESC " << absl::BytesToHexString(d->SerializeAsString()) << " "
            << common::Xxh64(absl::string_view(static_cast<const char*>(h->base), n)) << std::endl;
  std::string line;
  std::getline(std::cin, line);  // until the driver is done
  return 0;
}

int Driver(const std::string& self) {
  testing::Subprocess owner;
  std::vector<std::string> argv = {self, "--role=owner", absl::StrCat("--mib=", absl::GetFlag(FLAGS_mib)),
                                   "--tls=" + absl::GetFlag(FLAGS_tls)};
  if (!owner.Start(argv).ok()) Die("cannot start the owner");
  auto line = owner.WaitForLine([](const std::string& l) { return l.rfind("DESC ", 0) == 0; }, absl::Seconds(60));
  if (!line.ok()) Die(line.status().ToString());
  v1::TransferDescriptor d;
  std::vector<std::string> fields = absl::StrSplit(line->substr(5), ' ');
  if (fields.size() != 2 || !d.mutable_segment()->ParseFromString(absl::HexStringToBytes(fields[0]))) {
    Die("bad descriptor");
  }
  const uint64_t n = static_cast<uint64_t>(absl::GetFlag(FLAGS_mib)) << 20;
  d.set_length_bytes(n);
  uint64_t digest = 0;
  (void)absl::SimpleAtoi(fields[1], &digest);
  d.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  d.mutable_digest()->set_value(digest);
  transport::UcxOptions o;
  o.tls = absl::GetFlag(FLAGS_tls);
  auto t = transport::UcxTransport::Create(o);
  if (!t.ok()) Die(t.status().ToString());
  double best_fetch = 1e9, best_get = 1e9, best_reused = 1e9;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    // The steps a pull takes, one by one...
    absl::Time s = absl::Now();
    auto peer = (*t)->Connect(d.segment().worker_address());
    if (!peer.ok()) Die(peer.status().ToString());
    const absl::Time connected = absl::Now();
    auto local = (*t)->AllocateMemory(n, transport::MemoryKind::kHost, 0);
    if (!local.ok()) Die(local.status().ToString());
    const absl::Time allocated = absl::Now();
    absl::Status got = (*t)->Get(*peer, *local, 0, d.segment(), 0, n)->Wait(absl::Minutes(2));
    if (!got.ok()) Die(got.ToString());
    const absl::Time fetched = absl::Now();
    std::string bytes(static_cast<const char*>(local->base), n);
    const absl::Time copied = absl::Now();
    (void)(*t)->DeregisterMemory(*local);
    const absl::Time freed = absl::Now();
    best_get = std::min(best_get, absl::ToDoubleSeconds(fetched - allocated));
    std::cout << absl::StrFormat(
        "pull %d: connect %.1f ms, allocate %.1f ms, get %.1f ms (%.2f GB/s), copy out %.1f ms, deregister %.1f ms\n",
        r, absl::ToDoubleMilliseconds(connected - s), absl::ToDoubleMilliseconds(allocated - connected),
        absl::ToDoubleMilliseconds(fetched - allocated), n / absl::ToDoubleSeconds(fetched - allocated) / 1e9,
        absl::ToDoubleMilliseconds(copied - fetched), absl::ToDoubleMilliseconds(freed - copied));
    // ...and the whole DescriptorFetcher::Fetch (into the string it returns, digest checked).
    transport::DescriptorFetcher::Options fo;
    fo.max_bytes = n;
    fo.timeout = absl::Minutes(2);
    s = absl::Now();
    auto pool = std::make_shared<common::BufferPool>(1);
    auto all = transport::DescriptorFetcher(t->get(), fo).Fetch(d, absl::Now() + fo.timeout, pool);
    const double took = absl::ToDoubleSeconds(absl::Now() - s);
    if (!all.ok()) Die("Fetch: " + all.status().ToString());
    best_fetch = std::min(best_fetch, took);
    std::cout << absl::StrFormat("  DescriptorFetcher::Fetch %.1f ms (%.2f GB/s)\n", took * 1e3, n / took / 1e9);
    // ...and into the memory of the previous pull (what a replica does version after version).
    s = absl::Now();
    *all = common::HostBuffer();  // (back to the pool)
    auto again = transport::DescriptorFetcher(t->get(), fo).Fetch(d, absl::Now() + fo.timeout, pool);
    const double took_again = absl::ToDoubleSeconds(absl::Now() - s);
    if (!again.ok()) Die("Fetch: " + again.status().ToString());
    best_reused = std::min(best_reused, took_again);
    std::cout << absl::StrFormat("  DescriptorFetcher::Fetch into the previous pull's memory %.1f ms (%.2f GB/s)\n",
                                 took_again * 1e3, n / took_again / 1e9);
  }
  (void)owner.WriteLine("done");
  (void)owner.Wait(absl::Seconds(10));
  const std::string tls = absl::GetFlag(FLAGS_tls).empty() ? "all" : absl::GetFlag(FLAGS_tls);
  auto ref = UcxPerftestGbps(absl::GetFlag(FLAGS_tls).empty() ? "all" : absl::GetFlag(FLAGS_tls), "ucp_get", n, 4);
  std::cout << absl::StrFormat(
      "best get %.2f GB/s, best Fetch %.2f GB/s, best Fetch into reused memory %.2f GB/s, "
      "ucx_perftest -t ucp_get (UCX_TLS=%s) %.2f GB/s\n",
      n / best_get / 1e9, n / best_fetch / 1e9, n / best_reused / 1e9, tls, ref.ok() ? *ref : 0.0);
  return 0;
}

}  // namespace
}  // namespace rlfleet::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "owner") return rlfleet::bench::Owner();
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  return rlfleet::bench::Driver(self);
}
