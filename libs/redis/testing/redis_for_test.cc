#include "libs/redis/testing/redis_for_test.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/redis/redis_client.h"

namespace rlfleet::redis::testing {
namespace {

// A free loopback port (bound, read, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

pid_t server_pid = 0;  // (set under port_mu; read at exit)

void StopServer() {
  if (server_pid > 0) {
    kill(server_pid, SIGTERM);
    waitpid(server_pid, nullptr, 0);
    server_pid = 0;
  }
}

bool Answers(int port) {
  auto client = Client::Connect("127.0.0.1", port);
  if (!client.ok()) return false;
  auto pong = (*client)->Command({"PING"});
  return pong.ok();
}

absl::StatusOr<int> StartServer() {
  const int port = FreePort();
  if (port <= 0) return absl::UnavailableError("no free loopback port for redis-server");
  const std::string port_arg = std::to_string(port);
  // (built before fork: the child only execs)
  std::vector<const char*> argv = {"redis-server", "--bind", "127.0.0.1", "--port", port_arg.c_str(),
                                   "--save", "", "--appendonly", "no", "--daemonize", "no",
                                   "--loglevel", "warning", nullptr};
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError("fork failed");
  if (pid == 0) {
    execvp("redis-server", const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  server_pid = pid;
  std::atexit(StopServer);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (Answers(port)) return port;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      server_pid = 0;
      return absl::UnavailableError(absl::StrCat("redis-server exited (status ", status,
                                                 "); is it installed? (apt-get install redis-server)"));
    }
    absl::SleepFor(absl::Milliseconds(20));  // (polling a process we just started)
  }
  return absl::UnavailableError(absl::StrCat("redis-server on port ", port, " did not answer PING in 10 s"));
}

}  // namespace

namespace {
ABSL_CONST_INIT absl::Mutex port_mu(absl::kConstInit);
int port ABSL_GUARDED_BY(port_mu) = 0;
}  // namespace

absl::StatusOr<int> RedisPortForTest() {
  absl::MutexLock lock(&port_mu);
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

}  // namespace rlfleet::redis::testing
