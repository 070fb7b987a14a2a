// The attention benchmark (attention_bench.h). Shapes are Llama-3-8B's (32 query heads, 8 KV
// heads, d = 128). Inputs are seeded random values (never zeros: they run faster than real
// data); decode rotates through as many layers' worth of pages as fit 512 MB, so no call finds
// its K/V in the 60 MB L2.
//
// FLOP count for causal prefill, the FlashAttention convention: 4 * n^2 * d * H * batch / 2
// (two n x n x d matmuls of 2 FLOP per multiply-add, half of the square under the mask).
// Bytes for decode: the K and V entries read, batch * length * G * d * 2 (K, V) * 2 bytes.
#include "backend/cuda/attention_bench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/kernels.h"

namespace sieve::cuda {
namespace {

constexpr int kNumHeads = 32;
constexpr int kNumKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;

// PERF.md, measured on the development H200.
constexpr double kGemmTflops = 704.0;   // cuBLAS bf16 at M = 4096: the compute ceiling
constexpr double kCopyGbps = 4194.0;    // device-to-device copy: the bandwidth ceiling
constexpr double kFa2Tflops4k = 289.0;  // SDPA flash backend, causal, 32/8 heads, d = 128
constexpr double kFa2Tflops16k = 333.0;
constexpr double kCudnnTflops4k = 568.0;  // SDPA cuDNN backend: the stretch bar
constexpr double kCudnnTflops16k = 582.0;

// Uniform in [-sqrt(3), sqrt(3)] (unit variance) from a counter hash: random, reproducible.
__global__ void FillUniformKernel(bf16* out, int64_t count, uint64_t seed) {
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(index) + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    const float unit = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[index] = __float2bfloat16((unit * 2.0f - 1.0f) * 1.7320508f);
  }
}

// A device allocation that frees itself.
template <typename T>
class Buffer {
 public:
  explicit Buffer(size_t count) : count_(std::max<size_t>(count, 1)) {
    SIEVE_CUDA_CHECK(cudaMalloc(&data_, count_ * sizeof(T)));
  }
  ~Buffer() { cudaFree(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() const { return data_; }
  void Upload(const std::vector<T>& host) {
    SIEVE_CUDA_CHECK(
        cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

void FillRandom(bf16* data, int64_t count, uint64_t seed, cudaStream_t stream) {
  FillUniformKernel<<<1024, 256, 0, stream>>>(data, count, seed);
  SIEVE_CUDA_CHECK_LAUNCH();
}

// Milliseconds between two events recorded on `stream` around `work()`.
template <typename Work>
float TimedMs(cudaStream_t stream, Work&& work) {
  cudaEvent_t start;
  cudaEvent_t stop;
  SIEVE_CUDA_CHECK(cudaEventCreate(&start));
  SIEVE_CUDA_CHECK(cudaEventCreate(&stop));
  SIEVE_CUDA_CHECK(cudaEventRecord(start, stream));
  work();
  SIEVE_CUDA_CHECK(cudaEventRecord(stop, stream));
  SIEVE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  SIEVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  SIEVE_CUDA_CHECK(cudaEventDestroy(start));
  SIEVE_CUDA_CHECK(cudaEventDestroy(stop));
  return ms;
}

// Median time of one call of `launch(iteration)` in milliseconds, CUDA events around each call.
template <typename Launch>
double MedianMs(const AttentionBenchOptions& options, cudaStream_t stream, Launch&& launch) {
  int iteration = 0;
  for (int warm = 0; warm < options.warmup; ++warm) launch(iteration++);
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> times;
  const int iterations = std::max(options.iterations, 1);
  for (int repeat = 0; repeat < iterations; ++repeat) {
    times.push_back(TimedMs(stream, [&] { launch(iteration++); }));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Time of one call of `launch()` in milliseconds when the calls run back to back: the median over
// 3 rounds of the mean of `iterations` calls between two events. The host's work for a call (the
// Hopper prefill kernel encodes three tensor maps) then overlaps the call before it, as in the
// engine, instead of idling the GPU inside the timed window.
template <typename Launch>
double BackToBackMs(const AttentionBenchOptions& options, cudaStream_t stream, Launch&& launch) {
  for (int warm = 0; warm < options.warmup; ++warm) launch();
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> means;
  const int iterations = std::max(options.iterations, 1);
  for (int round = 0; round < 3; ++round) {
    const float ms = TimedMs(stream, [&] {
      for (int call = 0; call < iterations; ++call) launch();
    });
    means.push_back(ms / static_cast<float>(iterations));
  }
  std::sort(means.begin(), means.end());
  return means[1];
}

void Report(const AttentionBenchOptions& options, AttentionBenchResult result) {
  std::printf("%-44s %9.3f ms %9.1f %-7s  bound %6.0f (%5.1f%%)", result.name.c_str(),
              result.median_ms, result.value, result.unit.c_str(), result.bound,
              100.0 * result.value / result.bound);
  if (result.target > 0.0) {
    std::printf("  target %6.0f (%s): %5.1f%% %s", result.target, result.target_note.c_str(),
                100.0 * result.value / result.target,
                result.value >= result.target ? "MET" : "MISSED");
  } else {
    std::printf("  %s", result.target_note.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
  if (options.results != nullptr) options.results->push_back(std::move(result));
}

// `kernel` kAuto is what the engine runs; on Hopper the sm_80 kernel is timed beside it.
// head_dim 128 (Llama-3-8B) or 64 (32 / 8 heads of 64, as Llama-3.2-1B); floor and stretch 0: no
// bar in PERF.md. `chunks`: the step's prefill sequences (rows after cached keys).
void BenchPrefill(const AttentionBenchOptions& options, const std::string& shape,
                  const std::vector<PrefillChunk>& chunks, int head_dim, double floor_tflops,
                  double stretch_tflops, PrefillKernel kernel, cudaStream_t stream) {
  const int batch = static_cast<int>(chunks.size());
  std::vector<int32_t> query_start(batch + 1, 0);
  std::vector<int32_t> key_start(batch + 1, 0);
  std::vector<int32_t> context_lens(batch);
  int max_query_len = 0;
  int max_kv_len = 0;
  double flops = 0.0;  // 4 d H per (row, key) pair a row sees: its context and the rows up to it
  for (int seq = 0; seq < batch; ++seq) {
    const PrefillChunk& chunk = chunks[seq];
    query_start[seq + 1] = query_start[seq] + chunk.query_len;
    key_start[seq + 1] = key_start[seq] + chunk.context_len + chunk.query_len;
    context_lens[seq] = chunk.context_len;
    max_query_len = std::max(max_query_len, chunk.query_len);
    max_kv_len = std::max(max_kv_len, chunk.context_len + chunk.query_len);
    const double rows = chunk.query_len;
    flops += 4.0 * head_dim * kNumHeads * (rows * chunk.context_len + rows * rows / 2.0);
  }
  const int tokens = query_start[batch];
  const int keys = key_start[batch];
  const int64_t qkv_width = static_cast<int64_t>(kNumHeads + 2 * kNumKvHeads) * head_dim;
  const int64_t q_width = static_cast<int64_t>(kNumHeads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(kNumKvHeads) * head_dim;
  Buffer<bf16> qkv(static_cast<size_t>(tokens) * qkv_width);
  Buffer<bf16> k(static_cast<size_t>(keys) * kv_width);
  Buffer<bf16> v(static_cast<size_t>(keys) * kv_width);
  Buffer<bf16> out(static_cast<size_t>(tokens) * q_width);
  Buffer<float> lse(static_cast<size_t>(tokens) * kNumHeads);
  FillRandom(qkv.get(), static_cast<int64_t>(tokens) * qkv_width, 1, stream);
  FillRandom(k.get(), static_cast<int64_t>(keys) * kv_width, 2, stream);
  FillRandom(v.get(), static_cast<int64_t>(keys) * kv_width, 3, stream);
  Buffer<int32_t> query_start_dev(batch + 1);
  query_start_dev.Upload(query_start);
  Buffer<int32_t> key_start_dev(batch + 1);
  key_start_dev.Upload(key_start);
  Buffer<int32_t> context_dev(batch);
  context_dev.Upload(context_lens);
  StepView step{};
  step.query_start = query_start_dev.get();
  step.key_start = key_start_dev.get();
  step.context_lens = context_dev.get();
  step.num_tokens = step.num_prefill_tokens = tokens;
  step.num_seqs = step.num_prefill_seqs = batch;
  step.max_query_len = max_query_len;
  step.max_kv_len = max_kv_len;
  step.num_prefill_keys = keys;

  const double ms = BackToBackMs(options, stream, [&] {
    PrefillAttentionWithKernel(kernel, qkv.get(), qkv_width, k.get(), v.get(), kNumHeads,
                               kNumKvHeads, head_dim, step, chunks, out.get(), q_width, lse.get(),
                               kNumHeads, stream);
  });
  AttentionBenchResult result;
  result.name = "prefill causal " + shape + " H32/G8 d" + std::to_string(head_dim);
  if (kernel == PrefillKernel::kSm80) result.name += " (sm_80 kernel)";
  result.unit = "TFLOP/s";
  result.median_ms = ms;
  result.value = flops / (ms * 1e-3) / 1e12;
  result.bound = kGemmTflops;
  char note[96];
  if (stretch_tflops <= 0.0) {
    result.target = 0.0;
    std::snprintf(note, sizeof(note), "no bar in PERF.md; cuDNN: scripts/sdpa_bench.py");
  } else if (kernel == PrefillKernel::kSm80 || !PrefillAttentionSm90Supported()) {
    result.target = 0.8 * floor_tflops;  // PERF.md's floor for the FlashAttention-2-class kernel
    std::snprintf(note, sizeof(note), "80%% of FA2 %.0f; cuDNN %.0f", floor_tflops, stretch_tflops);
  } else {
    result.target = 0.9 * stretch_tflops;  // the Hopper kernel's bar: 0.9x cuDNN's SDPA
    std::snprintf(note, sizeof(note), "90%% of cuDNN %.0f", stretch_tflops);
  }
  result.target_note = note;
  Report(options, std::move(result));
}

void BenchDecode(const AttentionBenchOptions& options, int batch, int length, const char* label,
                 double target_gbps, cudaStream_t stream) {
  const int64_t bytes_per_layer =
      static_cast<int64_t>(batch) * length * kNumKvHeads * kHeadDim * 2 * 2;
  const int num_layers =
      static_cast<int>(std::clamp<int64_t>((int64_t{512} << 20) / bytes_per_layer + 1, 2, 256));
  const int pages_per_seq = (length + kPageSize - 1) / kPageSize;
  const int64_t num_pages = static_cast<int64_t>(num_layers) * batch * pages_per_seq;
  const int64_t entry_width = static_cast<int64_t>(kNumKvHeads) * kHeadDim;
  Buffer<bf16> k_pool(static_cast<size_t>(num_pages) * kPageSize * entry_width);
  Buffer<bf16> v_pool(static_cast<size_t>(num_pages) * kPageSize * entry_width);
  FillRandom(k_pool.get(), num_pages * kPageSize * entry_width, 4, stream);
  FillRandom(v_pool.get(), num_pages * kPageSize * entry_width, 5, stream);
  // Pages handed out in a shuffled order, as a long-running pool would.
  std::vector<int32_t> page_ids(num_pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  Buffer<int32_t> page_table(page_ids.size());
  page_table.Upload(page_ids);  // [L][batch][pages_per_seq]
  Buffer<int32_t> kv_lens(static_cast<size_t>(num_layers) * batch);
  kv_lens.Upload(std::vector<int32_t>(static_cast<size_t>(num_layers) * batch, length));
  std::vector<int32_t> starts(batch + 1);
  std::iota(starts.begin(), starts.end(), 0);
  Buffer<int32_t> query_start(batch + 1);
  query_start.Upload(starts);
  Buffer<int32_t> slots(batch);
  slots.Upload(std::vector<int32_t>(starts.begin(), starts.end() - 1));
  const int64_t qkv_width = static_cast<int64_t>(kNumHeads + 2 * kNumKvHeads) * kHeadDim;
  const int64_t q_width = static_cast<int64_t>(kNumHeads) * kHeadDim;
  Buffer<bf16> q(static_cast<size_t>(batch) * qkv_width);
  FillRandom(q.get(), batch * qkv_width, 6, stream);
  Buffer<bf16> out(static_cast<size_t>(batch) * q_width);
  const size_t workspace_bytes = DecodeAttentionWorkspaceBytes(batch, kNumHeads, kHeadDim, length);
  Buffer<uint8_t> workspace(workspace_bytes);

  StepView step{};
  step.query_start = query_start.get();
  step.seq_slots = slots.get();
  step.num_tokens = batch;
  step.num_seqs = batch;
  step.max_query_len = 1;
  step.max_kv_len = length;
  PoolView pool{};
  pool.k = k_pool.get();
  pool.v = v_pool.get();
  pool.page_table = page_table.get();
  pool.kv_lens = kv_lens.get();
  pool.page_size = kPageSize;
  pool.max_seqs = batch;
  pool.max_pages_per_seq = pages_per_seq;
  pool.num_kv_heads = kNumKvHeads;
  pool.head_dim = kHeadDim;

  const double ms = MedianMs(options, stream, [&](int iteration) {
    DecodeAttention(q.get(), qkv_width, kNumHeads, step, iteration % num_layers, pool, out.get(),
                    q_width, workspace.get(), workspace_bytes, stream);
  });
  const int splits =
      DecodeAttentionSplits(batch, kNumHeads, kNumKvHeads, kHeadDim, length, workspace_bytes);
  if (DecodeAttentionTraceRequested()) {
    // One more call with every CTA's phases stamped (decode_attention.h).
    const int64_t ctas = static_cast<int64_t>(batch) * kNumKvHeads * splits;
    Buffer<uint64_t> stamps(static_cast<size_t>(ctas) * kDecodeTraceSlots);
    SIEVE_CUDA_CHECK(
        cudaMemsetAsync(stamps.get(), 0, ctas * kDecodeTraceSlots * sizeof(uint64_t), stream));
    SetDecodeAttentionTrace(stamps.get(), ctas);
    DecodeAttention(q.get(), qkv_width, kNumHeads, step, 0, pool, out.get(), q_width,
                    workspace.get(), workspace_bytes, stream);
    SetDecodeAttentionTrace(nullptr, 0);
    std::vector<uint64_t> host(static_cast<size_t>(ctas) * kDecodeTraceSlots);
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(host.data(), stamps.get(), host.size() * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, stream));
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::printf("b%d x %d %s: %s", batch, length, label,
                SummarizeDecodeAttentionTrace(host.data(), ctas).c_str());
  }
  AttentionBenchResult result;
  result.name = "decode b" + std::to_string(batch) + " x " + std::to_string(length) + " " + label +
                " (splits " + std::to_string(splits) + ")";
  result.unit = "GB/s";
  result.median_ms = ms;
  result.value = static_cast<double>(bytes_per_layer) / (ms * 1e-3) / 1e9;
  result.bound = kCopyGbps;
  result.target = target_gbps;
  result.target_note = target_gbps > 0.0 ? "75% of copy" : "no bar in PERF.md";
  Report(options, std::move(result));
}

}  // namespace

int RunAttentionBenchmarks(const AttentionBenchOptions& options) {
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  SIEVE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  std::printf(
      "attention kernels on %s (%d SMs, L2 %d MB), %d warm-up calls; prefill: mean of %d calls "
      "back to back (median of 3 rounds); decode: median of %d calls\n",
      properties.name, properties.multiProcessorCount, properties.l2CacheSize >> 20, options.warmup,
      options.iterations, options.iterations);
  std::printf("prefill FLOP = 4 n^2 d H batch / 2 (causal); decode bytes = K + V entries read\n");
  cudaStream_t stream;
  SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // On Hopper the engine runs the sm_90a kernel; the sm_80 one (A100, RTX 4090) is timed too.
  std::vector<PrefillKernel> kernels = {PrefillKernel::kAuto};
  if (PrefillAttentionSm90Supported()) kernels.push_back(PrefillKernel::kSm80);
  // n rows from position 0, `batch` times.
  const auto uniform = [](int n, int batch) {
    return std::vector<PrefillChunk>(batch, PrefillChunk{n, 0});
  };
  // A step of `sieve serve` at 4000-token prompts and an 8192-token budget: the rest of a prompt
  // begun in the step before, a whole one, and the start of the next.
  const std::vector<PrefillChunk> serving = {{3936, 64}, {4000, 0}, {128, 0}};
  for (const PrefillKernel kernel : kernels) {
    BenchPrefill(options, "n=4096 x4", uniform(4096, 4), kHeadDim, kFa2Tflops4k, kCudnnTflops4k,
                 kernel, stream);
    if (!options.quick) {
      BenchPrefill(options, "n=16384 x1", uniform(16384, 1), kHeadDim, kFa2Tflops16k,
                   kCudnnTflops16k, kernel, stream);
      BenchPrefill(options, "n=4096 x4", uniform(4096, 4), 64, 0.0, 0.0, kernel, stream);
      BenchPrefill(options, "chunks 64+3936, 4000, 128", serving, kHeadDim, 0.0, 0.0, kernel,
                   stream);
    }
  }
  const int kept = 4096 / 10;
  for (const int batch : {1, 16, 64}) {
    if (options.quick && batch != 64) continue;
    BenchDecode(options, batch, 4096, "dense", batch == 64 ? 0.75 * kCopyGbps : 0.0, stream);
    BenchDecode(options, batch, kept, "1/10 kept", 0.0, stream);
  }
  SIEVE_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

std::string AttentionBenchResultsToJson(const std::vector<AttentionBenchResult>& results) {
  std::string json = "[";
  char buffer[512];
  for (size_t index = 0; index < results.size(); ++index) {
    const AttentionBenchResult& result = results[index];
    std::snprintf(
        buffer, sizeof(buffer),
        "%s\n  {\"name\": \"%s\", \"unit\": \"%s\", \"median_ms\": %.6g, \"value\": %.6g, "
        "\"bound\": %.6g, \"target\": %.6g, \"target_note\": \"%s\"}",
        index == 0 ? "" : ",", result.name.c_str(), result.unit.c_str(), result.median_ms,
        result.value, result.bound, result.target, result.target_note.c_str());
    json += buffer;
  }
  json += "\n]\n";
  return json;
}

}  // namespace sieve::cuda
