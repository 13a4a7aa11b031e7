#include "services/buffer/buffer_metrics.h"

#include <string>

namespace rlfleet::buffer {

void RegisterBufferMetrics(BufferCore* core, metrics::Registry& registry, size_t recovery_skipped) {
  auto stat = [core](auto field) {
    return [core, field] {
      v1::GetStatsResponse s;
      return core->GetStats(&s).ok() ? static_cast<double>(field(s)) : 0.0;
    };
  };
  const double skipped_count = static_cast<double>(recovery_skipped);
  registry.AddCallbackGauge("rlfleet_buffer_recovery_skipped_records",
                            "Stored records left out at start-up because they did not load (logged by key).", {},
                            [skipped_count] { return skipped_count; });
  using Stats = v1::GetStatsResponse;
  registry.AddCallbackGauge("rlfleet_buffer_depth_experiences", "Experiences held and not leased.", {},
                            stat([](const Stats& s) { return s.depth_experiences(); }));
  registry.AddCallbackGauge("rlfleet_buffer_complete_groups", "Groups ready to sample.", {},
                            stat([](const Stats& s) { return s.complete_groups(); }));
  registry.AddCallbackGauge("rlfleet_buffer_bytes", "Bytes held, including leased.", {},
                            stat([](const Stats& s) { return s.buffer_bytes(); }));
  registry.AddCallbackCounter("rlfleet_buffer_accepted_total", "Experiences accepted.", {},
                              stat([](const Stats& s) { return s.accepted_total(); }));
  registry.AddCallbackCounter("rlfleet_buffer_consumed_total", "Experiences acked by the trainer.", {},
                              stat([](const Stats& s) { return s.consumed_total(); }));
  registry.AddCallbackCounter("rlfleet_buffer_dropped_total", "Experiences dropped, by reason.", {{"reason", "stale"}},
                              stat([](const Stats& s) { return s.dropped().stale(); }));
  registry.AddCallbackCounter("rlfleet_buffer_dropped_total", "Experiences dropped, by reason.",
                              {{"reason", "zero_variance"}},
                              stat([](const Stats& s) { return s.dropped().zero_variance(); }));
  registry.AddCallbackCounter("rlfleet_buffer_dropped_total", "Experiences dropped, by reason.",
                              {{"reason", "duplicate"}}, stat([](const Stats& s) { return s.dropped().duplicate(); }));
  // The staleness distribution of what the trainer sampled: policy versions behind at
  // sampling time (the last bucket counts that many or more).
  for (uint64_t lag = 0; lag < 8; ++lag) {
    registry.AddCallbackCounter("rlfleet_buffer_sampled_total", "Experiences sampled, by staleness in versions.",
                                {{"staleness", lag == 7 ? "7+" : std::to_string(lag)}},
                                stat([lag](const Stats& s) -> uint64_t {
                                  for (const auto& b : s.staleness_histogram()) {
                                    if (b.staleness() == lag) return b.count();
                                  }
                                  return 0;
                                }));
  }
}

}  // namespace rlfleet::buffer
