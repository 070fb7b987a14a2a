#include "kv/block_pool.h"

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
  for (int index = 0; index < count; ++index) {
    const int32_t page = free_list_.back();
    free_list_.pop_back();
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
    if (--ref_counts_[page] == 0) free_list_.push_back(page);
  }
}

}  // namespace sieve
