// Checking CUDA and cuBLAS return codes. A failing CUDA call inside Sieve is a bug or a dead
// device, not bad input: it aborts with the call, the error and the place.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define SIEVE_CUDA_CHECK(call)                                                  \
  do {                                                                          \
    const cudaError_t sieve_cuda_error_ = (call);                               \
    if (sieve_cuda_error_ != cudaSuccess) {                                     \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(sieve_cuda_error_));                      \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

// The same for a cuBLAS(Lt) call's status.
#define SIEVE_CUBLAS_CHECK(call)                                                       \
  do {                                                                                 \
    const cublasStatus_t sieve_cublas_status_ = (call);                                \
    if (sieve_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                               \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(sieve_cublas_status_));                            \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// After a kernel launch: catches bad launch configurations at once.
#define SIEVE_CUDA_CHECK_LAUNCH() SIEVE_CUDA_CHECK(cudaGetLastError())

namespace sieve::cuda {

// Whether `pointer` may be read or written in 16-byte vectors (the kernels' uint4 accesses).
inline bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// `kAttribute` of the current device, read once per device (launch paths ask on every call);
// device ids past the cache read it every time.
template <cudaDeviceAttr kAttribute>
int CurrentDeviceAttribute() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> values[kMaxDevices] = {};
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  int value = device < kMaxDevices ? values[device].load() : 0;
  if (value == 0) {
    SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttribute, device));
    if (device < kMaxDevices) values[device].store(value);
  }
  return value;
}

// Runs `configure()` the first time it is called for `device` with this `done` set: kernel
// attributes (the opt-in to more than 48 KiB of dynamic shared memory, the carveout) are per
// device and must be set before the kernel's first launch there. Two racing first calls may both
// configure, which is harmless.
template <typename Configure>
void OncePerDevice(std::atomic<uint64_t>& done, int device, Configure&& configure) {
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((done.load(std::memory_order_acquire) & bit) != 0) return;
  configure();
  done.fetch_or(bit, std::memory_order_release);
}

}  // namespace sieve::cuda
