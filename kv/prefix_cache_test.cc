// The prefix cache's bookkeeping: PageKey chains, BlockPool's cached pages (LRU, eviction, revival)
// and KvCacheManager's cached-prefix calls. Random inputs from testing::MakeRng.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "core/testing.h"
#include "kv/block_pool.h"
#include "kv/kv_cache_manager.h"
#include "kv/page_key.h"

namespace sieve {
namespace {

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int count) {
  std::vector<int32_t> tokens(count);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng() % 50000);
  return tokens;
}

TEST(PageKeyTest, KeysChainThePrefix) {
  auto rng = testing::MakeRng();
  const std::vector<int32_t> prompt = RandomTokens(rng, 70);
  const uint64_t extra = MixExtraKey(MixExtraKey(0, uint64_t{3}), "snapkv");
  const std::vector<PageKey> keys = FullPageKeys(prompt, 16, extra);
  ASSERT_EQ(keys.size(), 4u);  // 70 tokens: 4 full pages of 16
  EXPECT_EQ(keys[0].parent, 0u);
  for (size_t page = 1; page < keys.size(); ++page)
    EXPECT_EQ(keys[page].parent, keys[page - 1].hash);
  // A prompt extending this one shares its full pages' keys; one differing in its first token
  // shares none, though its later pages hold the same tokens.
  std::vector<int32_t> longer = prompt;
  longer.resize(100, 7);
  const std::vector<PageKey> longer_keys = FullPageKeys(longer, 16, extra);
  ASSERT_EQ(longer_keys.size(), 6u);
  for (size_t page = 0; page < keys.size(); ++page) EXPECT_EQ(longer_keys[page], keys[page]);
  std::vector<int32_t> other = prompt;
  other[0] += 1;
  const std::vector<PageKey> other_keys = FullPageKeys(other, 16, extra);
  for (size_t page = 0; page < keys.size(); ++page) {
    EXPECT_FALSE(other_keys[page] == keys[page]) << page;
    EXPECT_NE(other_keys[page].hash, keys[page].hash) << page;
  }
  // Another layer, policy or knob (the extra key) shares nothing.
  const std::vector<PageKey> other_extra = FullPageKeys(prompt, 16, MixExtraKey(extra, "budget"));
  EXPECT_FALSE(other_extra[0] == keys[0]);
  EXPECT_NE(MixExtraKey(0, "snapkv"), MixExtraKey(0, "pyramidkv"));
}

TEST(BlockPoolTest, ReleasedKeyedPagesStayFindableUntilEvicted) {
  auto rng = testing::MakeRng();
  BlockPool pool(6);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Allocate(4, pages));
  const std::vector<PageKey> keys = FullPageKeys(RandomTokens(rng, 16), 4, 0);
  for (int index = 0; index < 3; ++index) EXPECT_TRUE(pool.Register(pages[index], keys[index]));
  EXPECT_FALSE(pool.Register(pages[3], keys[0]));  // another page holds that key
  EXPECT_FALSE(pool.Register(pages[0], keys[3]));  // this page has a key
  EXPECT_EQ(pool.Lookup(keys[1]), pages[1]);
  EXPECT_EQ(pool.Lookup(keys[3]), -1);
  // Released in the order 2, 0, 1, 3: the keyed ones become cached and still count as free.
  for (const int index : {2, 0, 1, 3}) pool.Release(std::vector<int32_t>{pages[index]});
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_EQ(pool.num_cached(), 3);
  EXPECT_EQ(pool.Lookup(keys[0]), pages[0]);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants().ToString();
  // A hit takes a cached page back.
  pool.Acquire(pages[0]);
  EXPECT_EQ(pool.ref_count(pages[0]), 1);
  EXPECT_EQ(pool.num_cached(), 2);
  // Allocation takes the 3 free pages first, then evicts the least recently released cached page
  // (pages[2]), whose key goes.
  std::vector<int32_t> more;
  ASSERT_TRUE(pool.Allocate(4, more));
  EXPECT_EQ(more.back(), pages[2]);
  EXPECT_EQ(pool.Lookup(keys[2]), -1);
  EXPECT_EQ(pool.Lookup(keys[1]), pages[1]);
  EXPECT_EQ(pool.num_evicted(), 1);
  EXPECT_FALSE(pool.Allocate(2, more));  // pages[1] is all that is left
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants().ToString();
  pool.Release(more);
  pool.Release(std::vector<int32_t>{pages[0]});
  EXPECT_EQ(pool.num_cached(), 2);  // pages[0] and pages[1] keep their keys
  EXPECT_EQ(pool.num_keyed(), 2);
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants().ToString();
}

// Keys with equal hashes but other tokens never find each other's page.
TEST(BlockPoolTest, LookupComparesWholeKeys) {
  auto rng = testing::MakeRng();
  BlockPool pool(2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Allocate(2, pages));
  PageKey first = MakePageKey(0, 0, RandomTokens(rng, 4));
  PageKey second = MakePageKey(0, 0, RandomTokens(rng, 4));
  second.hash = first.hash;  // a collision
  EXPECT_TRUE(pool.Register(pages[0], first));
  EXPECT_EQ(pool.Lookup(second), -1);
  EXPECT_TRUE(pool.Register(pages[1], second));
  EXPECT_EQ(pool.Lookup(first), pages[0]);
  EXPECT_EQ(pool.Lookup(second), pages[1]);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants().ToString();
}

// Random allocate / register / release / lookup-and-acquire: the invariants hold at every step,
// references match what the test holds, and a cached page is found until it is evicted.
TEST(BlockPoolTest, RandomCachingChurnKeepsEveryInvariant) {
  auto rng = testing::MakeRng();
  BlockPool pool(48);
  std::vector<int32_t> held;  // one entry per reference the test holds
  std::vector<PageKey> known;
  for (int step = 0; step < 4000; ++step) {
    const int action = static_cast<int>(rng() % 4);
    if (action == 0) {
      std::vector<int32_t> pages;
      if (pool.Allocate(static_cast<int>(rng() % 6), pages))
        held.insert(held.end(), pages.begin(), pages.end());
    } else if (action == 1 && !held.empty()) {
      const int32_t page = held[rng() % held.size()];
      PageKey key = MakePageKey(rng() % 3, 0, RandomTokens(rng, 2));
      if (pool.Register(page, key)) known.push_back(key);
    } else if (action == 2 && !held.empty()) {
      const size_t index = rng() % held.size();
      pool.Release(std::vector<int32_t>{held[index]});
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(index));
    } else if (!known.empty()) {
      const PageKey& key = known[rng() % known.size()];
      const int32_t page = pool.Lookup(key);
      if (page >= 0) {
        pool.Acquire(page);
        held.push_back(page);
      }
    }
    ASSERT_TRUE(pool.CheckInvariants().ok()) << step << ": " << pool.CheckInvariants().ToString();
    std::map<int32_t, int> references;
    for (const int32_t page : held) ++references[page];
    for (const auto& [page, count] : references) ASSERT_EQ(pool.ref_count(page), count);
    ASSERT_EQ(pool.num_used(), static_cast<int>(references.size()));
  }
}

KvCacheManager::Options CacheOptions() {
  KvCacheManager::Options options;
  options.num_pages = 24;
  options.page_size = 4;
  options.num_layers = 2;
  options.max_seqs = 4;
  options.max_pages_per_seq = 8;
  return options;
}

// One layer's keys: the layer index in the extra key, as the engine will make them.
std::vector<PageKey> LayerKeys(const std::vector<int32_t>& prompt, int layer, int page_size) {
  return FullPageKeys(prompt, page_size, MixExtraKey(0, static_cast<uint64_t>(layer)));
}

TEST(KvCacheManagerTest, ASecondPromptAttachesTheFirstsFullPages) {
  auto rng = testing::MakeRng();
  KvCacheManager manager(CacheOptions());
  const std::vector<int32_t> prompt = RandomTokens(rng, 14);  // 3 full pages of 4, 2 tokens over
  ASSERT_TRUE(manager.AddSequence(1).ok());
  ASSERT_TRUE(manager.Grow(1, std::vector<int>{14, 14}));
  manager.SetLengths(1, std::vector<int>{14, 14});
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(manager.RegisterPages(1, layer, 0, LayerKeys(prompt, layer, 4)), 3);
  }
  // A prompt that extends the first finds its 3 full pages in each layer while the first runs...
  std::vector<int32_t> extended = prompt;
  extended.resize(30, 9);
  ASSERT_TRUE(manager.AddSequence(2).ok());
  for (int layer = 0; layer < 2; ++layer) {
    const std::vector<PageKey> keys = LayerKeys(extended, layer, 4);
    ASSERT_EQ(keys.size(), 7u);
    int idle = -1;
    EXPECT_EQ(manager.CachedPrefixPages(keys, &idle), 3);
    EXPECT_EQ(idle, 0);  // sequence 1 holds them
    manager.AttachCachedPages(2, layer, std::span(keys).first(3));
    EXPECT_EQ(manager.Length(2, layer), 12);
    EXPECT_EQ(manager.PagesFreedByRemoval(2), 0);  // what it holds, sequence 1 holds too
    for (int page = 0; page < 3; ++page) {
      EXPECT_EQ(manager.Pages(2, layer)[page], manager.Pages(1, layer)[page]);
    }
  }
  ASSERT_TRUE(manager.CheckInvariants().ok()) << manager.CheckInvariants().ToString();
  // ...and it grows past them into pages of its own.
  ASSERT_TRUE(manager.Grow(2, std::vector<int>{30, 30}));
  EXPECT_EQ(manager.PagesFreedByRemoval(2), 2 * 5);    // its own pages, not the shared prefix
  EXPECT_EQ(manager.num_used_pages(), 2 * 4 + 2 * 5);  // 4 pages each of sequence 1, 5 new of 2
  // Another layer's keys never match (the extra key holds the layer).
  EXPECT_EQ(manager.CachedPrefixPages(LayerKeys(prompt, 5, 4)), 0);
  // Both gone: the 6 keyed pages stay cached (free to allocate), nothing leaks.
  manager.RemoveSequence(1);
  manager.RemoveSequence(2);
  EXPECT_EQ(manager.num_cached_pages(), 6);
  EXPECT_EQ(manager.num_free_pages(), 24);
  ASSERT_TRUE(manager.CheckInvariants().ok()) << manager.CheckInvariants().ToString();
  // A third request hits them after its predecessors are gone.
  ASSERT_TRUE(manager.AddSequence(3).ok());
  int idle = -1;
  EXPECT_EQ(manager.CachedPrefixPages(LayerKeys(extended, 0, 4), &idle), 3);
  EXPECT_EQ(idle, 3);  // nobody holds them: attaching takes them out of the free count
  manager.RemoveSequence(3);
}

// Cached pages never refuse a sequence that fits without them: Grow evicts them, oldest first.
TEST(KvCacheManagerTest, CachedPagesGiveWayUnderPressure) {
  auto rng = testing::MakeRng();
  KvCacheManager manager(CacheOptions());
  std::vector<std::vector<int32_t>> prompts;
  for (SeqId id = 0; id < 3; ++id) {
    prompts.push_back(RandomTokens(rng, 16));
    ASSERT_TRUE(manager.AddSequence(id).ok());
    ASSERT_TRUE(manager.Grow(id, std::vector<int>{16, 16}));
    manager.SetLengths(id, std::vector<int>{16, 16});
    for (int layer = 0; layer < 2; ++layer) {
      manager.RegisterPages(id, layer, 0, LayerKeys(prompts.back(), layer, 4));
    }
    manager.RemoveSequence(id);
  }
  EXPECT_EQ(manager.num_cached_pages(), 24);  // the whole pool, all evictable
  ASSERT_TRUE(manager.AddSequence(10).ok());
  ASSERT_TRUE(manager.Grow(10, std::vector<int>{32, 32}));  // 16 pages: evicts 16 cached ones
  EXPECT_EQ(manager.num_evicted_pages(), 16);
  EXPECT_EQ(manager.CachedPrefixPages(LayerKeys(prompts[0], 0, 4)), 0);  // the oldest went first
  EXPECT_EQ(manager.CachedPrefixPages(LayerKeys(prompts[2], 0, 4)), 4);
  ASSERT_TRUE(manager.CheckInvariants().ok()) << manager.CheckInvariants().ToString();
  manager.RemoveSequence(10);
  EXPECT_EQ(manager.num_free_pages(), 24);
  EXPECT_EQ(manager.num_cached_pages(), 8);  // prompts[2]'s pages stay cached, all free
}

}  // namespace
}  // namespace sieve
