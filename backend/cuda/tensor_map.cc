#include "backend/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"

namespace sieve::cuda {
namespace {

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no libcuda link).
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SIEVE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                      cudaEnableDefault, &found));
    SIEVE_CHECK(found == cudaDriverEntryPointSuccess && function != nullptr)
        << "the CUDA driver has no cuTensorMapEncodeTiled";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

}  // namespace

CUtensorMap PanelTensorMap(const __nv_bfloat16* base, int64_t width, int64_t rows, int64_t stride,
                           int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = TensorMapEncoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(base), dims, strides,
      box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SIEVE_CHECK(result == CUDA_SUCCESS) << "cuTensorMapEncodeTiled failed: " << result;
  return map;
}

bool Sm90aKernelCheck::Runs() {
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((checked_.load(std::memory_order_acquire) & bit) == 0) {
    int major = 0;
    int minor = 0;
    SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    bool runs = false;
    if (major == 9 && minor == 0) {
      cudaFuncAttributes attributes{};
      runs = cudaFuncGetAttributes(&attributes, kernel_) == cudaSuccess &&
             attributes.binaryVersion == 90 && attributes.ptxVersion == 90;
      (void)cudaGetLastError();  // a kernel image that does not load is an answer, not an error
    }
    if (runs) runs_.fetch_or(bit, std::memory_order_release);
    checked_.fetch_or(bit, std::memory_order_release);
  }
  return (runs_.load(std::memory_order_acquire) & bit) != 0;
}

}  // namespace sieve::cuda
