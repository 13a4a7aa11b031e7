#include "tests/util/redis_for_test.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/redis/redis_client.h"
#include "tests/util/subprocess.h"

namespace rlfleet::testing {
namespace {

ABSL_CONST_INIT absl::Mutex mu(absl::kConstInit);
int port ABSL_GUARDED_BY(mu) = 0;

bool Answers(int p) {
  auto client = redis::Client::Connect("127.0.0.1", p);
  return client.ok() && (*client)->Command({"PING"}).ok();
}

absl::StatusOr<int> StartServer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  const int p = FreeLoopbackPort();
  if (p <= 0) return absl::UnavailableError("no free loopback port for redis-server");
  // (a static: its destructor kills and reaps the server when the test process exits)
  static Subprocess server;
  // (--loglevel warning: it prints next to nothing into the pipe nobody drains)
  if (absl::Status s = server.Start({"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(p),
                                     "--save", "", "--appendonly", "no", "--loglevel", "warning"});
      !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("redis-server did not start (apt-get install redis-server): ", s.message()));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (Answers(p)) return p;
    absl::SleepFor(absl::Milliseconds(20));  // (polling a process we just started)
  }
  return absl::UnavailableError(
      absl::StrCat("redis-server on port ", p, " did not answer PING in 10 s: ", server.output()));
}

}  // namespace

absl::StatusOr<int> RedisPortForTest() {
  absl::MutexLock lock(&mu);
  if (port > 0) return port;
  if (const char* env = std::getenv("RLFLEET_REDIS_PORT"); env != nullptr && *env != '\0') {
    int p = 0;
    if (!absl::SimpleAtoi(env, &p) || p <= 0 || p > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("RLFLEET_REDIS_PORT=", env, " is not a port"));
    }
    port = p;
    return port;
  }
  absl::StatusOr<int> started = StartServer();
  if (!started.ok()) return started.status();
  port = *started;
  return port;
}

}  // namespace rlfleet::testing
