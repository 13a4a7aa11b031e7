// The HTTP server over real loopback connections: routes, limits, the head check
// before the body, exceptions, streaming, a client that goes away, the busy answer.
#include "libs/http/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "libs/http/raw_client.h"

namespace rlfleet::http {
namespace {

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(Server::Options options = {}, Server::HeadCheck check = nullptr) {
    options.paths = {"/echo", "/throw", "/stream", "/wait", "/gather"};
    auto server = Server::Start(
        "127.0.0.1", 0, options, [this](const Request& r) { return Handle(r); }, check);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  Reply Handle(const Request& r) {
    if (r.path == "/echo") {
      Reply reply;
      reply.body = absl::StrCat(r.method, " ", r.body, " ", r.Header("x-tag").value_or("-"));
      return reply;
    }
    if (r.path == "/throw") throw std::runtime_error("boom");
    if (r.path == "/stream") {
      Reply reply;
      reply.content_type = "text/event-stream";
      reply.stream = [this](StreamWriter& w) {
        for (int i = 0; i < 3; ++i) w.Write(absl::StrCat("data: ", i, "\n\n"));
        if (endless_) {
          while (w.Write("data: more\n\n")) absl::SleepFor(absl::Milliseconds(2));
          stream_ended_.Notify();
        }
      };
      return reply;
    }
    if (r.path == "/gather") {  // answers 200 once kGather requests are in at once
      gathered_.fetch_add(1);
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (gathered_.load() < kGather && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
      Reply reply;
      reply.status = gathered_.load() >= kGather ? 200 : 500;
      return reply;
    }
    if (r.path == "/wait") {  // a long non-streamed request: until the client goes away
      entered_.Notify();
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (r.connected() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
      if (absl::Now() < deadline) saw_gone_.Notify();
      return Reply{};
    }
    Reply reply = JsonError(404, absl::StrCat("no ", r.path));
    if (!r.body.empty()) reply.body = "a body reached the unknown path";
    return reply;
  }
  int port() const { return server_->port(); }

  static constexpr int kGather = 24;
  std::atomic<int> gathered_{0};
  bool endless_ = false;
  absl::Notification entered_, saw_gone_, stream_ended_;
  std::unique_ptr<Server> server_;
};

TEST_F(HttpServerTest, RoutesBodiesAndUnknownPaths) {
  Start();
  RawReply r = Exchange(port(), RawRequest("POST", "/echo", "hello", "X-Tag: t1\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST hello t1");
  r = Exchange(port(), RawRequest("POST", "/nowhere", "{}"));
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("no /nowhere"), std::string::npos) << r.body;
}

TEST_F(HttpServerTest, TwoRequestsOnOneKeptAliveConnection) {
  Start();
  const int fd = ConnectLoopback(port());
  ASSERT_GE(fd, 0);
  for (const char* body : {"one", "two"}) {
    ASSERT_TRUE(SendAll(fd, absl::StrCat("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n", body)));
    const RawReply r = ReadReply(fd);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, absl::StrCat("POST ", body, " -"));
  }
  close(fd);
}

TEST_F(HttpServerTest, AHandlerThatThrowsIsA500AndTheServerLives) {
  Start();
  for (int i = 0; i < 3; ++i) {
    const RawReply r = Exchange(port(), RawRequest("POST", "/throw", "{}"));
    EXPECT_EQ(r.status, 500);
    EXPECT_NE(r.body.find("server_error"), std::string::npos);
  }
  EXPECT_EQ(Exchange(port(), RawRequest("GET", "/echo", "")).status, 200);
}

TEST_F(HttpServerTest, MalformedAndOversizedRequestsAreRefusedByStatus) {
  Server::Options options;
  options.max_body_bytes = 100;
  Start(options);
  EXPECT_EQ(Exchange(port(), RawRequest("POST", "/echo", std::string(101, 'x'))).status, 413);
  EXPECT_EQ(Exchange(port(), "BAD\r\n\r\n").status, 400);
  EXPECT_EQ(Exchange(port(), absl::StrCat("GET /", std::string(9000, 'a'), " HTTP/1.1\r\n\r\n")).status, 414);
  EXPECT_EQ(Exchange(port(), "POST /echo HTTP/1.1\r\nContent-Length: x\r\n\r\n").status, 400);
  EXPECT_EQ(Exchange(port(), "POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n").status, 400);
  EXPECT_EQ(Exchange(port(), "POST /echo HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok").status,
            400);
  EXPECT_EQ(Exchange(port(), RawRequest("POST", "/echo", "ok")).status, 200);
}

TEST_F(HttpServerTest, TheHeadCheckAnswersBeforeTheBodyIsSent) {
  Start({}, [](const Request& r) -> std::optional<Reply> {
    if (r.Header("authorization") != "Bearer k") return JsonError(401, "no key");
    return std::nullopt;
  });
  // A head that announces a megabyte that never comes: answered at once.
  const int fd = ConnectLoopback(port());
  ASSERT_TRUE(SendAll(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"));
  const absl::Time start = absl::Now();
  const RawReply r = ReadReply(fd);
  close(fd);
  EXPECT_EQ(r.status, 401);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(Exchange(port(), RawRequest("POST", "/echo", "x", "Authorization: Bearer k\r\n")).status, 200);
}

TEST_F(HttpServerTest, AStreamIsChunkedAndEndsWhenItsClientGoes) {
  Start();
  RawReply r = Exchange(port(), RawRequest("GET", "/stream", ""));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  endless_ = true;
  const int fd = ConnectLoopback(port());
  ASSERT_TRUE(SendAll(fd, RawRequest("GET", "/stream", "")));
  char buffer[64];
  ASSERT_GT(read(fd, buffer, sizeof(buffer)), 0);
  close(fd);
  EXPECT_TRUE(stream_ended_.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(HttpServerTest, AHandlerSeesItsClientGoAway) {
  Start();
  const int fd = ConnectLoopback(port());
  ASSERT_TRUE(SendAll(fd, RawRequest("GET", "/wait", "")));
  ASSERT_TRUE(entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  close(fd);
  EXPECT_TRUE(saw_gone_.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// Connections arriving together are served together (each its own thread at once),
// even while others hold theirs with a head they never finish.
TEST_F(HttpServerTest, ConnectionsArrivingTogetherAreServedTogether) {
  Start();
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) {
    stalled.push_back(ConnectLoopback(port()));
    ASSERT_TRUE(SendAll(stalled.back(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le"));
  }
  std::vector<int> fds;
  for (int i = 0; i < kGather; ++i) {
    fds.push_back(ConnectLoopback(port()));
    ASSERT_TRUE(SendAll(fds.back(), RawRequest("GET", "/gather", "")));
  }
  for (int fd : fds) {
    EXPECT_EQ(ReadReply(fd).status, 200);
    close(fd);
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(Exchange(port(), RawRequest("POST", "/echo", "x")).status, 200);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (int fd : stalled) close(fd);
}

TEST_F(HttpServerTest, AConnectionPastTheLimitIsAnswered503) {
  Server::Options options;
  options.max_connections = 1;
  Start(options);
  const int busy = ConnectLoopback(port());
  ASSERT_TRUE(SendAll(busy, RawRequest("GET", "/wait", "")));
  ASSERT_TRUE(entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const RawReply r = Exchange(port(), RawRequest("POST", "/echo", "x"));
  EXPECT_EQ(r.status, 503);
  close(busy);
  ASSERT_TRUE(saw_gone_.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(HttpHelpersTest, LoopbackHostsAndConstantTimeCompare) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.8.0.2"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost(""));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("not-an-address"));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secre"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
}

TEST(HttpServerStartTest, RefusesBadHostsAndPorts) {
  EXPECT_EQ(Server::Start("nohost", 0, {}, [](const Request&) { return Reply{}; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Server::Start("127.0.0.1", 70000, {}, [](const Request&) { return Reply{}; }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::http
