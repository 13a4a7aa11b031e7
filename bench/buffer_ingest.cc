// buffer_ingest: durable ingest into the experience buffer (issue 5's benchmark).
//
// Starts its own redis-server (AOF on, random loopback port); each round starts a fresh
// buffer binary with --store=redis://... on an emptied Redis and streams experiences
// (StreamExperiences, --batch per message, --producers concurrent streams, the
// messages serialized up front as redis-benchmark formats its command once): every
// experience is acknowledged only after Redis took it. Small (1 KiB) experiences over
// --rounds rounds, large (1 MiB) once. References in the same run: `redis-benchmark -t
// set -P 16` with the same value size against the same redis-server, to one key just
// before and after each round (the best of the two) and to distinct keys (every value
// kept, as the buffer's store keeps every experience) just after it, and memcpy for the
// large ones. Writes a table to --out; last lines: buffer_ingest_ratio_vs_redis_set=<median
// over the rounds of 1 KiB experiences/s over one-key SETs/s> and
// buffer_ingest_ratio_vs_redis_set_distinct=<the same over distinct-key SETs/s>.
//
//   bazel run -c opt //bench:buffer_ingest -- --out=$PWD/bench/results/buffer_ingest.md
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/sync_stream.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "tests/util/subprocess.h"

ABSL_FLAG(int, producers, 4, "Concurrent producer streams.");
ABSL_FLAG(int, batch, 256, "Experiences per stream message (small experiences).");
ABSL_FLAG(int, small_count, 100000, "1 KiB experiences in total.");
ABSL_FLAG(int, large_count, 128, "1 MiB experiences in total.");
ABSL_FLAG(int, rounds, 5, "Rounds of the 1 KiB ingest and its reference; the ratio printed is their median.");
ABSL_FLAG(std::string, out, "buffer_ingest.md", "Where the table is written.");

namespace rlfleet::bench {
namespace {

using testing::Subprocess;

void Die(const std::string& m) {
  std::cerr << "buffer_ingest: " << m << std::endl;
  std::exit(1);
}

int FreePort() { return 20000 + static_cast<int>((getpid() * 7919 + absl::ToUnixNanos(absl::Now())) % 30000); }

std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) Die("popen " + cmd);
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  pclose(p);
  return out;
}

// An experience of about `bytes` bytes on the wire: token ids of a 32k+ vocabulary
// (3-byte varints), as a real policy's responses have.
v1::Experience Exp(const std::string& id, size_t bytes) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  e.set_group_id(id);
  e.set_reward(1.0f);
  for (size_t i = 0; i < bytes / 3; ++i) e.add_response_token_ids(static_cast<int32_t>(16384 + (i * 7919) % 50000));
  return e;
}

struct Result {
  double seconds = 0;
  uint64_t accepted = 0;
};

// `count` experiences of `bytes` each over `producers` streams, `batch` per message.
Result Ingest(const std::string& address, int count, size_t bytes, int batch, int producers, const std::string& tag) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  // Messages built and serialized up front, as redis-benchmark formats its command
  // once: the run measures the buffer's durable ingest, not the producers' protobuf
  // encoding (a real producer does that on its own cores). The bytes are exactly a
  // PutExperiencesRequest's.
  std::vector<std::vector<grpc::ByteBuffer>> messages(producers);
  for (int p = 0; p < producers; ++p) {
    const int mine = count / producers;
    for (int i = 0; i < mine; i += batch) {
      v1::PutExperiencesRequest m;
      for (int j = i; j < std::min(mine, i + batch); ++j) {
        *m.add_experiences() = Exp(absl::StrCat(tag, "-", p, "-", j), bytes);
      }
      grpc::ByteBuffer serialized;
      bool own = false;
      if (!grpc::SerializationTraits<v1::PutExperiencesRequest>::Serialize(m, &serialized, &own).ok()) {
        Die("cannot serialize a message");
      }
      messages[p].push_back(std::move(serialized));
    }
  }
  std::cerr << "  streaming " << count / producers * producers << " experiences..." << std::endl;
  std::vector<uint64_t> accepted(producers, 0);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
      // BufferService.StreamExperiences with the messages' bytes as they are.
      const grpc::internal::RpcMethod method("/rlfleet.v1.BufferService/StreamExperiences",
                                             grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
      grpc::ByteBuffer reply;
      std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
          grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &context, &reply));
      for (const auto& m : messages[p]) {
        if (!writer->Write(m)) break;
      }
      writer->WritesDone();
      grpc::Status s = writer->Finish();
      if (!s.ok()) Die("stream: " + s.error_message());
      v1::PutExperiencesResponse total;
      if (!grpc::SerializationTraits<v1::PutExperiencesResponse>::Deserialize(&reply, &total).ok()) {
        Die("the stream's reply does not parse");
      }
      accepted[p] = total.accepted();
    });
  }
  for (auto& t : threads) t.join();
  Result r;
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (uint64_t a : accepted) r.accepted += a;
  return r;
}

// `redis-benchmark -t set -P 16` against the server on `port`: SETs of `bytes` to one key
// over and over, or (`distinct`) to random keys out of 10^9, so that the server stores
// every value as the buffer's store does (then the keys are flushed again).
double RedisSetPerSecond(int port, size_t bytes, int n, bool distinct = false) {
  const std::string out = Run(absl::StrCat("redis-benchmark -h 127.0.0.1 -p ", port, " -t set -P 16 -d ", bytes, " -n ",
                                           n, distinct ? " -r 1000000000" : "", " -q 2>/dev/null"));
  if (distinct) Run(absl::StrCat("redis-cli -p ", port, " flushall >/dev/null 2>&1"));
  // "SET: 123456.79 requests per second, p50=..."; the last report wins.
  double rps = 0;
  for (absl::string_view line : absl::StrSplit(out, absl::ByAnyChar("\r\n"))) {
    auto pos = line.find("SET: ");
    if (pos == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(pos + 5);
    rest = rest.substr(0, rest.find(' '));
    (void)absl::SimpleAtod(rest, &rps);
  }
  return rps;
}

double MemcpyGbps() {
  const size_t n = 256 << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const absl::Time t = absl::Now();
    std::memcpy(b.data(), a.data(), n);
    best = std::max(best, n / absl::ToDoubleSeconds(absl::Now() - t) / 1e9);
  }
  return best + (b[n / 2] == 7 ? 1e-12 : 0);  // keep the copy
}

int Main(const std::string& self) {
  const int port = FreePort();
  char dir[] = "/tmp/buffer_ingest_XXXXXX";
  if (mkdtemp(dir) == nullptr) Die("mkdtemp");
  Subprocess redis;
  if (!redis
           .Start({"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", absl::StrCat(port), "--dir", dir, "--save",
                   "", "--appendonly", "yes", "--appendfsync", "everysec", "--loglevel", "warning"})
           .ok()) {
    Die("cannot start redis-server");
  }
  for (int i = 0;
       i < 100 && Run(absl::StrCat("redis-cli -p ", port, " ping 2>/dev/null")).find("PONG") == std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  // The buffer binary sits next to this one in bazel-bin.
  const std::string buffer_bin = self.substr(0, self.rfind("/bench/")) + "/services/buffer/rlfleet-buffer";
  // A fresh buffer (and an empty Redis) per round, so that every round measures the
  // same thing.
  auto start_buffer = [&](Subprocess& buffer, int round) {
    Run(absl::StrCat("redis-cli -p ", port, " flushall >/dev/null 2>&1"));
    auto address = testing::StartService(
        buffer, buffer_bin,
        {absl::StrCat("--store=redis://127.0.0.1:", port, "/bench", round, ":"), "--max_message_bytes=67108864"});
    if (!address.ok()) Die("buffer: " + address.status().ToString());
    auto stub = v1::BufferService::NewStub(grpc::CreateChannel(*address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext c;
    v1::ConfigureRequest config;
    config.set_group_size(1);
    config.set_capacity_bytes(uint64_t{8} << 30);
    v1::ConfigureResponse r;
    if (grpc::Status s = stub->Configure(&c, config, &r); !s.ok()) Die("Configure: " + s.error_message());
    return *address;
  };
  auto stop_buffer = [](Subprocess& buffer) {
    (void)buffer.Signal(SIGTERM);
    (void)buffer.Wait(absl::Seconds(30));
  };
  const int producers = absl::GetFlag(FLAGS_producers);
  const int small = absl::GetFlag(FLAGS_small_count), large = absl::GetFlag(FLAGS_large_count);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  struct Round {
    Result ingest;
    double set_per_second = 0;  // the reference: best of before and after
    double ratio = 0;
    double distinct_per_second = 0;  // the like-for-like reference: SETs that are all kept
    double distinct_ratio = 0;
  };
  std::vector<Round> small_rounds;
  for (int round = 0; round < rounds; ++round) {
    Subprocess buffer;
    const std::string address = start_buffer(buffer, round);
    Round r;
    // The reference before and after ours (an emptier server is faster); the larger counts.
    const double before = RedisSetPerSecond(port, 1024, 200000);
    std::cerr << "round " << round + 1 << "/" << rounds << ": ingesting " << small << " x 1 KiB over " << producers
              << " streams..." << std::endl;
    r.ingest = Ingest(address, small, 1024, absl::GetFlag(FLAGS_batch), producers, absl::StrCat("s", round));
    r.set_per_second = std::max(before, RedisSetPerSecond(port, 1024, 200000));
    stop_buffer(buffer);
    // Distinct keys on the emptied server, which (like ours from round 2 on) has just
    // freed a round's worth of values.
    Run(absl::StrCat("redis-cli -p ", port, " flushall >/dev/null 2>&1"));
    r.distinct_per_second = RedisSetPerSecond(port, 1024, small, /*distinct=*/true);
    r.ratio = r.set_per_second > 0 ? r.ingest.accepted / r.ingest.seconds / r.set_per_second : 0;
    r.distinct_ratio = r.distinct_per_second > 0 ? r.ingest.accepted / r.ingest.seconds / r.distinct_per_second : 0;
    std::cerr << absl::StrFormat(
                     "  %.0f experiences/s; SET -P 16 one key %.0f/s (ratio %.3f), distinct keys %.0f/s (ratio %.3f)",
                     r.ingest.accepted / r.ingest.seconds, r.set_per_second, r.ratio, r.distinct_per_second,
                     r.distinct_ratio)
              << std::endl;
    small_rounds.push_back(r);
  }
  Subprocess buffer;
  const std::string address = start_buffer(buffer, rounds);
  std::cerr << "ingesting " << large << " x 1 MiB..." << std::endl;
  Result s2 = Ingest(address, large, 1 << 20, 8, producers, "l");
  stop_buffer(buffer);
  std::cerr << "redis-benchmark..." << std::endl;
  const double set_large = RedisSetPerSecond(port, 1 << 20, 200);
  const double memcpy_gbps = MemcpyGbps();
  (void)redis.Signal(SIGTERM);
  (void)redis.Wait(absl::Seconds(30));
  Run(absl::StrCat("rm -rf ", dir));

  auto median_of = [&](double Round::*field) {
    std::vector<double> v;
    for (const Round& r : small_rounds) v.push_back(r.*field);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double ratio = median_of(&Round::ratio);
  const double distinct_ratio = median_of(&Round::distinct_ratio);
  const double large_mbps = s2.accepted * 1.048576 / s2.seconds;
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# buffer_ingest: durable StreamExperiences into the buffer (Redis store, AOF everysec)\n\n"
      << "CPU: " << CpuModel() << "\n\n"
      << producers << " producer streams; 1 KiB experiences " << absl::GetFlag(FLAGS_batch)
      << " per message, 1 MiB experiences 8 per message (token ids of a 32k+ vocabulary: 3-byte varints); "
         "each acknowledged after Redis took it, and held in the buffer's memory. A fresh buffer and an empty "
         "Redis every round. Two references: `redis-benchmark -t set -P 16 -d 1024` to one key over and over "
         "(-n 200000, the best of just before and just after the round), and the same with `-r 1000000000` "
         "(distinct keys, each value kept, as the buffer's store keeps every experience: the server grows by the "
         "same bytes) on the server emptied just after the round, as many SETs as experiences. Where fresh "
         "memory is expensive (a VM paying ~10 us a page) only the second does the same work as the buffer.\n\n"
      << "| round | experiences | accepted | seconds | experiences/s | MB/s | SET one key /s | ratio | SET distinct "
         "keys /s | ratio |\n"
         "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < small_rounds.size(); ++i) {
    const Round& r = small_rounds[i];
    const double eps = r.ingest.accepted / r.ingest.seconds;
    out << absl::StrFormat("| %d | 1 KiB | %d | %.2f | %.0f | %.1f | %.0f | %.3f | %.0f | %.3f |\n", i + 1,
                           r.ingest.accepted, r.ingest.seconds, eps, eps * 1024 / 1e6, r.set_per_second, r.ratio,
                           r.distinct_per_second, r.distinct_ratio);
  }
  out << absl::StrFormat(
             "\n| experiences | accepted | seconds | experiences/s | MB/s | reference "
             "|\n|---|---:|---:|---:|---:|---|\n"
             "| 1 MiB | %d | %.2f | %.1f | %.1f | SET -P 16 -d 1048576: %.1f/s (%.1f MB/s); memcpy %.1f GB/s |\n",
             s2.accepted, s2.seconds, s2.accepted / s2.seconds, large_mbps, set_large, set_large * 1.048576,
             memcpy_gbps)
      << absl::StrFormat("\nbuffer_ingest_ratio_vs_redis_set=%.3f (one key; median of %d rounds)\n", ratio, rounds)
      << absl::StrFormat("buffer_ingest_ratio_vs_redis_set_distinct=%.3f (median of %d rounds)\n", distinct_ratio,
                         rounds);
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << "\n";
  for (const Round& r : small_rounds) {
    if (r.ingest.accepted != static_cast<uint64_t>(small / producers * producers)) {
      std::cout << "NOT ALL ACCEPTED: " << r.ingest.accepted << "\n";
      return 1;
    }
  }
  if (s2.accepted != static_cast<uint64_t>(large / producers * producers)) {
    std::cout << "NOT ALL ACCEPTED: " << s2.accepted << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("buffer_ingest_ratio_vs_redis_set=%.3f", ratio) << std::endl;
  std::cout << absl::StrFormat("buffer_ingest_ratio_vs_redis_set_distinct=%.3f", distinct_ratio) << std::endl;
  return 0;
}
}  // namespace
}  // namespace rlfleet::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  return rlfleet::bench::Main(self);
}
