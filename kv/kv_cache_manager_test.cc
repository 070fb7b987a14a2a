#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/testing.h"

namespace sieve {
namespace {

KvCacheManager::Options SmallOptions() {
  KvCacheManager::Options options;
  options.num_pages = 40;
  options.page_size = 4;
  options.num_layers = 3;
  options.max_seqs = 4;
  options.max_pages_per_seq = 8;
  return options;
}

TEST(KvCacheManagerTest, LayersHoldDifferentLengths) {
  KvCacheManager manager(SmallOptions());
  ASSERT_TRUE(manager.AddSequence(7).ok());
  const std::vector<int> capacities = {30, 5, 12};
  EXPECT_EQ(manager.PagesToGrow(7, capacities), 8 + 2 + 3);
  ASSERT_TRUE(manager.Grow(7, capacities));
  manager.SetLength(7, 0, 30);
  manager.SetLength(7, 1, 5);
  manager.SetLength(7, 2, 9);  // frees the third page of layer 2
  EXPECT_EQ(manager.Pages(7, 2).size(), 3u);
  EXPECT_EQ(manager.PagesUsedBySequence(7), 8 + 2 + 3);
  EXPECT_EQ(manager.PagesUsedByLayer(1), 2);
  EXPECT_EQ(manager.EntriesHeldByLayer(0), 30);
  EXPECT_TRUE(manager.CheckInvariants().ok()) << manager.CheckInvariants().ToString();
  manager.RemoveSequence(7);
  EXPECT_EQ(manager.num_free_pages(), 40);
  EXPECT_TRUE(manager.CheckInvariants().ok());
}

TEST(KvCacheManagerTest, GrowIsAllOrNothing) {
  KvCacheManager manager(SmallOptions());
  ASSERT_TRUE(manager.AddSequence(1).ok());
  ASSERT_TRUE(manager.AddSequence(2).ok());
  ASSERT_TRUE(manager.Grow(1, std::vector<int>{32, 32, 32}));   // 24 pages
  EXPECT_FALSE(manager.Grow(2, std::vector<int>{32, 32, 32}));  // 24 more do not exist
  EXPECT_EQ(manager.PagesUsedBySequence(2), 0);
  EXPECT_FALSE(manager.Grow(2, std::vector<int>{33, 0, 0}));  // past max_pages_per_seq
  EXPECT_TRUE(manager.CheckInvariants().ok());
}

TEST(KvCacheManagerTest, SlotsRunOut) {
  KvCacheManager manager(SmallOptions());
  for (SeqId id = 0; id < 4; ++id) ASSERT_TRUE(manager.AddSequence(id).ok());
  const auto fifth = manager.AddSequence(4);
  EXPECT_EQ(fifth.status().code(), StatusCode::kResourceExhausted);
}

TEST(KvCacheManagerTest, PatchesReplayToTheMirror) {
  auto rng = testing::MakeRng();
  KvCacheManager manager(SmallOptions());
  std::vector<int32_t> device(manager.page_table().size(), -1);
  std::map<SeqId, bool> live;
  for (int step = 0; step < 3000; ++step) {
    const SeqId id = static_cast<SeqId>(rng() % 6);
    if (!manager.HasSequence(id)) {
      if (manager.AddSequence(id).ok()) live[id] = true;
    } else if (rng() % 5 == 0) {
      manager.RemoveSequence(id);
    } else {
      std::vector<int> capacities(3);
      for (int& capacity : capacities) capacity = static_cast<int>(rng() % 33);
      if (manager.Grow(id, capacities)) {
        for (int layer = 0; layer < 3; ++layer) {
          manager.SetLength(id, layer, static_cast<int>(rng() % (manager.Capacity(id, layer) + 1)));
        }
      }
    }
    // Several actions between uploads (so an entry can be cleared and written again). The device
    // applies patches in parallel: each entry at most once, so any order is right.
    if (rng() % 4 != 0) continue;
    auto patches = manager.TakePageTablePatches();
    std::shuffle(patches.begin(), patches.end(), rng);
    std::set<int32_t> seen;
    for (const auto& [index, value] : patches) {
      ASSERT_TRUE(seen.insert(index).second) << "entry " << index << " patched twice";
      device[index] = value;
    }
    ASSERT_EQ(device, manager.page_table());
    ASSERT_TRUE(manager.CheckInvariants().ok()) << manager.CheckInvariants().ToString();
  }
}

// The decode fast path (PagesToAppend, GrowForAppend) against the general one (PagesToGrow,
// Grow to length + 1) on a twin manager: same answers, same pages, same table writes, and all or
// nothing when the pool runs short.
TEST(KvCacheManagerTest, AppendFastPathMatchesGrow) {
  auto rng = testing::MakeRng();
  KvCacheManager fast(SmallOptions()), general(SmallOptions());
  const int layers = SmallOptions().num_layers;
  for (int step = 0; step < 3000; ++step) {
    const SeqId id = static_cast<SeqId>(rng() % 4);
    if (!fast.HasSequence(id)) {
      ASSERT_TRUE(fast.AddSequence(id).ok());
      ASSERT_TRUE(general.AddSequence(id).ok());
    } else if (rng() % 64 == 0) {  // rare enough that lists fill up and the pool runs short
      fast.RemoveSequence(id);
      general.RemoveSequence(id);
    } else if (rng() % 16 == 0) {  // some layers shrink (compression, eviction)
      std::vector<int> lengths(layers);
      for (int layer = 0; layer < layers; ++layer) {
        lengths[layer] = static_cast<int>(rng() % (fast.Capacity(id, layer) + 1));
      }
      fast.SetLengths(id, lengths);
      general.SetLengths(id, lengths);
    } else {  // one decode step
      std::vector<int> lengths(layers);
      const int needed = fast.PagesToAppend(id, lengths);
      std::vector<int> capacities(layers);
      for (int layer = 0; layer < layers; ++layer) {
        ASSERT_EQ(lengths[layer], general.Length(id, layer));
        capacities[layer] = lengths[layer] + 1;
      }
      ASSERT_EQ(needed, general.PagesToGrow(id, capacities));
      const bool grown = fast.GrowForAppend(id);
      ASSERT_EQ(grown, general.Grow(id, capacities));
      if (grown) {
        fast.SetLengths(id, capacities);
        general.SetLengths(id, capacities);
      }
    }
    ASSERT_EQ(fast.page_table(), general.page_table());
    ASSERT_EQ(fast.lengths(), general.lengths());
    ASSERT_EQ(fast.num_free_pages(), general.num_free_pages());
    ASSERT_EQ(fast.TakePageTablePatches(), general.TakePageTablePatches());
    ASSERT_TRUE(fast.CheckInvariants().ok()) << fast.CheckInvariants().ToString();
  }
}

}  // namespace
}  // namespace sieve
