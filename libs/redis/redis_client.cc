#include "libs/redis/redis_client.h"

#include <hiredis/hiredis.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
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

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& host, int port,
                                                        absl::Duration timeout) {
  std::unique_ptr<Client> client(new Client(host, port, timeout));
  ASSIGN_OR_RETURN(Reply pong, client->Command({"PING"}));
  (void)pong;
  return client;
}

Client::Client(std::string host, int port, absl::Duration timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {}

Client::~Client() {
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

absl::StatusOr<std::vector<Reply>> Client::RunLocked(
    const std::vector<std::vector<std::string>>& commands) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    RETURN_IF_ERROR(EnsureConnectedLocked());
    bool broken = false;
    for (const auto& argv : commands) {
      std::vector<const char*> args;
      std::vector<size_t> lengths;
      for (const std::string& a : argv) {
        args.push_back(a.data());
        lengths.push_back(a.size());
      }
      if (redisAppendCommandArgv(context_, static_cast<int>(args.size()), args.data(),
                                 lengths.data()) != REDIS_OK) {
        broken = true;
        break;
      }
    }
    std::vector<Reply> replies;
    for (size_t i = 0; !broken && i < commands.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
        broken = true;
        break;
      }
      auto* r = static_cast<redisReply*>(raw);
      replies.push_back(Convert(r));
      freeReplyObject(r);
    }
    if (!broken) {
      for (const Reply& r : replies) {
        if (r.type == Reply::Type::kError) {
          return absl::InternalError(absl::StrCat("Redis error: ", r.str));
        }
      }
      return replies;
    }
    // The connection broke (e.g. Redis restarted): dial again once.
    redisFree(context_);
    context_ = nullptr;
  }
  return absl::UnavailableError(absl::StrCat("Redis at ", address(), " did not answer"));
}

absl::StatusOr<Reply> Client::Command(const std::vector<std::string>& argv) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<Reply> replies, RunLocked({argv}));
  return std::move(replies[0]);
}

absl::StatusOr<std::vector<Reply>> Client::Pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  if (commands.empty()) return std::vector<Reply>{};
  absl::MutexLock lock(&mu_);
  return RunLocked(commands);
}

}  // namespace rlfleet::redis
