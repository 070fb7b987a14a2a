// Programmatic dependent launch (pdl.cuh) for kernels Sieve does not launch itself: cuBLASLt's.
// A decode step's graph has four cuBLASLt GEMMs per layer, and stream capture gives each a plain
// edge from the kernel before it, so each waits for its predecessor to drain and flush before it
// is even scheduled. cuBLASLt's API has no way to ask for a PDL launch; what a graph allows is to
// make the edge itself programmatic after capture, which is only correct if the kernel waits on
// the grid dependency before it reads its inputs.
//
// Whether a kernel waits cannot be read from its handle, so it is shown per kernel by running it:
// ProbeProgrammaticEdge puts an upstream kernel in front of a launch that triggers its dependents
// at once and writes the launch's inputs only after spinning for a while. A kernel that reads
// before waiting computes with stale inputs, which the caller's comparison with a reference
// catches; a kernel whose result is right is marked (MarkHonorsProgrammaticEdges), and
// MakeEdgesProgrammatic then turns the plain kernel-to-kernel edges into marked kernels of a
// captured graph into programmatic ones. Nothing is assumed about kernels that were not probed.
//
// Opt-in (SIEVE_GRAPH_PDL=1): with CUDA 13.0's cuBLASLt on the H200 none of the decode step's
// GEMM kernels (nvjet_sm90_*) waits, so nothing is converted and the probes would only cost
// start-up time (session 7, device run 1). It is kept to check again on a newer cuBLASLt:
// `SIEVE_GRAPH_PDL=1 SIEVE_GEMM_VERBOSE=1 sieve bench kernels ...` prints each plan's finding.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace sieve::cuda {

// SIEVE_GRAPH_PDL is "1" and PDL is active (pdl.cuh: sm_90+, SIEVE_PDL not "0").
bool GraphPdlEnabled();

// A buffer the probed launch reads: the probe zeroes `target`, and its upstream kernel copies
// `source` into it only after its spin.
struct ProbeInput {
  const void* source;
  void* target;
  size_t bytes;
};

// The kernel handle of a graph's kernel node (its CUfunction, or CUkernel when it has none), as
// MarkHonorsProgrammaticEdges keys it; nullptr when the node is not a kernel.
const void* KernelOfNode(cudaGraphNode_t node);

// Captures, on `stream` (which must not be capturing), the probe's upstream kernel followed by
// `launch()`, makes the edges from the upstream into the kernels right after it programmatic, and
// runs that graph once with the inputs zeroed first; returns after the stream is synchronised.
// Returns those kernels (empty when `launch` starts with something other than a kernel, e.g. a
// memset, or when PDL is not available), and their names in `names` if given: mark them only if
// what `launch` wrote is right.
std::vector<const void*> ProbeProgrammaticEdge(const std::function<void()>& launch,
                                               const std::vector<ProbeInput>& inputs,
                                               cudaStream_t stream,
                                               std::vector<std::string>* names = nullptr);

// Records kernels shown to honour a programmatic edge into them (process-wide).
void MarkHonorsProgrammaticEdges(const std::vector<const void*>& kernels);
bool HonorsProgrammaticEdges(const void* kernel);

// Turns every plain edge from a kernel node into a marked kernel node of `graph` into a
// programmatic one (the upstream's trigger port). Returns how many it changed.
int MakeEdgesProgrammatic(cudaGraph_t graph);

// The probe's own test subject: a plain launch of a kernel copying `bytes` from `source` to
// `target`, which waits on the grid dependency first only if `wait_first`.
void CopyBytesForProbeTest(const void* source, void* target, size_t bytes, bool wait_first,
                           cudaStream_t stream);

}  // namespace sieve::cuda
