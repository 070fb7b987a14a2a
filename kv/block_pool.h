// BlockPool: the ids and reference counts of the KV pages of one shared pool. It holds no K/V
// data (the backend's KvPool tensors do) and no per-sequence state (KvCacheManager does).
//
// Invariants: a page is either free (ref count 0, in the free list exactly once) or used (ref
// count >= 1, not in the free list); num_free() + num_used() == num_pages(). Ref counts exist so a
// prefix cache can share a page between sequences; freeing a page twice is a bug (CHECK).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sieve {

class BlockPool {
 public:
  explicit BlockPool(int num_pages);

  int num_pages() const { return static_cast<int>(ref_counts_.size()); }
  int num_free() const { return static_cast<int>(free_list_.size()); }
  int num_used() const { return num_pages() - num_free(); }
  int ref_count(int32_t page) const { return ref_counts_.at(page); }

  // Takes `count` free pages (ref count 1) into `out`; returns false and takes none when fewer
  // are free.
  [[nodiscard]] bool Allocate(int count, std::vector<int32_t>& out);
  void AddRef(int32_t page);
  // Drops one reference of each page; a page whose count reaches 0 is free again.
  void Release(std::span<const int32_t> pages);

 private:
  std::vector<int32_t> ref_counts_;  // [num_pages]
  std::vector<int32_t> free_list_;   // stack of free page ids; low ids are handed out first
};

}  // namespace sieve
