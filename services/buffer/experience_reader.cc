#include "services/buffer/experience_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "libs/common/ids.h"
#include "services/buffer/varint.h"

namespace rlfleet::buffer {
namespace {

template <typename Container>
void Versions(const Container& versions, ExperienceFacts* facts) {
  facts->token_policy_versions = versions.size();
  if (versions.empty()) return;
  const auto [lo, hi] = std::minmax_element(versions.begin(), versions.end());
  facts->oldest_version = *lo;
  facts->newest_version = *hi;
}

template <typename Message>
void Common(const Message& m, ExperienceFacts* facts) {
  facts->parsed = true;
  facts->id = m.experience_id().value();
  facts->group_id = m.group_id();
  facts->prompt_id = m.prompt_id();
  facts->has_reward = m.has_reward();
  facts->reward = m.reward();
  Versions(m.token_policy_versions(), facts);
  facts->response_loss_mask = m.response_loss_mask_size();
  facts->has_remote_payload = m.has_remote_payload();
  if (facts->has_remote_payload) facts->remote_payload = m.remote_payload();
  if (m.has_reward() && !std::isfinite(m.reward())) {
    facts->non_finite = absl::StrCat("reward is ", m.reward());
    return;
  }
  for (const auto& [name, value] : m.reward_components()) {
    if (!std::isfinite(value)) {
      facts->non_finite = absl::StrCat("reward_components[\"", absl::CHexEscape(name.substr(0, 64)), "\"] is ", value);
      return;
    }
  }
}

// Notes the first non-finite logprob (at `index` within the field) unless an earlier
// field already was.
void NonFiniteLogprob(int64_t index, float value, ExperienceFacts* facts) {
  if (index < 0 || !facts->non_finite.empty()) return;
  facts->non_finite = absl::StrCat("response_logprobs[", index, "] is ", value);
}

}  // namespace

bool CountPackedVarints(absl::string_view packed, uint64_t* count) {
  // A varint is up to 9 bytes with the high bit set, then one without. Eight bytes at a
  // time: the bytes that end a varint are those whose high bit is clear.
  const char* p = packed.data();
  const size_t n = packed.size();
  uint64_t total = 0;
  int run = 0;  // high-bit bytes since the last end
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    const uint64_t ends = ~w & 0x8080808080808080ull;
    if (ends == 0) {
      run += 8;
      if (run > 9) return false;
      continue;
    }
    if (run + __builtin_ctzll(ends) / 8 > 9) return false;  // (bytes before the first end)
    total += ((ends >> 7) * 0x0101010101010101ull) >> 56;   // (popcount of one bit per byte, without POPCNT)
    run = 7 - (63 - __builtin_clzll(ends)) / 8;             // bytes after the last end (runs inside are < 8)
  }
  for (; i < n; ++i) {
    if (static_cast<uint8_t>(p[i]) & 0x80) {
      if (++run > 9) return false;
    } else {
      run = 0;
      ++total;
    }
  }
  if (run != 0) return false;
  *count += total;
  return true;
}

int64_t FirstNonFiniteFloat(absl::string_view packed) {
  const size_t n = packed.size() / 4;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, packed.data() + 4 * i, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) return static_cast<int64_t>(i);  // exponent all ones: inf or NaN
  }
  return -1;
}

void ExperienceReader::Read(absl::string_view bytes, ExperienceFacts* facts) {
  *facts = ExperienceFacts();
  if (ReadView(bytes, facts)) {
    ++fast_reads_;
    return;
  }
  *facts = ExperienceFacts();
  ReadFull(bytes, facts);
}

bool ExperienceReader::ReadView(absl::string_view bytes, ExperienceFacts* facts) {
  // Walks the top-level fields: the packed per-token fields (5, 6, 7) are counted and
  // checked where they lie; every other field is copied (a few dozen bytes) for
  // v1::ExperienceView to parse, so protobuf checks them as it would in an Experience.
  // Anything unusual (malformed framing, groups, per-token fields not packed, unknown
  // fields) goes to the full parse, which decides.
  rest_.clear();
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* const end = p + bytes.size();
  uint64_t prompt_tokens = 0;
  int64_t first_bad_logprob = -1;
  float first_bad_value = 0;
  while (p < end) {
    const uint8_t* const field = p;
    uint64_t tag = 0;
    if (!ReadVarint(&p, end, &tag) || tag > 0xffffffffu || (tag >> 3) == 0) return false;
    const uint64_t number = tag >> 3;
    switch (tag & 7) {
      case 0: {
        uint64_t ignored;
        if (!ReadVarint(&p, end, &ignored)) return false;
        break;
      }
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      case 2: {
        uint64_t length = 0;
        if (!ReadVarint(&p, end, &length) || length > static_cast<uint64_t>(end - p)) return false;
        const absl::string_view value(reinterpret_cast<const char*>(p), length);
        p += length;
        if (number == 5 || number == 6) {
          if (!CountPackedVarints(value, number == 6 ? &facts->response_tokens : &prompt_tokens)) return false;
          continue;
        }
        if (number == 7) {
          if (length % 4 != 0) return false;
          if (const int64_t bad = FirstNonFiniteFloat(value); bad >= 0 && first_bad_logprob < 0) {
            first_bad_logprob = static_cast<int64_t>(facts->response_logprobs) + bad;
            std::memcpy(&first_bad_value, value.data() + 4 * bad, 4);
          }
          facts->response_logprobs += length / 4;
          continue;
        }
        break;
      }
      default:
        return false;
    }
    if (number >= 5 && number <= 7) return false;  // (sent unpacked)
    rest_.append(reinterpret_cast<const char*>(field), p - field);
  }
  if (!view_.ParseFromString(rest_)) return false;
  if (!view_.GetReflection()->GetUnknownFields(view_).empty()) return false;
  Common(view_, facts);
  NonFiniteLogprob(first_bad_logprob, first_bad_value, facts);
  return true;
}

void ExperienceReader::ReadFull(absl::string_view bytes, ExperienceFacts* facts) {
  if (!full_.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  Common(full_, facts);
  facts->response_tokens = full_.response_token_ids_size();
  facts->response_logprobs = full_.response_logprobs_size();
  for (int i = 0; i < full_.response_logprobs_size(); ++i) {
    if (!std::isfinite(full_.response_logprobs(i))) {
      NonFiniteLogprob(i, full_.response_logprobs(i), facts);
      break;
    }
  }
}

std::string InvalidExperience(const ExperienceFacts& f) {
  if (!f.parsed) return "not a serialized Experience";
  if (absl::Status s = common::ValidateId("experience_id", f.id); !s.ok()) return std::string(s.message());
  if (f.has_remote_payload) return "";  // (the rest is checked on the fetched bytes)
  if (f.response_tokens == 0) return "response_token_ids: empty";
  const uint64_t n = f.response_tokens;
  if (f.response_logprobs != 0 && f.response_logprobs != n) {
    return absl::StrCat("response_logprobs: ", f.response_logprobs, " entries, want ", n);
  }
  if (f.token_policy_versions != 0 && f.token_policy_versions != n) {
    return absl::StrCat("token_policy_versions: ", f.token_policy_versions, " entries, want ", n);
  }
  if (f.response_loss_mask != 0 && f.response_loss_mask != n) {
    return absl::StrCat("response_loss_mask: ", f.response_loss_mask, " entries, want 0 or ", n);
  }
  if (!f.non_finite.empty()) return absl::StrCat(f.non_finite, "; it must be a finite number");
  return "";
}

}  // namespace rlfleet::buffer
