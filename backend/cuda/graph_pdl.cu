// Programmatic edges into kernels shown to honour them (graph_pdl.h).
#include <cuda.h>  // the driver's kernel-node types; its functions come through the runtime
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph_pdl.h"
#include "backend/cuda/pdl.cuh"

namespace sieve::cuda {
namespace {

// How long the probe's upstream kernel spins after triggering its dependents and before writing
// their inputs: far longer than a dependent takes to be scheduled, so one that does not wait
// reads the zeroed inputs.
constexpr uint64_t kProbeSpinNs = 100'000;
constexpr int kMaxProbeInputs = 4;

struct ProbeCopies {
  const unsigned char* source[kMaxProbeInputs];
  unsigned char* target[kMaxProbeInputs];
  size_t bytes[kMaxProbeInputs];
  int count;
};

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// The probe's upstream: lets its dependents start at once, then spins, then writes their inputs.
__global__ void TriggerSpinThenCopy(ProbeCopies copies, uint64_t spin_ns) {
  PdlLaunchDependents();
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < spin_ns) {
  }
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int i = 0; i < copies.count; ++i) {
    for (size_t b = blockIdx.x * blockDim.x + threadIdx.x; b < copies.bytes[i]; b += stride) {
      copies.target[i][b] = copies.source[i][b];
    }
  }
}

// The driver functions behind a graph's kernel nodes, through the runtime (no link to libcuda).
template <typename Function>
Function DriverFunction(const char* name) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &function, 12030, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Function>(function);
}

using GetKernelNodeParams = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
using GetFunctionName = CUresult (*)(const char**, CUfunction);
using GetKernelName = CUresult (*)(const char**, CUkernel);

bool KernelNodeParams(cudaGraphNode_t node, CUDA_KERNEL_NODE_PARAMS& params) {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) {
    return false;
  }
  static const GetKernelNodeParams get =
      DriverFunction<GetKernelNodeParams>("cuGraphKernelNodeGetParams");
  std::memset(&params, 0, sizeof(params));
  return get != nullptr && get(node, &params) == CUDA_SUCCESS;
}

std::mutex& MarkedMutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<const void*>& Marked() {
  static std::set<const void*> kernels;
  return kernels;
}

// The kernel's name where the driver knows it (for logs), else "?".
std::string KernelNodeName(cudaGraphNode_t node) {
  CUDA_KERNEL_NODE_PARAMS params;
  if (!KernelNodeParams(node, params)) return "?";
  const char* name = nullptr;
  if (params.func != nullptr) {
    static const GetFunctionName get = DriverFunction<GetFunctionName>("cuFuncGetName");
    if (get == nullptr || get(&name, params.func) != CUDA_SUCCESS) name = nullptr;
  } else if (params.kern != nullptr) {
    static const GetKernelName get = DriverFunction<GetKernelName>("cuKernelGetName");
    if (get == nullptr || get(&name, params.kern) != CUDA_SUCCESS) name = nullptr;
  }
  return name != nullptr ? name : "?";
}

// Replaces every plain edge of `graph` for which convert(from, to) holds by a programmatic one
// (the upstream's trigger port). Returns the downstream nodes of the edges it changed.
std::vector<cudaGraphNode_t> MakeEdgesProgrammaticWhere(
    cudaGraph_t graph, const std::function<bool(cudaGraphNode_t, cudaGraphNode_t)>& convert) {
  size_t edge_count = 0;
  SIEVE_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  std::vector<cudaGraphEdgeData> data(edge_count);
  SIEVE_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edge_count));
  std::vector<cudaGraphNode_t> changed;
  for (size_t e = 0; e < edge_count; ++e) {
    if (data[e].type != cudaGraphDependencyTypeDefault || data[e].from_port != 0) continue;
    if (!convert(from[e], to[e])) continue;
    SIEVE_CUDA_CHECK(cudaGraphRemoveDependencies(graph, &from[e], &to[e], &data[e], 1));
    cudaGraphEdgeData programmatic = {};
    programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    SIEVE_CUDA_CHECK(cudaGraphAddDependencies(graph, &from[e], &to[e], &programmatic, 1));
    changed.push_back(to[e]);
  }
  return changed;
}

}  // namespace

bool GraphPdlEnabled() {
  const char* value = std::getenv("SIEVE_GRAPH_PDL");
  return value != nullptr && std::strcmp(value, "1") == 0 && PdlActive();
}

const void* KernelOfNode(cudaGraphNode_t node) {
  CUDA_KERNEL_NODE_PARAMS params;
  if (!KernelNodeParams(node, params)) return nullptr;
  return params.func != nullptr ? static_cast<const void*>(params.func)
                                : static_cast<const void*>(params.kern);
}

std::vector<const void*> ProbeProgrammaticEdge(const std::function<void()>& launch,
                                               const std::vector<ProbeInput>& inputs,
                                               cudaStream_t stream,
                                               std::vector<std::string>* names) {
  std::vector<const void*> kernels;
  if (!PdlActive() || inputs.size() > kMaxProbeInputs) return kernels;
  ProbeCopies copies = {};
  copies.count = static_cast<int>(inputs.size());
  for (int i = 0; i < copies.count; ++i) {
    copies.source[i] = static_cast<const unsigned char*>(inputs[i].source);
    copies.target[i] = static_cast<unsigned char*>(inputs[i].target);
    copies.bytes[i] = inputs[i].bytes;
  }
  SIEVE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  // Few CTAs, so the dependents find room on the SMs while it spins.
  TriggerSpinThenCopy<<<8, 256, 0, stream>>>(copies, kProbeSpinNs);
  SIEVE_CUDA_CHECK_LAUNCH();
  launch();
  cudaGraph_t graph = nullptr;
  SIEVE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));

  size_t root_count = 1;
  cudaGraphNode_t upstream = nullptr;
  SIEVE_CUDA_CHECK(cudaGraphGetRootNodes(graph, &upstream, &root_count));
  for (const cudaGraphNode_t node :
       MakeEdgesProgrammaticWhere(graph, [&](cudaGraphNode_t from, cudaGraphNode_t to) {
         return from == upstream && KernelOfNode(to) != nullptr;
       })) {
    kernels.push_back(KernelOfNode(node));
    if (names != nullptr) names->push_back(KernelNodeName(node));
  }
  cudaGraphExec_t exec = nullptr;
  SIEVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const ProbeInput& input : inputs) {
    SIEVE_CUDA_CHECK(cudaMemsetAsync(input.target, 0, input.bytes, stream));
  }
  SIEVE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  SIEVE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SIEVE_CUDA_CHECK(cudaGraphDestroy(graph));
  return kernels;
}

void MarkHonorsProgrammaticEdges(const std::vector<const void*>& kernels) {
  const std::lock_guard<std::mutex> lock(MarkedMutex());
  Marked().insert(kernels.begin(), kernels.end());
}

bool HonorsProgrammaticEdges(const void* kernel) {
  const std::lock_guard<std::mutex> lock(MarkedMutex());
  return kernel != nullptr && Marked().count(kernel) > 0;
}

int MakeEdgesProgrammatic(cudaGraph_t graph) {
  return static_cast<int>(
      MakeEdgesProgrammaticWhere(graph, [](cudaGraphNode_t from, cudaGraphNode_t to) {
        return KernelOfNode(from) != nullptr && HonorsProgrammaticEdges(KernelOfNode(to));
      }).size());
}

namespace {
__global__ void CopyBytesKernel(const unsigned char* source, unsigned char* target, size_t bytes,
                                bool wait_first) {
  if (wait_first) PdlWait();
  for (size_t b = blockIdx.x * blockDim.x + threadIdx.x; b < bytes;
       b += static_cast<size_t>(gridDim.x) * blockDim.x) {
    target[b] = source[b];
  }
}
}  // namespace

void CopyBytesForProbeTest(const void* source, void* target, size_t bytes, bool wait_first,
                           cudaStream_t stream) {
  CopyBytesKernel<<<8, 256, 0, stream>>>(static_cast<const unsigned char*>(source),
                                         static_cast<unsigned char*>(target), bytes, wait_first);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
