// libFuzzer harness: the NCCL_DEBUG=INFO log reader and its report, over arbitrary text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "libs/nccl_tuning/nccl_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view log(reinterpret_cast<const char*>(data), size);
  const rlfleet::nccl::NcclLogSummary summary = rlfleet::nccl::ParseNcclLog(log);
  if (summary.nccl_lines < 0 || summary.gdr_connections < 0) std::abort();
  (void)rlfleet::nccl::FormatNcclLogSummary(summary, /*json=*/false);
  (void)rlfleet::nccl::FormatNcclLogSummary(summary, /*json=*/true);
  return 0;
}
