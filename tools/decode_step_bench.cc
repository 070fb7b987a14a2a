#include "tools/decode_step_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "model/llama_model.h"
#include "model/tensor_parallel.h"
#include "runtime/model_runner.h"
#include "runtime/step_tuning.h"

#ifdef SIEVE_HAVE_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#endif

namespace sieve {

namespace {

double Median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Replays per device-timed sample: back-to-back replays between one pair of events, so that
// event records sit between few graphs (one pair per replay read the same within the noise on
// the H200: bench/results/2026-11-30-s4-h200-kernels.json against 2026-11-30-s4-h200-step.json).
constexpr int kReplaysPerSample = 5;

// The device time of one replay (PERF.md: CUDA events, median of many samples of
// kReplaysPerSample back-to-back replays), or the host time of replay + synchronise where the
// backend has no device timer.
double MedianReplayMs(Backend& backend, int graph, int iterations) {
  backend.ReplayGraph(graph);
  backend.Synchronize();
  std::vector<double> device_ms = backend.TimeGraphReplays(
      graph, std::max(1, iterations / kReplaysPerSample), kReplaysPerSample);
  if (!device_ms.empty()) return Median(std::move(device_ms));
  std::vector<double> times;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    const auto start = std::chrono::steady_clock::now();
    backend.ReplayGraph(graph);
    backend.Synchronize();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return Median(std::move(times));
}

// Each kind of op of the decode step, for every layer, captured alone in a graph of its own:
// where the step's time goes. Ops of one kind run back to back here, so the parts need not add up
// to the step exactly; the difference is what their neighbours change.
std::vector<DecodeStepPart> TimeParts(Backend& backend, const LlamaModel& model,
                                      const StepMeta& step, KvPool& pool,
                                      ForwardWorkspace& workspace, Tensor& logits,
                                      const DecodeStepBenchOptions& options, int length) {
  const ModelConfig& config = model.config();
  const LlamaWeights& weights = model.weights();
  const int batch = options.batch;
  const int layers = config.num_layers;
  const int heads = config.num_heads;
  const float eps = config.rms_norm_eps;
  const double elem = static_cast<double>(DTypeSize(backend.activation_dtype()));
  Tensor hidden = workspace.hidden.Rows(0, batch);
  Tensor normed = workspace.normed.Rows(0, batch);
  Tensor qkv = workspace.qkv.Rows(0, batch);
  Tensor attn = workspace.attn.Rows(0, batch);
  Tensor gate_up = workspace.gate_up.Rows(0, batch);
  // The MLP's activation as the model's forward writes it: quantized before an e4m3 down GEMM.
  Tensor act = GemmInput(weights.layers[0].down, workspace.act, workspace.act_e4m3, batch);
  Tensor last = workspace.last.Rows(0, batch);
  const auto bytes_of = [](const Tensor& weight) { return static_cast<double>(HeldBytes(weight)); };
  const double kv_bytes = static_cast<double>(batch) * length * config.num_kv_heads *
                          config.head_dim * 2 * (options.fp8_kv_cache ? 1.0 : elem);
  struct Part {
    const char* name;
    double bytes;
    std::function<void(int)> op;  // one layer's op
    int repeats;                  // layers, or 1
  };
  const double activations = static_cast<double>(batch) * config.hidden_size * elem;
  const auto gather_lm_head = [&](int) {
    backend.GatherRows(normed, step.sample_rows, last);
    backend.Linear(last, weights.lm_head, logits);
  };
  // The step's ops (model/README.md "Folded norms"): the GEMMs read the residual stream, the ops
  // after them scale rows by its inverse RMS, the o and down GEMMs add into it. (The parts' ops
  // capture `norm` by reference: it lives as long as they run.)
  const RowRms norm{&hidden, eps};
  const std::vector<Part> parts = {
      {"qkv GEMM", bytes_of(weights.layers[0].qkv),
       [&](int l) { backend.Linear(hidden, weights.layers[l].qkv, qkv); }, layers},
      {"RoPE + decode attention", kv_bytes + static_cast<double>(qkv.numel()) * elem + activations,
       [&](int l) {
         backend.RopeDecodeAttention(qkv, model.rope_table(), heads, step, l, pool, attn, norm);
       },
       layers},
      {"o GEMM (+ residual)", bytes_of(weights.layers[0].o) + 2 * activations,
       [&](int l) { backend.LinearAdd(attn, weights.layers[l].o, hidden); }, layers},
      // One op, as the model calls it (one kernel at one row): its weights, the row read and the
      // output written.
      {"gate_up GEMM + SiLU x mul",
       bytes_of(weights.layers[0].gate_up) + static_cast<double>(HeldBytes(act)) + activations,
       [&](int l) { backend.LinearSiluMul(hidden, weights.layers[l].gate_up, gate_up, act, norm); },
       layers},
      {"down GEMM (+ residual)", bytes_of(weights.layers[0].down) + 2 * activations,
       [&](int l) { backend.LinearAdd(act, weights.layers[l].down, hidden); }, layers},
      {"gather + lm_head", bytes_of(weights.lm_head), gather_lm_head, 1},
  };
  std::vector<DecodeStepPart> results;
  for (const Part& part : parts) {
    for (int l = 0; l < part.repeats; ++l) part.op(l);  // eager first: plans GEMMs
    backend.Synchronize();
    backend.BeginCapture();
    for (int l = 0; l < part.repeats; ++l) part.op(l);
    const int graph = backend.EndCapture();
    results.push_back(
        {part.name, MedianReplayMs(backend, graph, options.iterations), part.bytes * part.repeats});
  }
  return results;
}

}  // namespace

namespace {

constexpr int kPageSize = 16;  // the step's KV pool pages

// Entries of each (layer, sequence) in the step: a kept_fraction of the context plus this step's.
int StepLength(const DecodeStepBenchOptions& options) {
  return std::max(1, static_cast<int>(options.context * options.kept_fraction)) + 1;
}

// Pages that hold them.
int PagesPerSequence(const DecodeStepBenchOptions& options) {
  return (StepLength(options) + kPageSize - 1) / kPageSize;
}

// One rank's decode step, set up: its model (whole, or its shard), the step's metadata, its KV pool
// (its KV heads; the same pages on every rank), workspace and logits.
struct RankStep {
  std::unique_ptr<LlamaModel> model;
  StepMeta step;
  KvPool pool;
  ForwardWorkspace workspace;
  Tensor logits;
};

// The step every rank runs: `options.batch` sequences, each layer holding a kept_fraction of
// `options.context` entries plus this step's. Rank r of N holds exactly rank r's share of one
// rank's weights (RandomShard), and the same page tables.
RankStep MakeRankStep(Backend& backend, const ModelConfig& config,
                      const DecodeStepBenchOptions& options, const TensorParallelShard& shard,
                      Communicator* communicator) {
  const int batch = options.batch;
  const int layers = config.num_layers;
  const int length = StepLength(options);  // this step's token is appended
  const int pages_per_seq = PagesPerSequence(options);
  const int num_pages = pages_per_seq * batch * layers;
  // FP8 weights are quantized layer by layer as they are made, so that a 70B model's fit one GPU.
  auto model_or = LlamaModel::RandomShard(config, backend, 1, options.context + 2, shard,
                                          communicator, 0.02f, options.quantization);
  // The caller checked the split, and the command the device.
  SIEVE_CHECK(model_or.ok()) << model_or.status().ToString();
  RankStep rank;
  rank.model = std::move(model_or).value();
  const int kv_heads = rank.model->layout().num_kv_heads;
  StepMeta& step = rank.step;
  KvPool& pool = rank.pool;

  const auto ints = [&](const std::vector<int32_t>& values, std::vector<int64_t> shape) {
    Tensor tensor = backend.Allocate(std::move(shape), DType::kI32);
    backend.CopyFromHost(values.data(), values.size() * sizeof(int32_t), tensor);
    return tensor;
  };
  step.num_tokens = batch;
  step.num_seqs = batch;
  step.num_layers = layers;
  step.max_kv_len = length;
  if (options.length_bounds == StepLengthBounds::kEngineLayerBounds) {
    step.max_kv_len = options.max_model_len + 1;
    step.layer_max_kv_len.assign(layers, ModelRunner::GraphLayerBound(length, step.max_kv_len));
  }
  step.num_sample_rows = batch;
  std::vector<int32_t> rows(batch), starts(batch + 1), slots(batch);
  std::iota(rows.begin(), rows.end(), 0);
  std::iota(starts.begin(), starts.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::mt19937_64 rng(7);
  std::vector<int32_t> tokens(batch);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng() % config.vocab_size);
  step.token_ids = ints(tokens, {batch});
  // True positions are the full context even when a layer keeps fewer entries (sparse).
  step.positions = ints(std::vector<int32_t>(batch, options.context), {batch});
  step.query_start = ints(starts, {batch + 1});
  step.key_start = ints({0}, {1});
  step.context_lens = ints(std::vector<int32_t>(batch, options.context), {batch});
  step.seq_slots = ints(slots, {batch});
  step.write_start =
      ints(std::vector<int32_t>(static_cast<size_t>(layers) * batch, length - 1), {layers, batch});
  step.sample_rows = ints(rows, {batch});
  step.compression_jobs = ints({0}, {1});
  step.eviction_jobs = ints({0}, {1});
  step.job_begin.assign(layers + 1, 0);
  step.eviction_begin.assign(layers + 1, 0);

  pool.page_size = kPageSize;
  pool.num_pages = num_pages;
  pool.max_seqs = batch;
  pool.max_pages_per_seq = pages_per_seq;
  pool.num_kv_heads = kv_heads;
  pool.head_dim = config.head_dim;
  if (options.fp8_kv_cache) {
    pool.k = backend.Allocate({num_pages, kPageSize, kv_heads, config.head_dim}, DType::kF8E4M3);
    pool.v = backend.Allocate(pool.k.shape(), DType::kF8E4M3);
    // Random e4m3 codes (no NaN), one block of pages copied over the whole pool.
    const int64_t page_bytes = static_cast<int64_t>(kPageSize) * kv_heads * config.head_dim;
    const int64_t block_pages = std::min<int64_t>(num_pages, (int64_t{32} << 20) / page_bytes);
    std::vector<uint8_t> block(static_cast<size_t>(block_pages * page_bytes));
    std::mt19937_64 byte_rng(11);  // apart from rng: the page order matches the bf16 pool's
    for (uint8_t& byte : block) {
      byte = static_cast<uint8_t>(byte_rng() % 256);
      if ((byte & 0x7f) == 0x7f) byte ^= 1;
    }
    for (Tensor* data : {&pool.k, &pool.v}) {
      for (int64_t page = 0; page < num_pages; page += block_pages) {
        const int64_t end = std::min<int64_t>(num_pages, page + block_pages);
        Tensor pages = data->Rows(page, end);
        backend.CopyFromHost(block.data(), static_cast<size_t>((end - page) * page_bytes), pages);
      }
    }
    // Scales that keep values of order 1, as the bf16 pool's.
    const std::vector<float> scales(static_cast<size_t>(layers) * kv_heads, 1.0f / 64);
    pool.k_scales = backend.Allocate({layers, kv_heads}, DType::kF32);
    pool.v_scales = backend.Allocate({layers, kv_heads}, DType::kF32);
    backend.CopyFromHost(scales.data(), scales.size() * sizeof(float), pool.k_scales);
    backend.CopyFromHost(scales.data(), scales.size() * sizeof(float), pool.v_scales);
  } else {
    pool.k = backend.Allocate({num_pages, kPageSize, kv_heads, config.head_dim},
                              backend.activation_dtype());
    pool.v = backend.Allocate(pool.k.shape(), backend.activation_dtype());
    backend.FillRandom(pool.k, 3 + 2 * static_cast<uint64_t>(shard.rank), 1.0f);
    backend.FillRandom(pool.v, 4 + 2 * static_cast<uint64_t>(shard.rank), 1.0f);
  }
  // pages[layer][seq][i]: its own index (kInOrder) or shuffled over the whole pool.
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  if (options.page_order == PageOrder::kShuffled) {
    std::shuffle(pages.begin(), pages.end(), rng);
  }
  pool.page_table = ints(pages, {layers, batch, pages_per_seq});
  pool.kv_lens =
      ints(std::vector<int32_t>(static_cast<size_t>(layers) * batch, length), {layers, batch});

  rank.model->EnsureWorkspace(rank.workspace, batch, 1, batch, 1, 1);
  rank.logits = backend.Allocate({batch, config.vocab_size}, DType::kF32);
  return rank;
}

}  // namespace

double DecodeStepBenchBytes(const ModelConfig& config, const DecodeStepBenchOptions& options,
                            DType dtype) {
  const double weights = static_cast<double>(config.NumParameters()) * DTypeSize(dtype);
  const double pool_tokens =
      static_cast<double>(options.batch) * PagesPerSequence(options) * kPageSize;
  return weights + pool_tokens * static_cast<double>(config.KvBytesPerToken(dtype));
}

DecodeStepBenchResult RunDecodeStepBench(Backend& backend, const ModelConfig& config,
                                         const DecodeStepBenchOptions& options) {
  const int batch = options.batch;
  const int layers = config.num_layers;
  const int length = StepLength(options);
  RankStep rank = MakeRankStep(backend, config, options, {}, nullptr);
  const std::unique_ptr<LlamaModel>& model = rank.model;
  const StepMeta& step = rank.step;
  KvPool& pool = rank.pool;
  ForwardWorkspace& workspace = rank.workspace;
  Tensor& logits = rank.logits;
  backend.MarkTuningScope();
  model->Forward(step, pool, workspace, logits);  // warm-up: plans GEMMs, sizes workspaces
  backend.Synchronize();
  DecodeStepBenchResult result;
  int graph = -1;
  if (options.use_graph && backend.SupportsGraphs()) {
    // As the engine captures a decode bucket's first step (runtime/model_runner.cc): the GEMM
    // choices left open decided by timing the captured step. (The warm-up above planned them;
    // on a backend whose shapes were tuned by an earlier step, nothing is open.)
    std::vector<StepTuningOutcome> tuning;
    const auto start = std::chrono::steady_clock::now();
    graph = CaptureTunedGraph(
        backend, [&] { model->Forward(step, pool, workspace, logits); },
        /*replays_allowed=*/true, &tuning);
    result.tuning_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.tuning = DescribeStepTuning(tuning);
  }
  const auto run = [&] {
    if (graph >= 0) {
      backend.ReplayGraph(graph);
    } else {
      model->Forward(step, pool, workspace, logits);
    }
  };
  run();
  backend.Synchronize();
  std::vector<double> times;
  for (int iteration = 0; iteration < options.iterations; ++iteration) {
    const auto start = std::chrono::steady_clock::now();
    run();
    backend.Synchronize();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::vector<double> device_ms;
  if (graph >= 0) {
    device_ms = backend.TimeGraphReplays(graph, std::max(1, options.iterations / kReplaysPerSample),
                                         kReplaysPerSample);
  }
#ifdef SIEVE_HAVE_CUDA
  if (options.profiled_steps > 0 && backend.device() == Device::kCuda) {
    cudaProfilerStart();
    for (int profiled = 0; profiled < options.profiled_steps; ++profiled) run();
    backend.Synchronize();
    cudaProfilerStop();
  }
#endif

#ifdef SIEVE_HAVE_CUDA
  if (options.trace_attention && backend.device() == Device::kCuda) {
    // One more step with the decode attention's phases stamped (decode_attention.h), the last
    // layer's kept. It gets a graph of its own: the timed replays above ran without the stamps.
    constexpr int64_t kTraceCtas = 1 << 16;
    const size_t count = static_cast<size_t>(kTraceCtas) * cuda::kDecodeTraceSlots;
    uint64_t* trace = nullptr;
    SIEVE_CUDA_CHECK(cudaMalloc(&trace, count * sizeof(uint64_t)));
    SIEVE_CUDA_CHECK(cudaMemset(trace, 0, count * sizeof(uint64_t)));
    cuda::SetDecodeAttentionTrace(trace, kTraceCtas);
    if (graph >= 0) {
      backend.BeginCapture();
      model->Forward(step, pool, workspace, logits);
      backend.ReplayGraph(backend.EndCapture());  // never replayed again: its pointer may dangle
    } else {
      model->Forward(step, pool, workspace, logits);
    }
    cuda::SetDecodeAttentionTrace(nullptr, 0);
    backend.Synchronize();
    std::vector<uint64_t> host(count);
    SIEVE_CUDA_CHECK(
        cudaMemcpy(host.data(), trace, count * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    SIEVE_CUDA_CHECK(cudaFree(trace));
    result.attention_trace = cuda::SummarizeDecodeAttentionTrace(host.data(), kTraceCtas);
  }
#endif
  result.step_wall_ms = Median(times);
  result.step_ms = device_ms.empty() ? result.step_wall_ms : Median(std::move(device_ms));
  const double elem = static_cast<double>(DTypeSize(backend.activation_dtype()));
  if (options.breakdown && backend.SupportsGraphs()) {
    result.parts = TimeParts(backend, *model, step, pool, workspace, logits, options, length);
  }
  // Bytes a step must move: every weight except the embedding table once (B embedding rows), as
  // the model holds it (FP8 layers with their scales), every held K/V entry once.
  const double weights = static_cast<double>(model->WeightBytes()) -
                         static_cast<double>(config.vocab_size) * config.hidden_size *
                             (config.tie_word_embeddings ? 0 : 1) * elem;
  const double kv_elem = options.fp8_kv_cache ? 1.0 : elem;
  const double kv = static_cast<double>(batch) * layers * length * config.num_kv_heads *
                    config.head_dim * 2 * kv_elem;
  result.bytes = weights + kv;
  if (options.copy_bandwidth > 0) {
    // Bytes over the measured copy rate (read + write bytes per second), as PERF.md's table
    // computes its bound.
    result.bound_ms = result.bytes / options.copy_bandwidth * 1e3;
  }
  result.tokens_per_second = batch / (result.step_ms * 1e-3);
  result.achieved_bandwidth = result.bytes / (result.step_ms * 1e-3);
  return result;
}

DecodeStepBenchResult RunShardedDecodeStepBench(const std::vector<Backend*>& backends,
                                                const std::vector<Communicator*>& communicators,
                                                const ModelConfig& config,
                                                const DecodeStepBenchOptions& options) {
  const int size = static_cast<int>(backends.size());
  SIEVE_CHECK(size >= 1 && communicators.size() == backends.size());
  std::vector<std::vector<double>> device_ms(size), wall_ms(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Backend& backend = *backends[r];
      backend.MakeCurrent();
      RankStep rank = MakeRankStep(backend, config, options, {r, size}, communicators[r]);
      const auto forward = [&] {
        rank.model->Forward(rank.step, rank.pool, rank.workspace, rank.logits);
      };
      backend.MarkTuningScope();
      forward();  // plans GEMMs; every rank runs the same all-reduces
      backend.Synchronize();
      // Step tuning replays the step, all-reduces included: with one rank only (as the engine).
      const int graph = CaptureTunedGraph(backend, forward, /*replays_allowed=*/size == 1);
      backend.ReplayGraph(graph);
      backend.Synchronize();
      for (int iteration = 0; iteration < options.iterations; ++iteration) {
        const auto start = std::chrono::steady_clock::now();
        backend.ReplayGraph(graph);
        backend.Synchronize();
        wall_ms[r].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      device_ms[r] = backend.TimeGraphReplays(
          graph, std::max(1, options.iterations / kReplaysPerSample), kReplaysPerSample);
      backend.Synchronize();
    });
  }
  for (std::thread& thread : threads) thread.join();
  DecodeStepBenchResult result;
  for (int r = 0; r < size; ++r) {  // the slowest rank's
    result.step_wall_ms = std::max(result.step_wall_ms, Median(wall_ms[r]));
    result.step_ms =
        std::max(result.step_ms, device_ms[r].empty() ? Median(wall_ms[r]) : Median(device_ms[r]));
  }
  auto traffic = ComputeDecodeStepTraffic(config, size, options.batch, StepLength(options),
                                          backends[0]->activation_dtype());
  SIEVE_CHECK(traffic.ok()) << traffic.status().ToString();
  result.bytes = traffic->weight_bytes + traffic->kv_bytes;
  if (options.copy_bandwidth > 0) result.bound_ms = result.bytes / options.copy_bandwidth * 1e3;
  result.tokens_per_second = options.batch / (result.step_ms * 1e-3);
  result.achieved_bandwidth = result.bytes / (result.step_ms * 1e-3);
  return result;
}

}  // namespace sieve
