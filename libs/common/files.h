// Files named by a peer: confined under a configured root, regular files only, sizes
// checked before anything is allocated. And child processes started without a shell.
//
// Every service that reads or writes a path that came over the network goes through
// these (STYLE.md, "Input from the network"): a path resolves under its root (symlinks
// resolved, so a link cannot lead out), it is a regular file (not a directory, FIFO or
// device: /dev/zero or a FIFO would exhaust or block the reader), and its size is read
// from the open descriptor before a byte is read.
#ifndef RLFLEET_LIBS_COMMON_FILES_H_
#define RLFLEET_LIBS_COMMON_FILES_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlfleet::common {

// OK if `id` is a valid id (ValidateId) that is also safe as one path component: it
// does not start with '.', so "." and ".." and hidden names are refused. INVALID_ARGUMENT
// naming `field` otherwise.
absl::Status ValidatePathId(absl::string_view field, absl::string_view id);

// Resolves `path` (absolute, or relative to `root`) and returns its canonical form if
// it lies inside `root` (which must exist). Symlinks are resolved before the check;
// components that do not exist yet are allowed (for a file about to be written).
// INVALID_ARGUMENT naming `field` when the root is empty (the service was started
// without one: the feature is off) or the path leads outside it; the message never
// echoes file contents.
absl::StatusOr<std::filesystem::path> ResolveUnderRoot(absl::string_view field, const std::filesystem::path& root,
                                                       absl::string_view path);

// A regular file open for reading: its descriptor (closed with the object) and the size
// fstat gave for it. Move-only.
class RegularFile;
absl::StatusOr<RegularFile> OpenRegularFile(absl::string_view field, const std::filesystem::path& path,
                                            uint64_t max_bytes, bool no_follow);

class RegularFile {
 public:
  RegularFile(int fd, uint64_t size, std::string name) : fd_(fd), size_(size), name_(std::move(name)) {}
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  ~RegularFile();
  uint64_t size() const { return size_; }
  // Reads exactly `length` bytes at `offset` into `dst`. DATA_LOSS naming `field` if
  // the file ends (or fails) first.
  absl::Status ReadAt(absl::string_view field, uint64_t offset, char* dst, uint64_t length) const;

 private:
  friend absl::StatusOr<RegularFile> OpenRegularFile(absl::string_view, const std::filesystem::path&, uint64_t, bool);
  int fd_;
  uint64_t size_;
  std::string name_;  // the path, for messages
};

// Opens `path` as ReadRegularFile does: O_NONBLOCK (opening a FIFO does not block),
// fstat'ed, refused unless regular and at most `max_bytes`. With `no_follow`, a final
// symlink is refused too (for a path resolved already, e.g. by ResolveUnderRoot, so a
// link swapped in since is not followed). NOT_FOUND if it cannot be opened,
// INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<RegularFile> OpenRegularFile(absl::string_view field, const std::filesystem::path& path,
                                            uint64_t max_bytes, bool no_follow = false);

// Writes `port` and a newline to `path` atomically (a temporary file renamed over it):
// how a server bound to port 0 tells its starter which port it got (--port_file).
// INTERNAL naming the file when it cannot be written.
absl::Status WritePortFile(const std::string& path, int port);

// Reads a whole regular file of at most `max_bytes`. The descriptor is opened
// O_NONBLOCK (opening a FIFO does not block), fstat'ed, and refused unless it is a
// regular file; the size comes from that fstat, so what is checked is what is read. NOT_FOUND if it
// cannot be opened, INVALID_ARGUMENT naming `field` if it is not a regular file or is
// larger than `max_bytes`, DATA_LOSS on a short read.
absl::StatusOr<std::string> ReadRegularFile(absl::string_view field, const std::filesystem::path& path,
                                            uint64_t max_bytes);

// Size of the regular file at `path`, checked the same way as ReadRegularFile (opened,
// fstat'ed, regular, at most `max_bytes`).
absl::StatusOr<uint64_t> RegularFileSize(absl::string_view field, const std::filesystem::path& path,
                                         uint64_t max_bytes);

// Runs `argv[0]` (looked up in PATH) with `argv` as its arguments: no shell, so nothing
// in an argument is interpreted. stdin, stdout and stderr go to /dev/null. Waits at most
// `timeout`, then kills the child (SIGKILL) and returns DEADLINE_EXCEEDED. NOT_FOUND if
// the program is not in PATH; INTERNAL naming the exit code or signal if it failed.
absl::Status RunProgram(const std::vector<std::string>& argv, absl::Duration timeout);

// True if `program` is an executable file in one of PATH's directories.
bool ProgramInPath(absl::string_view program);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_FILES_H_
