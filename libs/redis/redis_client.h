// A small Redis client: the only code that includes hiredis (STYLE.md: one interface
// per vendor SDK). Commands go in argv form (binary-safe); replies come back as plain
// values. Commands are encoded here and sent with one sendmsg per up to 1024 pieces,
// pointing at the caller's argument bytes (no copy of a large value: hiredis's own
// command buffer copied every argument twice into fresh allocations whose pages the
// kernel zeroed, a quarter of the buffer's durable-ingest profile); hiredis reads the
// replies. A connection found closed before anything is sent on it (Redis restarted)
// is dialled again; once a call's bytes are sent, a failure is returned and the call is
// never resent (Redis may have applied it): UNAVAILABLE when the connection broke,
// DEADLINE_EXCEEDED when Redis did not answer within the timeout (never a hang). Either
// way the connection is closed (no late reply is read by a later call).
//
// Thread-safe (one connection under a mutex).
#ifndef RLFLEET_LIBS_REDIS_REDIS_CLIENT_H_
#define RLFLEET_LIBS_REDIS_REDIS_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct redisContext;

namespace rlfleet::redis {

struct Reply {
  enum class Type { kNil, kInteger, kString, kArray, kStatus, kError };
  Type type = Type::kNil;
  int64_t integer = 0;
  std::string str;  // kString, kStatus, kError
  std::vector<Reply> elements;

  bool is_nil() const { return type == Type::kNil; }
};

// A parsed `redis://host:port[/key-prefix]` connection string.
struct Url {
  std::string host;
  int port = 0;
  std::string prefix;  // `default_prefix` when the string has none
};

// INVALID_ARGUMENT naming the string when it is not redis://host:port[/prefix].
absl::StatusOr<Url> ParseUrl(absl::string_view connection, absl::string_view default_prefix);

class Client {
 public:
  // Connects and PINGs. UNAVAILABLE if Redis does not answer within `timeout`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& host, int port,
                                                         absl::Duration timeout = absl::Seconds(2));
  ~Client();

  // One command. UNAVAILABLE if Redis cannot be reached or the connection broke;
  // DEADLINE_EXCEEDED if it did not answer within the timeout (after either, the
  // command may or may not have been applied: it is not resent); INTERNAL for an error
  // reply (with Redis's message).
  absl::StatusOr<Reply> Command(const std::vector<std::string>& argv);
  // Several commands in one round trip; replies in order. Errors as for Command; an
  // error reply to any command, or an error element inside a reply (EXEC's array of the
  // queued commands' replies: e.g. WRONGTYPE at exec time), fails the whole call
  // (INTERNAL); EXEC answering nil (an aborted transaction) is ABORTED.
  absl::StatusOr<std::vector<Reply>> Pipeline(const std::vector<std::vector<std::string>>& commands);
  // The same over views: the bytes are sent from where they are (they must outlive
  // the call).
  absl::StatusOr<std::vector<Reply>> PipelineViews(const std::vector<std::vector<absl::string_view>>& commands);

  // Command without waiting for it: `done` runs once with the reply (or the error, as
  // Command's), on the client's I/O thread; it must not block, and must not call this
  // client's blocking methods. The commands queued while one pipeline is at Redis go
  // together in the next, so N concurrent callers cost about one round trip, not N in
  // turn (the registry's heartbeats from thousands of replicas). Each gets its own reply
  // or its own error reply (INTERNAL); a connection failure or timeout fails every
  // command of its pipeline. After the destructor started: UNAVAILABLE at once.
  void CommandAsync(std::vector<std::string> argv, std::function<void(absl::StatusOr<Reply>)> done);
  // CommandAsync, waiting for the reply.
  absl::StatusOr<Reply> CommandCombined(const std::vector<std::string>& argv);

  std::string address() const;

 private:
  // A command waiting in CommandAsync's queue.
  struct Queued {
    std::vector<std::string> argv;
    std::function<void(absl::StatusOr<Reply>)> done;
  };
  static constexpr size_t kMaxCombined = 1024;

  Client(std::string host, int port, absl::Duration timeout);
  absl::Status EnsureConnectedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<Reply>> RunLocked(const std::vector<std::vector<absl::string_view>>& commands)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RunLocked without looking into the replies (error replies are returned as replies).
  absl::StatusOr<std::vector<Reply>> SendAndReadLocked(const std::vector<std::vector<absl::string_view>>& commands)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An error reply (also inside EXEC's array) as INTERNAL; EXEC's nil as ABORTED.
  static absl::Status ReplyError(const std::vector<absl::string_view>& argv, const Reply& reply);
  // Encodes and sends `commands` on the connection; false if it broke (errno says why),
  // with `*sent` the bytes that went out before.
  bool SendLocked(const std::vector<std::vector<absl::string_view>>& commands, size_t* sent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the idle connection is still open: false if Redis closed it (or sent bytes
  // nobody asked for), so that it is replaced before anything is sent on it.
  bool IdleConnectionAliveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropConnectionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The I/O thread of CommandAsync: sends what is queued, answers it, until stopping.
  void AsyncLoop();

  const std::string host_;
  const int port_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  redisContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string headers_ ABSL_GUARDED_BY(mu_);  // RESP framing and small arguments, reused

  // CommandAsync's queue and I/O thread (started by the first CommandAsync).
  absl::Mutex async_mu_;  // (never held with mu_)
  std::deque<Queued> queue_ ABSL_GUARDED_BY(async_mu_);
  bool stopping_ ABSL_GUARDED_BY(async_mu_) = false;
  std::thread io_thread_;  // started under async_mu_; joined by the destructor after stopping_
};

}  // namespace rlfleet::redis

#endif  // RLFLEET_LIBS_REDIS_REDIS_CLIENT_H_
