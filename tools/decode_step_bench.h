// The decode-step benchmark: one decode step of a whole model (dummy weights) at batch B with
// every sequence holding C context entries per layer, timed on the device and printed beside its
// memory-bandwidth bound (weights + KV read once per step).
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/llama_model.h"
#include "model/model_config.h"

namespace sieve {

// The length bounds the step claims (StepMeta::max_kv_len and layer_max_kv_len), by which the
// decode attention sizes its launch; the sequences' true lengths are the same in both.
enum class StepLengthBounds {
  kTrue,               // this step's true length
  kEngineLayerBounds,  // max_model_len + 1, and each layer's bound as ModelRunner sets it
};

// Where the step's KV pages sit in the pool.
enum class PageOrder {
  kShuffled,  // shuffled over the whole pool: every layer's pages spread over all of it, as a
              // long-running server's free list hands them out
  kInOrder,   // unshuffled: each sequence's pages of a layer adjacent, layer after layer (as a
              // fresh server hands them out); tells what the shuffle costs
};

struct DecodeStepBenchOptions {
  int batch = 64;
  int context = 4096;
  double kept_fraction = 1.0;  // entries each layer holds, as a fraction of the context
  int iterations = 100;        // steps timed; the median is reported
  bool use_graph = true;
  StepLengthBounds length_bounds = StepLengthBounds::kTrue;
  int max_model_len = 8192;  // for kEngineLayerBounds
  PageOrder page_order = PageOrder::kShuffled;
  // Extra steps between cudaProfilerStart and Stop, back to back (CUDA only; 0: none).
  int profiled_steps = 0;
  // After the timing, one more step (its own graph) with the decode attention CTAs' phases
  // stamped; the last layer's are summarised (CUDA only; decode_attention.h).
  bool trace_attention = false;
  bool breakdown = false;     // also time each kind of op alone (graph backends only)
  double copy_bandwidth = 0;  // bytes/s, read + write (the measured ceiling)
  // The layers' weights in this format (the bound counts the bytes they are held in).
  WeightQuantization quantization = WeightQuantization::kNone;
  // The KV pool in e4m3 with per-(layer, KV head) scales (runtime/engine.h kv_cache_dtype fp8);
  // the bound counts its bytes.
  bool fp8_kv_cache = false;
};

// One kind of op of the step (e.g. every layer's o GEMM) captured alone in a graph: its time per
// step and the bytes it must move.
struct DecodeStepPart {
  std::string name;
  double ms = 0;
  double bytes = 0;
};

struct DecodeStepBenchResult {
  std::vector<DecodeStepPart> parts;  // with options.breakdown
  double step_ms = 0;       // device time of one step (CUDA events where the backend has them)
  double step_wall_ms = 0;  // host time of one step: launch, run, synchronise
  double bound_ms = 0;
  double tokens_per_second = 0;
  double bytes = 0;
  double achieved_bandwidth = 0;
  std::string attention_trace;  // with options.trace_attention
  std::string tuning;           // the step tuning's decisions (runtime/step_tuning.h), if any
  double tuning_s = 0;          // wall time of the tuned capture
};

DecodeStepBenchResult RunDecodeStepBench(Backend& backend, const ModelConfig& config,
                                         const DecodeStepBenchOptions& options);

// The bytes RunDecodeStepBench holds on the device for its weights and KV pool, in `dtype` (the
// backend's activation dtype; its workspace and logits are not counted): what a caller checks
// against the free memory before asking for a shape.
double DecodeStepBenchBytes(const ModelConfig& config, const DecodeStepBenchOptions& options,
                            DType dtype);

// The same step with the model split over the ranks of `backends` (rank r: backends[r], its
// shard, its KV heads' pool, communicators[r] for its all-reduces), one thread a rank, captured in
// a graph on each (step-tuned with one rank only) and replayed on all at once: the slowest rank's
// median. The bound is one rank's weights + KV at the copy rate (model/tensor_parallel.h), without
// the all-reduces. Options' profiling, attention trace and breakdown do not apply; the split must
// be valid (CheckTensorParallel).
DecodeStepBenchResult RunShardedDecodeStepBench(const std::vector<Backend*>& backends,
                                                const std::vector<Communicator*>& communicators,
                                                const ModelConfig& config,
                                                const DecodeStepBenchOptions& options);

}  // namespace sieve
