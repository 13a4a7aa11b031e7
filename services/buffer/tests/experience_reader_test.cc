// ExperienceReader must accept exactly the bytes v1::Experience parses and read the same
// facts from them, whether it took the view (packed token ids counted, not decoded) or
// the full parse: checked on random experiences, on random corruptions of them, and on
// encodings a producer may legally choose (unpacked, split packed fields).
#include "services/buffer/experience_reader.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"

namespace rlfleet::buffer {
namespace {

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

// The bytewise definition the word-at-a-time counter must agree with.
bool ReferenceCount(const std::string& b, uint64_t* count) {
  uint64_t n = 0;
  int run = 0;
  for (unsigned char c : b) {
    if (c & 0x80) {
      if (++run >= 10) return false;
    } else {
      run = 0;
      ++n;
    }
  }
  if (run != 0) return false;
  *count = n;
  return true;
}

TEST(CountPackedVarints, CountsWellFormedVarintsOfEveryLength) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 5000; ++trial) {
    std::string packed;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const int bits = static_cast<int>(rng() % 65);
      packed += Varint(bits == 64 ? rng() : rng() & ((uint64_t{1} << bits) - 1));
    }
    uint64_t count = 0;
    ASSERT_TRUE(CountPackedVarints(packed, &count)) << trial;
    EXPECT_EQ(count, static_cast<uint64_t>(n));
  }
  uint64_t count = 0;
  EXPECT_TRUE(CountPackedVarints(std::string(9, '\x80') + '\x01', &count));  // 10 bytes: the longest
  EXPECT_EQ(count, 1u);
  EXPECT_FALSE(CountPackedVarints(std::string(10, '\x80') + '\x01', &count));  // 11 bytes
  EXPECT_FALSE(CountPackedVarints(std::string("\x05\x81", 2), &count));        // cut off
}

TEST(CountPackedVarints, AgreesWithTheBytewiseDefinitionOnRandomBytes) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 20000; ++trial) {
    const int len = static_cast<int>(rng() % 70);
    const int high_percent = static_cast<int>(rng() % 101);  // from all-ends to all-continuations
    std::string b(len, '\0');
    for (char& c : b)
      c = static_cast<char>((rng() % 100 < static_cast<uint64_t>(high_percent) ? 0x80 : 0) | (rng() & 0x7f));
    uint64_t want = 0, got = 0;
    const bool ok = ReferenceCount(b, &want);
    ASSERT_EQ(CountPackedVarints(b, &got), ok) << trial;
    if (ok) {
      ASSERT_EQ(got, want) << trial;
    }
  }
}

v1::Experience RandomExperience(std::mt19937_64& rng) {
  v1::Experience e;
  e.mutable_experience_id()->set_value("exp-" + std::to_string(rng() % 100000));
  if (rng() % 2) e.set_group_id("g" + std::to_string(rng() % 10));
  if (rng() % 2) e.set_prompt_id("p" + std::to_string(rng() % 10));
  e.set_task("reverse");
  const int n = static_cast<int>(rng() % 40);
  for (int i = 0; i < n; ++i)
    e.add_response_token_ids(static_cast<int32_t>(rng() % 3 == 0 ? -(rng() % 5) : rng() % 70000));
  for (int i = 0; i < static_cast<int>(rng() % 6); ++i) e.add_prompt_token_ids(static_cast<int32_t>(rng() % 300));
  if (rng() % 2) {
    for (int i = 0; i < n + static_cast<int>(rng() % 2); ++i) e.add_response_logprobs(-0.01f * i);
  }
  if (rng() % 2) {
    for (int i = 0; i < n; ++i) e.add_token_policy_versions(rng() % 5 + (rng() % 7 == 0 ? (uint64_t{1} << 40) : 0));
  }
  if (rng() % 4) e.set_reward(static_cast<float>(rng() % 3) - 1.0f);
  if (rng() % 3 == 0) (*e.mutable_reward_components())["exact"] = 1.0f;
  if (rng() % 3 == 0) {
    for (int i = 0; i < e.response_token_ids_size(); ++i) e.add_response_loss_mask(rng() % 2 == 0);
  }
  return e;
}

void ExpectSameAsFullParse(const std::string& bytes, ExperienceReader& reader, const std::string& what) {
  ExperienceFacts f;
  reader.Read(bytes, &f);
  v1::Experience full;
  const bool parses = full.ParseFromString(bytes);
  ASSERT_EQ(f.parsed, parses) << what;
  if (!parses) return;
  EXPECT_EQ(f.id, full.experience_id().value()) << what;
  EXPECT_EQ(f.group_id, full.group_id()) << what;
  EXPECT_EQ(f.prompt_id, full.prompt_id()) << what;
  EXPECT_EQ(f.has_reward, full.has_reward()) << what;
  if (full.has_reward()) EXPECT_EQ(f.reward, full.reward()) << what;
  EXPECT_EQ(f.response_tokens, static_cast<uint64_t>(full.response_token_ids_size())) << what;
  EXPECT_EQ(f.response_logprobs, static_cast<uint64_t>(full.response_logprobs_size())) << what;
  EXPECT_EQ(f.token_policy_versions, static_cast<uint64_t>(full.token_policy_versions_size())) << what;
  uint64_t lo = 0, hi = 0;
  if (!full.token_policy_versions().empty()) {
    lo = *std::min_element(full.token_policy_versions().begin(), full.token_policy_versions().end());
    hi = *std::max_element(full.token_policy_versions().begin(), full.token_policy_versions().end());
  }
  EXPECT_EQ(f.oldest_version, lo) << what;
  EXPECT_EQ(f.newest_version, hi) << what;
  EXPECT_EQ(f.has_remote_payload, full.has_remote_payload()) << what;
  EXPECT_EQ(f.response_loss_mask, static_cast<uint64_t>(full.response_loss_mask_size())) << what;
}

TEST(ExperienceReader, ReadsWhatTheFullParseReadsOnRandomAndCorruptedBytes) {
  std::mt19937_64 rng(3);
  ExperienceReader reader;
  int rejected = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const std::string bytes = RandomExperience(rng).SerializeAsString();
    const uint64_t fast_before = reader.fast_reads();
    ExpectSameAsFullParse(bytes, reader, "valid #" + std::to_string(trial));
    ASSERT_EQ(reader.fast_reads(), fast_before + 1) << "a valid experience did not take the fast path";
    // Corruptions: a flipped byte, a truncation, a random insertion.
    std::string flipped = bytes;
    if (!flipped.empty()) flipped[rng() % flipped.size()] ^= static_cast<char>(1 + rng() % 255);
    std::string cut = bytes.substr(0, bytes.empty() ? 0 : rng() % bytes.size());
    std::string inserted = bytes;
    inserted.insert(rng() % (bytes.size() + 1), 1, static_cast<char>(rng()));
    for (const std::string& bad : {flipped, cut, inserted}) {
      ExpectSameAsFullParse(bad, reader, "corrupted #" + std::to_string(trial));
      v1::Experience e;
      rejected += e.ParseFromString(bad) ? 0 : 1;
    }
  }
  EXPECT_GT(rejected, 1000);  // the corruptions did exercise the rejecting paths
}

// Legal encodings a producer may choose: per-token fields unpacked (one tag per
// element) and a packed field split over two occurrences. Both read as the full parse.
TEST(ExperienceReader, UnpackedAndSplitPackedFieldsCountEveryToken) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    v1::ExperienceId id;
    id.set_value("x");
    out.WriteTag(1 << 3 | 2);
    out.WriteVarint32(id.ByteSizeLong());
    id.SerializeToCodedStream(&out);
    for (int v : {5, 300, 70000}) {  // field 6 unpacked
      out.WriteTag(6 << 3 | 0);
      out.WriteVarint32(v);
    }
    for (int chunk = 0; chunk < 2; ++chunk) {  // field 6 packed, twice
      const std::string packed = Varint(1) + Varint(2);
      out.WriteTag(6 << 3 | 2);
      out.WriteVarint32(packed.size());
      out.WriteRaw(packed.data(), packed.size());
    }
    out.WriteTag(9 << 3 | 5);
    out.WriteLittleEndian32(0x3f800000);  // reward 1.0
  }
  ExperienceReader reader;
  ExperienceFacts f;
  reader.Read(bytes, &f);
  ASSERT_TRUE(f.parsed);
  EXPECT_EQ(f.response_tokens, 7u);
  EXPECT_TRUE(f.has_reward);
  ExpectSameAsFullParse(bytes, reader, "unpacked + split");

  // Only split packed occurrences (no unknown fields: the view reads it).
  v1::Experience e;
  e.mutable_experience_id()->set_value("y");
  e.add_response_token_ids(1);
  std::string split = e.SerializeAsString() + e.SerializeAsString().substr(e.experience_id().ByteSizeLong() + 2);
  reader.Read(split, &f);
  EXPECT_EQ(f.response_tokens, 2u);
  ExpectSameAsFullParse(split, reader, "split packed");
}

TEST(InvalidExperience, NamesTheField) {
  ExperienceFacts f;
  EXPECT_EQ(InvalidExperience(f), "not a serialized Experience");
  f.parsed = true;
  f.id = "a";
  EXPECT_EQ(InvalidExperience(f), "response_token_ids: empty");
  f.response_tokens = 3;
  f.response_logprobs = 2;
  EXPECT_EQ(InvalidExperience(f), "response_logprobs: 2 entries, want 3");
  f.response_logprobs = 3;
  f.token_policy_versions = 1;
  EXPECT_EQ(InvalidExperience(f), "token_policy_versions: 1 entries, want 3");
  f.token_policy_versions = 0;
  EXPECT_EQ(InvalidExperience(f), "");
  f.response_loss_mask = 2;
  EXPECT_EQ(InvalidExperience(f), "response_loss_mask: 2 entries, want 0 or 3");
  f.response_loss_mask = 3;
  EXPECT_EQ(InvalidExperience(f), "");
}

// NaN passes every `< 0` check: a reward, reward component or logprob that is not a
// finite number is refused naming the field and the index, on the fast path and on
// the full parse alike.
TEST(InvalidExperience, NonFiniteNumbersAreNamed) {
  auto base = [] {
    v1::Experience e;
    e.mutable_experience_id()->set_value("x");
    e.set_reward(1);
    for (int i = 0; i < 4; ++i) {
      e.add_response_token_ids(5);
      e.add_response_logprobs(-0.5f);
    }
    return e;
  };
  ExperienceReader reader;
  ExperienceFacts f;
  auto why = [&](const std::string& bytes) {
    reader.Read(bytes, &f);
    return InvalidExperience(f);
  };
  v1::Experience e = base();
  EXPECT_EQ(why(e.SerializeAsString()), "");
  e.set_reward(std::nanf(""));
  EXPECT_EQ(why(e.SerializeAsString()), "reward is nan; it must be a finite number");
  e = base();
  (*e.mutable_reward_components())["partial"] = -INFINITY;
  EXPECT_EQ(why(e.SerializeAsString()), "reward_components[\"partial\"] is -inf; it must be a finite number");
  e = base();
  e.set_response_logprobs(2, std::nanf(""));
  const uint64_t fast = reader.fast_reads();
  EXPECT_EQ(why(e.SerializeAsString()), "response_logprobs[2] is nan; it must be a finite number");
  EXPECT_EQ(reader.fast_reads(), fast + 1);
  // The same logprobs sent unpacked (one fixed32 field each) take the full parse.
  v1::Experience no_logprobs = base();
  no_logprobs.clear_response_logprobs();
  std::string unpacked = no_logprobs.SerializeAsString();
  for (float v : {-0.5f, -0.5f, INFINITY, -0.5f}) {
    unpacked.push_back(static_cast<char>((7 << 3) | 5));
    char bytes[4];
    std::memcpy(bytes, &v, 4);
    unpacked.append(bytes, 4);
  }
  EXPECT_EQ(why(unpacked), "response_logprobs[2] is inf; it must be a finite number");
  EXPECT_EQ(reader.fast_reads(), fast + 1);
}

}  // namespace
}  // namespace rlfleet::buffer
