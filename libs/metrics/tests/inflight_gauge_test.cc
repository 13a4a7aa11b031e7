#include "libs/metrics/inflight_gauge.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace rlfleet::metrics {
namespace {

TEST(InflightGauge, InstancesAddTheirCountsToOneSeriesAndGiveThemBackWhenDestroyed) {
  Registry r;
  Gauge* series = r.AddGauge("queued", "Queued.", {});
  InflightGauge a("queued", "Queued.", r);
  {
    InflightGauge b("queued", "Queued.", r);
    a.Add(3);
    b.Add(4);
    b.Remove(1);
    EXPECT_EQ(a.value(), 3);
    EXPECT_EQ(b.value(), 3);
    EXPECT_EQ(series->value(), 6);
  }
  EXPECT_EQ(series->value(), 3);  // (b's work went with it)
  a.Set(10);
  EXPECT_EQ(series->value(), 10);
  a.Set(0);
  EXPECT_EQ(series->value(), 0);
  EXPECT_EQ(a.underflows(), 0);
  EXPECT_EQ(InflightGauge::UnderflowsOf("queued", r), 0);
}

TEST(InflightGauge, ARemoveBelowZeroStopsAtZeroAndIsCounted) {
  Registry r;
  InflightGauge g("open_streams", "Open.", r);
  g.Add(2);
  g.Remove(5);  // three more than were added: a path that retired work twice
  EXPECT_EQ(g.value(), 0);
  EXPECT_EQ(g.underflows(), 1);
  EXPECT_EQ(InflightGauge::UnderflowsOf("open_streams", r), 1);
  const std::string text = r.Render();
  EXPECT_TRUE(absl::StrContains(text, "open_streams 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_inflight_underflows_total{gauge=\"open_streams\"} 1\n")) << text;
  g.Add(1);
  g.Remove(1);
  EXPECT_EQ(g.underflows(), 1);  // paired: nothing new
}

}  // namespace
}  // namespace rlfleet::metrics
