#include "libs/http/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "httplib.h"

namespace rlfleet::http {
namespace {

// Set on a thread that answers a connection past Options::max_connections: its
// requests are refused 503 before routing.
thread_local bool t_refusing = false;

// httplib's task queue: up to 2 x `limit` threads, made as connections come and kept
// until shutdown. A connection taken while fewer than `limit` are served is served;
// otherwise it is refused (503). Connections wait only while every thread is busy.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(int limit) : limit_(limit) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(fn));
    // (an idle thread already woken for an earlier connection still counts in idle_:
    // a thread is made whenever the connections waiting outnumber the idle threads)
    if (static_cast<int>(pending_.size()) > idle_ && static_cast<int>(threads_.size()) < 2 * limit_) {
      threads_.emplace_back([this] { Work(); });
    }
    wake_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      --idle_;
      if (pending_.empty()) return;  // (stopping, and nothing is left to close)
      std::function<void()> fn = std::move(pending_.front());
      pending_.pop_front();
      const bool serve = serving_ < limit_;
      (serve ? serving_ : refusing_)++;
      lock.unlock();
      t_refusing = !serve;
      fn();  // (httplib serves the connection and closes it)
      lock.lock();
      (serve ? serving_ : refusing_)--;
    }
  }

  const int limit_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> pending_;  // guarded by mu_
  std::vector<std::thread> threads_;           // guarded by mu_ (joined at shutdown)
  int idle_ = 0;                               // guarded by mu_
  int serving_ = 0;                            // guarded by mu_
  int refusing_ = 0;                           // guarded by mu_
  bool stopping_ = false;                      // guarded by mu_
};

std::string EscapeRegex(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '/' && c != '_' && c != '-') out += '\\';
    out += c;
  }
  return out;
}

// The descriptor of the connection from `peer`:`peer_port` to `local_port`, or -1.
// (cpp-httplib 0.11 gives a handler no access to its socket.)
int FindConnection(const std::string& peer, int peer_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    int fd = -1;
    struct stat st {};
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
      continue;
    }
    sockaddr_in local{}, remote{};
    socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 || local.sin_family != AF_INET ||
        ntohs(local.sin_port) != local_port ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0 ||
        ntohs(remote.sin_port) != peer_port) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &remote.sin_addr, text, sizeof(text)) != nullptr && peer == text) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

Request FromLibrary(const httplib::Request& in, bool with_body) {
  Request out;
  out.method = in.method;
  out.path = in.path;
  out.remote_addr = in.remote_addr;
  out.headers.reserve(in.headers.size());
  for (const auto& [name, value] : in.headers) out.headers.emplace_back(absl::AsciiStrToLower(name), value);
  if (with_body) out.body = in.body;
  out.connected = [fd = -2, peer = in.remote_addr, peer_port = in.remote_port, local = in.local_port]() mutable {
    if (fd == -2) fd = FindConnection(peer, peer_port, local);
    if (fd < 0) return true;  // (not found: assume it is there)
    pollfd p{fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) < 0) return true;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
  };
  return out;
}

class SinkWriter : public StreamWriter {
 public:
  explicit SinkWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool Write(absl::string_view data) override {
    if (!ok_) return false;
    if (!data.empty()) ok_ = sink_.write(data.data(), data.size());
    return ok_;
  }
  bool ok() const { return ok_; }

 private:
  httplib::DataSink& sink_;
  bool ok_ = true;
};

void ToLibrary(Reply reply, httplib::Response& res) {
  res.status = reply.status;
  for (const auto& [name, value] : reply.headers) res.set_header(name, value);
  if (!reply.stream) {
    res.set_content(reply.body, reply.content_type);  // (0.11 takes a const reference)
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(reply.content_type,
                                   [stream = std::move(reply.stream)](size_t, httplib::DataSink& sink) {
                                     SinkWriter writer(sink);
                                     try {
                                       stream(writer);
                                     } catch (const std::exception& e) {
                                       std::cerr << "http: a stream's writer threw: " << e.what() << std::endl;
                                       return false;
                                     } catch (...) {
                                       std::cerr << "http: a stream's writer threw" << std::endl;
                                       return false;
                                     }
                                     if (!writer.ok()) return false;
                                     sink.done();
                                     return true;
                                   });
}

absl::string_view Reason(int status) {
  switch (status) {
    case 400:
      return "the request is malformed";
    case 404:
      return "not found";
    case 413:
      return "the body is larger than the server's limit";
    case 414:
      return "the request target is too long";
    case 503:
      return "the server is at its connection limit; retry later";
    default:
      return status < 500 ? "the request was refused" : "the server failed";
  }
}

}  // namespace

std::optional<std::string> Request::Header(absl::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return std::nullopt;
}

Reply JsonError(int status, absl::string_view message, absl::string_view type) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x80) ? '?' : c;
  }
  Reply r;
  r.status = status;
  r.body = absl::StrCat(R"({"error":{"message":")", escaped, R"(","type":")", type, R"(","param":null,"code":null}})");
  return r;
}

bool IsLoopbackHost(absl::string_view host) {
  if (host.empty() || host == "localhost") return true;
  in_addr addr{};
  const std::string ip(host);
  return inet_pton(AF_INET, ip.c_str(), &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ (b.empty() ? 0 : b[i % b.size()]);
  return diff == 0;
}

struct Server::Impl {
  httplib::Server server;
  std::thread listener;
};

Server::Server(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

Server::~Server() {
  impl_->server.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const std::string& host, int port, Options options,
                                                      Handler handler, HeadCheck head_check) {
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("HTTP port ", port, " is out of range"));
  const std::string ip = host.empty() || host == "localhost" ? "127.0.0.1" : host;
  in_addr parsed{};
  if (inet_pton(AF_INET, ip.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP host `", host, "` is not an IPv4 address"));
  }
  if (options.max_connections < 1) return absl::InvalidArgumentError("max_connections must be at least 1");
  auto impl = std::make_unique<Impl>();
  httplib::Server& s = impl->server;
  const int limit = options.max_connections;
  s.new_task_queue = [limit] { return new ConnectionThreads(limit); };
  const auto seconds = [](absl::Duration d) {
    return std::chrono::microseconds(std::max<int64_t>(1, absl::ToInt64Microseconds(d)));
  };
  s.set_read_timeout(seconds(options.read_timeout));
  s.set_write_timeout(seconds(options.write_timeout));
  s.set_keep_alive_timeout(std::max<time_t>(1, absl::ToInt64Seconds(options.keep_alive_timeout)));
  s.set_keep_alive_max_count(static_cast<size_t>(std::max(1, options.keep_alive_max_requests)));
  s.set_payload_max_length(options.max_body_bytes);
  s.set_pre_routing_handler([head_check](const httplib::Request& req, httplib::Response& res) {
    std::optional<Reply> refused;
    const bool has_length = req.has_header("Content-Length");
    const std::string length = req.get_header_value("Content-Length");
    if (has_length && (length.empty() || length.size() > 19 ||
                       !std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; }))) {
      refused = JsonError(400, "Content-Length is not a number");
      refused->headers.emplace_back("Connection", "close");
    } else if (has_length && req.has_header("Transfer-Encoding")) {
      refused = JsonError(400, "a request with both Content-Length and Transfer-Encoding");
      refused->headers.emplace_back("Connection", "close");
    } else if (t_refusing) {
      refused = JsonError(503, Reason(503), "server_error");
      refused->headers.emplace_back("Connection", "close");
      refused->headers.emplace_back("Retry-After", "1");
    } else if (head_check) {
      try {
        refused = head_check(FromLibrary(req, /*with_body=*/false));
      } catch (const std::exception& e) {
        std::cerr << "http: the head check threw: " << e.what() << std::endl;
        refused = JsonError(500, "the server failed on this request", "server_error");
      }
    }
    if (!refused.has_value()) return httplib::Server::HandlerResponse::Unhandled;
    ToLibrary(*std::move(refused), res);
    return httplib::Server::HandlerResponse::Handled;
  });
  auto route = [handler](const httplib::Request& req, httplib::Response& res) {
    Reply reply;
    try {
      reply = handler(FromLibrary(req, /*with_body=*/true));
    } catch (const std::exception& e) {
      std::cerr << "http: " << req.method << " " << req.path << " threw: " << e.what() << std::endl;
      reply = JsonError(500, "the server failed on this request (logged)", "server_error");
    } catch (...) {
      std::cerr << "http: " << req.method << " " << req.path << " threw" << std::endl;
      reply = JsonError(500, "the server failed on this request (logged)", "server_error");
    }
    ToLibrary(std::move(reply), res);
  };
  for (const std::string& path : options.paths) {
    const std::string pattern = EscapeRegex(path);
    s.Get(pattern, route);
    s.Post(pattern, route);
    s.Put(pattern, route);
    s.Patch(pattern, route);
    s.Delete(pattern, route);
    s.Options(pattern, route);
  }
  // What the library answers itself (no route, a bad head, a body too large) and what
  // a handler answered without a body: a JSON error. A request for a path with no route
  // goes to the handler without its body (its 404 or 405).
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([handler](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        Reply reply =
            JsonError(res.status, Reason(res.status), res.status < 500 ? "invalid_request_error" : "server_error");
        if (res.status == 404 && !req.method.empty()) {
          try {
            reply = handler(FromLibrary(req, /*with_body=*/false));
          } catch (const std::exception& e) {
            std::cerr << "http: " << req.method << " " << req.path << " threw: " << e.what() << std::endl;
          }
          if (reply.stream) reply = JsonError(404, Reason(404));
        }
        ToLibrary(std::move(reply), res);
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    std::cerr << "http: " << req.method << " " << req.path << " threw" << std::endl;
    ToLibrary(JsonError(500, "the server failed on this request (logged)", "server_error"), res);
  });
  const int bound = port == 0 ? s.bind_to_any_port(ip) : (s.bind_to_port(ip, port) ? port : -1);
  if (bound < 0) return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", ip, ":", port));
  impl->listener = std::thread([s = &impl->server] { s->listen_after_bind(); });
  return std::unique_ptr<Server>(new Server(std::move(impl), bound));
}

}  // namespace rlfleet::http
