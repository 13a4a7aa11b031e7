// The buffer's metrics read the core at each scrape: what a Put adds shows in the next
// rendering; the recovery count is what start-up gave.
#include "services/buffer/buffer_metrics.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "services/buffer/tests/test_experience.h"

namespace rlfleet::buffer {
namespace {

TEST(BufferMetrics, AScrapeReadsTheCoreAsItIsNow) {
  BufferCore core;
  metrics::Registry registry;
  RegisterBufferMetrics(&core, registry, /*recovery_skipped=*/3);
  std::string text = registry.Render();
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_buffer_recovery_skipped_records 3\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_buffer_accepted_total 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_buffer_dropped_total{reason=\"zero_variance\"} 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_buffer_sampled_total{staleness=\"7+\"} 0\n")) << text;
  v1::PutExperiencesRequest put;
  *put.add_experiences() = Exp("a", "g", 1.0f);
  *put.add_experiences() = Exp("b", "g", 0.0f);
  v1::PutExperiencesResponse out;
  ASSERT_TRUE(core.Put(put, &out).ok());
  text = registry.Render();
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_buffer_accepted_total 2\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_buffer_depth_experiences 2\n")) << text;
}

}  // namespace
}  // namespace rlfleet::buffer
