#include "kv/block_pool.h"

#include <iterator>
#include <string>

#include "core/check.h"

namespace sieve {

BlockPool::BlockPool(int num_pages)
    : ref_counts_(num_pages, 0),
      lru_prev_(num_pages, -1),
      lru_next_(num_pages, -1),
      keyed_(num_pages, 0) {
  SIEVE_CHECK(num_pages >= 0);
  free_list_.reserve(num_pages);
  for (int32_t page = num_pages - 1; page >= 0; --page) free_list_.push_back(page);
}

bool BlockPool::Allocate(int count, std::vector<int32_t>& out) {
  SIEVE_CHECK(count >= 0);
  if (count > num_free()) return false;
  // Pops ids off the top of the stack in one move (the same order as one at a time).
  const int from_free = std::min(count, static_cast<int>(free_list_.size()));
  const auto top = free_list_.end() - from_free;
  out.insert(out.end(), std::make_reverse_iterator(free_list_.end()),
             std::make_reverse_iterator(top));
  for (auto it = top; it != free_list_.end(); ++it) ref_counts_[*it] = 1;
  free_list_.erase(top, free_list_.end());
  for (int evicted = from_free; evicted < count; ++evicted) {
    const int32_t page = lru_head_;
    LruUnlink(page);
    DropKey(page);
    ++num_evicted_;
    ref_counts_[page] = 1;
    out.push_back(page);
  }
  return true;
}

void BlockPool::AddRef(int32_t page) {
  SIEVE_CHECK(page >= 0 && page < num_pages() && ref_counts_[page] > 0) << "page " << page;
  ++ref_counts_[page];
}

void BlockPool::Release(std::span<const int32_t> pages) {
  for (const int32_t page : pages) {
    SIEVE_CHECK(page >= 0 && page < num_pages()) << "page " << page;
    SIEVE_CHECK(ref_counts_[page] > 0) << "page " << page << " released twice";
    if (--ref_counts_[page] > 0) continue;
    if (keyed_[page] != 0) {
      LruPushBack(page);
    } else {
      free_list_.push_back(page);
    }
  }
}

bool BlockPool::Register(int32_t page, const PageKey& key) {
  SIEVE_CHECK(page >= 0 && page < num_pages() && ref_counts_[page] > 0)
      << "only a used page takes a key (page " << page << ")";
  if (keyed_[page] != 0 || Lookup(key) >= 0) return false;
  key_of_page_.emplace(page, key);
  keyed_[page] = 1;
  page_of_key_.emplace(key.hash, page);
  return true;
}

int32_t BlockPool::Lookup(const PageKey& key) const {
  const auto [first, last] = page_of_key_.equal_range(key.hash);
  for (auto it = first; it != last; ++it) {
    if (key_of_page_.at(it->second) == key) return it->second;
  }
  return -1;
}

void BlockPool::Acquire(int32_t page) {
  SIEVE_CHECK(page >= 0 && page < num_pages()) << "page " << page;
  if (ref_counts_[page] == 0) {
    SIEVE_CHECK(keyed_[page] != 0) << "page " << page << " is free, not cached";
    LruUnlink(page);
  }
  ++ref_counts_[page];
}

void BlockPool::DropKey(int32_t page) {
  const auto found = key_of_page_.find(page);
  const auto [first, last] = page_of_key_.equal_range(found->second.hash);
  for (auto it = first; it != last; ++it) {
    if (it->second == page) {
      page_of_key_.erase(it);
      break;
    }
  }
  key_of_page_.erase(found);
  keyed_[page] = 0;
}

void BlockPool::LruUnlink(int32_t page) {
  const int32_t prev = lru_prev_[page];
  const int32_t next = lru_next_[page];
  (prev >= 0 ? lru_next_[prev] : lru_head_) = next;
  (next >= 0 ? lru_prev_[next] : lru_tail_) = prev;
  lru_prev_[page] = lru_next_[page] = -1;
  --num_cached_;
}

void BlockPool::LruPushBack(int32_t page) {
  lru_prev_[page] = lru_tail_;
  lru_next_[page] = -1;
  (lru_tail_ >= 0 ? lru_next_[lru_tail_] : lru_head_) = page;
  lru_tail_ = page;
  ++num_cached_;
}

Status BlockPool::CheckInvariants() const {
  std::vector<int> seen(num_pages(), 0);  // 1: in the free list, 2: in the LRU
  for (const int32_t page : free_list_) {
    if (page < 0 || page >= num_pages() || seen[page] != 0) {
      return InternalError("free list holds page " + std::to_string(page) + " twice or bad");
    }
    if (ref_counts_[page] != 0 || keyed_[page] != 0) {
      return InternalError("free page " + std::to_string(page) + " is referenced or keyed");
    }
    seen[page] = 1;
  }
  int in_lru = 0;
  for (int32_t page = lru_head_, prev = -1; page >= 0; prev = page, page = lru_next_[page]) {
    if (seen[page] != 0 || lru_prev_[page] != prev || ++in_lru > num_pages()) {
      return InternalError("the LRU of cached pages is broken at page " + std::to_string(page));
    }
    if (ref_counts_[page] != 0 || keyed_[page] == 0) {
      return InternalError("cached page " + std::to_string(page) + " is referenced or unkeyed");
    }
    seen[page] = 2;
  }
  if (in_lru != num_cached_) return InternalError("cached page count disagrees with the LRU");
  for (int32_t page = 0; page < num_pages(); ++page) {
    if (seen[page] == 0 && ref_counts_[page] <= 0) {
      return InternalError("page " + std::to_string(page) + " is in no list and unreferenced");
    }
    if ((keyed_[page] != 0) != (key_of_page_.count(page) != 0)) {
      return InternalError("page " + std::to_string(page) + "'s key flag disagrees with the map");
    }
  }
  for (const auto& [page, key] : key_of_page_) {
    if (Lookup(key) != page) {
      return InternalError("page " + std::to_string(page) + "'s key does not find it");
    }
  }
  if (key_of_page_.size() != page_of_key_.size()) {
    return InternalError("the key maps disagree");
  }
  return Status::Ok();
}

}  // namespace sieve
