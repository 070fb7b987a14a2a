#include "tools/bench/serving_bound.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/model_config.h"
#include "model/tensor_parallel.h"
#include "sparsity/kv_policy.h"
#include "tools/bench/server_info.h"

namespace sieve::bench {

namespace {

Result<KvPolicy> PolicyFor(const BoundConfig& config, int num_layers) {
  KvPolicyOptions options = config.kv_policy_options;
  if (config.kv_budget > 0) options.budget = config.kv_budget;
  if (config.kv_window > 0) options.window = config.kv_window;
  auto policy =
      KvPolicy::Parse(config.kv_policy.empty() ? "full" : config.kv_policy, num_layers, options);
  if (!policy.ok()) return policy.status().WithContext("--bound-kv-policy");
  return policy;
}

}  // namespace

Status ValidateBoundConfig(const BoundConfig& config) {
  if (config.model_config.empty()) return Status::Ok();
  auto model = LoadModelConfig(config.model_config);
  if (!model.ok()) return model.status().WithContext("--bound-model-config");
  SIEVE_RETURN_IF_ERROR(PolicyFor(config, model->num_layers).status());
  SIEVE_RETURN_IF_ERROR(CheckTensorParallel(*model, config.tensor_parallel_size)
                            .WithContext("--bound-tensor-parallel-size"));
  if (config.tensor_parallel_size > 1 &&
      (!(config.allreduce_bus_gbs > 0) || config.allreduce_latency_us < 0)) {
    return InvalidArgumentError(
        "the bound needs --bound-allreduce-bus-gbs > 0 and --bound-allreduce-latency-us >= 0");
  }
  if (config.kv_pool_pages < BoundConfig::kPoolFromServer || config.page_size <= 0) {
    return InvalidArgumentError(
        "the bound needs --bound-kv-pool-pages >= 0 (or -1: the server's) and --bound-page-size "
        "> 0");
  }
  if (config.quantization != "" && config.quantization != "none" && config.quantization != "fp8") {
    return InvalidArgumentError("--bound-quantization is none or fp8, not '" + config.quantization +
                                "'");
  }
  if (config.kv_cache_dtype != "" && config.kv_cache_dtype != "auto" &&
      config.kv_cache_dtype != "bf16" && config.kv_cache_dtype != "fp8") {
    return InvalidArgumentError("--bound-kv-cache-dtype is auto, bf16 or fp8, not '" +
                                config.kv_cache_dtype + "'");
  }
  if (config.fp8_gemm_tflops < 0 ||
      (config.quantization == "fp8" && !(config.fp8_gemm_tflops > 0))) {
    return InvalidArgumentError(
        "FP8 weights need --bound-fp8-gemm-tflops (positive): the FP8 GEMM rate at prefill sizes "
        "(sieve bench kernels --prefill-step --quantization fp8)");
  }
  if (!(config.gemm_tflops > 0) || !(config.copy_gbs > 0) || config.attention_tflops < 0) {
    return InvalidArgumentError(
        "the bound needs --bound-gemm-tflops and --bound-copy-gbs (positive) and "
        "--bound-attention-tflops >= 0: the GPU's measured ceilings (sieve bench kernels, "
        "scripts/sdpa_bench.py)");
  }
  return Status::Ok();
}

namespace {

std::string ResolvePool(const nlohmann::json& server_info, BoundConfig& config) {
  if (config.kv_pool_pages != BoundConfig::kPoolFromServer) {
    return config.kv_pool_pages > 0
               ? fmt::format("bound: KV pool of {} pages of {} entries (--bound-kv-pool-pages)\n",
                             config.kv_pool_pages, config.page_size)
               : "bound: KV pool not limited (--bound-kv-pool-pages 0)\n";
  }
  const std::optional<ServerKvPool> pool = KvPoolOf(server_info);
  if (!pool) {
    config.kv_pool_pages = 0;
    return "bound: the server does not give its KV pool (GET /server_info): decode is not "
           "limited by it (--bound-kv-pool-pages sets one)\n";
  }
  config.kv_pool_pages = pool->pages;
  config.page_size = pool->page_size;
  return fmt::format("bound: KV pool of {} pages of {} entries (the server's GET /server_info)\n",
                     pool->pages, pool->page_size);
}

// The server's string field `key`, or empty.
std::string ServerString(const nlohmann::json& server_info, const std::string& key) {
  const nlohmann::json* field = ServerInfoField(server_info, key);
  return field != nullptr && field->is_string() ? field->get<std::string>() : std::string();
}

// "auto" is the activation dtype, bf16 on the GPU.
std::string KvDtypeName(const std::string& dtype) { return dtype == "fp8" ? "fp8" : "bf16"; }

// The KV dtype the server's pool shows: its bytes over its pages' K and V elements (one rank's
// heads), about 1 for FP8 (plus its scales) and 2 for bf16; empty when it does not say.
std::string KvDtypeOfPool(const nlohmann::json& server_info, const ModelConfig& model,
                          int tensor_parallel_size) {
  const std::optional<ServerKvPool> pool = KvPoolOf(server_info);
  const nlohmann::json* bytes = ServerInfoField(server_info, "kv_cache_bytes");
  if (!pool || bytes == nullptr || !bytes->is_number() || pool->pages <= 0) return {};
  auto shard = MakeShardLayout(model, {0, tensor_parallel_size});
  if (!shard.ok()) return {};
  const double elements =
      static_cast<double>(pool->pages) * pool->page_size * 2 * shard->num_kv_heads * model.head_dim;
  const double per_element = bytes->get<double>() / elements;
  if (per_element > 0.9 && per_element < 1.5) return "fp8";
  if (per_element >= 1.5 && per_element < 2.5) return "bf16";
  return {};
}

// Settles config.quantization and config.kv_cache_dtype from the server when not given; the log's
// lines, with a warning where the bound's are not the server's.
std::string ResolvePrecision(const nlohmann::json& server_info, const ModelConfig& model,
                             BoundConfig& config) {
  std::string log;
  const std::string served_quantization = ServerString(server_info, "quantization");
  if (config.quantization.empty()) {
    if (!served_quantization.empty()) {
      config.quantization = served_quantization;
      log += "bound: weights " + served_quantization + " (the server's GET /server_info)\n";
    } else {
      config.quantization = "none";
      log +=
          "bound: the server does not give its weights' quantization (GET /server_info): the "
          "bound takes bf16 weights (--bound-quantization sets it)\n";
    }
  } else if (!served_quantization.empty() && served_quantization != config.quantization) {
    log += "warning: the bound's weights (" + config.quantization + ") are not the server's (" +
           served_quantization + "): --bound-quantization\n";
  }
  std::string served_kv = ServerString(server_info, "kv_cache_dtype");
  std::string how = "the server's GET /server_info";
  if (served_kv.empty()) {
    served_kv = KvDtypeOfPool(server_info, model, config.tensor_parallel_size);
    how = "the bytes an entry of the server's KV pool, GET /server_info";
  }
  if (config.kv_cache_dtype.empty()) {
    if (!served_kv.empty()) {
      config.kv_cache_dtype = KvDtypeName(served_kv);
      log += "bound: KV cache " + config.kv_cache_dtype + " (" + how + ")\n";
    } else {
      config.kv_cache_dtype = "bf16";
      log +=
          "bound: the server does not give its KV cache dtype (GET /server_info): the bound takes "
          "bf16 (--bound-kv-cache-dtype sets it)\n";
    }
  } else if (!served_kv.empty() && KvDtypeName(served_kv) != KvDtypeName(config.kv_cache_dtype)) {
    log += "warning: the bound's KV cache dtype (" + KvDtypeName(config.kv_cache_dtype) +
           ") is not the server's (" + KvDtypeName(served_kv) + ", " + how +
           "): --bound-kv-cache-dtype\n";
  }
  return log;
}

}  // namespace

std::string ResolveFromServer(const nlohmann::json& server_info, BoundConfig& config) {
  std::string log = ResolvePool(server_info, config);
  const std::optional<ServerKvPolicy> server = KvPolicyOf(server_info);
  const bool given = !config.kv_policy.empty();
  if (!given) {
    if (server) {
      config.kv_policy = server->spec;
      config.kv_policy_options = server->options;
    } else {
      config.kv_policy = "full";
      log +=
          "bound: the server does not give its KV policy (GET /server_info): the bound takes "
          "full (--bound-kv-policy sets one)\n";
    }
  }
  auto model = LoadModelConfig(config.model_config);
  if (!model.ok()) return log;  // ValidateBoundConfig says so
  log += ResolvePrecision(server_info, *model, config);
  auto bounded = PolicyFor(config, model->num_layers);
  if (!bounded.ok()) return log;
  if (!given && server) {
    log += "bound: KV policy " + bounded->ToString() + " (the server's GET /server_info)\n";
  }
  const nlohmann::json* ranks = ServerInfoField(server_info, "tensor_parallel_size");
  if (ranks != nullptr && ranks->is_number_integer() &&
      ranks->get<int64_t>() != config.tensor_parallel_size) {
    log += fmt::format(
        "warning: the bound's tensor-parallel size ({}) is not the server's ({}): "
        "--bound-tensor-parallel-size\n",
        config.tensor_parallel_size, ranks->get<int64_t>());
  }
  if (server) {
    auto served = KvPolicy::Parse(server->spec, model->num_layers, server->options);
    if (!served.ok()) {
      log += "warning: the server's KV policy '" + server->spec + "' does not fit " +
             config.model_config + ": " + served.status().message() + "\n";
    } else if (served->ToString() != bounded->ToString()) {
      log += "warning: the bound's KV policy (" + bounded->ToString() + ") is not the server's (" +
             served->ToString() + ")\n";
    }
  }
  return log;
}

Result<ServingBound> ComputeServingBound(const BoundConfig& config,
                                         const std::vector<BoundRequest>& requests,
                                         int concurrency) {
  SIEVE_RETURN_IF_ERROR(ValidateBoundConfig(config));
  if (config.model_config.empty()) return InvalidArgumentError("no --bound-model-config");
  SIEVE_ASSIGN_OR_RETURN(ModelConfig model, LoadModelConfig(config.model_config));
  SIEVE_ASSIGN_OR_RETURN(KvPolicy policy, PolicyFor(config, model.num_layers));
  const double d = model.hidden_size, hd = model.head_dim, v = model.vocab_size;
  const int layers = model.num_layers;
  const int ranks = config.tensor_parallel_size;
  // Rank 0's share (all ranks hold equal shares): its q heads (with replicated KV heads, its KV
  // heads' whole groups), KV heads, o columns and MLP units.
  SIEVE_ASSIGN_OR_RETURN(ShardLayout shard, MakeShardLayout(model, {0, ranks}));
  const double q_heads = shard.num_q_heads, kv_heads = shard.num_kv_heads,
               out_heads = shard.num_out_heads, units = static_cast<double>(shard.ffn_size);
  // The GEMMs of one layer (q, k, v, o, gate, up, down) on one rank, in weights = FLOPs / 2 per
  // token; the LM head is replicated.
  const double past_attention_weights = out_heads * hd * d + 3 * units * d;  // o and the MLP
  const double layer_weights = d * (q_heads + 2 * kv_heads) * hd + past_attention_weights;
  // Their output channels (q, k, v, o, gate, up, down), each with an f32 scale in FP8.
  const double layer_channels = (q_heads + 2 * kv_heads) * hd + d + 2 * units + d;
  const bool fp8_weights = config.quantization == "fp8";
  const bool fp8_kv = config.kv_cache_dtype == "fp8";
  const double activation_bytes = 2;  // bf16
  const double layer_weight_bytes =
      fp8_weights ? layer_weights + 4 * layer_channels : activation_bytes * layer_weights;
  // The layers' GEMMs run at the FP8 rate with FP8 weights; the LM head is bf16 either way.
  const double layer_flops_per_s =
      (fp8_weights ? config.fp8_gemm_tflops : config.gemm_tflops) * 1e12;
  const double lm_head = v * d;
  ServingBound bound;
  bound.kv_policy = policy.ToString();
  bound.quantization = fp8_weights ? "fp8" : "none";
  bound.kv_cache_dtype = fp8_kv ? "fp8" : "bf16";
  // A decode step reads every layer's weights and the lm_head (the embedding only its rows).
  bound.weight_bytes = layers * layer_weight_bytes + activation_bytes * lm_head;
  // K and V of one entry in one layer on one rank.
  const double entry_bytes = 2.0 * kv_heads * hd * (fp8_kv ? 1 : activation_bytes);
  // One all-reduce of `rows` residual rows (bf16): ring, 2 (N - 1) / N of it over each rank's
  // links, plus the fixed latency.
  const auto all_reduce_s = [&](double rows) {
    if (ranks == 1) return 0.0;
    return config.allreduce_latency_us * 1e-6 + 2.0 * (ranks - 1) / ranks * rows * d *
                                                    activation_bytes /
                                                    (config.allreduce_bus_gbs * 1e9);
  };

  for (const BoundRequest& request : requests) {
    if (request.prompt_len < 0 || request.output_len < 0) {
      return InvalidArgumentError(fmt::format("the bound's request of {} + {} tokens is negative",
                                              request.prompt_len, request.output_len));
    }
  }
  for (const BoundRequest& request : requests) {
    const double n = request.prompt_len;
    // Past its attention the last layer computes only the sampled row, as does the LM head: no
    // other row's output is read (LlamaModel::Forward runs them so).
    if (n > 0) {
      const double layer_flops =
          2 * (n * layers * layer_weights - (n - 1) * past_attention_weights);
      bound.prefill_gemm_flops += layer_flops + 2 * lm_head;
      if (fp8_weights) bound.prefill_fp8_gemm_flops += layer_flops;
    }
    // Causal: query i sees i + 1 keys; QK^T and PV, 2 FLOPs a multiply-add, the rank's heads.
    bound.prefill_attention_flops += 4 * q_heads * hd * (n * (n + 1) / 2) * layers;
    bound.all_reduce_s += 2 * layers * all_reduce_s(n);
  }
  bound.prefill_s =
      (bound.prefill_gemm_flops - bound.prefill_fp8_gemm_flops) / (config.gemm_tflops * 1e12) +
      bound.prefill_fp8_gemm_flops / layer_flops_per_s + bound.all_reduce_s;
  if (config.attention_tflops > 0) {
    bound.prefill_s += bound.prefill_attention_flops / (config.attention_tflops * 1e12);
  }

  // Decode in waves of `concurrency` requests, in order: a wave runs as many steps as its longest
  // output, each reading the weights once and every running sequence's entries. A step's running
  // sequences hold their pages at once, so the wave's page-steps (each sequence's pages summed
  // over its decode steps) over the pool's pages also bound its steps from below.
  const size_t wave = concurrency > 0 ? static_cast<size_t>(concurrency) : requests.size();
  const double copy_bytes_per_s = config.copy_gbs * 1e9;
  const double weights_s = bound.weight_bytes / copy_bytes_per_s;  // a step's weights read
  // A row's GEMM time at the FLOP rates: the layers' at theirs, the LM head's at the bf16 one.
  const double row_flops_s =
      2 * layers * layer_weights / layer_flops_per_s + 2 * lm_head / (config.gemm_tflops * 1e12);
  // A step of `rows` rows: its GEMMs at the longer of their bytes and their FLOPs.
  const auto roofline_gemm_s = [&](double rows) { return std::max(weights_s, rows * row_flops_s); };
  double decode_bytes = 0;
  double roofline_gemm_total_s = 0;
  double decode_all_reduce_s = 0;
  int64_t output_tokens = 0;
  for (size_t first = 0; first < requests.size(); first += wave) {
    const size_t last = std::min(requests.size(), first + wave);
    int64_t steps = 0;
    int64_t page_steps = 0;
    int64_t wave_tokens = 0;
    for (size_t i = first; i < last; ++i) {
      const BoundRequest& request = requests[i];
      steps = std::max<int64_t>(steps, request.output_len);
      wave_tokens += request.output_len;
      // Entries of each layer at decode step t: what the prompt left plus t, up to a decode cap.
      const std::vector<int> kept = policy.EntriesAfterPrompt(request.prompt_len);
      for (int layer = 0; layer < layers; ++layer) {
        const int cap = policy.DecodeLimitFor(layer).max_entries;
        for (int t = 0; t < request.output_len; ++t) {
          int entries = kept[layer] + t + 1;  // the step's own token too
          if (cap > 0) entries = std::min(entries, cap);
          bound.kv_bytes_read += entries * entry_bytes;
          page_steps += (entries + config.page_size - 1) / config.page_size;
        }
      }
    }
    bool pool_limited = false;
    if (config.kv_pool_pages > 0) {  // kPoolFromServer unresolved: not limited
      const int64_t by_pool = (page_steps + config.kv_pool_pages - 1) / config.kv_pool_pages;
      if (by_pool > steps) {
        bound.pool_limited_steps += by_pool - steps;
        steps = by_pool;
        pool_limited = true;
      }
    }
    bound.decode_steps += steps;
    output_tokens += wave_tokens;
    decode_bytes += static_cast<double>(steps) * bound.weight_bytes;
    if (steps > 0 && !pool_limited) {
      // Step t runs the wave's requests with more than t tokens still to come.
      std::vector<int64_t> ending(static_cast<size_t>(steps) + 1, 0);
      for (size_t i = first; i < last; ++i) ++ending[static_cast<size_t>(requests[i].output_len)];
      int64_t rows = static_cast<int64_t>(last - first);
      for (int64_t t = 0; t < steps; ++t) {
        rows -= ending[static_cast<size_t>(t)];
        const double step_s = roofline_gemm_s(static_cast<double>(rows));
        if (step_s > weights_s) ++bound.compute_bound_steps;
        roofline_gemm_total_s += step_s;
      }
    } else if (steps > 0) {
      // Which rows run in which of the pool's steps is not modelled: the mean rows a step
      // (roofline_gemm_s is convex in the rows, so this stays a lower bound).
      const double step_s = roofline_gemm_s(static_cast<double>(wave_tokens) / steps);
      if (step_s > weights_s) bound.compute_bound_steps += steps;
      roofline_gemm_total_s += static_cast<double>(steps) * step_s;
    }
    // Each step all-reduces its running rows: a fixed cost a step, and the wave's rows in all
    // (all_reduce_s is affine in the rows, so the mean row count a step gives the sum).
    if (steps > 0) {
      decode_all_reduce_s += static_cast<double>(steps) * 2 * layers *
                             all_reduce_s(static_cast<double>(wave_tokens) / steps);
    }
  }
  decode_bytes += bound.kv_bytes_read;
  bound.decode_s = decode_bytes / copy_bytes_per_s + decode_all_reduce_s;
  // Exactly decode_s where no step is past the ridge (no rounding of the sum and difference).
  bound.decode_roofline_s = bound.compute_bound_steps == 0
                                ? bound.decode_s
                                : bound.decode_s -
                                      static_cast<double>(bound.decode_steps) * weights_s +
                                      roofline_gemm_total_s;
  bound.all_reduce_s += decode_all_reduce_s;
  const double total = bound.prefill_s + bound.decode_s;
  bound.output_tokens_per_s = total > 0 ? output_tokens / total : 0;
  const double roofline_total = bound.prefill_s + bound.decode_roofline_s;
  bound.roofline_output_tokens_per_s = roofline_total > 0 ? output_tokens / roofline_total : 0;
  return bound;
}

}  // namespace sieve::bench
