// What the rollout's requests are checked against before anything runs, each field in
// its own type first (rollout_core.cc's Generate and GenerateBatch use these).
#ifndef RLFLEET_SERVICES_ROLLOUT_ROLLOUT_REQUESTS_H_
#define RLFLEET_SERVICES_ROLLOUT_ROLLOUT_REQUESTS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_field.h"
#include "libs/model/policy.h"
#include "rlfleet/v1/common.pb.h"
#include "services/rollout/rollout_core.h"

namespace rlfleet::rollout {

// Every field of SamplingParams, range-checked in its own type before any cast (a
// uint32 of 2^31 or more is no negative int here; NaN fails every range), as the
// scheduler's options; *seed: the request's seed, or a random one.
absl::StatusOr<model::SamplingOptions> ToOptions(const v1::SamplingParams& sp, const RolloutLimits& limits,
                                                 const model::PolicyConfig& config, uint64_t* seed);

// Strings copied into every Experience: bounded (INVALID_ARGUMENT naming `field`).
absl::Status CheckCopied(absl::string_view field, const std::string& value);

// A prompt's token ids: not empty, in the vocabulary, and with `max_new` tokens within
// max_seq_len (INVALID_ARGUMENT naming `field`).
absl::Status CheckPrompt(const google::protobuf::RepeatedField<int32_t>& ids, const std::string& field, int max_new,
                         const model::PolicyConfig& config);

// `num_samples` of a request, in its own type first: 0 = 1, at most `most`.
absl::StatusOr<int> Samples(uint32_t num_samples, int most);

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_ROLLOUT_REQUESTS_H_
