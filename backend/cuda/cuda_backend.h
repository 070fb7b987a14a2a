// CudaBackend: the Backend ops on one NVIDIA GPU. bf16 weights, activations and KV pages, fp32
// accumulation; GEMMs through cuBLASLt; every other op is a kernel of kernels.h. All work goes to
// one stream, so ops are ordered without host synchronisation; CopyToHost waits.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"

namespace sieve {

// A CUDA backend on device `device_index`; Unavailable when there is no usable GPU.
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device_index);
// GPUs the CUDA runtime sees (0 when none or when it fails).
int CudaDeviceCount();

// The device index and the stream (a cudaStream_t) of a backend MakeCudaBackend made; -1 and null
// for any other backend. Collectives that must be ordered with the backend's ops (the NCCL
// communicator) run on this stream.
int CudaDeviceOf(const Backend& backend);
void* CudaStreamOf(const Backend& backend);

}  // namespace sieve
