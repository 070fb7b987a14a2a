// Programmatic dependent launch (PDL, sm_90+). A decode step is ~300 short kernels in a row; with
// plain stream order each waits for its predecessor to drain and then pays its own launch and
// ramp-up. A kernel launched here with LaunchWithPdl may start while its predecessor still runs:
// it does what depends on nothing (a GEMM prefetches its weights) and then calls PdlWait(), which
// returns once the predecessor grid has finished and its writes are visible. Every kernel
// launched this way calls PdlWait() on every path before it reads or writes anything another
// kernel touches, and before it exits: that keeps the ordering transitive along the stream. They
// also call PdlLaunchDependents() early, which lets the next kernel be scheduled.
// On devices before sm_90, or with SIEVE_PDL=0 (a documented option, README_gemm.md), launches
// are plain and both calls are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_image.h"

namespace sieve::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launches use PDL: SIEVE_PDL ("0" turns it off) until SetPdlEnabled says otherwise.
inline std::atomic<int>& PdlSetting() {
  static std::atomic<int> setting{[] {
    const char* value = std::getenv("SIEVE_PDL");
    return value != nullptr && std::strcmp(value, "0") == 0 ? 0 : 1;
  }()};
  return setting;
}
inline void SetPdlEnabled(bool enabled) { PdlSetting().store(enabled ? 1 : 0); }

// The current device's compute capability major, read once per device.
inline int DeviceComputeMajor() {
  return CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>();
}

// PDL is on, and the current device and the device code loaded on it are sm_90 or newer (code
// built for older targets has no griddepcontrol: device_image.h).
inline bool PdlActive() {
  return PdlSetting().load() != 0 && DeviceComputeMajor() >= 9 && LoadedImageArch() >= 900;
}

// A kernel that never triggers its dependents early (cuBLASLt's: README_gemm.md) lets nothing
// overlap it, and the launch after it costs more with the programmatic attribute than without: in
// a decode step the gaps from the qkv GEMM to attention and from gate_up to SiLU were 0.82 and
// 0.79 us with it, 0.35 and 0.26 us without (kernel timelines of
// bench/results/2026-12-01-s9-h200-pdl-candidates.json). GemmRunner notes each
// cuBLASLt launch here; the next LaunchWithPdl on that stream (from this host thread) is plain.
// A plain launch is always correct: PdlWait() then returns at once.
struct NonTriggeringLaunch {
  bool pending = false;
  cudaStream_t stream = nullptr;
};
inline NonTriggeringLaunch& LastNonTriggeringLaunch() {
  thread_local NonTriggeringLaunch last;
  return last;
}
inline void NoteNonTriggeringLaunch(cudaStream_t stream) {
  LastNonTriggeringLaunch() = NonTriggeringLaunch{true, stream};
}
// Whether the next launch on `stream` follows a noted kernel directly; clears the note.
inline bool TakeNonTriggeringLaunch(cudaStream_t stream) {
  NonTriggeringLaunch& last = LastNonTriggeringLaunch();
  if (!last.pending || last.stream != stream) return false;
  last.pending = false;
  return true;
}

// LaunchWithPdl whose grid is tiled by thread-block clusters of `cluster` CTAs (sm_90+; a cluster
// of one CTA is a plain launch).
template <typename... Params, typename... Args>
void LaunchWithPdlInClusters(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                             size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  const bool after_non_triggering = TakeNonTriggeringLaunch(stream);
  if (PdlActive() && !after_non_triggering) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster.x;
    attributes[count].val.clusterDim.y = cluster.y;
    attributes[count].val.clusterDim.z = cluster.z;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  SIEVE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void LaunchWithPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  LaunchWithPdlInClusters(kernel, grid, dim3(1, 1, 1), block, shared_bytes, stream,
                          std::forward<Args>(args)...);
}

}  // namespace sieve::cuda
