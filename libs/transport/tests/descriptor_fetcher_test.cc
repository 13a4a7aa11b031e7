// DescriptorFetcher from a peer's memory (loopback): the bytes and digest; into the
// memory of an earlier fetch when it is big enough (no new buffer), else a new one.
#include "libs/transport/descriptor_fetcher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/transport/fault/fault_transport.h"
#include "libs/transport/loopback/loopback_transport.h"

namespace rlfleet::transport {
namespace {

v1::TransferDescriptor Describe(Transport& owner, const MemoryHandle& handle, const std::string& bytes) {
  v1::TransferDescriptor d;
  *d.mutable_segment() = *owner.Describe(handle);
  d.set_length_bytes(bytes.size());
  d.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  d.mutable_digest()->set_value(common::Xxh64(bytes));
  return d;
}

TEST(DescriptorFetcherTest, FetchesIntoTheMemoryOfAnEarlierFetchWhenItFits) {
  auto owner = LoopbackTransport::Create();
  auto puller = LoopbackTransport::Create();
  std::string v1_bytes(1 << 20, 'a'), v2_bytes((1 << 20) - 100, 'b'), big(2 << 20, 'c');
  v1_bytes[5] = 'x';
  v2_bytes[7] = 'y';
  auto h1 = owner->RegisterMemory(v1_bytes.data(), v1_bytes.size(), MemoryKind::kHost, 0);
  auto h2 = owner->RegisterMemory(v2_bytes.data(), v2_bytes.size(), MemoryKind::kHost, 0);
  auto h3 = owner->RegisterMemory(big.data(), big.size(), MemoryKind::kHost, 0);
  ASSERT_TRUE(h1.ok() && h2.ok() && h3.ok());
  DescriptorFetcher::Options options;
  options.max_bytes = 4 << 20;
  DescriptorFetcher fetcher(puller.get(), options);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);

  auto pool = std::make_shared<common::BufferPool>(1);
  FetchTimings timings;
  auto first = fetcher.Fetch(Describe(*owner, *h1, v1_bytes), deadline, pool, &timings);
  ASSERT_TRUE(first.ok()) << first.status();
  // Where the time went: each phase measured (the transport's copy and the digest take
  // some; the allocation may round to nothing).
  EXPECT_GT(timings.transfer, absl::ZeroDuration());
  EXPECT_GT(timings.verify, absl::ZeroDuration());
  EXPECT_GE(timings.allocate, absl::ZeroDuration());
  EXPECT_EQ(first->str(), v1_bytes);
  const char* memory = first->data();
  *first = common::HostBuffer();  // (dropped: its memory goes back to the pool)
  // A smaller version lands in the same memory.
  auto second = fetcher.Fetch(Describe(*owner, *h2, v2_bytes), deadline, pool);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->str(), v2_bytes);
  EXPECT_EQ(second->data(), memory);
  *second = common::HostBuffer();
  // A bigger one needs new memory, and still arrives whole.
  auto third = fetcher.Fetch(Describe(*owner, *h3, big), deadline, pool);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->str(), big);
  *third = common::HostBuffer();
  // A bad digest is DATA_LOSS whatever memory it went into (and the memory is kept).
  v1::TransferDescriptor wrong = Describe(*owner, *h1, v1_bytes);
  wrong.mutable_digest()->set_value(wrong.digest().value() ^ 1);
  EXPECT_EQ(fetcher.Fetch(wrong, deadline, pool).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(pool->size(), 1u);
}

// A fetch that times out while the Get may still land holds its memory and
// registration only until the Get finishes; then they are released (not leaked).
TEST(DescriptorFetcherTest, ATimedOutFetchReleasesItsMemoryOnceTheTransferFinishes) {
  auto owner = LoopbackTransport::Create();
  FaultPlan slow;
  slow.delay = absl::Milliseconds(300);
  FaultTransport puller(LoopbackTransport::Create(), slow);
  std::string bytes(1 << 20, 'p');
  auto h = owner->RegisterMemory(bytes.data(), bytes.size(), MemoryKind::kHost, 0);
  ASSERT_TRUE(h.ok());
  DescriptorFetcher::Options options;
  options.max_bytes = 4 << 20;
  options.max_pending_bytes = 1 << 20;  // one timed-out fetch held at most
  DescriptorFetcher fetcher(&puller, options);
  const v1::TransferDescriptor d = Describe(*owner, *h, bytes);
  EXPECT_EQ(fetcher.Fetch(d, absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fetcher.ReleaseFinished(), 1u);  // still in flight: held
  // Another while it is held would pass the bound: refused, nothing allocated.
  EXPECT_EQ(fetcher.Fetch(d, absl::Now() + absl::Seconds(5)).status().code(), absl::StatusCode::kResourceExhausted);
  // Once the transfer finished its memory and registration are released.
  EXPECT_EQ(fetcher.ReleaseFinished(absl::Seconds(10)), 0u);
  auto again = fetcher.Fetch(d, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, bytes);
}

// FILE descriptors: only regular files under the configured root, the range checked
// against the file before anything is allocated; none at all without a root.
TEST(DescriptorFetcherTest, FileDescriptorsResolveOnlyToRegularFilesUnderTheRoot) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string root = tmp + "/payloads";
  ASSERT_TRUE(mkdir(root.c_str(), 0755) == 0 || errno == EEXIST);
  const std::string content(4096, 'f');
  std::ofstream(root + "/ok.bin", std::ios::binary) << content;
  std::ofstream(tmp + "/outside.bin", std::ios::binary) << content;
  ASSERT_EQ(mkfifo((root + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(mkdir((root + "/dir").c_str(), 0755), 0);
  ASSERT_EQ(symlink((tmp + "/outside.bin").c_str(), (root + "/link").c_str()), 0);
  auto file = [&](const std::string& path, uint64_t length, uint64_t offset = 0) {
    v1::TransferDescriptor d;
    d.mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
    d.mutable_segment()->set_worker_address(path);
    d.set_offset_bytes(offset);
    d.set_length_bytes(length);
    d.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
    d.mutable_digest()->set_value(common::Xxh64(content));
    return d;
  };
  DescriptorFetcher::Options options;
  options.max_bytes = uint64_t{1} << 40;
  options.file_root = root;
  options.file_root_flag = "--publish_dir";
  DescriptorFetcher fetcher(nullptr, options);
  auto ok = fetcher.Fetch(file(root + "/ok.bin", content.size()));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, content);
  EXPECT_TRUE(fetcher.Fetch(file("ok.bin", content.size())).ok());  // relative to the root
  for (const std::string& bad : {tmp + "/outside.bin", root + "/../outside.bin", root + "/link",
                                 std::string("/dev/zero"), std::string("/etc/passwd"), root + "/fifo", root + "/dir"}) {
    absl::StatusOr<std::string> got = fetcher.Fetch(file(bad, content.size()));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "segment.worker_address")) << got.status();
  }
  // A length past the file's end (2 GiB, or 1 TiB) is refused before it is allocated.
  for (uint64_t length : {uint64_t{2} << 30, uint64_t{1} << 40}) {
    absl::StatusOr<std::string> got = fetcher.Fetch(file(root + "/ok.bin", length));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_FALSE(absl::StrContains(got.status().message(), "4096")) << "the file's size is echoed";
  }
  EXPECT_EQ(fetcher.Fetch(file(root + "/ok.bin", 10, ~uint64_t{0} - 5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // No root: no files at all, and the flag is named.
  DescriptorFetcher none(nullptr, DescriptorFetcher::Options{});
  absl::Status refused = none.Fetch(file(root + "/ok.bin", content.size())).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.message(), "--payload_dir")) << refused;
}

}  // namespace
}  // namespace rlfleet::transport
