// NCCL communicators for tensor parallelism over the GPUs of one process: rank r is the CUDA
// backend backends[r], on its own device, driven by its own thread. Collectives are enqueued on
// the backend's stream (CudaStreamOf), so they are ordered with the rank's ops without host
// synchronisation and a CUDA graph captured on that stream records them.
//
// NVLink SHARP (multicast) stays off: NCCL_NVLS_ENABLE=0 is set before the communicators are made
// (on shared machines a program that uses multicast can take the host's GPUs out of service).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "core/status.h"

namespace sieve {

// Whether this build has NCCL (CMake found nccl.h and libnccl); without it MakeNcclCommunicators
// is Unimplemented.
bool NcclAvailable();

// One communicator per backend, element r for rank r (ncclCommInitAll over their devices).
// InvalidArgument when a backend is not a CUDA backend or two share a device; Unavailable when
// NCCL fails to set up.
Result<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(
    const std::vector<Backend*>& backends);

// The ranks of a model split over the GPUs cuda:first .. cuda:first + size - 1: a CUDA backend
// each, and their NCCL communicators (declared after the backends: destroyed first).
struct CudaRanks {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> communicators;

  std::vector<Backend*> backend_pointers() const;
  std::vector<Communicator*> communicator_pointers() const;
};

// InvalidArgument naming the GPUs when the machine has too few; errors as MakeCudaBackend and
// MakeNcclCommunicators.
Result<CudaRanks> MakeCudaRanks(int first, int size);

}  // namespace sieve
