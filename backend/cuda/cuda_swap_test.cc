// Backend::SwapOutPages / SwapInPages on CUDA against the CPU twin, bit for bit (the copies move
// bytes: the tolerance is zero): the host slots after a swap-out, and the pool after the slots
// come back into other pages, for bf16 and e4m3 pools with and without side pools. Skips without
// a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"
#include "core/testing.h"

namespace sieve {
namespace {

struct PoolKind {
  DType dtype;
  bool side_pools;
};

// A pool of `kind` on `backend` whose every byte is `bytes` (one vector per part, K, V, then the
// side pools, as KvPoolPageParts orders them).
KvPool MakePool(Backend& backend, const PoolKind& kind,
                const std::vector<std::vector<uint8_t>>& bytes) {
  KvPool pool;
  pool.page_size = 16;
  pool.num_pages = 40;
  pool.num_kv_heads = 2;
  pool.head_dim = 128;
  const std::vector<int64_t> shape = {pool.num_pages, pool.page_size, pool.num_kv_heads,
                                      pool.head_dim};
  pool.k = backend.Allocate(shape, kind.dtype);
  pool.v = backend.Allocate(shape, kind.dtype);
  if (kind.side_pools) {
    const int64_t entries = int64_t{pool.num_pages} * pool.page_size;
    pool.scores = backend.Allocate({entries, pool.num_kv_heads}, DType::kF32);
    pool.positions = backend.Allocate({entries, pool.num_kv_heads}, DType::kI32);
  }
  size_t index = 0;
  for (Tensor* part : {&pool.k, &pool.v, &pool.scores, &pool.positions}) {
    if (!part->defined() || index == bytes.size()) continue;
    backend.CopyFromHost(bytes[index].data(), bytes[index].size(), *part);
    ++index;
  }
  return pool;
}

std::vector<std::vector<uint8_t>> PoolBytes(Backend& backend, const KvPool& pool) {
  std::vector<std::vector<uint8_t>> bytes;
  for (const Tensor* part : KvPoolPageParts(pool)) {
    if (!part->defined()) continue;
    bytes.emplace_back(part->nbytes());
    backend.CopyToHost(*part, bytes.back().data());
  }
  return bytes;
}

TEST(CudaSwapTest, SwapOutAndInMatchTheCpuTwinBitwise) {
  SIEVE_REQUIRE_GPU();
  auto gpu = std::move(MakeCudaBackend(0)).value();
  auto cpu = MakeCpuBackend();
  auto rng = testing::MakeRng();
  for (const PoolKind kind : {PoolKind{DType::kBF16, true}, PoolKind{DType::kBF16, false},
                              PoolKind{DType::kF8E4M3, true}}) {
    SCOPED_TRACE(std::string(DTypeName(kind.dtype)) + (kind.side_pools ? " side pools" : ""));
    // The CPU twin's pool has the same dtype and bytes: the copies never read values.
    const KvPool shape_only = MakePool(*cpu, kind, {});
    std::vector<std::vector<uint8_t>> bytes;
    for (const Tensor* part : KvPoolPageParts(shape_only)) {
      if (!part->defined()) continue;
      bytes.emplace_back(part->nbytes());
      for (uint8_t& byte : bytes.back()) byte = rng() & 0xff;
    }
    KvPool gpu_pool = MakePool(*gpu, kind, bytes);
    KvPool cpu_pool = MakePool(*cpu, kind, bytes);
    ASSERT_EQ(KvPageSwapBytes(gpu_pool), KvPageSwapBytes(cpu_pool));
    const size_t slot_bytes = KvPageSwapBytes(gpu_pool);

    // Scattered pages, and runs of consecutive pages into consecutive slots (one 2D copy each).
    const std::vector<int32_t> out_pages = {39, 0, 7, 8, 9, 21, 3};
    const std::vector<int32_t> slots = {4, 11, 0, 1, 2, 7, 6};
    const size_t host_bytes = 12 * slot_bytes;
    HostBuffer gpu_host = gpu->AllocateHostBuffer(host_bytes);
    HostBuffer cpu_host = cpu->AllocateHostBuffer(host_bytes);
    std::memset(gpu_host.get(), 0x5a, host_bytes);
    std::memset(cpu_host.get(), 0x5a, host_bytes);
    gpu->SwapOutPages(gpu_pool, out_pages, slots, gpu_host.get());
    cpu->SwapOutPages(cpu_pool, out_pages, slots, cpu_host.get());
    gpu->Synchronize();
    ASSERT_EQ(0, std::memcmp(gpu_host.get(), cpu_host.get(), host_bytes));

    // Back into other pages (some the swapped ones themselves), after the pool was rewritten.
    std::vector<std::vector<uint8_t>> rewritten = bytes;
    for (auto& part : rewritten) {
      for (uint8_t& byte : part) byte = rng() & 0xff;
    }
    gpu_pool = MakePool(*gpu, kind, rewritten);
    cpu_pool = MakePool(*cpu, kind, rewritten);
    const std::vector<int32_t> in_pages = {10, 11, 12, 0, 38, 39, 5};
    gpu->SwapInPages(gpu_host.get(), slots, in_pages, gpu_pool);
    cpu->SwapInPages(cpu_host.get(), slots, in_pages, cpu_pool);
    const auto gpu_after = PoolBytes(*gpu, gpu_pool);
    const auto cpu_after = PoolBytes(*cpu, cpu_pool);
    ASSERT_EQ(gpu_after.size(), cpu_after.size());
    for (size_t part = 0; part < gpu_after.size(); ++part) {
      EXPECT_EQ(gpu_after[part], cpu_after[part]) << "part " << part;
      EXPECT_NE(cpu_after[part], rewritten[part]) << "part " << part << " was not swapped in";
    }
  }
}

}  // namespace
}  // namespace sieve
