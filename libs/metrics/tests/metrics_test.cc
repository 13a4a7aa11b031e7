#include "libs/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/metrics/http_server.h"
#include "libs/rpc/server_runner.h"
#include "rlfleet/testing/echo.grpc.pb.h"

namespace rlfleet::metrics {
namespace {

TEST(Metrics, RendersPrometheusTextFormat) {
  Registry r;
  r.AddCounter("x_total", "Things.", {{"kind", "a\"b"}})->Add(3);
  r.AddCounter("x_total", "Things.", {{"kind", "c"}})->Add(0.5);
  Gauge* g = r.AddGauge("depth", "Queue depth.", {});
  g->Set(7);
  g->Add(-2);
  r.AddCallbackGauge("read_at_scrape", "A callback.", {}, [] { return 42.0; });
  r.AddGauge("unix_time", "A large value with a fraction.", {})->Set(1764554823.125);
  Histogram* h = r.AddHistogram("latency_seconds", "Latency.", {{"op", "put"}}, {0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h->Observe(v);
  // The same name and labels are the same series.
  EXPECT_EQ(r.AddGauge("depth", "Queue depth.", {}), g);
  const std::string text = r.Render();
  for (const char* want :
       {"# HELP x_total Things.\n# TYPE x_total counter\n", "x_total{kind=\"a\\\"b\"} 3\n", "x_total{kind=\"c\"} 0.5\n",
        "# TYPE depth gauge\ndepth 5\n", "read_at_scrape 42\n", "unix_time 1764554823.125\n",
        "# TYPE latency_seconds histogram\n", "latency_seconds_bucket{op=\"put\",le=\"0.1\"} 2\n",
        "latency_seconds_bucket{op=\"put\",le=\"1\"} 3\n", "latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 4\n",
        "latency_seconds_sum{op=\"put\"} 3.65\n", "latency_seconds_count{op=\"put\"} 4\n"}) {
    EXPECT_TRUE(absl::StrContains(text, want)) << "missing: " << want << "\nin:\n" << text;
  }
}

TEST(MetricsServer, ServesMetricsAndNotFoundElsewhere) {
  Registry r;
  r.AddCounter("served_total", "Served.", {})->Add(2);
  auto server = MetricsServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  auto ok = HttpGet("127.0.0.1", (*server)->port(), "/metrics", absl::Seconds(5));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(absl::StartsWith(ok->head, "HTTP/1.1 200 OK\r\n")) << ok->head;
  EXPECT_TRUE(absl::StrContains(ok->head, "text/plain; version=0.0.4")) << ok->head;
  EXPECT_TRUE(absl::StartsWith(ok->body, "# HELP served_total Served.\n")) << ok->body;
  auto other = HttpGet("127.0.0.1", (*server)->port(), "/other", absl::Seconds(5));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(absl::StartsWith(other->head, "HTTP/1.1 404")) << other->head;
  // The client side (rlfleet doctor reads replicas' clocks this way).
  auto body = FetchMetrics("127.0.0.1", (*server)->port(), absl::Seconds(5));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(FindSample(*body, "served_total"), 2.0);
  EXPECT_FALSE(FindSample(*body, "served").has_value());
  EXPECT_EQ(FindSample("x{a=\"1\"} 4.5\n", "x"), 4.5);
  // A taken port is UNAVAILABLE, not a crash.
  EXPECT_EQ(MetricsServer::Start("127.0.0.1", (*server)->port(), &r).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(MetricsServer::Start("not-an-ip", 0, &r).status().code(), absl::StatusCode::kInvalidArgument);
}

// A TCP connection to 127.0.0.1:port (or -1), optionally with a tiny receive buffer.
int Connect(const std::string& host, int port, bool small_receive_buffer = false) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (small_receive_buffer) {
    int bytes = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The idle connection is accepted first and sends nothing; the scrape after it must not
// wait for it (the old server served one connection at a time, 5 s each).
TEST(MetricsServer, AnIdleConnectionDoesNotBlockAScrape) {
  Registry r;
  r.AddCounter("served_total", "Served.", {})->Add(2);
  auto server = MetricsServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const int idle = Connect("127.0.0.1", (*server)->port());
  ASSERT_GE(idle, 0);
  const absl::Time start = absl::Now();
  auto body = FetchMetrics("127.0.0.1", (*server)->port(), absl::Seconds(2));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(FindSample(*body, "served_total"), 2.0);
  close(idle);
}

// More idle connections than the server keeps open: the oldest make room, a scrape
// still gets through.
TEST(MetricsServer, ManyIdleConnectionsDoNotBlockAScrape) {
  Registry r;
  r.AddCounter("served_total", "Served.", {})->Add(1);
  auto server = MetricsServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> idle;
  for (int i = 0; i < kMaxConnections + 8; ++i) idle.push_back(Connect("127.0.0.1", (*server)->port()));
  auto body = FetchMetrics("127.0.0.1", (*server)->port(), absl::Seconds(2));
  EXPECT_TRUE(body.ok()) << body.status();
  for (int fd : idle) close(fd);
}

// A client that asks for a large exposition and never reads it: the server's send
// would block; it must not block the next scrape.
TEST(MetricsServer, AClientThatDoesNotReadDoesNotBlockAScrape) {
  Registry r;
  r.AddCallbackGauge("big", std::string(16 << 20, 'h'), {}, [] { return 1.0; });
  auto server = MetricsServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const int stuck = Connect("127.0.0.1", (*server)->port(), /*small_receive_buffer=*/true);
  ASSERT_GE(stuck, 0);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(stuck, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  auto body = FetchMetrics("127.0.0.1", (*server)->port(), absl::Seconds(4));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(FindSample(*body, "big"), 1.0);
  close(stuck);
}

// Raw bytes in, the whole answer out.
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect("127.0.0.1", port);
  if (fd < 0) return "connect failed";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  close(fd);
  return out;
}

TEST(MetricsServer, MalformedOversizedAndOtherMethodsAreRefused) {
  Registry r;
  auto server = MetricsServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GARBAGE\r\n\r\n"), "HTTP/1.1 400 "))
      << Exchange(port, "GARBAGE\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405 "));
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.1 200 "));
  // A head without its end, past the bound: refused without waiting for more.
  const std::string long_head = "GET /metrics HTTP/1.1\r\nX: " + std::string(kMaxRequestHeadBytes, 'a');
  EXPECT_TRUE(absl::StartsWith(Exchange(port, long_head), "HTTP/1.1 431 ")) << Exchange(port, long_head).substr(0, 80);
}

TEST(HttpRequestHead, ParsesOrRefusesWithoutReadingPastTheBound) {
  auto incomplete = ParseHttpRequestHead("GET /metrics HTTP/1.1\r\nHost: a\r\n");
  ASSERT_TRUE(incomplete.ok());
  EXPECT_FALSE(incomplete->has_value());
  auto whole = ParseHttpRequestHead("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\nextra");
  ASSERT_TRUE(whole.ok() && whole->has_value()) << whole.status();
  EXPECT_EQ((*whole)->method, "GET");
  EXPECT_EQ((*whole)->path, "/metrics");
  EXPECT_EQ((*whole)->target, "/metrics?x=1");
  EXPECT_EQ((*whole)->head_bytes, std::string("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").size());
  EXPECT_EQ((*whole)->Header("host"), "a");
  EXPECT_EQ((*whole)->Header("accept"), std::nullopt);
  auto headers = ParseHttpRequestHead("POST /v1 HTTP/1.1\r\nContent-Length:  12 \r\nX-A: 1\r\nx-a: 2\r\n\r\n");
  ASSERT_TRUE(headers.ok() && headers->has_value());
  EXPECT_EQ((*headers)->Header("content-length"), "12");  // names in lower case, values trimmed
  EXPECT_EQ((*headers)->Header("x-a"), "1");              // the first of repeated ones
  EXPECT_EQ((*headers)->headers.size(), 3u);
  for (const char* bad :
       {"\r\n\r\n", "GET\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n", "GET /m HTTP/2\r\n\r\n", "G(T /m HTTP/1.1\r\n\r\n",
        "GET /m HTTP/1.1\r\nno colon\r\n\r\n", "GET /m HTTP/1.1\r\n: empty\r\n\r\n", "GET /m\x01 HTTP/1.1\r\n\r\n"}) {
    EXPECT_EQ(ParseHttpRequestHead(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::string many = "GET /m HTTP/1.1\r\n";
  for (int i = 0; i <= kMaxRequestHeaders; ++i) many += "a: b\r\n";
  EXPECT_EQ(ParseHttpRequestHead(many + "\r\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHttpRequestHead(std::string(100, 'a'), 64).status().code(), absl::StatusCode::kResourceExhausted);
}

// The bind address is the one asked for: 127.0.0.2 answers, 127.0.0.1 does not.
TEST(MetricsServer, BindsTheAddressItIsGiven) {
  Registry r;
  auto server = MetricsServer::Start("127.0.0.2", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->host(), "127.0.0.2");
  EXPECT_TRUE(FetchMetrics("127.0.0.2", (*server)->port(), absl::Seconds(2)).ok());
  EXPECT_EQ(Connect("127.0.0.1", (*server)->port()), -1);
}

// --metrics_bind through the server runner every binary uses: default is --host, the
// flag moves /metrics alone.
TEST(MetricsBindFlag, ServerRunnerBindsMetricsWhereTheFlagSays) {
  {
    auto options = rpc::ServerOptionsFromFlags();
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->metrics_host, "");  // default: the gRPC host, as before
  }
  absl::SetFlag(&FLAGS_metrics_bind, "127.0.0.3");
  absl::SetFlag(&FLAGS_metrics_port, 0);
  auto options = rpc::ServerOptionsFromFlags();
  absl::SetFlag(&FLAGS_metrics_bind, "");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->metrics_host, "127.0.0.3");
  options->handle_signals = false;
  testing::EchoService::Service echo;  // a server needs a service; this one is never called
  rpc::ServerRunner runner(*options);
  runner.AddService(&echo);
  absl::Status started = runner.Start();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_GT(runner.metrics_port(), 0);
  EXPECT_TRUE(FetchMetrics("127.0.0.3", runner.metrics_port(), absl::Seconds(2)).ok());
  EXPECT_EQ(Connect("127.0.0.1", runner.metrics_port()), -1);
  runner.Shutdown();

  // Unset, /metrics binds the gRPC host.
  rpc::ServerOptions plain;
  plain.host = "127.0.0.1";
  plain.metrics_port = 0;
  rpc::ServerRunner loopback(plain);
  loopback.AddService(&echo);
  started = loopback.Start();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_TRUE(FetchMetrics("127.0.0.1", loopback.metrics_port(), absl::Seconds(2)).ok());
  loopback.Shutdown();
}

}  // namespace
}  // namespace rlfleet::metrics
