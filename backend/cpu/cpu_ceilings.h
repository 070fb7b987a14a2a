// What this machine's CPU can do at most, measured: the fp32 FMA rate of its vector unit (no
// memory traffic) and its read bandwidth from memory. `sieve bench cpu` prints the CPU backend's
// GEMM, prefill and decode rates beside them.
#pragma once

#include "backend/cpu/cpu_kernels.h"
#include "core/thread_pool.h"

namespace sieve::cpu {

// FLOP/s of independent fma chains in registers on every thread of `pool`, with `isa`'s vectors
// (two FLOPs an fma a lane): best of 3 runs of about 0.1 s.
double MeasureFmaPeak(ThreadPool& pool, Isa isa);

// Bytes/s every thread of `pool` reads of a 512 MB array (summed, with independent partial sums so
// that the adds are not the limit): best of 3.
double MeasureReadBandwidth(ThreadPool& pool);

}  // namespace sieve::cpu
