#include "backend/cpu/cpu_backend.h"

#include <unistd.h>

#include <cstring>
#include <new>
#include <random>

#include "core/check.h"

namespace sieve {

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

CpuBackend::CpuBackend(ThreadPool* pool) : pool_(pool ? *pool : ThreadPool::Default()) {}

std::string CpuBackend::name() const {
  return "cpu (" + std::to_string(pool_.num_threads()) + " threads)";
}

size_t CpuBackend::FreeMemoryBytes() const {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * page_size : 0;
}

Tensor CpuBackend::Allocate(std::vector<int64_t> shape, DType dtype) {
  return Tensor::Empty(std::move(shape), dtype);
}

void CpuBackend::CopyFromHost(const void* src, size_t bytes, Tensor& dst) {
  SIEVE_CHECK(bytes <= dst.nbytes()) << "copy of " << bytes << " bytes into " << dst.ShapeString();
  std::memcpy(dst.data(), src, bytes);
}

void CpuBackend::CopyToHost(const Tensor& src, void* dst) {
  std::memcpy(dst, src.data(), src.nbytes());
}

Tensor CpuBackend::UploadWeight(const void* src, DType src_dtype, std::vector<int64_t> shape) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
  ConvertToFloat(src, src_dtype, static_cast<size_t>(tensor.numel()), tensor.data_as<float>());
  return tensor;
}

void CpuBackend::FillRandom(Tensor& tensor, uint64_t seed, float stddev) {
  SIEVE_CHECK(tensor.dtype() == DType::kF32 && tensor.is_contiguous());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  float* data = tensor.data_as<float>();
  for (int64_t index = 0; index < tensor.numel(); ++index) data[index] = normal(rng);
}

void CpuBackend::Copy(const Tensor& src, Tensor& dst) {
  SIEVE_CHECK(src.rank() == 2 && dst.rank() == 2 && src.dim(0) == dst.dim(0) &&
              src.dim(1) == dst.dim(1) && src.dtype() == dst.dtype() && src.stride(1) == 1 &&
              dst.stride(1) == 1)
      << "copy of " << src.ShapeString() << " into " << dst.ShapeString();
  const size_t row_bytes = static_cast<size_t>(src.dim(1)) * src.element_size();
  const auto* from = static_cast<const char*>(src.data());
  auto* to = static_cast<char*>(dst.data());
  for (int64_t row = 0; row < src.dim(0); ++row) {
    std::memcpy(to + row * dst.stride(0) * dst.element_size(),
                from + row * src.stride(0) * src.element_size(), row_bytes);
  }
}

HostBuffer CpuBackend::AllocateHostBuffer(size_t bytes) {
  return HostBuffer(new (std::nothrow) uint8_t[bytes], [](uint8_t* memory) { delete[] memory; });
}

namespace {

// Page pages[i] of the pool <-> slot slots[i] of `host`, part by part (KvPoolPageParts).
void CopyPageSlots(const KvPool& pool, std::span<const int32_t> pages,
                   std::span<const int32_t> slots, uint8_t* host, bool to_host) {
  SIEVE_CHECK(pages.size() == slots.size());
  const size_t slot_bytes = KvPageSwapBytes(pool);
  for (size_t index = 0; index < pages.size(); ++index) {
    SIEVE_CHECK(pages[index] >= 0 && pages[index] < pool.num_pages);
    uint8_t* slot = host + static_cast<size_t>(slots[index]) * slot_bytes;
    for (const Tensor* part : KvPoolPageParts(pool)) {
      const size_t bytes = KvPoolPartBytes(pool, *part);
      if (bytes == 0) continue;
      uint8_t* page = part->data_as<uint8_t>() + static_cast<size_t>(pages[index]) * bytes;
      if (to_host) {
        std::memcpy(slot, page, bytes);
      } else {
        std::memcpy(page, slot, bytes);
      }
      slot += bytes;
    }
  }
}

}  // namespace

void CpuBackend::SwapOutPages(const KvPool& pool, std::span<const int32_t> pages,
                              std::span<const int32_t> slots, uint8_t* host) {
  CopyPageSlots(pool, pages, slots, host, /*to_host=*/true);
}

void CpuBackend::SwapInPages(const uint8_t* host, std::span<const int32_t> slots,
                             std::span<const int32_t> pages, KvPool& pool) {
  CopyPageSlots(pool, pages, slots, const_cast<uint8_t*>(host), /*to_host=*/false);
}

}  // namespace sieve
