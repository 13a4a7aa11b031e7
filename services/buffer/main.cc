// rlfleet-buffer: the experience buffer. Flags + wiring only.
#include <malloc.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "libs/common/clock.h"
#include "libs/common/config.h"
#include "libs/rpc/server_runner.h"
#include "services/buffer/buffer_core.h"
#include "services/buffer/buffer_service.h"

ABSL_FLAG(absl::Duration, stream_full_wait, absl::Seconds(30),
          "StreamExperiences: how long a message waits for room in a full buffer before the "
          "stream ends with RESOURCE_EXHAUSTED.");
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
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-buffer: " << options.status() << "\n";
    return 2;
  }
  auto store = rlfleet::buffer::OpenBufferStore(absl::GetFlag(FLAGS_store));
  if (!store.ok()) {
    std::cerr << "rlfleet-buffer: --store: " << store.status() << "\n";
    return 2;
  }
  rlfleet::buffer::BufferCore core(rlfleet::common::Clock::Real(), store->get());
  if (absl::Status s = core.Recover(); !s.ok()) {
    std::cerr << "rlfleet-buffer: recovering from --store: " << s << "\n";
    return 1;
  }
  rlfleet::buffer::BufferServiceImpl service(&core, rlfleet::rpc::CallAuth{options->auth.token},
                                             absl::GetFlag(FLAGS_stream_full_wait));
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  if (absl::Status s = runner.Start(); !s.ok()) {
    std::cerr << "rlfleet-buffer: " << s << "\n";
    return 1;
  }
  std::cout << "rlfleet-buffer listening on " << runner.address() << std::endl;
  const int signo = runner.WaitForTermination();
  std::cout << "rlfleet-buffer stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}
