// BufferPool keeps the largest buffers' memory, at most its bound, and hands the
// largest out first.
#include "libs/common/buffer_pool.h"

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

}  // namespace
}  // namespace rlfleet::common
