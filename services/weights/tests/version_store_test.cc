// VersionStore on its own: a version is verified before it is kept; the newest
// keep_versions keep their bytes, and a lease keeps a retired version's bytes until
// the sync using it lets go, its memory then going to the next version's pull; the
// records of the newest 8 and their statuses.
#include "services/weights/version_store.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/model/safetensors.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "services/weights/tests/fake_trainer.h"

namespace rlfleet::weights {
namespace {

// Writes a safetensors image of `bytes` bytes (one F32 tensor) for `version` and returns
// the request that publishes it from that file.
v1::PublishVersionRequest PublishFile(uint64_t version, size_t floats = 4096, uint64_t digest_xor = 0) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/store-v", version);
  std::map<std::string, model::TensorBlob> tensors;
  tensors["w"] = {"F32", {static_cast<int64_t>(floats)}, std::string(floats * 4, static_cast<char>(version))};
  EXPECT_TRUE(model::WriteSafetensors(path, tensors).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  v1::PublishVersionRequest r;
  r.mutable_manifest()->mutable_version()->set_version(version);
  v1::TransferDescriptor* where = r.add_sources()->add_shards()->mutable_location();
  where->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
  where->mutable_segment()->set_worker_address(path);
  where->set_length_bytes(image.size());
  where->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  where->mutable_digest()->set_value(common::Xxh64(image) ^ digest_xor);
  return r;
}

TEST(VersionStore, AVersionWhoseBytesDoNotMatchIsNotKept) {
  VersionStore store(nullptr);
  store.SetFileRoot(std::getenv("TEST_TMPDIR"));
  v1::PublishVersionResponse out;
  EXPECT_EQ(store.Publish(PublishFile(1, 4096, /*digest_xor=*/1), {"r"}, &out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store.Resolve(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Latest(), nullptr);
  ASSERT_TRUE(store.Publish(PublishFile(1), {"r"}, &out).ok());
  // Without a data plane replicas read the trainer's file; the tensors come from its header.
  absl::StatusOr<Lease> lease = store.Acquire(0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->info->number, 1u);
  EXPECT_EQ(lease->image, nullptr);
  EXPECT_EQ(lease->Source().segment().backend(), v1::TRANSFER_BACKEND_FILE);
  ASSERT_EQ(lease->info->tensors.size(), 1u);
  EXPECT_EQ(lease->info->tensors[0].name, "w");
  // Each destination named at publish has a PENDING status.
  std::optional<v1::DestinationSyncStatus> s = store.StatusOf(1, "r");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->phase(), v1::SYNC_PHASE_PENDING);
  EXPECT_EQ(s->bytes_needed(), lease->info->location.length_bytes());
}

TEST(VersionStore, ALeaseKeepsARetiredVersionsBytesAndTheirMemoryGoesToTheNextPull) {
  auto data_plane = transport::LoopbackTransport::Create();
  VersionStore store(data_plane.get());
  store.SetFileRoot(std::getenv("TEST_TMPDIR"));
  store.SetKeepVersions(2);
  constexpr size_t kFloats = 1 << 20;  // 4 MiB images, pulled from the trainer's memory
  FakeTrainer trainer;
  v1::PublishVersionResponse out;
  ASSERT_TRUE(store.Publish(trainer.Publish(1, kFloats), {}, &out).ok());
  absl::StatusOr<Lease> held = store.Acquire(1);
  ASSERT_TRUE(held.ok());
  ASSERT_NE(held->image, nullptr);
  EXPECT_TRUE(held->image->staged());
  EXPECT_EQ(held->Source().length_bytes(), held->image->bytes().size());
  const std::string copy = held->image->bytes();
  const char* memory = held->image->bytes().data();

  ASSERT_TRUE(store.Publish(trainer.Publish(2, kFloats), {}, &out).ok());
  const char* memory2 = store.Acquire(2)->image->bytes().data();
  ASSERT_TRUE(store.Publish(trainer.Publish(3, kFloats), {}, &out).ok());
  // (version 1's memory is still in use: version 3 is pulled into other memory)
  EXPECT_NE(store.Acquire(3)->image->bytes().data(), memory);
  // Version 1 is out of the kept two: refused to new syncs, by name...
  absl::StatusOr<Lease> late = store.Acquire(1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "--keep_versions")) << late.status();
  // ...while the sync holding it still reads its bytes, unchanged.
  EXPECT_EQ(held->image->bytes(), copy);
  EXPECT_NE(store.Acquire(2).status().code(), absl::StatusCode::kFailedPrecondition);
  // Once that sync lets go, version 1's memory and version 2's (out of the kept two now)
  // are what versions 4 and 5 are pulled into: no new memory.
  held = absl::UnknownError("released");
  ASSERT_TRUE(store.Publish(trainer.Publish(4, kFloats), {}, &out).ok());
  absl::StatusOr<Lease> four = store.Acquire(4);
  ASSERT_TRUE(four.ok());
  const char* memory4 = four->image->bytes().data();
  EXPECT_TRUE(memory4 == memory || memory4 == memory2);
  EXPECT_EQ(four->image->bytes()[four->image->bytes().size() - 1], static_cast<char>(4));
  four = absl::UnknownError("released");
  ASSERT_TRUE(store.Publish(trainer.Publish(5, kFloats), {}, &out).ok());
  const char* memory5 = store.Acquire(5)->image->bytes().data();
  EXPECT_TRUE(memory5 == memory || memory5 == memory2);
  EXPECT_NE(memory5, memory4);
}

// A version published with the trainer's GPU copy keeps no bytes here until a sync
// needs them; syncs that need them at once share one pull; one that does not (a
// replica taking the GPU copy) gets the trainer's memory as its source.
TEST(VersionStore, ADeferredHostCopyIsPulledOnceWhenFirstNeeded) {
  auto data_plane = transport::LoopbackTransport::Create();
  VersionStore store(data_plane.get());
  std::atomic<int> pulls{0};
  store.SetLogger([&pulls](const std::string& line) {
    if (absl::StrContains(line, "host copy pulled")) ++pulls;
  });
  FakeTrainer trainer;
  v1::PublishVersionRequest request = trainer.Publish(1, 1 << 16, "host-a");
  v1::PublishVersionResponse out;
  ASSERT_TRUE(store.Publish(request, {"r"}, &out).ok());
  EXPECT_EQ(out.bytes_read(), 0u);
  EXPECT_TRUE(store.HostCopyDeferred(1));
  absl::StatusOr<Lease> gpu_lease = store.Acquire(1, VersionStore::Bytes::kNotNeeded);
  ASSERT_TRUE(gpu_lease.ok()) << gpu_lease.status();
  EXPECT_EQ(gpu_lease->image, nullptr);
  EXPECT_EQ(gpu_lease->Source().segment().worker_address(),
            request.sources(0).shards(0).location().segment().worker_address());
  EXPECT_TRUE(gpu_lease->info->tensors.empty());  // (not known until the image is read)
  EXPECT_TRUE(store.HostCopyDeferred(1));
  std::vector<absl::StatusOr<Lease>> leases(4, absl::UnknownError("not run"));
  std::vector<std::thread> syncs;
  for (auto& lease : leases) syncs.emplace_back([&store, &lease] { lease = store.Acquire(1); });
  for (auto& t : syncs) t.join();
  for (const auto& lease : leases) {
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->image, leases[0]->image);
    EXPECT_EQ(lease->image->bytes(), trainer.images[1]);
    ASSERT_EQ(lease->info->tensors.size(), 1u);
  }
  EXPECT_EQ(pulls.load(), 1);
  EXPECT_FALSE(store.HostCopyDeferred(1));
}

// A deferred host copy is pullable only while the trainer holds the version (its
// latest two), whatever --keep_versions says: an older one is refused by name.
TEST(VersionStore, ADeferredHostCopyOlderThanTheTrainersTwoIsRefused) {
  auto data_plane = transport::LoopbackTransport::Create();
  VersionStore store(data_plane.get());
  store.SetKeepVersions(4);
  FakeTrainer trainer;
  for (uint64_t v = 1; v <= 3; ++v) {
    v1::PublishVersionResponse out;
    ASSERT_TRUE(store.Publish(trainer.Publish(v, 1024, "host-a"), {}, &out).ok()) << v;
  }
  EXPECT_FALSE(store.HostCopyDeferred(1));
  absl::StatusOr<Lease> old = store.Acquire(1);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition) << old.status();
  EXPECT_TRUE(absl::StrContains(old.status().message(), "sync a newer one")) << old.status();
  EXPECT_TRUE(store.HostCopyDeferred(2));
  absl::StatusOr<Lease> two = store.Acquire(2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->image->bytes(), trainer.images[2]);
}

TEST(VersionStore, TheNewestEightRecordsAndTheirStatusesAreKept) {
  VersionStore store(nullptr);
  store.SetFileRoot(std::getenv("TEST_TMPDIR"));
  v1::PublishVersionResponse out;
  for (uint64_t v = 1; v <= 9; ++v) ASSERT_TRUE(store.Publish(PublishFile(v), {"r"}, &out).ok()) << v;
  EXPECT_EQ(store.Resolve(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store.Resolve(0), 9u);
  EXPECT_EQ(*store.Resolve(2), 2u);
  v1::DestinationSyncStatus s;
  s.set_replica_id("r");
  s.set_version(9);
  s.set_phase(v1::SYNC_PHASE_INSTALLED);
  store.SetStatus(9, s);
  store.SetStatus(1, s);  // (its record is gone: nothing)
  EXPECT_EQ(store.StatusOf(9, "r")->phase(), v1::SYNC_PHASE_INSTALLED);
  EXPECT_FALSE(store.StatusOf(1, "r").has_value());
  EXPECT_EQ(store.Statuses(1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(store.Statuses(9)->size(), 1u);
  // An older version than the latest is refused, naming the latest.
  absl::Status older = store.Publish(PublishFile(5, /*floats=*/100), {}, &out);
  EXPECT_EQ(older.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(older.message(), "latest, 9")) << older;
}

}  // namespace
}  // namespace rlfleet::weights
