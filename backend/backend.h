// Backend: the ops the Llama-family forward pass needs, implemented once per device.
//
// The model (model/) is written once against this interface; the CPU backend (backend/cpu) is
// the fp32 reference and the oracle of every test, and the CUDA backend (backend/cuda) must match
// it within each op's stated tolerance. Ops are asynchronous on the backend's stream: results
// are visible to the host only after CopyToHost or Synchronize. Shapes are written next to every
// argument; "act" is activation_dtype(), "cache" is the KV pool's dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/step_meta.h"
#include "core/status.h"
#include "core/tensor.h"

namespace sieve {

// Host memory a backend allocated (Backend::AllocateHostBuffer), freed as it must be.
using HostBuffer = std::unique_ptr<uint8_t[], void (*)(uint8_t*)>;

// Which tokens of a step RopeAndCacheWrite rotates and writes.
enum class RopeTokens {
  kAll,      // [0, num_tokens)
  kPrefill,  // [0, num_prefill_tokens): the prefill sequences' chunks
  kDecode,   // [num_prefill_tokens, num_tokens): one token per decode sequence
};

// An RMSNorm folded into the GEMM before an op (model/README.md, "folded norms"): the op scales
// row t of its input by s_t = 1 / sqrt(mean(rows[t]^2) + eps) before using it. rows [T][D] act
// is the residual stream the GEMM read; null rows: no scaling. rms(x) * (x W'^T) with W' = W
// diag(g) equals RmsNorm(x, g) W^T, so the model needs no RMSNorm kernel between layers.
struct RowRms {
  const Tensor* rows = nullptr;
  float eps = 0.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu (8 threads)", "cuda:0 NVIDIA H200"
  // dtype of activations and of weights uploaded with UploadWeight.
  virtual DType activation_dtype() const = 0;
  // Bytes of device memory free now (for KV planning); the CPU backend reports host memory.
  virtual size_t FreeMemoryBytes() const = 0;

  // ---- memory ----
  virtual Tensor Allocate(std::vector<int64_t> shape, DType dtype) = 0;
  virtual void CopyFromHost(const void* src, size_t bytes, Tensor& dst) = 0;  // contiguous dst
  virtual void CopyToHost(const Tensor& src, void* dst) = 0;                  // waits for the copy
  virtual void Synchronize() = 0;
  // Converts host data of `src_dtype` to activation_dtype() and uploads it.
  virtual Tensor UploadWeight(const void* src, DType src_dtype, std::vector<int64_t> shape) = 0;
  // Fills with seeded pseudo-random N(0, stddev) values (for --load-format dummy).
  virtual void FillRandom(Tensor& tensor, uint64_t seed, float stddev) = 0;
  // dst = src element for element, on the device (how a tensor-parallel rank cuts its slices
  // out of a full dummy weight at load).    src, dst [R][C] of one dtype; rows may be strided
  // (Rows / Columns views), columns contiguous.
  virtual void Copy(const Tensor& src, Tensor& dst) = 0;
  // Makes this backend's device the calling thread's current one. A thread that issues ops to a
  // backend it did not create calls it first (tensor parallelism: each rank's worker thread);
  // the CPU backend has nothing to do.
  virtual void MakeCurrent() {}

  // ---- dense ops ----
  // out[t] = table[ids[t]]          table [V][D] act, ids [T] i32, out [T][D] act
  virtual void Embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // out = x / rms(x) * weight       x [T][D] act, weight [D] act, out [T][D] act or a quantized
  // activation (below)
  virtual void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // out = x @ w^T                   x [M][K] act (row stride allowed), w [N][K] act, out [M][N]
  // act or f32 (f32 is how logits are produced).
  virtual void Linear(const Tensor& x, const Tensor& w, Tensor& out) = 0;
  // out += x @ w^T (the residual add fused into the GEMM)    x [M][K] act, w [N][K] act,
  // out [M][N] act: the f32 sum of out and the product, rounded once.
  virtual void LinearAdd(const Tensor& x, const Tensor& w, Tensor& out) = 0;
  // w[n][k] *= scale[k], rounded to act (folds an RMSNorm weight into the next GEMM's weight at
  // load).    w [N][K] act, scale [K] act
  virtual void ScaleColumns(Tensor& w, const Tensor& scale) = 0;
  // out = silu(s gate_up[:, :F]) * (s gate_up[:, F:]), s from `norm` per row (1 when
  // norm.rows is null)     gate_up [T][2F] act, out [T][F] act or a quantized activation (below)
  virtual void SiluMul(const Tensor& gate_up, Tensor& out, RowRms norm) = 0;
  // The MLP's first half as one op, so that a backend can fuse the GEMM and SiLU (the CUDA backend
  // does at one row): Linear(x, w, gate_up) then SiluMul(gate_up, out, norm).
  // x [T][D] act, w [2F][D] act (gate rows, then up rows), gate_up [T][2F] act is scratch
  // (afterwards unspecified), out [T][F] act or a quantized activation (below).
  virtual void LinearSiluMul(const Tensor& x, const Tensor& w, Tensor& gate_up, Tensor& out,
                             RowRms norm) {
    Linear(x, w, gate_up);
    SiluMul(gate_up, out, norm);
  }
  // out[r] = x[rows[r]]             x [T][D] act, rows [R] i32, out [R][D] act
  virtual void GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;

  // ---- FP8 weights (core/float8.h; model/README.md "FP8 weights") ----
  // Quantizes a weight by output channel: row n of the result holds e4m3(w[n] * 448 / amax_n) and
  // carries row_scales()[n] = amax_n / 448 (E4m3ScaleForAmax). Linear, LinearAdd and
  // LinearSiluMul take such a weight as `w`: they quantize each row of x the same way (one scale a
  // token, from the row as the op reads it: dynamic) and compute
  // out[t][n] = sx[t] sw[n] sum_k e4m3(x)[t][k] e4m3(w)[n][k] with f32 accumulation.
  // w [N][K] act, contiguous -> [N][K] f8_e4m3 with row scales [N] f32.
  //
  // A quantized activation is x so quantized ahead, by the op that produced it: [T][K] f8_e4m3
  // (contiguous rows, row stride a multiple of 16) with row scales [T] f32. RmsNorm and SiluMul
  // write one when their `out` is one: the row as the op computes it in act (rounded to act),
  // then quantized as Linear would quantize that act row, so the codes and scales are exactly
  // those of the op into act followed by Linear's own quantization. Linear, LinearAdd and
  // LinearSiluMul over an e4m3 weight take one as `x` as it is, with no quantizing pass.
  virtual Tensor QuantizeWeightE4m3(const Tensor& w) = 0;
  // A published FP8 checkpoint's weight as it is, not requantized (model/fp8_checkpoint.h): the
  // result is what QuantizeWeightE4m3 returns, with the checkpoint's codes and scales. The caller
  // checks the shape with CheckE4m3Weight first; the host buffers may be freed on return.
  // codes [N][K] e4m3 and row_scales [N] f32 (a per-tensor scale repeated), both on the host ->
  // [N][K] f8_e4m3 with row scales [N] f32.
  virtual Tensor UploadWeightE4m3(const uint8_t* codes, const float* row_scales, int64_t rows,
                                  int64_t cols) = 0;
  // Whether this backend runs FP8 GEMMs over a [N][K] e4m3 weight: checked when a model is
  // quantized, so that a device or shape the kernels cannot take is a clear error there. The CPU
  // backend takes every shape.
  virtual Status CheckE4m3Weight(int64_t rows, int64_t cols) const {
    (void)rows, (void)cols;
    return Status::Ok();
  }
  // Sizes the scratch of FP8 GEMMs for up to `rows` inputs of width `k` and outputs of width
  // `n`, once at start-up (LlamaModel::EnsureWorkspace), so that no captured step sees it grow.
  virtual void ReserveQuantizedInputs(int64_t rows, int64_t k, int64_t n) {
    (void)rows, (void)k, (void)n;
  }

  // ---- attention ----
  // Scales q, k and v of the `tokens` by their row's s (RowRms; in f32, before rotating), rotates
  // q and k (rope_table [max_pos][d/2][2] f32 holds cos, sin at each true position), writes the
  // results back into qkv (rounded to act), then writes k and v of each token whose sequence has
  // write_start[layer][s] >= 0 into the pool at entry write_start + (t - query_start[s]) (and the
  // side pools: its position, score 0). Other tokens are left alone.
  // qkv [T][(H + 2G) d] act: q heads, then k heads, then v heads.
  virtual void RopeAndCacheWrite(Tensor& qkv, const Tensor& rope_table, int num_heads,
                                 const StepMeta& step, int layer, KvPool& pool, RopeTokens tokens,
                                 RowRms norm) = 0;
  // Builds each prefill sequence's whole K/V in scratch rows key_start[s] .. : the entries cached
  // before this step (context_lens[s] of them, gathered from the layer's pages) followed by the
  // chunk's rotated k and v from qkv.      k_out, v_out [num_prefill_keys][G][d] act
  virtual void GatherPrefillKv(const Tensor& qkv, int num_heads, const StepMeta& step, int layer,
                               const KvPool& pool, Tensor& k_out, Tensor& v_out) = 0;
  // Causal attention of each prefill sequence's chunk against its whole K/V (the chunk's rows are
  // the last rows of the keys, so row i sees keys j <= context_len + i). GQA: query head h reads
  // KV head h / (H / G).     q: the q columns of qkv [T][H d] (row stride allowed); k, v from
  // GatherPrefillKv; out [T_p][H d] act; lse [T_p][H] f32 natural-log log-sum-exp of the scaled
  // scores of each row.
  virtual void PrefillAttention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                                const StepMeta& step, Tensor& out, Tensor& lse) = 0;
  // Attention of each decode token against every entry its sequence holds in `layer` (kv_lens,
  // page_table), the token's own entry included.   q: rows [T_p, T) of the q columns, out rows
  // [T_p, T) of [T][H d]. When the pool has a scores side pool, adds each entry's probability
  // (mean over the KV head's query group) to it (H2O's accumulated attention).
  virtual void DecodeAttention(const Tensor& q, int num_heads, const StepMeta& step, int layer,
                               KvPool& pool, Tensor& out) = 0;
  // The decode half of a layer's attention: exactly RopeAndCacheWrite(..., RopeTokens::kDecode,
  // norm) then DecodeAttention(q columns of qkv, ...), as one op so that a backend can fuse the two
  // (the CUDA backend does, without H2O scores). Afterwards the decode rows of qkv are
  // unspecified: scaled and rotated or not.     qkv [T][(H + 2G) d] act, out [T][H d] act (rows
  // [T_p, T)).
  virtual void RopeDecodeAttention(Tensor& qkv, const Tensor& rope_table, int num_heads,
                                   const StepMeta& step, int layer, KvPool& pool, Tensor& out,
                                   RowRms norm) {
    RopeAndCacheWrite(qkv, rope_table, num_heads, step, layer, pool, RopeTokens::kDecode, norm);
    const Tensor q = qkv.Columns(0, static_cast<int64_t>(num_heads) * pool.head_dim);
    DecodeAttention(q, num_heads, step, layer, pool, out);
  }

  // ---- KV sparsity (SPARSITY.md) ----
  // For each compression job of `layer` in kTopScores mode, with R = score_rows:
  // a[g][j] = reduce_{h in group g} sum_{i = n-R}^{n-1} exp(scale * q_h[i] . k_g[j] - lse_h[i])
  // for every key j < n (causal: terms with j > i are 0). The scored rows lie in this step's
  // chunk.    scores [..] f32, job rows at score_offset, laid out [G][n].
  virtual void WindowScores(const Tensor& q, const Tensor& k, const Tensor& lse, int num_heads,
                            const StepMeta& step, int layer, Tensor& scores) = 0;
  // For each job: pool each KV head's scores over j < n - W, keep the C - W best (ties toward the
  // lower position; kFirstPositions keeps positions 0 .. C-W-1), sorted ascending.
  // kept [..] i32, job rows at index_offset, laid out [G][C - W].
  virtual void SelectKept(const Tensor& scores, int num_kv_heads, const StepMeta& step, int layer,
                          Tensor& kept) = 0;
  // Writes each job's kept entries into the layer's pages: entry t < C - W of KV head g is key
  // kept[g][t]; entries C - W .. C - 1 are the window keys n - W .. n - 1. Sets kv_lens to C.
  // Fills the side pools (scores from `scores`, positions) when they exist.
  virtual void WriteKeptKv(const Tensor& k, const Tensor& v, const Tensor& scores,
                           const Tensor& kept, const StepMeta& step, int layer, KvPool& pool) = 0;
  // For each eviction job of `layer`, per KV head: the victim is, among entries neither recent
  // nor sinks, the lowest accumulated score (ties: the lowest position) or the lowest position;
  // the layer's last entry moves into its place (K, V and both side pools) and kv_lens drops by
  // one. Needs the positions side pool (and scores for kLowestScore).
  virtual void EvictEntries(const StepMeta& step, int layer, KvPool& pool) = 0;

  // ---- capabilities ----
  // Whether this backend's attention kernels serve this head dim, checked when a model loads so
  // that a model the kernels cannot run is a clear error there, never an abort mid-forward: an
  // error naming what is unsupported and what is. (Head counts are the config's to validate.)
  // The CPU backend serves every head dim.
  virtual Status CheckHeadDim(int head_dim) const {
    (void)head_dim;
    return Status::Ok();
  }

  // ---- batch invariance (runtime/README.md "Batch invariance") ----
  // On: every op computes each row (token, sequence, head) with the same arithmetic in the same
  // order whatever else the call holds (how many rows, which other sequences, their lengths),
  // so that a request's bits do not depend on its batch. Set once, before the first op of a
  // model's forward pass (plans made before may not hold). Unimplemented where the backend
  // cannot; the CPU backend is batch-invariant always (backend/README.md).
  virtual Status SetBatchInvariant(bool on) {
    if (!on) return Status::Ok();
    return UnimplementedError(name() + " has no batch-invariant mode");
  }

  // ---- graphs ----
  // Records the ops issued between BeginCapture and EndCapture into a graph; ReplayGraph runs it
  // again on the same buffers (whose contents may have changed). No allocation or host copy may
  // happen while capturing. Backends without graphs return -1 and the caller runs ops eagerly.
  virtual bool SupportsGraphs() const { return false; }
  virtual void BeginCapture() {}
  virtual int EndCapture() { return -1; }
  virtual void ReplayGraph(int graph) { (void)graph; }
  // Frees a graph's executable; its id is not reused and may not be replayed again.
  virtual void DestroyGraph(int graph) { (void)graph; }
  // Replays `graph` count x per_sample times back to back and returns `count` samples in
  // milliseconds: each the mean device time of `per_sample` consecutive replays, as the device's
  // own timer saw it (CUDA events: PERF.md's method), so host launch and synchronisation latency
  // are not counted. Empty where the backend has no such timer.
  virtual std::vector<double> TimeGraphReplays(int graph, int count, int per_sample) {
    (void)graph, (void)count, (void)per_sample;
    return {};
  }
  // ---- step tuning (runtime/step_tuning.h) ----
  // Choices a backend made between options that timed alike alone (the CUDA backend: a GEMM
  // shape's cuBLASLt configurations within 3% of each other), left open so that timing whole
  // captured steps can decide them. The open choices are those the ops issued since the last
  // MarkTuningScope() made, in the order they were first made; option 0 is the pick alone.
  struct TuningChoice {
    std::string name;                  // e.g. "GEMM 64 x 28672 x 4096"
    std::vector<std::string> options;  // what each option is, for logs
  };
  virtual void MarkTuningScope() {}
  virtual std::vector<TuningChoice> OpenTuningChoices() { return {}; }
  // Applies to ops issued (or captured) from now on.
  virtual void SetTuningOption(int choice, int option) { (void)choice, (void)option; }
  // Keeps open choice `choice` at its current option for good (the indices of the others shift).
  virtual void CloseTuningChoice(int choice) { (void)choice; }

  // Whether ops do work on their first call with a new shape that later calls skip (the CUDA
  // backend times cuBLASLt's candidates for each GEMM shape): then a server warms up by running
  // those shapes before requests arrive (Engine::WarmUp).
  virtual bool PlansShapes() const { return false; }

  // Sizes every scratch buffer the ops of a decode step of up to `max_batch` sequences with up to
  // `max_kv_len` entries need, so that captured graphs never see a buffer move.
  virtual void PrepareDecodeGraphs(int max_batch, int num_heads, int head_dim, int max_kv_len) {
    (void)max_batch, (void)num_heads, (void)head_dim, (void)max_kv_len;
  }

  // ---- sampling ----
  // One row's knobs for sampling on the device (no penalties: those rows sample on the host).
  struct DeviceSamplingRow {
    float temperature;  // <= 0: greedy
    int32_t top_k;      // <= 0: off
    float top_p;        // >= 1: off
    float min_p;        // <= 0: off
    uint64_t seed;
    uint64_t offset;  // the request's draw counter (its t-th token uses draw t)
  };
  // Picks each row's token from logits [R][V] f32 without moving the logits to the host, and
  // does not wait for it: writes the tokens to `tokens` [>= R] i32 on the device (where a later
  // step reads them: GatherInt32) and starts copying tokens and the chosen tokens' raw
  // log-probabilities to the host. TakeSamples waits for the oldest sampling begun and not yet
  // taken and returns its results; at most two may be outstanding. False: the backend cannot
  // sample these rows (nothing was begun; the caller samples on the host, and runtime/sampler.h
  // is the twin). The engine overlaps its host work for the next step with the device's
  // (runtime/README.md).
  virtual bool BeginSampling(const Tensor& logits, const std::vector<DeviceSamplingRow>& rows,
                             Tensor& tokens) {
    (void)logits, (void)rows, (void)tokens;
    return false;
  }
  virtual void TakeSamples(std::vector<int32_t>& tokens, std::vector<float>& logprobs) {
    (void)tokens, (void)logprobs;
    SIEVE_CHECK(false) << "no sampling was begun";
  }

  // ---- bookkeeping ----
  // dst[patches[p][0]] = patches[p][1] for p < count.    patches [>= count][2] i32, dst i32.
  virtual void ScatterInt32(const Tensor& patches, int count, Tensor& dst) = 0;
  // dst[pairs[p][0]] = src[pairs[p][1]] for p < count.   pairs [>= count][2] i32, src, dst i32.
  // (A step's token ids from the samples of the step before, still on the device.)
  virtual void GatherInt32(const Tensor& src, const Tensor& pairs, int count, Tensor& dst) = 0;

  // ---- preemption by swap: KV pages to host memory and back ----
  // `bytes` of host memory the swap copies use: pinned on CUDA (cudaHostAlloc), so that they run
  // asynchronously on the backend's stream. Allocated once (--swap-space). Null when the host
  // cannot give (or pin) that much.
  virtual HostBuffer AllocateHostBuffer(size_t bytes) = 0;
  // Copies page pages[i] of the pool (every layer's entries there: pages belong to one (sequence,
  // layer)) into slot slots[i] of `host`, KvPageSwapBytes(pool) bytes a slot laid out as
  // KvPoolPageParts says, as bytes whatever the dtype. In stream order after the steps launched
  // before (which may still write the pages) and before any later one (which may reuse them).
  // `host`'s bytes are readable on the host after Synchronize().
  virtual void SwapOutPages(const KvPool& pool, std::span<const int32_t> pages,
                            std::span<const int32_t> slots, uint8_t* host) = 0;
  // The reverse: slot slots[i] of `host` into page pages[i], in stream order before any later
  // step reads the pages. `host` must not change until the copies are done (Synchronize(), or a
  // later SwapOutPages into the same slots, which is ordered after them).
  virtual void SwapInPages(const uint8_t* host, std::span<const int32_t> slots,
                           std::span<const int32_t> pages, KvPool& pool) = 0;
};

// The CPU reference backend; `num_threads` <= 0 uses the default pool.
std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace sieve
