// ServeUntilTerminated: the hooks run in order around serving, the listening line
// names the address, a shutdown ends it with 0; a server that cannot start is 1.
#include "libs/service/serve.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/rpc/tests/echo_service.h"

namespace rlfleet::service {
namespace {

TEST(Serve, HooksRunAroundServingAndAShutdownEndsItWithZero) {
  rpc::ServerOptions options;
  options.port = 0;
  rpc::ServerRunner runner(options);
  rpc::testing::EchoServiceImpl echo{rpc::CallAuth()};
  runner.AddService(&echo);
  std::vector<std::string> events;
  absl::Notification started;
  ServeSpec spec;
  spec.binary = "rlfleet-test";
  spec.started = [&](rpc::ServerRunner& r) {
    events.push_back(r.port() > 0 ? "started with a port" : "started without a port");
    started.Notify();
  };
  spec.note = [] { return std::string(" (policy version 7)"); };
  spec.stopping = [&] { events.push_back("stopping"); };
  ::testing::internal::CaptureStdout();
  int code = -1;
  std::thread serving([&] { code = ServeUntilTerminated(runner, spec); });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  runner.Shutdown();  // (as a signal would: WaitForTermination returns)
  serving.join();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "started with a port");
  EXPECT_EQ(events[1], "stopping");
  EXPECT_TRUE(absl::StrContains(out, "rlfleet-test listening on " + runner.address() + " (policy version 7)")) << out;
  EXPECT_TRUE(absl::StrContains(out, "rlfleet-test stopped\n")) << out;
}

TEST(Serve, AServerThatCannotStartIsExitCodeOneAndNoHookRuns) {
  rpc::ServerOptions options;
  options.host = "256.0.0.1";  // (not an address)
  rpc::ServerRunner runner(options);
  bool ran = false;
  ServeSpec spec;
  spec.binary = "rlfleet-test";
  spec.started = [&](rpc::ServerRunner&) { ran = true; };
  spec.stopping = [&] { ran = true; };
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ServeUntilTerminated(runner, spec), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(ran);
  EXPECT_TRUE(absl::StrContains(err, "rlfleet-test: ")) << err;
}

}  // namespace
}  // namespace rlfleet::service
