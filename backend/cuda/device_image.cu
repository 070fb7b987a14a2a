#include "backend/cuda/device_image.h"

#include <atomic>

#include "backend/cuda/cuda_check.h"

namespace sieve::cuda {
namespace {

// Each device image holds its own values; the host reads the loaded one's.
#if defined(__CUDA_ARCH__)
__device__ int kImageArch = __CUDA_ARCH__;
#else
__device__ int kImageArch = 0;
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int kImageSm90a = 1;
#else
__device__ int kImageSm90a = 0;
#endif

struct ImageFacts {
  int arch = 0;
  bool sm90a = false;
};

ImageFacts LoadedImage() {
  constexpr int kMaxDevices = 64;
  // arch + 1 (0: not read yet) and the sm_90a bit, per device.
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  int packed = device < kMaxDevices ? known[device].load(std::memory_order_acquire) : 0;
  if (packed == 0) {
    int arch = 0;
    int sm90a = 0;
    SIEVE_CUDA_CHECK(cudaMemcpyFromSymbol(&arch, kImageArch, sizeof(arch)));
    SIEVE_CUDA_CHECK(cudaMemcpyFromSymbol(&sm90a, kImageSm90a, sizeof(sm90a)));
    packed = ((arch + 1) << 1) | (sm90a != 0 ? 1 : 0);
    if (device < kMaxDevices) known[device].store(packed, std::memory_order_release);
  }
  return ImageFacts{(packed >> 1) - 1, (packed & 1) != 0};
}

}  // namespace

int LoadedImageArch() { return LoadedImage().arch; }

bool LoadedImageIsSm90a() { return LoadedImage().sm90a; }

}  // namespace sieve::cuda
