// CpuBackend: the fp32 reference implementation of every Backend op. Correctness first: each op
// is written the straightforward way, parallelised over independent outputs with the thread pool,
// and every output element is computed by the same code whatever the batch holds, so a batched
// run is bitwise equal to single runs. The CUDA backend is tested against it.
#pragma once

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace sieve {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool* pool = nullptr);

  Device device() const override { return Device::kCpu; }
  std::string name() const override;
  DType activation_dtype() const override { return DType::kF32; }
  size_t FreeMemoryBytes() const override;

  Tensor Allocate(std::vector<int64_t> shape, DType dtype) override;
  void CopyFromHost(const void* src, size_t bytes, Tensor& dst) override;
  void CopyToHost(const Tensor& src, void* dst) override;
  void Synchronize() override {}
  // Batch-invariant always: each output element is computed the same way whatever the batch
  // holds (backend/README.md), so there is nothing to switch.
  Status SetBatchInvariant(bool on) override {
    (void)on;
    return Status::Ok();
  }
  Tensor UploadWeight(const void* src, DType src_dtype, std::vector<int64_t> shape) override;
  void FillRandom(Tensor& tensor, uint64_t seed, float stddev) override;
  void Copy(const Tensor& src, Tensor& dst) override;

  void Embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void Linear(const Tensor& x, const Tensor& w, Tensor& out) override;
  void LinearAdd(const Tensor& x, const Tensor& w, Tensor& out) override;
  void ScaleColumns(Tensor& w, const Tensor& scale) override;
  void SiluMul(const Tensor& gate_up, Tensor& out, RowRms norm) override;
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  Tensor QuantizeWeightE4m3(const Tensor& w) override;
  Tensor UploadWeightE4m3(const uint8_t* codes, const float* row_scales, int64_t rows,
                          int64_t cols) override;

  void RopeAndCacheWrite(Tensor& qkv, const Tensor& rope_table, int num_heads, const StepMeta& step,
                         int layer, KvPool& pool, RopeTokens tokens, RowRms norm) override;
  void GatherPrefillKv(const Tensor& qkv, int num_heads, const StepMeta& step, int layer,
                       const KvPool& pool, Tensor& k_out, Tensor& v_out) override;
  void PrefillAttention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                        const StepMeta& step, Tensor& out, Tensor& lse) override;
  void DecodeAttention(const Tensor& q, int num_heads, const StepMeta& step, int layer,
                       KvPool& pool, Tensor& out) override;

  void WindowScores(const Tensor& q, const Tensor& k, const Tensor& lse, int num_heads,
                    const StepMeta& step, int layer, Tensor& scores) override;
  void SelectKept(const Tensor& scores, int num_kv_heads, const StepMeta& step, int layer,
                  Tensor& kept) override;
  void WriteKeptKv(const Tensor& k, const Tensor& v, const Tensor& scores, const Tensor& kept,
                   const StepMeta& step, int layer, KvPool& pool) override;
  void EvictEntries(const StepMeta& step, int layer, KvPool& pool) override;
  void ScatterInt32(const Tensor& patches, int count, Tensor& dst) override;
  void GatherInt32(const Tensor& src, const Tensor& pairs, int count, Tensor& dst) override;
  HostBuffer AllocateHostBuffer(size_t bytes) override;
  void SwapOutPages(const KvPool& pool, std::span<const int32_t> pages,
                    std::span<const int32_t> slots, uint8_t* host) override;
  void SwapInPages(const uint8_t* host, std::span<const int32_t> slots,
                   std::span<const int32_t> pages, KvPool& pool) override;

  // Greedy rows only (any other row: false, the engine samples them on the host): the argmax
  // and its raw log-probability, as runtime/sampler.h's greedy path. Done at once; TakeSamples
  // hands the results out in order.
  bool BeginSampling(const Tensor& logits, const std::vector<DeviceSamplingRow>& rows,
                     Tensor& tokens) override;
  void TakeSamples(std::vector<int32_t>& tokens, std::vector<float>& logprobs) override;

 private:
  // out = x @ w^T, or out += x @ w^T with `accumulate` (f32 sum of out and the product).
  void Gemm(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate);
  // The same with an e4m3 weight (QuantizeWeightE4m3): x's rows quantized per token first.
  void GemmE4m3(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate);

  ThreadPool& pool_;
  struct Samples {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
  };
  std::vector<Samples> begun_;  // oldest first
};

// RowRms on the CPU. CheckRowRms: norm.rows, when set, is a 2-D f32 host tensor of `rows` rows.
// RowRmsScale: s of row `row`, cpu::InvRms of norm.rows's row (exactly the inverse RMS RmsNorm
// uses); 1 when norm.rows is null.
void CheckRowRms(const RowRms& norm, int64_t rows, const char* what);
float RowRmsScale(const RowRms& norm, int64_t row);

// Pools one KV head's prefix scores and returns the `keep` best positions, ascending; ties go to
// the lower position. Exposed for the sparsity reference tests. `scores` has `count` values.
void PoolScores(const float* scores, int count, PoolKind pool, int kernel, float* pooled);
void SelectTopPositions(const float* pooled, int count, int keep, int32_t* kept);

}  // namespace sieve
