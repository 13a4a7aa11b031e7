// DescriptorFetcher from a peer's memory (loopback): the bytes and digest; into the
// memory of an earlier fetch when it is big enough (no new buffer), else a new one.
#include "libs/transport/descriptor_fetcher.h"

#include "gtest/gtest.h"
#include "libs/common/checksum.h"
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

  FetchTimings timings;
  auto first = fetcher.Fetch(Describe(*owner, *h1, v1_bytes), deadline, std::string(), &timings);
  ASSERT_TRUE(first.ok()) << first.status();
  // Where the time went: each phase measured (the transport's copy and the digest take
  // some; the allocation may round to nothing).
  EXPECT_GT(timings.transfer, absl::ZeroDuration());
  EXPECT_GT(timings.verify, absl::ZeroDuration());
  EXPECT_GE(timings.allocate, absl::ZeroDuration());
  EXPECT_EQ(*first, v1_bytes);
  const char* memory = first->data();
  // A smaller version lands in the same memory.
  auto second = fetcher.Fetch(Describe(*owner, *h2, v2_bytes), deadline, std::move(*first));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, v2_bytes);
  EXPECT_EQ(second->data(), memory);
  // A bigger one needs new memory, and still arrives whole.
  auto third = fetcher.Fetch(Describe(*owner, *h3, big), deadline, std::move(*second));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, big);
  // A bad digest is DATA_LOSS whatever memory it went into.
  v1::TransferDescriptor wrong = Describe(*owner, *h1, v1_bytes);
  wrong.mutable_digest()->set_value(wrong.digest().value() ^ 1);
  EXPECT_EQ(fetcher.Fetch(wrong, deadline, std::move(*third)).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rlfleet::transport
