// libFuzzer harness: the safetensors parser (8-byte header length, JSON header,
// offsets into the file) over arbitrary bytes. Every parse must end in OK or
// DATA_LOSS, and every view of an OK parse must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "libs/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto views = rlfleet::model::ParseSafetensorsViews(bytes, "fuzz");
  if (!views.ok()) {
    if (views.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  for (const auto& [name, view] : *views) {
    if (view.bytes.data() < bytes.data() || view.bytes.data() + view.bytes.size() > bytes.data() + bytes.size()) {
      std::abort();
    }
  }
  auto header = rlfleet::model::ParseSafetensorsHeader(bytes, "fuzz");
  if (!header.ok() || header->size() != views->size()) std::abort();
  // What parses serialises back to an image that parses to the same tensors.
  const std::string again = rlfleet::model::SerializeSafetensors(*views);
  auto reparsed = rlfleet::model::ParseSafetensorsViews(again, "again");
  if (!reparsed.ok() || reparsed->size() != views->size()) std::abort();
  return 0;
}
