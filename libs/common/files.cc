#include "libs/common/files.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

extern char** environ;

namespace rlfleet::common {
namespace fs = std::filesystem;
absl::Status ValidatePathId(absl::string_view field, absl::string_view id) {
  if (absl::Status s = ValidateId(field, id); !s.ok()) return s;
  if (id.front() == '.') {
    return absl::InvalidArgumentError(absl::StrCat(field, " starts with '.'; it becomes a file name"));
  }
  return absl::OkStatus();
}

absl::StatusOr<fs::path> ResolveUnderRoot(absl::string_view field, const fs::path& root, absl::string_view path) {
  if (root.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": this service has no root directory configured for files, so it takes no paths"));
  }
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, " contains a NUL byte"));
  }
  std::error_code ec;
  const fs::path canonical_root = fs::canonical(root, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": the configured root ", root.string(), " does not exist: ", ec.message()));
  }
  const fs::path given(std::string{path});
  const fs::path joined = given.is_absolute() ? given : canonical_root / given;
  // weakly_canonical resolves every existing prefix (symlinks included) and normalises
  // the rest lexically, so "a/../../x" and a link out of the root both land outside.
  const fs::path resolved = fs::weakly_canonical(joined, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot resolve ", given.string()));
  auto r = canonical_root.begin();
  auto p = resolved.begin();
  for (; r != canonical_root.end(); ++r, ++p) {
    if (p == resolved.end() || *p != *r) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", given.string(), " is outside the configured root ", canonical_root.string()));
    }
  }
  return resolved;
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), name_(std::move(other.name_)) {
  other.fd_ = -1;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status RegularFile::ReadAt(absl::string_view field, uint64_t offset, char* dst, uint64_t length) const {
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd_, dst + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(
          absl::StrCat(field, ": short read of ", name_, " at byte ", done, " of the ", length, " asked for"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<RegularFile> OpenRegularFile(absl::string_view field, const fs::path& path, uint64_t max_bytes,
                                            bool no_follow) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (no_follow ? O_NOFOLLOW : 0));
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(field, ": cannot open ", path.string(), ": ", std::strerror(errno)));
  }
  RegularFile file(fd, 0, path.string());
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path.string(), " is not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path.string(), " is ", size, " bytes; the limit is ", max_bytes));
  }
  file.size_ = size;
  return file;
}

absl::StatusOr<uint64_t> RegularFileSize(absl::string_view field, const fs::path& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(field, path, max_bytes));
  return file.size();
}

absl::StatusOr<std::string> ReadRegularFile(absl::string_view field, const fs::path& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(field, path, max_bytes));
  std::string bytes(file.size(), '\0');
  RETURN_IF_ERROR(file.ReadAt(field, 0, bytes.data(), bytes.size()));
  return bytes;
}

bool ProgramInPath(absl::string_view program) {
  if (program.find('/') != absl::string_view::npos) return ::access(std::string(program).c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    if (::access(absl::StrCat(dir, "/", program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

absl::Status RunProgram(const std::vector<std::string>& argv, absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("RunProgram: no program");
  if (!ProgramInPath(argv[0])) return absl::NotFoundError(absl::StrCat(argv[0], " is not in PATH"));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd = 0; fd <= 2; ++fd) {
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));

  // Wait with a deadline: poll waitpid(WNOHANG) with a short backoff (no SIGCHLD
  // handler, which would be process-wide).
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  int wstatus = 0;
  while (true) {
    const pid_t got = ::waitpid(pid, &wstatus, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    if (absl::Now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wstatus, 0);
      return absl::DeadlineExceededError(absl::StrCat(argv[0], " ran past ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return absl::OkStatus();
  if (WIFSIGNALED(wstatus)) {
    return absl::InternalError(absl::StrCat(argv[0], " was killed by signal ", WTERMSIG(wstatus)));
  }
  return absl::InternalError(absl::StrCat(argv[0], " exited with code ", WEXITSTATUS(wstatus)));
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::common
