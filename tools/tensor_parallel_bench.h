// `sieve bench kernels`' tensor-parallel part: the decode step's bound of a model split over N
// ranks (model/tensor_parallel.h: each rank's weights and KV at the copy rate, plus its
// all-reduces), for the sizes of a plan, so that multi-GPU runs have their targets before they
// start; and, on the GPUs there are, the all-reduce of a decode step's payload timed through
// NCCL as the decode graphs run it.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"

namespace sieve {

struct TensorParallelPlanOptions {
  std::vector<int> sizes = {1, 2, 4, 8};
  int batch = 64;
  int context = 4096;
  double copy_bytes_per_s = 0;     // measured (bench kernels' ceiling)
  double device_memory_bytes = 0;  // one GPU's; 0: no "fits" column
  double bus_bytes_per_s = 370e9;  // assumed unless measured (see the flag's help)
  double collective_latency_s = 8e-6;
  // Measured seconds of one all-reduce of the step's payload at one size (0: none measured):
  // replaces the assumed rates' all-reduce time at that size.
  int measured_size = 0;
  double measured_all_reduce_s = 0;
};

// Prints the plan's table (dense and 1/10 of the context kept; LM head replicated, and the
// vocab-parallel alternative's bound) and returns its rows as JSON. Sizes the model does not
// split into are printed as such.
nlohmann::json PrintTensorParallelPlan(const ModelConfig& config, const std::string& name,
                                       const TensorParallelPlanOptions& options);

// One all-reduce of `elements` bf16 values on every rank, `count` of them back to back in a CUDA
// graph on each rank's stream (as a decode step's 2 per layer): the median time of one, over the
// slowest rank. backends[r] is rank r's, communicators[r] its communicator.
double TimeAllReduce(const std::vector<Backend*>& backends,
                     const std::vector<Communicator*>& communicators, int64_t elements, int count);

}  // namespace sieve
