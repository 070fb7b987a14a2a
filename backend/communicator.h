// Communicator: the collectives tensor parallelism needs between the ranks of one model
// (DESIGN.md "Tensor parallelism"). One Communicator object per rank; rank r's is used only by
// the thread that drives rank r's Backend, on tensors of that backend. Every rank must make the
// same sequence of calls with the same shapes: a collective returns (or, on a device, completes)
// only once every rank has made it.
//
// Implementations: InProcessCommunicator (backend/cpu: N ranks of CPU backends in one process,
// one thread each; what CI tests the sharding with) and the NCCL communicator
// (backend/cuda/nccl_communicator.h: one GPU per rank, collectives on the backend's stream, so a
// CUDA graph captured on that stream records them).
#pragma once

#include "core/tensor.h"

namespace sieve {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // [0, size)
  virtual int size() const = 0;

  // data = the sum over ranks of every rank's data, in place; every rank receives the same
  // values bit for bit. data: contiguous, the same shape and dtype on every rank (f32; the NCCL
  // communicator also bf16). Asynchronous on the rank's backend stream where it has one.
  virtual void AllReduceSum(Tensor& data) = 0;
  // out = every rank's `in` concatenated in rank order: out holds size() * in.numel() elements,
  // rank r's at [r * in.numel(), (r + 1) * in.numel()). in, out: contiguous, one dtype.
  virtual void AllGather(const Tensor& in, Tensor& out) = 0;
  // Returns once every rank has called Barrier and this rank's work queued before it is done.
  virtual void Barrier() = 0;
};

}  // namespace sieve
