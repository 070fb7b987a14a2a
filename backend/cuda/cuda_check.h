// Checking CUDA and cuBLAS return codes. A failing CUDA call inside Sieve is a bug or a dead
// device, not bad input: it aborts with the call, the error and the place.
#pragma once

#include <cuda_runtime.h>

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

// After a kernel launch: catches bad launch configurations at once.
#define SIEVE_CUDA_CHECK_LAUNCH() SIEVE_CUDA_CHECK(cudaGetLastError())
