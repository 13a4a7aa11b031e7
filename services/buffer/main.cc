// rlfleet-buffer: the experience buffer. Flags + wiring only.
#include <iostream>

#include "libs/common/config.h"
#include "libs/rpc/server_runner.h"
#include "services/buffer/buffer_core.h"
#include "services/buffer/buffer_service.h"

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(
      argc, argv, "rlfleet-buffer: experience buffer.\n  rlfleet-buffer --port=7002 [--auth_token_file=F]");
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-buffer: " << options.status() << "\n";
    return 2;
  }
  rlfleet::buffer::BufferCore core;
  rlfleet::buffer::BufferServiceImpl service(&core, rlfleet::rpc::CallAuth{options->auth.token});
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
