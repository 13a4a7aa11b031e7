#include "services/rollout/rollout_requests.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "libs/common/checks.h"
#include "libs/common/status_macros.h"

namespace rlfleet::rollout {
namespace {

constexpr double kMaxTemperature = 100;
constexpr uint32_t kMaxTopK = 1 << 20;
constexpr size_t kMaxCopiedBytes = 256;

}  // namespace

absl::StatusOr<model::SamplingOptions> ToOptions(const v1::SamplingParams& sp, const RolloutLimits& limits,
                                                 const model::PolicyConfig& config, uint64_t* seed) {
  model::SamplingOptions o;
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("sampling.max_new_tokens", sp.max_new_tokens(), 0,
                                                 static_cast<uint32_t>(limits.max_new_tokens)));
  o.max_new_tokens = sp.max_new_tokens() == 0 ? 48 : static_cast<int>(sp.max_new_tokens());
  if (o.max_new_tokens > limits.max_new_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_new_tokens ", o.max_new_tokens, " exceeds the limit of ", limits.max_new_tokens));
  }
  RETURN_IF_ERROR(common::CheckFiniteInRange("sampling.temperature", sp.temperature(), 0, kMaxTemperature));
  RETURN_IF_ERROR(common::CheckFiniteInRange("sampling.top_p", sp.top_p(), 0, 1));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("sampling.top_k", sp.top_k(), 0, kMaxTopK));
  if (sp.stop_token_ids_size() > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop_token_ids has ", sp.stop_token_ids_size(), " entries; the limit is 16"));
  }
  for (int i = 0; i < sp.stop_token_ids_size(); ++i) {
    RETURN_IF_ERROR(common::CheckInRange<int32_t>(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                                                  sp.stop_token_ids(i), 0, config.vocab_size - 1));
  }
  o.temperature = sp.temperature();
  // (more than the vocabulary keeps every token, as 0 does)
  o.top_k = static_cast<int>(std::min<uint32_t>(sp.top_k(), static_cast<uint32_t>(config.vocab_size)));
  o.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  o.stop_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
  o.eos_id = -1;
  if (!sp.ignore_eos()) {
    for (size_t i = 0; i < limits.eos_ids.size(); ++i) {
      if (i == 0) {
        o.eos_id = limits.eos_ids[0];
      } else {
        o.stop_ids.push_back(limits.eos_ids[i]);
      }
    }
  }
  *seed = sp.has_seed() ? sp.seed() : absl::Uniform<uint64_t>(absl::BitGen());
  return o;
}

absl::Status CheckCopied(absl::string_view field, const std::string& value) {
  if (value.size() <= kMaxCopiedBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(), " bytes; at most ", kMaxCopiedBytes));
}

absl::Status CheckPrompt(const google::protobuf::RepeatedField<int32_t>& ids, const std::string& field, int max_new,
                         const model::PolicyConfig& config) {
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", ids[i], " is outside the vocabulary of ", config.vocab_size));
    }
  }
  if (ids.size() + max_new > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", ids.size(), " tokens; with max_new_tokens ", max_new,
                                                   " that exceeds max_seq_len ", config.max_seq_len));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Samples(uint32_t num_samples, int most) {
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("num_samples", num_samples, 0, static_cast<uint32_t>(most)));
  return num_samples == 0 ? 1 : static_cast<int>(num_samples);
}

}  // namespace rlfleet::rollout
