// libFuzzer harness: the buffer's ExperienceReader over arbitrary bytes. Its contract:
// it accepts exactly the bytes v1::Experience parses, and its fast path agrees with a
// full parse on every fact it reports.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rlfleet/v1/common.pb.h"
#include "services/buffer/experience_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* reader = new rlfleet::buffer::ExperienceReader();
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  rlfleet::buffer::ExperienceFacts facts;
  reader->Read(bytes, &facts);
  rlfleet::v1::Experience full;
  const bool parses = full.ParseFromArray(data, static_cast<int>(size));
  if (facts.parsed != parses) std::abort();
  if (!parses) return 0;
  if (facts.id != full.experience_id().value() || facts.group_id != full.group_id()) std::abort();
  if (facts.prompt_id != full.prompt_id() || facts.has_reward != full.has_reward()) std::abort();
  if (facts.response_tokens != static_cast<uint64_t>(full.response_token_ids_size())) std::abort();
  if (facts.response_logprobs != static_cast<uint64_t>(full.response_logprobs_size())) std::abort();
  if (facts.token_policy_versions != static_cast<uint64_t>(full.token_policy_versions_size())) std::abort();
  if (facts.has_remote_payload != full.has_remote_payload()) std::abort();
  if (full.token_policy_versions_size() > 0) {
    uint64_t lo = ~uint64_t{0}, hi = 0;
    for (uint64_t v : full.token_policy_versions()) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (facts.oldest_version != lo || facts.newest_version != hi) std::abort();
  }
  (void)rlfleet::buffer::InvalidExperience(facts);
  return 0;
}
