// The Redis client against the redis-server that tools/test.sh starts
// (RLFLEET_REDIS_PORT): commands it encodes itself must arrive byte for byte, however
// large, however many pieces.
#include "libs/redis/redis_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/common/ids.h"
#include "tests/util/redis_for_test.h"

namespace rlfleet::redis {
namespace {

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> port = rlfleet::testing::RedisPortForTest();
    ASSERT_TRUE(port.ok()) << port.status();
    auto client = Client::Connect("127.0.0.1", *port);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    prefix_ = common::NewId("redis-client-test") + ":";
  }
  std::unique_ptr<Client> client_;
  std::string prefix_;
};

// Values of every size around the inline threshold and far above it, with CR, LF and
// NUL inside, come back exactly.
TEST_F(RedisClientTest, ValuesRoundTripByteForByte) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4096}, size_t{9} << 20}) {
    std::string value(size, '\0');
    for (size_t i = 0; i < size; ++i) value[i] = "\r\n\0x$*"[i % 6];
    const std::string key = absl::StrCat(prefix_, "v", size);
    auto set = client_->PipelineViews({{"SET", key, value}, {"GET", key}});
    ASSERT_TRUE(set.ok()) << set.status();
    ASSERT_EQ((*set)[1].type, Reply::Type::kString);
    EXPECT_EQ((*set)[1].str, value) << "size " << size;
  }
}

// More pieces than one sendmsg takes (1024): a 3000-argument command and a pipeline of
// 1500 commands arrive whole and in order.
TEST_F(RedisClientTest, ManyPiecesArriveInOrder) {
  std::vector<std::string> values;
  for (int i = 0; i < 3000; ++i)
    values.push_back(std::string(70 + i % 50, static_cast<char>('a' + i % 26)) + std::to_string(i));
  const std::string list = prefix_ + "list";
  std::vector<absl::string_view> rpush = {"RPUSH", list};
  rpush.insert(rpush.end(), values.begin(), values.end());
  auto pushed = client_->PipelineViews({rpush});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ((*pushed)[0].integer, 3000);
  auto range = client_->Command({"LRANGE", list, "0", "-1"});
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->elements.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(range->elements[i].str, values[i]) << i;

  std::vector<std::vector<std::string>> incrs;
  for (int i = 0; i < 1500; ++i) incrs.push_back({"INCR", prefix_ + "counter"});
  auto counted = client_->Pipeline(incrs);
  ASSERT_TRUE(counted.ok()) << counted.status();
  ASSERT_EQ(counted->size(), 1500u);
  for (int i = 0; i < 1500; ++i) ASSERT_EQ((*counted)[i].integer, i + 1);
}

TEST_F(RedisClientTest, AnErrorReplyIsInternalWithRedisMessage) {
  auto r = client_->Command({"NOSUCHCOMMAND", "x"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("unknown command"), absl::string_view::npos) << r.status();
  // The connection is still usable afterwards.
  auto ping = client_->Command({"PING"});
  ASSERT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(ping->str, "PONG");
}

// EXEC answers with one reply per queued command; Redis runs them all even when one
// fails at exec time (WRONGTYPE). That error must fail the call, or a caller acks what
// Redis did not store.
TEST_F(RedisClientTest, AnErrorInsideExecFailsTheWholeCall) {
  const std::string text = prefix_ + "text", list = prefix_ + "list";
  ASSERT_TRUE(client_->Command({"SET", text, "not a list"}).ok());
  auto r = client_->Pipeline({{"MULTI"}, {"SET", list + "-other", "v"}, {"LPUSH", text, "x"}, {"EXEC"}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "WRONGTYPE")) << r.status();
  // A clean transaction still answers with its replies.
  auto ok = client_->Pipeline({{"MULTI"}, {"SET", list + "-other", "w"}, {"GET", list + "-other"}, {"EXEC"}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ((*ok)[3].elements.size(), 2u);
  EXPECT_EQ((*ok)[3].elements[1].str, "w");
}

// Commands from many threads at once, combined into shared pipelines, each get their
// own reply in their own order; an error reply fails only the command that caused it.
TEST_F(RedisClientTest, CombinedCommandsEachGetTheirOwnReply) {
  const std::string text = prefix_ + "combined-text";
  ASSERT_TRUE(client_->Command({"SET", text, "not a number"}).ok());
  constexpr int kThreads = 16, kEach = 200;
  std::atomic<int> wrong{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = absl::StrCat(prefix_, "combined-", t);
      int64_t expected = 0;
      for (int i = 0; i < kEach; ++i) {
        if (i % 50 == 7) {  // an error reply for this caller only
          auto bad = client_->CommandCombined({"INCR", text});
          if (bad.status().code() == absl::StatusCode::kInternal) ++errors;
          continue;
        }
        auto r = client_->CommandCombined({"INCR", key});
        if (!r.ok() || r->type != Reply::Type::kInteger || r->integer != ++expected) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), kThreads * (kEach / 50));
  for (int t = 0; t < kThreads; ++t) {
    auto r = client_->Command({"GET", absl::StrCat(prefix_, "combined-", t)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->str, absl::StrCat(kEach - kEach / 50)) << t;
  }
}

// A Redis of the test's own making on a loopback port, serving one connection at a time
// (the next is accepted once the previous one is closed): PING answers +PONG; every
// other command is counted and, unless `answer` says so, left unanswered (a Redis that
// applied it but whose reply is late).
class FakeRedis {
 public:
  explicit FakeRedis(bool close_after_first_ping = false) : close_after_first_ping_(close_after_first_ping) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    // (a fake that cannot listen fails its test here, not later with a port 0)
    const bool listening = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                           listen(listen_fd_, 8) == 0 &&
                           getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    EXPECT_TRUE(listening) << "the fake Redis cannot listen on loopback";
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeRedis() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  int commands(const std::string& name) const { return name == "INCR" ? incrs_.load() : 0; }
  int connections() const { return connections_.load(); }
  // Once the first connection is closed on the server's side.
  bool WaitFirstClosed() { return first_closed_.WaitForNotificationWithTimeout(absl::Seconds(10)); }

 private:
  // Waits for `fd` to be readable; false when stopping.
  bool Readable(int fd) {
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) return true;
    }
    return false;
  }
  void Serve() {
    while (Readable(listen_fd_)) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      ++connections_;
      std::string in;
      char buf[4096];
      bool open = true;
      while (open && Readable(fd)) {
        const ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        in.append(buf, n);
        std::vector<std::string> argv;
        while (open && Parse(&in, &argv)) {
          if (argv[0] == "PING") {
            (void)!write(fd, "+PONG\r\n", 7);
            if (close_after_first_ping_ && connections_ == 1) open = false;
          } else if (argv[0] == "INCR") {
            ++incrs_;
          }
        }
      }
      close(fd);
      if (!first_closed_.HasBeenNotified()) first_closed_.Notify();
    }
  }
  // One RESP array of bulk strings off the front of `*in` (false: not complete yet).
  static bool Parse(std::string* in, std::vector<std::string>* argv) {
    argv->clear();
    size_t pos = 0;
    auto line = [&](std::string* out) {
      const size_t end = in->find("\r\n", pos);
      if (end == std::string::npos) return false;
      *out = in->substr(pos, end - pos);
      pos = end + 2;
      return true;
    };
    std::string header;
    int count = 0;
    if (!line(&header) || header.empty() || header[0] != '*' || !absl::SimpleAtoi(header.substr(1), &count)) {
      return false;
    }
    for (int i = 0; i < count; ++i) {
      size_t size = 0;
      if (!line(&header) || !absl::SimpleAtoi(header.substr(1), &size) || in->size() < pos + size + 2) return false;
      argv->push_back(in->substr(pos, size));
      pos += size + 2;
    }
    in->erase(0, pos);
    return true;
  }

  const bool close_after_first_ping_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> incrs_{0}, connections_{0};
  absl::Notification first_closed_;
  std::thread thread_;
};

// A pipeline whose reply does not come within the timeout may have been applied: it is
// DEADLINE_EXCEEDED for the caller to decide, never sent again behind its back (an INCR
// or APPEND applied twice).
TEST(RedisClientFaults, ATimedOutPipelineIsNotResent) {
  FakeRedis redis;
  auto client = Client::Connect("127.0.0.1", redis.port(), absl::Milliseconds(300));
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->Pipeline({{"INCR", "k"}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "may or may not have been applied")) << r.status();
  // The next call dials again (the fake serves one connection at a time: it has read
  // everything of the earlier ones by the time it answers).
  auto ping = (*client)->Command({"PING"});
  ASSERT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(redis.commands("INCR"), 1);
}

// A connection Redis closed while it was idle (a restart) is replaced before anything
// is sent on it: the call succeeds on a new connection.
TEST(RedisClientFaults, AConnectionClosedWhileIdleIsDialledAgain) {
  FakeRedis redis(/*close_after_first_ping=*/true);
  auto client = Client::Connect("127.0.0.1", redis.port(), absl::Seconds(2));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(redis.WaitFirstClosed());
  auto ping = (*client)->Command({"PING"});
  ASSERT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(ping->str, "PONG");
  EXPECT_EQ(redis.connections(), 2);
}

}  // namespace
}  // namespace rlfleet::redis
