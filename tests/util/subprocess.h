// Subprocess: starts a real binary for integration tests, reads its output with
// deadlines, signals it and reaps it. The child's stdout and stderr are merged into one
// pipe, which a reader thread drains from the start: a chatty child never blocks on a
// full pipe however long the test leaves it unread (the fleet's weights service, left
// unread through a long multihost run, stalled in a write to stderr with every call in
// flight). The destructor kills (SIGKILL) and reaps a child still running, so a failing
// test never leaves processes behind. One test thread drives an instance.
#ifndef RLFLEET_TESTS_UTIL_SUBPROCESS_H_
#define RLFLEET_TESTS_UTIL_SUBPROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  // Everything the child printed so far.
  std::string output() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The reader thread: appends what the pipe carries to output_ until EOF or stop_.
  void ReadLoop();
  // Stops the reader (after up to `grace` for EOF: what the child left in the pipe).
  void StopReader(absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int in_fd_ = -1;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  size_t consumed_ = 0;  // bytes of output_ already returned as lines (the test thread's)
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
