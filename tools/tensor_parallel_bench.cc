#include "tools/tensor_parallel_bench.h"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace sieve {

nlohmann::json PrintTensorParallelPlan(const ModelConfig& config, const std::string& name,
                                       const TensorParallelPlanOptions& options) {
  const DecodeStepRates rates{options.copy_bytes_per_s, options.bus_bytes_per_s,
                              options.collective_latency_s};
  const std::string measured_note =
      options.measured_size > 0
          ? "; at TP=" + std::to_string(options.measured_size) + " the all-reduce as measured"
          : "";
  std::printf(
      "== tensor-parallel decode step bound, %s shape, batch %d x %d context: one rank's weights "
      "+ KV at the copy rate (%.0f GB/s), + its all-reduces (2 a layer) at %.0f GB/s bus "
      "bandwidth and %.1f us each (assumed: NCCL's ring on NVLink 4 without NVLS%s)\n",
      name.c_str(), options.batch, options.context, options.copy_bytes_per_s / 1e9,
      options.bus_bytes_per_s / 1e9, options.collective_latency_s * 1e6, measured_note.c_str());
  std::printf("%-10s %3s %9s %5s %10s %8s %14s %9s %11s %9s %9s   %s\n", "kept", "TP", "held GB",
              "fits", "weights GB", "KV GB", "all-reduces", "memory ms", "collect. ms", "bound ms",
              "tok/s", "vocab-parallel LM head: bound ms");
  nlohmann::json rows = nlohmann::json::array();
  for (const double kept : {1.0, 0.1}) {
    const int64_t entries = std::max<int64_t>(1, static_cast<int64_t>(options.context * kept)) + 1;
    const std::string label = kept == 1.0 ? "dense" : "1/10 kept";
    for (const int size : options.sizes) {
      auto traffic = ComputeDecodeStepTraffic(config, size, options.batch, entries, DType::kBF16);
      if (!traffic.ok()) {
        std::printf("%-10s %3d   %s\n", label.c_str(), size, traffic.status().message().c_str());
        continue;
      }
      auto vocab_parallel = ComputeDecodeStepTraffic(config, size, options.batch, entries,
                                                     DType::kBF16, LmHeadSplit::kVocabParallel);
      DecodeStepBound bound = ComputeDecodeStepBound(*traffic, rates);
      DecodeStepBound vocab_bound = ComputeDecodeStepBound(*vocab_parallel, rates);
      const bool measured = size == options.measured_size && options.measured_all_reduce_s > 0;
      if (measured) {
        // The measured all-reduces in place of the assumed ones (bound.collective_s is only
        // all-reduces; the vocab-parallel bound's gather stays as assumed).
        const double change =
            traffic->all_reduces * options.measured_all_reduce_s - bound.collective_s;
        for (DecodeStepBound* b : {&bound, &vocab_bound}) {
          b->collective_s += change;
          b->step_s += change;
        }
      }
      const double held = traffic->held_bytes + traffic->kv_bytes;
      const char* fits = options.device_memory_bytes <= 0            ? "-"
                         : held <= 0.9 * options.device_memory_bytes ? "yes"
                                                                     : "no";
      char all_reduces[32];
      std::snprintf(all_reduces, sizeof(all_reduces), "%d x %.2f MB", traffic->all_reduces,
                    traffic->all_reduce_bytes / 1e6);
      std::printf("%-10s %3d %9.1f %5s %10.1f %8.1f %14s %9.3f %11.3f %9.3f %9.0f   %.3f%s\n",
                  label.c_str(), size, held / 1e9, fits, traffic->weight_bytes / 1e9,
                  traffic->kv_bytes / 1e9, all_reduces, bound.memory_s * 1e3,
                  bound.collective_s * 1e3, bound.step_s * 1e3, options.batch / bound.step_s,
                  vocab_bound.step_s * 1e3, measured ? "   (all-reduce measured)" : "");
      rows.push_back({{"kept_fraction", kept},
                      {"tensor_parallel_size", size},
                      {"batch", options.batch},
                      {"context", options.context},
                      {"held_bytes", held},
                      {"fits", fits},
                      {"weight_bytes", traffic->weight_bytes},
                      {"kv_bytes", traffic->kv_bytes},
                      {"all_reduces", traffic->all_reduces},
                      {"all_reduce_bytes", traffic->all_reduce_bytes},
                      {"memory_ms", bound.memory_s * 1e3},
                      {"collective_ms", bound.collective_s * 1e3},
                      {"bound_ms", bound.step_s * 1e3},
                      {"bound_tokens_per_second", options.batch / bound.step_s},
                      {"vocab_parallel_bound_ms", vocab_bound.step_s * 1e3},
                      {"all_reduce_measured", measured}});
    }
  }
  return rows;
}

double TimeAllReduce(const std::vector<Backend*>& backends,
                     const std::vector<Communicator*>& communicators, int64_t elements, int count) {
  constexpr int kSamples = 20;
  const int size = static_cast<int>(backends.size());
  std::vector<double> per_rank(size, 0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      Backend& backend = *backends[rank];
      backend.MakeCurrent();
      Tensor data = backend.Allocate({elements}, DType::kBF16);
      backend.FillRandom(data, 100 + static_cast<uint64_t>(rank), 1e-3f);
      for (int i = 0; i < count; ++i) communicators[rank]->AllReduceSum(data);  // NCCL's setup
      backend.Synchronize();
      backend.BeginCapture();
      for (int i = 0; i < count; ++i) communicators[rank]->AllReduceSum(data);
      const int graph = backend.EndCapture();
      backend.ReplayGraph(graph);
      backend.Synchronize();
      std::vector<double> ms = backend.TimeGraphReplays(graph, kSamples, 1);
      std::sort(ms.begin(), ms.end());
      per_rank[rank] = ms.empty() ? 0 : ms[ms.size() / 2] * 1e-3 / count;
    });
  }
  for (std::thread& thread : threads) thread.join();
  return *std::max_element(per_rank.begin(), per_rank.end());
}

}  // namespace sieve
