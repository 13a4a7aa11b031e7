// The buffer's Prometheus metrics: its stats (depth, complete groups, bytes, accepted,
// consumed, dropped by reason, sampled by staleness) read from the core at every
// scrape, and the records recovery skipped at start.
#ifndef RLFLEET_SERVICES_BUFFER_BUFFER_METRICS_H_
#define RLFLEET_SERVICES_BUFFER_BUFFER_METRICS_H_

#include <cstddef>

#include "libs/metrics/metrics.h"
#include "services/buffer/buffer_core.h"

namespace rlfleet::buffer {

// Adds them to `registry`; `core` (not owned) must outlive every scrape.
void RegisterBufferMetrics(BufferCore* core, metrics::Registry& registry, size_t recovery_skipped);

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_BUFFER_METRICS_H_
