// ExperienceReader: what the buffer needs to know of one serialized v1::Experience to
// check it and place it (id, group, reward, versions, per-token counts), read without
// decoding or copying the packed token ids where it can (their varints are counted and
// checked for well-formedness where they lie; the other fields are parsed as a
// v1::ExperienceView), and by a full parse otherwise. Either way it accepts exactly the
// bytes v1::Experience parses.
//
// Not thread-safe: one per thread (it reuses its messages between calls).
#ifndef RLFLEET_SERVICES_BUFFER_EXPERIENCE_READER_H_
#define RLFLEET_SERVICES_BUFFER_EXPERIENCE_READER_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "rlfleet/v1/buffer.pb.h"

namespace rlfleet::buffer {

struct ExperienceFacts {
  bool parsed = false;  // false: the bytes are not a serialized Experience
  std::string id;
  std::string group_id;
  std::string prompt_id;
  bool has_reward = false;
  float reward = 0;
  uint64_t oldest_version = 0;  // min(token_policy_versions), 0 if none
  uint64_t newest_version = 0;  // max(token_policy_versions), 0 if none
  uint64_t response_tokens = 0;
  uint64_t response_logprobs = 0;
  uint64_t token_policy_versions = 0;
  uint64_t response_loss_mask = 0;
  bool has_remote_payload = false;
  v1::TransferDescriptor remote_payload;  // when has_remote_payload
  // The first number that is not finite (NaN or infinite), named with its field
  // ("response_logprobs[3] is nan"); empty when every float is finite.
  std::string non_finite;
};

class ExperienceReader {
 public:
  // Overwrites every field of `*facts`.
  void Read(absl::string_view bytes, ExperienceFacts* facts);
  // How many reads took the fast path (for tests).
  uint64_t fast_reads() const { return fast_reads_; }

 private:
  bool ReadView(absl::string_view bytes, ExperienceFacts* facts);
  void ReadFull(absl::string_view bytes, ExperienceFacts* facts);

  v1::ExperienceView view_;
  v1::Experience full_;
  std::string rest_;  // the fields other than the packed per-token ones
  uint64_t fast_reads_ = 0;
};

// Empty if `facts` describe a valid experience, else the reason naming the field: a
// malformed id, per-token counts that disagree, or a reward, reward component or
// response logprob that is not a finite number (NaN would turn every advantage of its
// group into NaN). (Rules that depend on the buffer's configuration are the caller's.)
std::string InvalidExperience(const ExperienceFacts& facts);

// The number of varints in `packed` (a packed repeated varint field's bytes); false if
// they are not well-formed (a varint longer than 10 bytes or cut off at the end).
bool CountPackedVarints(absl::string_view packed, uint64_t* count);

// The index of the first float in `packed` (a packed repeated float field's bytes,
// little-endian fixed32) that is NaN or infinite, or -1 if all are finite.
int64_t FirstNonFiniteFloat(absl::string_view packed);

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_EXPERIENCE_READER_H_
