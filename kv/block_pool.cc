#include "kv/block_pool.h"

#include <iterator>

#include "core/check.h"

namespace sieve {

BlockPool::BlockPool(int num_pages) : ref_counts_(num_pages, 0) {
  SIEVE_CHECK(num_pages >= 0);
  free_list_.reserve(num_pages);
  for (int32_t page = num_pages - 1; page >= 0; --page) free_list_.push_back(page);
}

bool BlockPool::Allocate(int count, std::vector<int32_t>& out) {
  SIEVE_CHECK(count >= 0);
  if (count > num_free()) return false;
  // Pops `count` ids off the top of the stack in one move (the same order as one at a time).
  const auto top = free_list_.end() - count;
  out.insert(out.end(), std::make_reverse_iterator(free_list_.end()),
             std::make_reverse_iterator(top));
  for (auto it = top; it != free_list_.end(); ++it) ref_counts_[*it] = 1;
  free_list_.erase(top, free_list_.end());
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
    if (--ref_counts_[page] == 0) free_list_.push_back(page);
  }
}

}  // namespace sieve
