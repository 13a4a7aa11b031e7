// Experiences sent by descriptor (remote_payload): the buffer fetches them from a file
// or from the producer's registered memory (loopback transport here; UCX in the
// service), checks the digest and that it is the experience it claims to be, and
// rejects every bad descriptor with a message naming the problem.
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "services/buffer/buffer_core.h"

namespace rlfleet::buffer {
namespace {

v1::Experience Full(const std::string& id) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  e.set_group_id("g-" + id);
  e.set_task("reverse");
  for (int t = 0; t < 3000; ++t) {  // a large response: why it travels by descriptor
    e.add_response_token_ids(4 + t % 20);
    e.add_response_logprobs(-0.5f);
    e.add_token_policy_versions(1);
  }
  e.set_reward(1.0f);
  return e;
}

// The experience as sent: its id and the descriptor only.
v1::Experience Sent(const std::string& id, const v1::TransferDescriptor& where) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  *e.mutable_remote_payload() = where;
  return e;
}

v1::PutExperiencesRequest Request(std::vector<v1::Experience> experiences) {
  v1::PutExperiencesRequest r;
  for (auto& e : experiences) *r.add_experiences() = std::move(e);
  return r;
}

TEST(RemotePayload, FromAFileWithItsDigestAndEveryBadDescriptorRejectedByName) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/payloads.bin";
  const std::string bytes = Full("e1").SerializeAsString();
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string(100, 'x') << bytes;  // at offset 100
  }
  v1::TransferDescriptor good;
  good.mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
  good.mutable_segment()->set_worker_address(path);
  good.set_offset_bytes(100);
  good.set_length_bytes(bytes.size());
  good.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  good.mutable_digest()->set_value(common::Xxh64(bytes));

  BufferCore core;
  transport::DescriptorFetcher::Options options;
  options.file_root = std::getenv("TEST_TMPDIR");
  transport::DescriptorFetcher fetcher(nullptr, options);
  // Without a fetcher: rejected, saying so.
  v1::PutExperiencesResponse none;
  ASSERT_TRUE(core.Put(Request({Sent("e1", good)}), &none).ok());
  ASSERT_EQ(none.rejections_size(), 1);
  EXPECT_TRUE(absl::StrContains(none.rejections(0).message(), "remote_payload: this buffer fetches no payloads"));
  core.SetPayloadFetcher(&fetcher);

  auto bad = [&](auto edit) {
    v1::TransferDescriptor d = good;
    edit(d);
    return d;
  };
  struct Case {
    v1::TransferDescriptor d;
    std::string id;
    std::string want;
  };
  std::vector<Case> cases = {
      {bad([](auto& d) { d.mutable_digest()->set_value(d.digest().value() ^ 1); }), "e1", "digest: the"},
      {bad([](auto& d) { d.clear_digest(); }), "e1", "digest: required"},
      {bad([](auto& d) { d.set_length_bytes(0); }), "e1", "length_bytes: 0"},
      {bad([](auto& d) { d.set_length_bytes(uint64_t{1} << 40); }), "e1", "exceeds the limit"},
      {bad([](auto& d) { d.set_offset_bytes(1 << 20); }), "e1", "offset_bytes + length_bytes: past the end"},
      {bad([](auto& d) { d.mutable_segment()->set_backend(v1::TRANSFER_BACKEND_NCCL); }), "e1",
       "TRANSFER_BACKEND_NCCL is not one the buffer fetches from"},
      {bad([](auto& d) { d.mutable_segment()->set_backend(v1::TRANSFER_BACKEND_UCX); }), "e1",
       "no data-plane transport"},
      {bad([](auto& d) { d.mutable_segment()->set_worker_address("/nonexistent"); }), "e1",
       "is outside the configured root"},
      {bad([](auto& d) { d.mutable_segment()->set_worker_address("/etc/hostname"); }), "e1",
       "is outside the configured root"},
      {bad([&](auto& d) { d.mutable_segment()->set_worker_address(path + "/../../../etc/hostname"); }), "e1",
       "is outside the configured root"},
      {good, "e2", "the fetched experience is `e1`, not `e2`"},
  };
  for (const Case& c : cases) {
    v1::PutExperiencesResponse r;
    ASSERT_TRUE(core.Put(Request({Sent(c.id, c.d)}), &r).ok());
    ASSERT_EQ(r.rejections_size(), 1) << c.want;
    EXPECT_EQ(r.rejections(0).reason(), v1::REJECT_REASON_INVALID);
    EXPECT_TRUE(absl::StartsWith(r.rejections(0).message(), "remote_payload: ")) << r.rejections(0).message();
    EXPECT_TRUE(absl::StrContains(r.rejections(0).message(), c.want)) << r.rejections(0).message();
    EXPECT_EQ(r.accepted(), 0u);
  }
  // A buffer without a payload directory takes no FILE descriptors.
  {
    BufferCore strict;
    transport::DescriptorFetcher no_files(nullptr);
    strict.SetPayloadFetcher(&no_files);
    v1::PutExperiencesResponse r;
    ASSERT_TRUE(strict.Put(Request({Sent("e1", good)}), &r).ok());
    ASSERT_EQ(r.rejections_size(), 1);
    EXPECT_TRUE(absl::StrContains(r.rejections(0).message(), "FILE descriptors are not accepted here"))
        << r.rejections(0).message();
  }
  // The good one, next to an inline one: both accepted; what the trainer samples is the
  // full experience.
  v1::PutExperiencesResponse ok;
  ASSERT_TRUE(core.Put(Request({Sent("e1", good), Full("e3")}), &ok).ok());
  EXPECT_EQ(ok.accepted(), 2u) << (ok.rejections_size() ? ok.rejections(0).message() : "");
  v1::SampleBatchRequest sample;
  sample.set_num_groups(2);
  v1::SampleBatchResponse batch;
  ASSERT_TRUE(core.SampleBatch(sample, &batch).ok());
  ASSERT_EQ(batch.groups_size(), 2);
  for (const auto& g : batch.groups()) {
    ASSERT_EQ(g.experiences_size(), 1);
    EXPECT_EQ(g.experiences(0).response_token_ids_size(), 3000);
    EXPECT_FALSE(g.experiences(0).has_remote_payload());
  }
}

TEST(RemotePayload, FromTheProducersMemoryAndAStaleRegistrationIsRejected) {
  auto producer = transport::LoopbackTransport::Create();
  auto buffer_side = transport::LoopbackTransport::Create();
  std::string bytes = Full("m1").SerializeAsString();
  auto handle = producer->RegisterMemory(bytes.data(), bytes.size(), transport::MemoryKind::kHost, 0);
  ASSERT_TRUE(handle.ok());
  v1::TransferDescriptor d;
  *d.mutable_segment() = *producer->Describe(*handle);
  d.set_length_bytes(bytes.size());
  d.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_CRC32C);
  d.mutable_digest()->set_value(common::Crc32c(bytes));
  ASSERT_EQ(d.segment().backend(), v1::TRANSFER_BACKEND_LOOPBACK);

  BufferCore core;
  transport::DescriptorFetcher fetcher(buffer_side.get());
  core.SetPayloadFetcher(&fetcher);
  v1::PutExperiencesResponse ok;
  ASSERT_TRUE(core.Put(Request({Sent("m1", d)}), &ok).ok());
  EXPECT_EQ(ok.accepted(), 1u) << (ok.rejections_size() ? ok.rejections(0).message() : "");
  // The producer let go of the memory: the descriptor is stale.
  ASSERT_TRUE(producer->DeregisterMemory(*handle).ok());
  v1::Experience again = Sent("m2", d);
  v1::PutExperiencesResponse stale;
  ASSERT_TRUE(core.Put(Request({again}), &stale).ok());
  ASSERT_EQ(stale.rejections_size(), 1);
  EXPECT_TRUE(absl::StrContains(stale.rejections(0).message(), "remote_payload: FAILED_PRECONDITION"))
      << stale.rejections(0).message();
}

}  // namespace
}  // namespace rlfleet::buffer
