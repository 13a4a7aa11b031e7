// BufferPool keeps the largest buffers' memory, at most its bound, and hands the
// largest out first; a HostBuffer gives its memory back to its pool when dropped.
#include "libs/common/host_buffer.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

std::string Buffer(size_t bytes) {
  std::string s;
  s.reserve(bytes);
  return s;
}

TEST(BufferPool, TheLargestAreKeptAndTakenFirst) {
  BufferPool pool(2);
  pool.Give(Buffer(1000));
  pool.Give(Buffer(5000));
  pool.Give(Buffer(3000));
  EXPECT_EQ(pool.size(), 2u);
  std::string first = pool.Take();
  EXPECT_GE(first.capacity(), 5000u);
  const char* memory = first.data();
  std::string second = pool.Take();
  EXPECT_GE(second.capacity(), 3000u);
  EXPECT_LT(second.capacity(), 5000u);
  EXPECT_TRUE(pool.Take().empty());
  // The memory given back is the memory taken next.
  pool.Give(std::move(first));
  EXPECT_EQ(pool.Take().data(), memory);
}

TEST(BufferPool, EmptyBuffersAreNotKeptAndTheBoundCanShrink) {
  BufferPool pool(4);
  pool.Give(std::string());
  EXPECT_EQ(pool.size(), 0u);
  for (size_t n : {100, 200, 300, 400}) pool.Give(Buffer(n * 100));
  EXPECT_EQ(pool.size(), 4u);
  pool.SetMaxBuffers(1);
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_GE(pool.Take().capacity(), 40000u);
}

TEST(BufferPool, ConcurrentGivesAndTakesLoseNoBound) {
  BufferPool pool(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        pool.Give(Buffer(1024 * (1 + (i + t) % 7)));
        (void)pool.Take();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(pool.size(), 3u);
}

TEST(HostBuffer, DroppedOrReplacedBuffersGoBackToTheirPool) {
  auto pool = std::make_shared<BufferPool>(2);
  const char* memory = nullptr;
  {
    HostBuffer first = HostBuffer::Allocate(pool, 1 << 20);
    ASSERT_EQ(first.size(), 1u << 20);
    memory = first.data();
    EXPECT_EQ(pool->size(), 0u);
  }
  EXPECT_EQ(pool->size(), 1u);
  // The next allocation that fits is written into the same memory.
  HostBuffer second = HostBuffer::Allocate(pool, 4096);
  EXPECT_EQ(second.data(), memory);
  EXPECT_EQ(second.size(), 4096u);
  EXPECT_EQ(pool->size(), 0u);
  // Assigning over a buffer gives the old one back first; a moved-from one holds none.
  HostBuffer third = HostBuffer::Allocate(pool, 2048);
  third = std::move(second);
  EXPECT_EQ(third.data(), memory);
  EXPECT_EQ(pool->size(), 1u);
  // One too large for what the pool holds gets fresh memory and leaves the pool as is.
  HostBuffer large = HostBuffer::Allocate(pool, 2 << 20);
  EXPECT_EQ(large.size(), 2u << 20);
  EXPECT_EQ(pool->size(), 0u);  // (the smaller buffer taken was released, not kept)
}

TEST(HostBuffer, ReleasedBytesLeaveThePool) {
  auto pool = std::make_shared<BufferPool>(2);
  HostBuffer buffer(std::string(100000, 'x'), pool);
  std::string bytes = std::move(buffer).Release();
  EXPECT_EQ(bytes.size(), 100000u);
  EXPECT_TRUE(buffer.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  { HostBuffer dropped = std::move(buffer); }
  EXPECT_EQ(pool->size(), 0u);
  // Without a pool the memory is simply freed.
  { HostBuffer alone = HostBuffer::Allocate(nullptr, 1000); }
  EXPECT_EQ(pool->size(), 0u);
}

}  // namespace
}  // namespace rlfleet::common
