// BlockPool: the ids and reference counts of the KV pages of one shared pool, and the prefix
// cache's map of full pages by PageKey. It holds no K/V data (the backend's KvPool tensors do)
// and no per-sequence state (KvCacheManager does).
//
// A page is in one of three states:
// - free: ref count 0, in the free list exactly once, no key;
// - used: ref count >= 1 (one per list that holds it: sequences share a cached prefix's pages),
//   in neither list, with or without a key;
// - cached: ref count 0 with a key, in the LRU of cached pages exactly once. Lookup finds it,
//   Acquire takes it back (used again); Allocate evicts the least recently released cached pages
//   when the free list runs short, dropping their keys.
// Cached pages count as free (num_free): caching never refuses an allocation that would succeed
// without it. num_free() + num_used() == num_pages(). Freeing a page twice is a bug (CHECK).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/page_key.h"

namespace sieve {

class BlockPool {
 public:
  explicit BlockPool(int num_pages);

  int num_pages() const { return static_cast<int>(ref_counts_.size()); }
  // Free and cached pages: what Allocate can hand out.
  int num_free() const { return static_cast<int>(free_list_.size()) + num_cached_; }
  int num_used() const { return num_pages() - num_free(); }
  int num_cached() const { return num_cached_; }                           // cached, no reference
  int num_keyed() const { return static_cast<int>(key_of_page_.size()); }  // used or cached
  int64_t num_evicted() const { return num_evicted_; }
  int ref_count(int32_t page) const { return ref_counts_.at(page); }

  // Takes `count` pages (ref count 1) into `out`: free ones first (low ids first), then cached
  // ones, least recently released first (their keys are dropped). Returns false and takes none
  // when fewer than `count` are free or cached.
  [[nodiscard]] bool Allocate(int count, std::vector<int32_t>& out);
  // One more reference to a used page.
  void AddRef(int32_t page);
  // Drops one reference of each page; at 0 a keyed page becomes cached, any other free.
  void Release(std::span<const int32_t> pages);

  // ---- prefix cache ----
  // Gives a used page `key` (its K/V are complete and will not change while it is keyed). False,
  // and nothing changes, when another page holds an equal key already or this page has one.
  bool Register(int32_t page, const PageKey& key);
  // The page holding an equal key (used or cached), or -1.
  int32_t Lookup(const PageKey& key) const;
  // One more reference to a used or cached page (a cached page leaves the LRU).
  void Acquire(int32_t page);
  bool HasKey(int32_t page) const { return keyed_.at(page) != 0; }

  // OK when the states above hold for every page.
  Status CheckInvariants() const;

 private:
  void LruUnlink(int32_t page);
  void LruPushBack(int32_t page);
  void DropKey(int32_t page);

  std::vector<int32_t> ref_counts_;  // [num_pages]
  std::vector<int32_t> free_list_;   // stack of free page ids; low ids are handed out first
  // The LRU of cached pages: a doubly linked list through [num_pages] arrays, head = oldest.
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int num_cached_ = 0;
  int64_t num_evicted_ = 0;
  std::vector<uint8_t> keyed_;  // [num_pages]: 1 where key_of_page_ has the page
  std::unordered_map<int32_t, PageKey> key_of_page_;        // keyed pages only
  std::unordered_multimap<uint64_t, int32_t> page_of_key_;  // hash -> page
};

}  // namespace sieve
