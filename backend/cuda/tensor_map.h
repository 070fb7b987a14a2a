// Host side of the sm_90a kernels (prefill_attention_sm90.cu, epilogue_gemm_sm90.cu): tensor maps
// (TMA descriptors) of bf16 matrices in the panels wgmma.cuh's tiles use, and the check that the
// current device runs a kernel's sm_90a code.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>

namespace sieve::cuda {

// A [rows][width] bf16 matrix with row stride `stride` (elements) as boxes of `box_rows` rows x
// 64 columns, 128-byte swizzled: each box lands as one panel of a tile. Box elements past the
// matrix read as zeros.
CUtensorMap PanelTensorMap(const __nv_bfloat16* base, int64_t width, int64_t rows, int64_t stride,
                           int box_rows);

// Whether the current device is an sm_90 part and `kernel` was compiled for sm_90a (a build for
// other architectures has the kernel without its body; its PTX would JIT to nothing useful).
// Asked once per device.
class Sm90aKernelCheck {
 public:
  explicit Sm90aKernelCheck(const void* kernel) : kernel_(kernel) {}
  bool Runs();

 private:
  const void* kernel_;
  std::atomic<uint64_t> checked_{0};
  std::atomic<uint64_t> runs_{0};
};

}  // namespace sieve::cuda
