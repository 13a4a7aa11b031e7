// rlfleet-buffer: the experience buffer. Flags + wiring only.
#include <malloc.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "libs/common/clock.h"
#include "libs/common/config.h"
#include "libs/metrics/metrics.h"
#include "libs/rpc/server_runner.h"
#include "libs/service/serve.h"
#include "libs/transport/data_plane.h"
#include "services/buffer/buffer_core.h"
#include "services/buffer/buffer_metrics.h"
#include "services/buffer/buffer_service.h"

ABSL_FLAG(absl::Duration, stream_full_wait, absl::Seconds(30),
          "StreamExperiences: how long a message waits for room in a full buffer before the "
          "stream ends with RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, stream_linger, absl::Milliseconds(2),
          "StreamExperiences: how long a message may wait for the stream's next ones, to be stored "
          "with them in one commit (0: each at once); in 0..1s. The most an experience's sampling is "
          "delayed by.");
ABSL_FLAG(std::string, payload_dir, "",
          "FILE payload descriptors may name files under this directory only; empty: FILE descriptors refused.");
ABSL_FLAG(uint64_t, dedupe_ids, rlfleet::buffer::BufferCore::kDefaultRememberedRemovedIds,
          "How many consumed or dropped experience ids are still refused as duplicates (the newest; ids "
          "held always are): the window in which a producer's retry is recognised.");
ABSL_FLAG(uint64_t, keep_retired_segments, 1024,
          "Redis store: removal logs of this many retired segments (group commits) are kept, so that a "
          "restarted buffer still refuses their ids; older ones are folded into the counters.");
ABSL_FLAG(std::string, store, "memory://",
          "Where accepted experiences are kept: memory:// or redis://host:port[/prefix] "
          "(survives a restart).");

int main(int argc, char** argv) {
  // Stream messages are 0.1-4 MiB: above glibc's default mmap threshold each one is a
  // fresh mmap whose pages the kernel zeroes (a third of the ingest profile). Keep
  // them on the heap, and keep freed heap for the next message.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  rlfleet::common::ParseFlagsWithConfig(
      argc, argv, "rlfleet-buffer: experience buffer.\n  rlfleet-buffer --port=7002 [--auth_token_file=F]");
  auto options = rlfleet::service::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-buffer: " << options.status() << "\n";
    return 2;
  }
  const absl::Duration linger = absl::GetFlag(FLAGS_stream_linger);
  if (linger < absl::ZeroDuration() || linger > absl::Seconds(1)) {
    std::cerr << "rlfleet-buffer: --stream_linger=" << linger << " is outside 0..1s\n";
    return 2;
  }
  auto store = rlfleet::buffer::OpenBufferStore(absl::GetFlag(FLAGS_store), absl::GetFlag(FLAGS_keep_retired_segments));
  if (!store.ok()) {
    std::cerr << "rlfleet-buffer: --store: " << store.status() << "\n";
    return 2;
  }
  rlfleet::buffer::BufferCore core(rlfleet::common::Clock::Real(), store->get());
  core.SetRememberedRemovedIds(absl::GetFlag(FLAGS_dedupe_ids));
  // Payloads by descriptor: FILE under --payload_dir; memory over the data plane.
  auto data_plane =
      rlfleet::transport::OpenDataPlaneFromFlags(options->host, "rlfleet-buffer", "remote payloads by FILE only");
  if (!data_plane.ok()) {
    std::cerr << "rlfleet-buffer: " << data_plane.status() << "\n";
    return 2;
  }
  rlfleet::transport::DescriptorFetcher::Options fetch;
  fetch.file_root = absl::GetFlag(FLAGS_payload_dir);
  rlfleet::transport::DescriptorFetcher fetcher(data_plane->get(), fetch);
  core.SetPayloadFetcher(&fetcher);
  std::vector<std::string> skipped;  // stored records that did not load
  if (absl::Status s = core.Recover(&skipped); !s.ok()) {
    std::cerr << "rlfleet-buffer: recovering from --store: " << s << "\n";
    return 1;
  }
  for (const std::string& why : skipped) std::cerr << "rlfleet-buffer: recovery skipped " << why << "\n";
  if (!skipped.empty()) {
    std::cerr << "rlfleet-buffer: recovery skipped " << skipped.size() << " stored record(s) that did not load"
              << std::endl;
  }
  // Prometheus: the buffer's stats, read at each scrape (core outlives the runner).
  rlfleet::buffer::RegisterBufferMetrics(&core, rlfleet::metrics::Global(), skipped.size());
  rlfleet::buffer::BufferServiceImpl service(&core, rlfleet::rpc::CallAuthFrom(options->auth),
                                             absl::GetFlag(FLAGS_stream_full_wait), linger);
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  rlfleet::service::ServeSpec spec;
  spec.binary = "rlfleet-buffer";
  spec.role = rlfleet::v1::REPLICA_ROLE_BUFFER;
  return rlfleet::service::ServeUntilTerminated(runner, spec);
}
