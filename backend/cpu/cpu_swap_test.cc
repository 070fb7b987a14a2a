// Backend::SwapOutPages / SwapInPages on the CPU backend: a page's bytes of K, V and the side
// pools go to its slot in the layout KvPoolPageParts states, and come back into another page
// bit for bit, for every pool dtype and side-pool combination, leaving every other page as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/testing.h"

namespace sieve {
namespace {

struct PoolKind {
  DType dtype;
  bool scores;
  bool positions;
};

void FillBytes(Tensor& tensor, std::mt19937_64& rng) {
  auto* bytes = tensor.data_as<uint8_t>();
  for (size_t index = 0; index < tensor.nbytes(); ++index) bytes[index] = rng() & 0xff;
}

std::vector<uint8_t> PageBytes(const Tensor& part, int num_pages, int page) {
  const size_t bytes = part.nbytes() / num_pages;
  const uint8_t* begin = part.data_as<uint8_t>() + page * bytes;
  return {begin, begin + bytes};
}

TEST(CpuSwapTest, PagesRoundTripThroughHostSlotsBitwise) {
  auto rng = testing::MakeRng();
  auto backend = MakeCpuBackend();
  for (const PoolKind kind :
       {PoolKind{DType::kF32, true, true}, PoolKind{DType::kF32, false, true},
        PoolKind{DType::kF8E4M3, false, false}, PoolKind{DType::kF8E4M3, true, true}}) {
    SCOPED_TRACE(std::string(DTypeName(kind.dtype)) + (kind.scores ? " scores" : "") +
                 (kind.positions ? " positions" : ""));
    KvPool pool;
    pool.page_size = 4;
    pool.num_pages = 9;
    pool.num_kv_heads = 2;
    pool.head_dim = 8;
    const std::vector<int64_t> shape = {pool.num_pages, pool.page_size, pool.num_kv_heads,
                                        pool.head_dim};
    pool.k = backend->Allocate(shape, kind.dtype);
    pool.v = backend->Allocate(shape, kind.dtype);
    const int64_t entries = int64_t{pool.num_pages} * pool.page_size;
    if (kind.scores) pool.scores = backend->Allocate({entries, pool.num_kv_heads}, DType::kF32);
    if (kind.positions) {
      pool.positions = backend->Allocate({entries, pool.num_kv_heads}, DType::kI32);
    }
    std::vector<Tensor*> parts = {&pool.k, &pool.v};
    if (kind.scores) parts.push_back(&pool.scores);
    if (kind.positions) parts.push_back(&pool.positions);
    for (Tensor* part : parts) FillBytes(*part, rng);

    const size_t slot_bytes = KvPageSwapBytes(pool);
    size_t expected_slot_bytes = 0;
    for (const Tensor* part : parts) expected_slot_bytes += part->nbytes() / pool.num_pages;
    ASSERT_EQ(slot_bytes, expected_slot_bytes);

    // Scattered pages and slots, and a run of consecutive ones (3, 4 -> 5, 6).
    const std::vector<int32_t> out_pages = {7, 0, 3, 4};
    const std::vector<int32_t> slots = {1, 3, 5, 6};
    HostBuffer host = backend->AllocateHostBuffer(8 * slot_bytes);
    std::memset(host.get(), 0xa5, 8 * slot_bytes);
    backend->SwapOutPages(pool, out_pages, slots, host.get());
    backend->Synchronize();
    std::vector<std::vector<std::vector<uint8_t>>> original(out_pages.size());
    for (size_t index = 0; index < out_pages.size(); ++index) {
      size_t offset = 0;
      for (const Tensor* part : parts) {
        original[index].push_back(PageBytes(*part, pool.num_pages, out_pages[index]));
        const std::vector<uint8_t>& want = original[index].back();
        EXPECT_EQ(0, std::memcmp(host.get() + slots[index] * slot_bytes + offset, want.data(),
                                 want.size()))
            << "page " << out_pages[index] << " in slot " << slots[index];
        offset += want.size();
      }
    }
    // Slots not written keep their bytes.
    for (const int slot : {0, 2, 4, 7}) {
      for (size_t byte = 0; byte < slot_bytes; ++byte) {
        ASSERT_EQ(host.get()[slot * slot_bytes + byte], 0xa5) << "slot " << slot;
      }
    }

    // The pool is rewritten (the pages were handed to others); the slots come back elsewhere.
    for (Tensor* part : parts) FillBytes(*part, rng);
    std::vector<std::vector<uint8_t>> before;
    for (const Tensor* part : parts) {
      const uint8_t* begin = part->data_as<uint8_t>();
      before.emplace_back(begin, begin + part->nbytes());
    }
    const std::vector<int32_t> in_pages = {2, 8, 5, 6};
    backend->SwapInPages(host.get(), slots, in_pages, pool);
    backend->Synchronize();
    for (size_t part_index = 0; part_index < parts.size(); ++part_index) {
      for (int page = 0; page < pool.num_pages; ++page) {
        const auto found = std::find(in_pages.begin(), in_pages.end(), page);
        const std::vector<uint8_t> got = PageBytes(*parts[part_index], pool.num_pages, page);
        if (found != in_pages.end()) {
          EXPECT_EQ(got, original[found - in_pages.begin()][part_index]) << "page " << page;
        } else {
          const size_t bytes = got.size();
          EXPECT_EQ(0, std::memcmp(got.data(), before[part_index].data() + page * bytes, bytes))
              << "page " << page << " changed";
        }
      }
    }
  }
}

}  // namespace
}  // namespace sieve
