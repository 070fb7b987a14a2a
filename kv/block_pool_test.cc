#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/testing.h"

namespace sieve {
namespace {

TEST(BlockPoolTest, AllocateReleaseAndRefCounts) {
  BlockPool pool(8);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Allocate(5, pages));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(std::set<int32_t>(pages.begin(), pages.end()).size(), 5u);
  EXPECT_FALSE(pool.Allocate(4, pages));  // all or nothing
  EXPECT_EQ(pages.size(), 5u);
  pool.AddRef(pages[0]);
  pool.Release(pages);
  EXPECT_EQ(pool.num_free(), 7);  // pages[0] still has one reference
  EXPECT_EQ(pool.ref_count(pages[0]), 1);
  pool.Release(std::vector<int32_t>{pages[0]});
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(BlockPoolDeathTest, DoubleFreeIsABug) {
  BlockPool pool(2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Allocate(1, pages));
  pool.Release(pages);
  EXPECT_DEATH(pool.Release(pages), "released twice");
}

TEST(BlockPoolTest, RandomChurnKeepsCounts) {
  auto rng = testing::MakeRng();
  BlockPool pool(64);
  std::vector<std::vector<int32_t>> held;
  for (int step = 0; step < 5000; ++step) {
    if (held.empty() || rng() % 2) {
      std::vector<int32_t> pages;
      const int count = static_cast<int>(rng() % 8);
      if (pool.Allocate(count, pages)) held.push_back(pages);
    } else {
      const size_t index = rng() % held.size();
      pool.Release(held[index]);
      held.erase(held.begin() + index);
    }
    size_t in_use = 0;
    for (const auto& pages : held) in_use += pages.size();
    ASSERT_EQ(static_cast<size_t>(pool.num_used()), in_use);
  }
}

}  // namespace
}  // namespace sieve
