#include "backend/cuda/nccl_communicator.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

#ifdef SIEVE_HAVE_NCCL
#include <nccl.h>

// A failing NCCL call once the communicators exist is a dead device or link, not bad input: it
// aborts with the call, the error and the place, as SIEVE_CUDA_CHECK does.
#define SIEVE_NCCL_CHECK(call)                                                  \
  do {                                                                          \
    const ncclResult_t sieve_nccl_result_ = (call);                             \
    if (sieve_nccl_result_ != ncclSuccess) {                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   ncclGetErrorString(sieve_nccl_result_));                     \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
#endif

namespace sieve {

#ifdef SIEVE_HAVE_NCCL

namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream) {
    SIEVE_CUDA_CHECK(cudaSetDevice(device_));
    SIEVE_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    SIEVE_CUDA_CHECK(cudaMemsetAsync(barrier_word_, 0, sizeof(float), stream_));
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaFree(barrier_word_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void AllReduceSum(Tensor& data) override {
    SIEVE_CHECK(data.device() == Device::kCuda && data.is_contiguous() &&
                (data.dtype() == DType::kF32 || data.dtype() == DType::kBF16))
        << "NCCL all-reduce of " << data.ShapeString() << ": contiguous f32 or bf16 on the GPU";
    const ncclDataType_t type = data.dtype() == DType::kF32 ? ncclFloat32 : ncclBfloat16;
    SIEVE_NCCL_CHECK(ncclAllReduce(data.data(), data.data(), static_cast<size_t>(data.numel()),
                                   type, ncclSum, comm_, stream_));
  }

  void AllGather(const Tensor& in, Tensor& out) override {
    SIEVE_CHECK(in.device() == Device::kCuda && out.device() == Device::kCuda &&
                in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype() &&
                out.numel() == in.numel() * size_)
        << "NCCL all-gather of " << in.ShapeString() << " into " << out.ShapeString();
    // As bytes: every dtype gathers alike.
    const size_t bytes = static_cast<size_t>(in.numel()) * in.element_size();
    SIEVE_NCCL_CHECK(ncclAllGather(in.data(), out.data(), bytes, ncclUint8, comm_, stream_));
  }

  void Barrier() override {
    SIEVE_NCCL_CHECK(
        ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream_));
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  ncclComm_t comm_;
  int rank_;
  int size_;
  int device_;
  cudaStream_t stream_;
  float* barrier_word_ = nullptr;  // [1] f32 what Barrier all-reduces
};

}  // namespace

bool NcclAvailable() { return true; }

Result<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(
    const std::vector<Backend*>& backends) {
  const int size = static_cast<int>(backends.size());
  if (size < 1) return InvalidArgumentError("NCCL communicators for no ranks");
  std::vector<int> devices;
  std::set<int> distinct;
  for (const Backend* backend : backends) {
    const int device = backend != nullptr ? CudaDeviceOf(*backend) : -1;
    if (device < 0) {
      return InvalidArgumentError("NCCL communicators need a CUDA backend for every rank");
    }
    if (!distinct.insert(device).second) {
      return InvalidArgumentError("two ranks on CUDA device " + std::to_string(device) +
                                  ": each rank needs its own GPU");
    }
    devices.push_back(device);
  }
  // Multicast off whatever the environment says (see the header).
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  int current_device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&current_device));
  std::vector<ncclComm_t> comms(size);
  const ncclResult_t result = ncclCommInitAll(comms.data(), size, devices.data());
  SIEVE_CUDA_CHECK(cudaSetDevice(current_device));
  if (result != ncclSuccess) {
    return UnavailableError(std::string("NCCL could not set up ") + std::to_string(size) +
                            " ranks: " + ncclGetErrorString(result));
  }
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int rank = 0; rank < size; ++rank) {
    communicators.push_back(std::make_unique<NcclCommunicator>(
        comms[rank], rank, size, devices[rank],
        static_cast<cudaStream_t>(CudaStreamOf(*backends[rank]))));
  }
  SIEVE_CUDA_CHECK(cudaSetDevice(current_device));
  return communicators;
}

#else  // !SIEVE_HAVE_NCCL

bool NcclAvailable() { return false; }

Result<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(
    const std::vector<Backend*>& backends) {
  (void)backends;
  return UnimplementedError(
      "this Sieve was built without NCCL (CMake found no nccl.h / libnccl): tensor parallelism "
      "on CUDA needs it");
}

#endif

std::vector<Backend*> CudaRanks::backend_pointers() const {
  std::vector<Backend*> out;
  for (const auto& backend : backends) out.push_back(backend.get());
  return out;
}

std::vector<Communicator*> CudaRanks::communicator_pointers() const {
  std::vector<Communicator*> out;
  for (const auto& communicator : communicators) out.push_back(communicator.get());
  return out;
}

Result<CudaRanks> MakeCudaRanks(int first, int size) {
  const int available = CudaDeviceCount();
  if (size < 1 || first < 0 || first + size > available) {
    return InvalidArgumentError(std::to_string(size) +
                                " ranks need GPUs cuda:" + std::to_string(first) +
                                " .. cuda:" + std::to_string(first + size - 1) + "; " +
                                std::to_string(available) + " found");
  }
  CudaRanks ranks;
  for (int rank = 0; rank < size; ++rank) {
    SIEVE_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeCudaBackend(first + rank));
    ranks.backends.push_back(std::move(backend));
  }
  SIEVE_ASSIGN_OR_RETURN(ranks.communicators, MakeNcclCommunicators(ranks.backend_pointers()));
  return ranks;
}

}  // namespace sieve
