// The device views (kernels.h) of the engine's step metadata and KV pool, as CudaBackend passes
// them to its kernels; tests that launch a kernel directly build theirs the same way.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace sieve::cuda {

StepView ViewOf(const StepMeta& step);
PoolView ViewOf(const KvPool& pool);

}  // namespace sieve::cuda
