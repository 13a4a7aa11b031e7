// Subprocess: starts a real binary for integration tests, reads its output with
// deadlines, signals it and reaps it. The child's stdout and stderr are merged into one
// pipe. The destructor kills (SIGKILL) and reaps a child still running, so a failing
// test never leaves processes behind. Not thread-safe.
#ifndef RLFLEET_TESTS_UTIL_SUBPROCESS_H_
#define RLFLEET_TESTS_UTIL_SUBPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rlfleet::testing {

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts argv[0] (a path) with `argv`. INTERNAL if it cannot be started.
  absl::Status Start(const std::vector<std::string>& argv);

  // Reads output until a line satisfies `match`; returns that line. DEADLINE_EXCEEDED
  // after `timeout`; FAILED_PRECONDITION (with the output so far) if the child exits.
  absl::StatusOr<std::string> WaitForLine(const std::function<bool(const std::string&)>& match, absl::Duration timeout);

  // Writes `line` and a newline to the child's stdin. FAILED_PRECONDITION if the child
  // has exited or closed its stdin.
  absl::Status WriteLine(const std::string& line);

  // Sends `signo` to the child. FAILED_PRECONDITION if it is not running.
  absl::Status Signal(int signo);

  // Waits up to `timeout` for the child to exit and returns its wait status. On timeout
  // the child is killed with SIGKILL and DEADLINE_EXCEEDED is returned.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  pid_t pid() const { return pid_; }
  // Everything the child printed so far (drained by WaitForLine / Wait).
  const std::string& output() const { return output_; }

 private:
  // Reads what is available within `timeout`; false on EOF.
  bool ReadSome(absl::Duration timeout);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int in_fd_ = -1;
  std::string output_;
  size_t consumed_ = 0;  // bytes of output_ already returned as lines
};

// Path of a binary built by Bazel, from the test's runfiles ("services/x/y").
std::string RunfilePath(const std::string& workspace_relative);

// Starts an rlfleet service binary (runfiles path) on 127.0.0.1 with port 0 and
// `flags`, waits up to `timeout` for its "... listening on HOST:PORT" line and returns
// HOST:PORT. Errors as Start / WaitForLine.
absl::StatusOr<std::string> StartService(Subprocess& process, const std::string& binary,
                                         const std::vector<std::string>& flags,
                                         absl::Duration timeout = absl::Seconds(60));

// A command run to its end: its exit status (-1 when it did not end within the
// timeout, or did not start) and everything it printed (stdout and stderr).
struct Exited {
  int code = -1;
  std::string output;
};
// Runs `argv` (argv[0] a runfiles path, "services/x/y", or an absolute path) and waits
// up to `timeout`.
Exited RunToExit(std::vector<std::string> argv, absl::Duration timeout = absl::Seconds(60));

// A TCP port on 127.0.0.1 free at the time of the call (the kernel's pick), for a
// server a test starts itself (redis-server, a fleet binary with a fixed port).
int FreeLoopbackPort();

}  // namespace rlfleet::testing

#endif  // RLFLEET_TESTS_UTIL_SUBPROCESS_H_
