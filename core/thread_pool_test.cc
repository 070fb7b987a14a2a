#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

namespace sieve {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t count : {1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(count);
    pool.ParallelFor(count, 3, [&](int64_t begin, int64_t end) {
      for (int64_t index = begin; index < end; ++index) hits[index].fetch_add(1);
    });
    for (int64_t index = 0; index < count; ++index) ASSERT_EQ(hits[index].load(), 1) << index;
  }
}

TEST(ThreadPoolTest, NestedLoopsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t outer = begin; outer < end; ++outer) {
      pool.ParallelFor(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
    }
  });
  EXPECT_EQ(total.load(), 160);
}

}  // namespace
}  // namespace sieve
