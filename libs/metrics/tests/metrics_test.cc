#include "libs/metrics/metrics.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/metrics/http_server.h"

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
  for (const char* want : {"# HELP x_total Things.\n# TYPE x_total counter\n",
                           "x_total{kind=\"a\\\"b\"} 3\n",
                           "x_total{kind=\"c\"} 0.5\n",
                           "# TYPE depth gauge\ndepth 5\n",
                           "read_at_scrape 42\n",
                           "unix_time 1764554823.125\n",
                           "# TYPE latency_seconds histogram\n",
                           "latency_seconds_bucket{op=\"put\",le=\"0.1\"} 2\n",
                           "latency_seconds_bucket{op=\"put\",le=\"1\"} 3\n",
                           "latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 4\n",
                           "latency_seconds_sum{op=\"put\"} 3.65\n",
                           "latency_seconds_count{op=\"put\"} 4\n"}) {
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
  EXPECT_EQ(MetricsServer::Start("127.0.0.1", (*server)->port(), &r).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(MetricsServer::Start("not-an-ip", 0, &r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::metrics
