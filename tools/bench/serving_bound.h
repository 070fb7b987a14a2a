// The bound of a serving run (PERF.md's model), computed by the benchmark beside what it measured:
// every prompt's prefill at the compute ceilings (its GEMM FLOPs at a GEMM rate, its causal
// attention FLOPs at an attention rate) plus every decode step at the copy rate (the weights once a
// step, and each running sequence's KV entries, as the server's KV policy keeps them); with tensor
// parallelism, one rank's share of both plus the all-reduces between them. Prefill and decode are
// added, not overlapped, and decode batches are full waves of the concurrency: the time no engine
// can beat on this GPU short of overlapping the two. Past the last layer's attention a prefill
// counts its sampled row only, as the engine computes it; that attention counts every row, which
// the engine computes too, though only the rows the last layer's policy scores and the sampled
// one are read (at most 1/L of the attention FLOPs). With the server's KV pool given, a wave also
// runs at least as many steps as its sequences' pages over the decode (each step's running
// sequences share the pool) take in pool-fulls: past the concurrency at which the pool holds every
// sequence (dense KV of long prompts), fewer decode together. With FP8 weights (the server's
// --quantization fp8) a decode step reads the layers' linear weights as e4m3 (1 byte a weight, an
// f32 scale an output channel; the embeddings and LM head stay bf16) and a prefill runs the
// layers' GEMMs at the FP8 GEMM rate; with an FP8 KV cache (--kv-cache-dtype fp8) a step reads 1
// byte a K or V element (the per-head scales are not counted), and the server's pool, which it
// gives in its own pages, holds twice the entries in the same memory.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sparsity/kv_policy.h"

namespace sieve::bench {

// What the bound needs beyond the workload: the model's shape, the server's KV policy and the
// GPU's measured ceilings. An empty model_config means no bound.
struct BoundConfig {
  std::string model_config;  // a directory with config.json (or params.json)
  // The server's --kv-policy; empty: the server's own (ResolveFromServer), else full.
  std::string kv_policy;
  KvPolicyOptions kv_policy_options;  // its other knobs (the server's when its policy is taken)
  int kv_budget = 0;                  // its --kv-budget (0: kv_policy_options')
  int kv_window = 0;                  // its --kv-window (0: kv_policy_options')
  double gemm_tflops = 0;             // bf16 GEMM rate at prefill sizes (bench kernels)
  double attention_tflops = 0;        // causal prefill attention rate (cuDNN SDPA); 0: not counted
  double copy_gbs = 0;                // device copy rate, read + write (bench kernels)
  // FP8 GEMM rate at prefill sizes (bench kernels --prefill-step --quantization fp8): the layers'
  // GEMMs with FP8 weights; needed when the weights are FP8.
  double fp8_gemm_tflops = 0;
  // The server's --quantization, "none" or "fp8"; empty: the server's (ResolveFromServer), else
  // none.
  std::string quantization;
  // The server's --kv-cache-dtype, "auto" or "bf16" (2 bytes an element) or "fp8" (1); empty: the
  // server's (ResolveFromServer: what its GET /server_info says, else its pool's bytes an entry),
  // else bf16.
  std::string kv_cache_dtype;
  // Tensor parallelism: the server's --tensor-parallel-size. Each rank computes 1/N of every
  // prefill's FLOPs and reads its share of the weights and KV in every decode step
  // (model/tensor_parallel.h), and all its ranks all-reduce 2 times a layer: a step's rows at
  // the bus bandwidth plus a fixed latency each (the rates of bench kernels' plan; measured with
  // bench kernels --tensor-parallel-size N).
  int tensor_parallel_size = 1;
  double allreduce_bus_gbs = 370;
  double allreduce_latency_us = 8;
  // The server's KV pool: pages of page_size entries of one layer (one rank's share of the KV
  // heads, in the KV dtype: an FP8 pool has twice the pages of a bf16 one of the same bytes). 0:
  // not limited; kPoolFromServer: what the server's GET /server_info says (sieve bench resolves it,
  // with ResolveFromServer, before computing).
  static constexpr int64_t kPoolFromServer = -1;
  int64_t kv_pool_pages = kPoolFromServer;
  int page_size = 16;
};

// One request of the workload.
struct BoundRequest {
  int prompt_len = 0;
  int output_len = 0;
};

struct ServingBound {
  double prefill_s = 0;  // every prompt's prefill
  double decode_s = 0;   // every decode step
  double output_tokens_per_s = 0;
  double weight_bytes = 0;             // read by every decode step (one rank's)
  double prefill_gemm_flops = 0;       // over every prompt (one rank's)
  double prefill_fp8_gemm_flops = 0;   // of them, those at the FP8 rate (FP8 weights' layers)
  double prefill_attention_flops = 0;  // over every prompt (one rank's)
  double kv_bytes_read = 0;            // over every decode step, one rank's
  // The roofline of decode: decode_s counts a step's weights at the copy rate whatever its rows,
  // but its GEMMs also do 2 FLOPs a weight a row, which outlast the weight bytes past about
  // GEMM rate / copy rate rows (~170 on an H200). decode_roofline_s is decode_s with each step's
  // GEMMs at the longer of the two; the bound's time with it is still one no engine can beat,
  // only closer to what one can reach at large batches.
  double decode_roofline_s = 0;             // >= decode_s
  int64_t compute_bound_steps = 0;          // decode steps whose GEMM FLOPs outlast their bytes
  double roofline_output_tokens_per_s = 0;  // prefill_s + decode_roofline_s
  double all_reduce_s = 0;                  // in prefill_s and decode_s: the ranks' all-reduces
  std::string kv_policy;                    // KvPolicy::ToString of the policy bounded
  std::string quantization;                 // of the weights bounded: "none" or "fp8"
  std::string kv_cache_dtype;               // of the KV bounded: "bf16" or "fp8"
  int64_t decode_steps = 0;                 // in every wave
  int64_t pool_limited_steps = 0;  // of them, those the KV pool adds (0: it holds every wave)
};

// Checks the config (the model directory parses, the policy parses for it, rates positive).
Status ValidateBoundConfig(const BoundConfig& config);

// What the server's GET /server_info (`server_info` as FetchServerInfo gives it) settles: an
// empty kv_policy becomes the server's policy and knobs (full when it does not say), a
// kPoolFromServer pool the server's pool (not limited when it does not say), an empty
// quantization the server's "quantization" (none when it does not say), an empty kv_cache_dtype
// the server's "kv_cache_dtype", else the one its pool's bytes an entry ("kv_cache_bytes" over its
// pages' entries) show, else bf16. Returns lines for the log saying which, and a warning when the
// policy, weights or KV dtype bounded are not the ones the server runs or the tensor-parallel
// size not the server's.
// Needs a valid config with a model.
std::string ResolveFromServer(const nlohmann::json& server_info, BoundConfig& config);

// The bound of sending `requests` with at most `concurrency` in flight (0: all at once), decoded
// in waves of `concurrency` in request order.
Result<ServingBound> ComputeServingBound(const BoundConfig& config,
                                         const std::vector<BoundRequest>& requests,
                                         int concurrency);

}  // namespace sieve::bench
