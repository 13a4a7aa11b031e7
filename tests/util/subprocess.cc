#include "tests/util/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

extern char** environ;

namespace rlfleet::testing {

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  StopReader(absl::Seconds(1));
  if (out_fd_ >= 0) close(out_fd_);
  if (in_fd_ >= 0) close(in_fd_);
}

absl::Status Subprocess::Start(const std::vector<std::string>& argv) {
  if (pid_ > 0) return absl::FailedPreconditionError("a process is already running");
  StopReader(absl::ZeroDuration());  // (a previous child's reader)
  if (out_fd_ >= 0) close(out_fd_);
  if (in_fd_ >= 0) close(in_fd_);
  out_fd_ = in_fd_ = -1;
  // A write to a child that died must be an error, not a fatal SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  int fds[2], in[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(strerror(errno));
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError(strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  close(in[0]);
  in_fd_ = in[1];
  if (rc != 0) {
    close(fds[0]);
    close(in_fd_);
    in_fd_ = -1;
    pid_ = -1;
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", strerror(rc)));
  }
  out_fd_ = fds[0];
  {
    absl::MutexLock lock(&mu_);
    output_.clear();
    eof_ = false;
  }
  consumed_ = 0;
  stop_ = false;
  reader_ = std::thread([this] { ReadLoop(); });
  return absl::OkStatus();
}

void Subprocess::ReadLoop() {
  char buf[4096];
  while (!stop_.load()) {
    pollfd pfd{out_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 50) <= 0) continue;  // (a timeout or EINTR: look at stop_ again)
    const ssize_t got = read(out_fd_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    absl::MutexLock lock(&mu_);
    if (got <= 0) break;
    output_.append(buf, static_cast<size_t>(got));
  }
  absl::MutexLock lock(&mu_);
  eof_ = true;
}

void Subprocess::StopReader(absl::Duration grace) {
  if (!reader_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&eof_), grace);
  }
  stop_ = true;
  reader_.join();
}

std::string Subprocess::output() const {
  absl::MutexLock lock(&mu_);
  return output_;
}

absl::StatusOr<std::string> Subprocess::WaitForLine(const std::function<bool(const std::string&)>& match,
                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::string line;
    {
      absl::MutexLock lock(&mu_);
      auto complete_line_or_eof = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return eof_ || output_.find('\n', consumed_) != std::string::npos;
      };
      mu_.AwaitWithDeadline(absl::Condition(&complete_line_or_eof), deadline);
      const size_t eol = output_.find('\n', consumed_);
      if (eol == std::string::npos) {
        if (eof_) {
          return absl::FailedPreconditionError(
              absl::StrCat("process exited before printing the line; output:\n", output_));
        }
        return absl::DeadlineExceededError(absl::StrCat("no matching line; output:\n", output_));
      }
      line = output_.substr(consumed_, eol - consumed_);
      consumed_ = eol + 1;
    }
    if (match(line)) return line;  // (outside the lock: the reader goes on meanwhile)
  }
}

absl::Status Subprocess::WriteLine(const std::string& line) {
  if (in_fd_ < 0) return absl::FailedPreconditionError("stdin is closed");
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(in_fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::FailedPreconditionError(absl::StrCat("write to child: ", strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Subprocess::Signal(int signo) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process is not running");
  if (kill(pid_, signo) != 0) return absl::InternalError(strerror(errno));
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process is not running");
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      StopReader(absl::Seconds(2));  // (what it left in the pipe; a grandchild may hold it)
      return status;
    }
    if (absl::Now() >= deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      pid_ = -1;
      StopReader(absl::Seconds(2));
      return absl::DeadlineExceededError("process did not exit in time; killed");
    }
    absl::SleepFor(absl::Milliseconds(10));  // (no SIGCHLD wait without a handler)
  }
}

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return absl::StrCat(srcdir, "/", workspace ? workspace : "rlfleet", "/", workspace_relative);
}

Exited RunToExit(std::vector<std::string> argv, absl::Duration timeout) {
  if (!argv.empty() && argv[0].rfind('/', 0) != 0) argv[0] = RunfilePath(argv[0]);
  Subprocess process;
  if (!process.Start(argv).ok()) return {};
  absl::StatusOr<int> status = process.Wait(timeout);
  return {status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, process.output()};
}

absl::StatusOr<std::string> StartService(Subprocess& process, const std::string& binary,
                                         const std::vector<std::string>& flags, absl::Duration timeout) {
  constexpr char kListening[] = " listening on ";
  std::vector<std::string> argv = {RunfilePath(binary), "--host=127.0.0.1", "--port=0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  if (absl::Status s = process.Start(argv); !s.ok()) return s;
  auto line =
      process.WaitForLine([&](const std::string& l) { return l.find(kListening) != std::string::npos; }, timeout);
  if (!line.ok()) return line.status();
  std::string rest = line->substr(line->find(kListening) + strlen(kListening));
  return rest.substr(0, rest.find(' '));
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace rlfleet::testing
