#include "libs/redis/redis_client.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/common/await_callback.h"
#include "libs/common/status_macros.h"

namespace rlfleet::redis {
namespace {

Reply Convert(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
      break;
    default:
      out.type = Reply::Type::kNil;
  }
  return out;
}

// The first error reply in `r` or anywhere inside it (an EXEC's array), else null.
// (hiredis nests at most 7 levels deep, so the recursion is bounded.)
const Reply* FirstError(const Reply& r) {
  if (r.type == Reply::Type::kError) return &r;
  for (const Reply& e : r.elements) {
    if (const Reply* found = FirstError(e); found != nullptr) return found;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<Url> ParseUrl(absl::string_view connection, absl::string_view default_prefix) {
  absl::string_view rest = connection;
  Url url;
  url.prefix = std::string(default_prefix);
  const size_t colon = [&] {
    if (!absl::ConsumePrefix(&rest, "redis://")) return absl::string_view::npos;
    if (size_t slash = rest.find('/'); slash != absl::string_view::npos) {
      url.prefix = std::string(rest.substr(slash + 1));
      rest = rest.substr(0, slash);
    }
    return rest.rfind(':');
  }();
  if (colon == absl::string_view::npos || colon == 0 || !absl::SimpleAtoi(rest.substr(colon + 1), &url.port) ||
      url.port <= 0 || url.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad Redis address `", connection, "`: want redis://host:port[/prefix]"));
  }
  url.host = std::string(rest.substr(0, colon));
  return url;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& host, int port, absl::Duration timeout) {
  std::unique_ptr<Client> client(new Client(host, port, timeout));
  ASSIGN_OR_RETURN(Reply pong, client->Command({"PING"}));
  (void)pong;
  return client;
}

Client::Client(std::string host, int port, absl::Duration timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {}

Client::~Client() {
  {
    absl::MutexLock lock(&async_mu_);
    stopping_ = true;
  }
  if (io_thread_.joinable()) io_thread_.join();  // (after answering what was queued)
  absl::MutexLock lock(&mu_);
  if (context_ != nullptr) redisFree(context_);
}

std::string Client::address() const { return absl::StrCat(host_, ":", port_); }

absl::Status Client::EnsureConnectedLocked() {
  if (context_ != nullptr && context_->err == 0) return absl::OkStatus();
  if (context_ != nullptr) redisFree(context_);
  const timeval tv = absl::ToTimeval(timeout_);
  context_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (context_ == nullptr || context_->err != 0) {
    const std::string why = context_ != nullptr ? context_->errstr : "out of memory";
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot reach Redis at ", address(), ": ", why));
  }
  redisSetTimeout(context_, tv);
  return absl::OkStatus();
}

bool Client::SendLocked(const std::vector<std::vector<absl::string_view>>& commands, size_t* sent) {
  *sent = 0;
  // Pass 1: the framing (and arguments under 64 bytes) into headers_; each piece is a
  // range of headers_ (offset >= 0) or an argument's own bytes.
  struct Piece {
    int64_t offset;  // into headers_, or -1
    size_t length;
    const char* data;
  };
  constexpr size_t kInline = 64;
  headers_.clear();
  std::vector<Piece> pieces;
  int64_t open = 0;  // start of the headers_ range not yet made a piece
  auto close_range = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (static_cast<int64_t>(headers_.size()) > open) {
      pieces.push_back({open, headers_.size() - static_cast<size_t>(open), nullptr});
    }
    open = static_cast<int64_t>(headers_.size());
  };
  for (const auto& argv : commands) {
    absl::StrAppend(&headers_, "*", argv.size(), "\r\n");
    for (absl::string_view a : argv) {
      absl::StrAppend(&headers_, "$", a.size(), "\r\n");
      if (a.size() < kInline) {
        headers_.append(a.data(), a.size());
      } else {
        close_range();
        pieces.push_back({-1, a.size(), a.data()});
      }
      headers_.append("\r\n");
    }
  }
  close_range();
  // Pass 2: send, at most IOV_MAX pieces per call; a short write resumes mid-piece.
  std::vector<iovec> iov;
  size_t next = 0, skip = 0;  // first piece not fully sent, bytes of it already sent
  while (next < pieces.size()) {
    iov.clear();
    for (size_t i = next; i < pieces.size() && iov.size() < 1024; ++i) {
      const Piece& p = pieces[i];
      const char* base = p.offset >= 0 ? headers_.data() + p.offset : p.data;
      const size_t off = i == next ? skip : 0;
      iov.push_back({const_cast<char*>(base + off), p.length - off});
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = iov.size();
    const ssize_t n = sendmsg(context_->fd, &msg, MSG_NOSIGNAL);  // (SO_SNDTIMEO bounds it)
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    *sent += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (left > 0) {
      const size_t rest = pieces[next].length - skip;
      if (left < rest) {
        skip += left;
        left = 0;
      } else {
        left -= rest;
        ++next;
        skip = 0;
      }
    }
  }
  return true;
}

absl::StatusOr<std::vector<Reply>> Client::SendAndReadLocked(
    const std::vector<std::vector<absl::string_view>>& commands) {
  // A connection Redis closed while it sat idle (Redis restarted) is found before
  // anything is sent on it and dialled again: that resend is safe, nothing of this call
  // reached Redis. Once a byte is sent, a failure is returned and never resent: Redis
  // may have applied the commands (INCRBY or APPEND twice would be wrong). The caller
  // decides (the buffer's writes are idempotent by record id; the store says so).
  for (int attempt = 0;; ++attempt) {
    RETURN_IF_ERROR(EnsureConnectedLocked());
    if (!IdleConnectionAliveLocked()) {
      DropConnectionLocked();
      if (attempt == 0) continue;
      return absl::UnavailableError(absl::StrCat("Redis at ", address(), " closed the connection"));
    }
    size_t sent = 0;
    if (!SendLocked(commands, &sent)) {
      const int err = errno;
      DropConnectionLocked();
      if (sent == 0 && attempt == 0) continue;  // (nothing reached Redis: safe to send again)
      return absl::UnavailableError(absl::StrCat("Redis at ", address(), ": sending failed after ", sent, " bytes (",
                                                 strerror(err), "); the commands may or may not have been applied"));
    }
    break;
  }
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      const int err = errno;
      bool timed_out = context_->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK);
#ifdef REDIS_ERR_TIMEOUT
      timed_out = timed_out || context_->err == REDIS_ERR_TIMEOUT;
#endif
      const std::string why = context_->errstr;
      // The rest of this call's replies may still arrive on this connection: it is
      // closed so that no later call reads them as its own.
      DropConnectionLocked();
      const std::string what =
          absl::StrCat("Redis at ", address(), " did not answer command ", i + 1, " of ", commands.size(), " (", why,
                       "); the commands may or may not have been applied");
      if (timed_out) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": no reply within ", absl::FormatDuration(timeout_)));
      }
      return absl::UnavailableError(what);
    }
    auto* r = static_cast<redisReply*>(raw);
    replies.push_back(Convert(r));
    freeReplyObject(r);
  }
  return replies;
}

absl::StatusOr<std::vector<Reply>> Client::RunLocked(const std::vector<std::vector<absl::string_view>>& commands) {
  ASSIGN_OR_RETURN(std::vector<Reply> replies, SendAndReadLocked(commands));
  for (size_t i = 0; i < replies.size(); ++i) RETURN_IF_ERROR(ReplyError(commands[i], replies[i]));
  return replies;
}

absl::Status Client::ReplyError(const std::vector<absl::string_view>& argv, const Reply& reply) {
  // EXEC answers with an array of the queued commands' replies: an error among them
  // (e.g. WRONGTYPE at exec time) fails the call like a top-level error reply.
  if (const Reply* error = FirstError(reply); error != nullptr) {
    return absl::InternalError(absl::StrCat("Redis error: ", error->str));
  }
  if (reply.is_nil() && !argv.empty() && absl::EqualsIgnoreCase(argv[0], "EXEC")) {
    return absl::AbortedError("Redis aborted the transaction (EXEC answered nil)");
  }
  return absl::OkStatus();
}

void Client::CommandAsync(std::vector<std::string> argv, std::function<void(absl::StatusOr<Reply>)> done) {
  {
    absl::MutexLock lock(&async_mu_);
    if (!stopping_) {
      queue_.push_back({std::move(argv), std::move(done)});
      if (!io_thread_.joinable()) io_thread_ = std::thread([this] { AsyncLoop(); });
      return;
    }
  }
  done(absl::UnavailableError(absl::StrCat("Redis client for ", address(), " is closing")));
}

absl::StatusOr<Reply> Client::CommandCombined(const std::vector<std::string>& argv) {
  // (no deadline of its own: every pipeline ends within the connection's timeout)
  return common::AwaitCallback<absl::StatusOr<Reply>>([&](auto done) { CommandAsync(argv, std::move(done)); });
}

void Client::AsyncLoop() {
  for (;;) {
    std::vector<Queued> batch;
    {
      absl::MutexLock lock(&async_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(async_mu_) { return stopping_ || !queue_.empty(); };
      async_mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything queued was answered
      // Everything queued meanwhile goes in one pipeline (bounded, so that one pipeline
      // stays well inside the connection's timeout).
      const size_t n = std::min(queue_.size(), kMaxCombined);
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<std::vector<absl::string_view>> commands;
    commands.reserve(batch.size());
    for (const Queued& q : batch) commands.emplace_back(q.argv.begin(), q.argv.end());
    absl::StatusOr<std::vector<Reply>> replies;
    {
      absl::MutexLock lock(&mu_);
      replies = SendAndReadLocked(commands);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!replies.ok()) {
        batch[i].done(replies.status());
      } else if (absl::Status error = ReplyError(commands[i], (*replies)[i]); !error.ok()) {
        batch[i].done(error);
      } else {
        batch[i].done(std::move((*replies)[i]));
      }
    }
  }
}

bool Client::IdleConnectionAliveLocked() {
  if (context_->reader != nullptr && context_->reader->len > context_->reader->pos) return false;  // stray bytes
  pollfd p{context_->fd, POLLIN, 0};
  const int ready = poll(&p, 1, 0);
  if (ready == 0) return true;  // nothing to read: open as far as we can tell
  if (ready < 0) return errno == EINTR;
  // Readable while idle: EOF (Redis closed it), an error, or bytes nobody asked for.
  return false;
}

void Client::DropConnectionLocked() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

namespace {
std::vector<std::vector<absl::string_view>> Views(const std::vector<std::vector<std::string>>& commands) {
  std::vector<std::vector<absl::string_view>> views;
  views.reserve(commands.size());
  for (const auto& argv : commands) views.emplace_back(argv.begin(), argv.end());
  return views;
}
}  // namespace

absl::StatusOr<Reply> Client::Command(const std::vector<std::string>& argv) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<Reply> replies, RunLocked(Views({argv})));
  return std::move(replies[0]);
}

absl::StatusOr<std::vector<Reply>> Client::Pipeline(const std::vector<std::vector<std::string>>& commands) {
  if (commands.empty()) return std::vector<Reply>{};
  absl::MutexLock lock(&mu_);
  return RunLocked(Views(commands));
}

absl::StatusOr<std::vector<Reply>> Client::PipelineViews(const std::vector<std::vector<absl::string_view>>& commands) {
  if (commands.empty()) return std::vector<Reply>{};
  absl::MutexLock lock(&mu_);
  return RunLocked(commands);
}

}  // namespace rlfleet::redis
