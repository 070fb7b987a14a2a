#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <spdlog/spdlog.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_image.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/sampling_kernels.h"
#include "backend/cuda/skinny_gemm.h"

namespace sieve {

namespace {

using cuda::bf16;

bf16* Bf16(const Tensor& tensor) { return static_cast<bf16*>(tensor.data()); }

void CheckDevice(const Tensor& tensor, const char* what) {
  SIEVE_CHECK(tensor.device() == Device::kCuda)
      << what << " is not on the GPU: " << tensor.ShapeString();
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    SIEVE_CUDA_CHECK(cudaSetDevice(device));
    SIEVE_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
    SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = std::make_unique<cuda::GemmRunner>(stream_);
    // Launch paths ask which device code is loaded (device_image.h); asked here first, never
    // while a graph is captured.
    const int image_arch = cuda::LoadedImageArch();
    if (props_.major == 9 && props_.minor == 0 && !cuda::LoadedImageIsSm90a()) {
      spdlog::warn(
          "cuda:{} ({}) runs device code built for sm_{}, not sm_90a: the Hopper prefill attention "
          "kernel is off. Build with -DCMAKE_CUDA_ARCHITECTURES=90a (the release preset's list "
          "has it; 'native' gives sm_90 without it)",
          device, props_.name, image_arch / 10);
    } else {
      spdlog::debug("cuda:{} ({}, sm_{}{}) runs device code built for sm_{}{}", device, props_.name,
                    props_.major, props_.minor, image_arch / 10,
                    cuda::LoadedImageIsSm90a() ? "a" : "");
    }
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    for (cudaGraphExec_t exec : graphs_) {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
    gemm_.reset();
    fp8_gemm_.reset();
    cudaFree(quantized_inputs_);
    cudaFree(attention_workspace_);
    cudaFree(select_workspace_);
    cudaFree(sample_buffer_);
    for (HostSamples& host : host_samples_) {
      cudaFreeHost(host.memory);
      if (host.done != nullptr) cudaEventDestroy(host.done);
    }
    cudaFreeHost(staging_);
    for (const Staged& staged : staged_) cudaEventDestroy(staged.copied);
    for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
    for (cudaEvent_t event : {sampled_, params_ready_}) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override {
    return "cuda:" + std::to_string(device_) + " " + props_.name;
  }
  DType activation_dtype() const override { return DType::kBF16; }
  // The attention kernels are instantiated for head dims 64 and 128 (prefill_attention.cu,
  // decode_attention.cu); the score, select and compact kernels take any multiple of 8 to 256.
  Status CheckHeadDim(int head_dim) const override {
    if (head_dim != 64 && head_dim != 128) {
      return UnimplementedError(
          "the CUDA backend's attention kernels support head_dim 64 and "
          "128; this model's is " +
          std::to_string(head_dim) + " (--device cpu runs any head_dim)");
    }
    return Status::Ok();
  }
  size_t FreeMemoryBytes() const override {
    size_t free_bytes = 0;
    size_t total = 0;
    SIEVE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
  }
  void* stream() const { return stream_; }

  Tensor Allocate(std::vector<int64_t> shape, DType dtype) override {
    int64_t count = 1;
    for (const int64_t extent : shape) count *= extent;
    const size_t bytes = std::max<size_t>(256, static_cast<size_t>(count) * DTypeSize(dtype));
    void* memory = nullptr;
    const cudaError_t error = cudaMalloc(&memory, bytes);
    SIEVE_CHECK(error == cudaSuccess)
        << "cudaMalloc of " << bytes << " bytes: " << cudaGetErrorString(error);
    SIEVE_CUDA_CHECK(cudaMemsetAsync(memory, 0, bytes, stream_));
    std::shared_ptr<void> owner(memory, [](void* p) { cudaFree(p); });
    return Tensor::Wrap(memory, std::move(shape), dtype, Device::kCuda, std::move(owner));
  }

  void CopyFromHost(const void* src, size_t bytes, Tensor& dst) override {
    CheckDevice(dst, "copy destination");
    SIEVE_CHECK(bytes <= dst.nbytes()) << bytes << " bytes into " << dst.ShapeString();
    // The caller may reuse its buffer at once: the source is staged (StageAndCopy) before this
    // returns.
    StageAndCopy(dst.data(), src, bytes, stream_);
  }

  void CopyToHost(const Tensor& src, void* dst) override {
    CheckDevice(src, "copy source");
    SIEVE_CUDA_CHECK(
        cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void Synchronize() override {
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (copy_stream_ != nullptr) SIEVE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  }

  Tensor UploadWeight(const void* src, DType src_dtype, std::vector<int64_t> shape) override {
    Tensor tensor = Allocate(std::move(shape), DType::kBF16);
    const size_t count = static_cast<size_t>(tensor.numel());
    if (src_dtype == DType::kBF16) {
      SIEVE_CUDA_CHECK(
          cudaMemcpyAsync(tensor.data(), src, count * 2, cudaMemcpyHostToDevice, stream_));
    } else {
      std::vector<float> floats(count);
      ConvertToFloat(src, src_dtype, count, floats.data());
      std::vector<uint16_t> halves(count);
      ConvertFromFloat(floats.data(), count, DType::kBF16, halves.data());
      SIEVE_CUDA_CHECK(cudaMemcpyAsync(tensor.data(), halves.data(), count * 2,
                                       cudaMemcpyHostToDevice, stream_));
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `halves` dies here
    }
    return tensor;
  }

  void FillRandom(Tensor& tensor, uint64_t seed, float stddev) override {
    SIEVE_CHECK(tensor.dtype() == DType::kBF16 && tensor.is_contiguous());
    cuda::FillRandomBf16(Bf16(tensor), tensor.numel(), seed, stddev, stream_);
  }
  void Copy(const Tensor& src, Tensor& dst) override {
    CheckDevice(src, "copy source");
    CheckDevice(dst, "copy destination");
    SIEVE_CHECK(src.rank() == 2 && dst.rank() == 2 && src.dim(0) == dst.dim(0) &&
                src.dim(1) == dst.dim(1) && src.dtype() == dst.dtype() && src.stride(1) == 1 &&
                dst.stride(1) == 1)
        << "copy of " << src.ShapeString() << " into " << dst.ShapeString();
    const size_t element = src.element_size();
    SIEVE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data(), dst.stride(0) * element, src.data(),
                                       src.stride(0) * element, src.dim(1) * element, src.dim(0),
                                       cudaMemcpyDeviceToDevice, stream_));
  }
  void MakeCurrent() override { SIEVE_CUDA_CHECK(cudaSetDevice(device_)); }
  int device_index() const { return device_; }

  void Embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    cuda::Embedding(Bf16(table), table.stride(0), ids.data_as<int32_t>(),
                    static_cast<int>(ids.numel()), static_cast<int>(table.dim(1)), Bf16(out),
                    out.stride(0), stream_);
  }
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    if (out.dtype() == DType::kF8E4M3) {
      cuda::RmsNormE4m3(Bf16(x), x.stride(0), Bf16(weight), eps, static_cast<int>(x.dim(0)),
                        static_cast<int>(x.dim(1)), QuantizedRows(out, "rms_norm output"), stream_);
      return;
    }
    cuda::RmsNorm(Bf16(x), x.stride(0), Bf16(weight), eps, static_cast<int>(x.dim(0)),
                  static_cast<int>(x.dim(1)), Bf16(out), out.stride(0), stream_);
  }
  void Linear(const Tensor& x, const Tensor& w, Tensor& out) override {
    RunLinear(x, w, out, /*accumulate=*/false);
  }
  void LinearAdd(const Tensor& x, const Tensor& w, Tensor& out) override {
    SIEVE_CHECK(out.dtype() == DType::kBF16) << "LinearAdd accumulates into activations";
    RunLinear(x, w, out, /*accumulate=*/true);
  }
  void ScaleColumns(Tensor& w, const Tensor& scale) override {
    CheckDevice(w, "scaled weight");
    SIEVE_CHECK(w.rank() == 2 && scale.numel() == w.dim(1) && w.stride(1) == 1)
        << "ScaleColumns " << w.ShapeString() << " by " << scale.ShapeString();
    cuda::ScaleColumns(Bf16(w), w.stride(0), static_cast<int>(w.dim(0)), static_cast<int>(w.dim(1)),
                       Bf16(scale), stream_);
  }
  void SiluMul(const Tensor& gate_up, Tensor& out, RowRms norm) override {
    if (out.dtype() == DType::kF8E4M3) {
      cuda::SiluMulE4m3(Bf16(gate_up), gate_up.stride(0), static_cast<int>(out.dim(0)),
                        static_cast<int>(out.dim(1)), QuantizedRows(out, "silu_mul output"),
                        View(norm), stream_);
      return;
    }
    cuda::SiluMul(Bf16(gate_up), gate_up.stride(0), static_cast<int>(out.dim(0)),
                  static_cast<int>(out.dim(1)), Bf16(out), out.stride(0), View(norm), stream_);
  }
  void LinearSiluMul(const Tensor& x, const Tensor& w, Tensor& gate_up, Tensor& out,
                     RowRms norm) override {
    const int64_t rows = x.dim(0);
    const int64_t f = out.dim(1);
    const int64_t k = x.dim(1);
    // At one row (where the runner's plan is the skinny kernel anyway) its gated form; from 8 rows
    // on cuBLASLt + SiluMul is faster (README_gemm.md, "The gated form"). The gated form writes
    // bf16 only: a quantized `out` (before an FP8 down GEMM) takes SiluMul's quantizing form.
    // Not under batch invariance: a row's gate_up would be the skinny kernel's sums alone and
    // cuBLASLt's in a batch.
    if (!batch_invariant_ && rows == 1 && w.dtype() == DType::kBF16 &&
        out.dtype() == DType::kBF16 && w.dim(0) == 2 * f && w.dim(1) == k && w.stride(0) == k &&
        cuda::SkinnyGemmSupports(rows, k, Bf16(w), k, Bf16(x), x.stride(0))) {
      cuda::SkinnyGemmSwiGlu(rows, f, k, Bf16(w), Bf16(x), x.stride(0), View(norm), Bf16(out),
                             out.stride(0), stream_);
      return;
    }
    Backend::LinearSiluMul(x, w, gate_up, out, norm);
  }
  Tensor QuantizeWeightE4m3(const Tensor& w) override {
    CheckDevice(w, "quantized weight");
    SIEVE_CHECK(w.dtype() == DType::kBF16 && w.rank() == 2 && w.is_contiguous())
        << "QuantizeWeightE4m3 takes a contiguous bf16 matrix, got " << w.ShapeString();
    SIEVE_CHECK(cuda::Fp8GemmRunner::DeviceSupportsFp8())
        << "FP8 weights need an sm_89 or newer GPU (" << props_.name << " is sm_" << props_.major
        << props_.minor << ")";
    Tensor codes = Allocate({w.dim(0), w.dim(1)}, DType::kF8E4M3);
    Tensor scales = Allocate({w.dim(0)}, DType::kF32);
    cuda::QuantizeRowsE4m3(Bf16(w), w.stride(0), w.dim(0), w.dim(1), codes.data_as<uint8_t>(),
                           w.dim(1), scales.data_as<float>(), stream_);
    return codes.WithRowScales(scales);
  }
  Tensor UploadWeightE4m3(const uint8_t* codes, const float* row_scales, int64_t rows,
                          int64_t cols) override {
    // The loader consulted CheckE4m3Weight before reading any weight.
    SIEVE_CHECK(cuda::Fp8GemmRunner::DeviceSupportsFp8())
        << "FP8 weights need an sm_89 or newer GPU (" << props_.name << " is sm_" << props_.major
        << props_.minor << ")";
    SIEVE_CHECK(rows > 0 && cols > 0) << "an e4m3 weight of " << rows << " x " << cols;
    Tensor data = Allocate({rows, cols}, DType::kF8E4M3);
    Tensor scales = Allocate({rows}, DType::kF32);
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(data.data(), codes, static_cast<size_t>(rows * cols),
                                     cudaMemcpyHostToDevice, stream_));
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(scales.data(), row_scales,
                                     static_cast<size_t>(rows) * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_));
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller frees its host buffers next
    return data.WithRowScales(scales);
  }
  Status CheckE4m3Weight(int64_t rows, int64_t cols) const override {
    if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) {
      return UnimplementedError(std::string("FP8 weights need a GPU with FP8 tensor cores (sm_89 "
                                            "or newer: RTX 4090, L40S, H100, H200); ") +
                                props_.name + " is sm_" + std::to_string(props_.major) +
                                std::to_string(props_.minor));
    }
    if (cols % 16 != 0 || rows < 1) {
      return InvalidArgumentError("FP8 GEMMs need the input width to be a multiple of 16; a " +
                                  std::to_string(rows) + " x " + std::to_string(cols) +
                                  " weight is not");
    }
    return Status::Ok();
  }
  void ReserveQuantizedInputs(int64_t rows, int64_t k, int64_t n) override {
    EnsureWorkspace(quantized_inputs_, quantized_inputs_bytes_, QuantizedInputBytes(rows, k));
    Fp8Gemm().Reserve(rows, n);
  }
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    cuda::GatherRows(Bf16(x), x.stride(0), rows.data_as<int32_t>(), static_cast<int>(rows.numel()),
                     static_cast<int>(x.dim(1)), Bf16(out), out.stride(0), stream_);
  }

  void RopeAndCacheWrite(Tensor& qkv, const Tensor& rope_table, int num_heads, const StepMeta& step,
                         int layer, KvPool& pool, RopeTokens tokens, RowRms norm) override {
    const int first_token = tokens == RopeTokens::kDecode ? step.num_prefill_tokens : 0;
    const int end_token =
        tokens == RopeTokens::kPrefill ? step.num_prefill_tokens : step.num_tokens;
    cuda::RopeAndCacheWrite(Bf16(qkv), qkv.stride(0), rope_table.data_as<float>(), num_heads,
                            View(step), layer, View(pool), first_token, end_token, View(norm),
                            stream_);
  }
  void GatherPrefillKv(const Tensor& qkv, int num_heads, const StepMeta& step, int layer,
                       const KvPool& pool, Tensor& k_out, Tensor& v_out) override {
    cuda::GatherPrefillKv(Bf16(qkv), qkv.stride(0), num_heads, View(step), layer, View(pool),
                          Bf16(k_out), Bf16(v_out), stream_);
  }
  void PrefillAttention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                        const StepMeta& step, Tensor& out, Tensor& lse) override {
    cuda::PrefillAttention(Bf16(q), q.stride(0), Bf16(k), Bf16(v), num_heads,
                           static_cast<int>(k.dim(1)), static_cast<int>(k.dim(2)), View(step),
                           step.prefill_chunks, Bf16(out), out.stride(0), lse.data_as<float>(),
                           lse.stride(0), stream_);
  }
  void DecodeAttention(const Tensor& q, int num_heads, const StepMeta& step, int layer,
                       KvPool& pool, Tensor& out) override {
    const size_t bytes =
        cuda::DecodeAttentionWorkspaceBytes(step.num_seqs - step.num_prefill_seqs, num_heads,
                                            pool.head_dim, step.max_kv_len, batch_invariant_);
    EnsureWorkspace(attention_workspace_, attention_workspace_bytes_, bytes);
    cuda::DecodeAttention(Bf16(q), q.stride(0), num_heads, LayerView(step, layer), layer,
                          View(pool), Bf16(out), out.stride(0), attention_workspace_,
                          attention_workspace_bytes_, stream_, batch_invariant_);
  }
  // One kernel (RoPE of the decode tokens inside decode attention) unless H2O needs rotated q in
  // memory for its score pass. Two kernels made the dense decode step 13.62 ms against 13.37
  // (bench/results/2026-12-01-s6-h200-step.json, "RoPE not fused").
  void RopeDecodeAttention(Tensor& qkv, const Tensor& rope_table, int num_heads,
                           const StepMeta& step, int layer, KvPool& pool, Tensor& out,
                           RowRms norm) override {
    if (pool.scores.defined()) {
      Backend::RopeDecodeAttention(qkv, rope_table, num_heads, step, layer, pool, out, norm);
      return;
    }
    const size_t bytes =
        cuda::DecodeAttentionWorkspaceBytes(step.num_seqs - step.num_prefill_seqs, num_heads,
                                            pool.head_dim, step.max_kv_len, batch_invariant_);
    EnsureWorkspace(attention_workspace_, attention_workspace_bytes_, bytes);
    cuda::RopeDecodeAttention(Bf16(qkv), qkv.stride(0), rope_table.data_as<float>(), num_heads,
                              LayerView(step, layer), layer, View(pool), Bf16(out), out.stride(0),
                              attention_workspace_, attention_workspace_bytes_, View(norm), stream_,
                              batch_invariant_);
  }

  void WindowScores(const Tensor& q, const Tensor& k, const Tensor& lse, int num_heads,
                    const StepMeta& step, int layer, Tensor& scores) override {
    cuda::WindowScores(Bf16(q), q.stride(0), Bf16(k), lse.data_as<float>(), lse.stride(0),
                       num_heads, static_cast<int>(k.dim(1)), static_cast<int>(k.dim(2)),
                       View(step), step.jobs_host.data(), step.job_begin[layer],
                       step.job_begin[layer + 1], scores.data_as<float>(), stream_);
  }
  void SelectKept(const Tensor& scores, int num_kv_heads, const StepMeta& step, int layer,
                  Tensor& kept) override {
    const size_t bytes = cuda::SelectKeptWorkspaceBytes(
        step.jobs_host.data(), step.job_begin[layer], step.job_begin[layer + 1], num_kv_heads);
    EnsureWorkspace(select_workspace_, select_workspace_bytes_, bytes);
    cuda::SelectKept(scores.data_as<float>(), num_kv_heads, View(step), step.jobs_host.data(),
                     step.job_begin[layer], step.job_begin[layer + 1], kept.data_as<int32_t>(),
                     select_workspace_, select_workspace_bytes_, stream_);
  }
  void WriteKeptKv(const Tensor& k, const Tensor& v, const Tensor& scores, const Tensor& kept,
                   const StepMeta& step, int layer, KvPool& pool) override {
    cuda::WriteKeptKv(Bf16(k), Bf16(v), scores.data_as<float>(), kept.data_as<int32_t>(),
                      View(step), step.jobs_host.data(), step.job_begin[layer],
                      step.job_begin[layer + 1], layer, View(pool), stream_);
  }
  void EvictEntries(const StepMeta& step, int layer, KvPool& pool) override {
    cuda::EvictEntries(View(step), step.evictions_host.data(), step.eviction_begin[layer],
                       step.eviction_begin[layer + 1], layer, View(pool), stream_);
  }
  HostBuffer AllocateHostBuffer(size_t bytes) override {
    void* memory = nullptr;
    const cudaError_t error =
        cudaHostAlloc(&memory, std::max<size_t>(bytes, 1), cudaHostAllocDefault);
    if (error != cudaSuccess) {
      cudaGetLastError();  // cleared: the caller reports the failure
      spdlog::error("cudaHostAlloc of {} bytes: {}", bytes, cudaGetErrorString(error));
      memory = nullptr;
    }
    return HostBuffer(static_cast<uint8_t*>(memory), [](uint8_t* p) {
      if (p != nullptr) cudaFreeHost(p);
    });
  }

  // Runs of consecutive pages going to consecutive slots are one 2D copy per part (the slot's
  // pitch on the host, the part's on the device); everything on stream_, so the steps before
  // have written the pages and the steps after see them.
  void SwapOutPages(const KvPool& pool, std::span<const int32_t> pages,
                    std::span<const int32_t> slots, uint8_t* host) override {
    SwapPages(pool, pages, slots, host, /*to_host=*/true);
  }
  void SwapInPages(const uint8_t* host, std::span<const int32_t> slots,
                   std::span<const int32_t> pages, KvPool& pool) override {
    SwapPages(pool, pages, slots, const_cast<uint8_t*>(host), /*to_host=*/false);
  }

  void ScatterInt32(const Tensor& patches, int count, Tensor& dst) override {
    cuda::ScatterInt32(patches.data_as<int32_t>(), count, dst.data_as<int32_t>(), stream_);
  }

  bool SupportsGraphs() const override { return true; }
  bool PlansShapes() const override { return true; }
  void BeginCapture() override {
    SIEVE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  int EndCapture() override {
    cudaGraph_t graph = nullptr;
    SIEVE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    SIEVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    SIEVE_CUDA_CHECK(cudaGraphDestroy(graph));
    graphs_.push_back(exec);
    return static_cast<int>(graphs_.size()) - 1;
  }
  void PrepareDecodeGraphs(int max_batch, int num_heads, int head_dim, int max_kv_len) override {
    EnsureWorkspace(attention_workspace_, attention_workspace_bytes_,
                    cuda::DecodeAttentionWorkspaceBytes(max_batch, num_heads, head_dim, max_kv_len,
                                                        batch_invariant_));
  }

  // README_gemm.md and README_attention.md, "Batch invariance": the GEMMs take one configuration
  // per weight shape for every m, decode attention splits of a fixed size by one CTA shape, and
  // the one-row fused SwiGLU is off. The other kernels compute each row (or each sequence's job)
  // the same way at any batch already.
  Status SetBatchInvariant(bool on) override {
    batch_invariant_ = on;
    gemm_->SetBatchInvariant(on);
    if (fp8_gemm_ != nullptr) fp8_gemm_->SetBatchInvariant(on);
    return Status::Ok();
  }

  bool BeginSampling(const Tensor& logits, const std::vector<DeviceSamplingRow>& rows,
                     Tensor& tokens) override {
    static_assert(sizeof(DeviceSamplingRow) == sizeof(cuda::SamplingRowParams));
    SIEVE_CHECK(begun_.size() < 2) << "at most two samplings may be outstanding";
    const int count = static_cast<int>(rows.size());
    if (sampling_supported_ < 0) sampling_supported_ = cuda::SampleTokensSupported() ? 1 : 0;
    if (sampling_supported_ == 0) return false;  // before sm_90: the engine samples on the host
    if (logits.dim(1) > cuda::kSampleTokensMaxVocab) return false;  // so does a huge vocabulary
    CheckDevice(tokens, "sampled tokens");
    SIEVE_CHECK(tokens.dtype() == DType::kI32 && tokens.numel() >= count);
    // The device side (params in, log-probabilities out) is shared by every sampling, ordered by
    // the events below; the host side is not, so each of the two outstanding has its own pinned
    // buffer and event. Both are sized for kSamplingRows rows at once: growing them synchronises
    // (the device buffer's free waits for the streams, cudaFreeHost for the device), which would
    // hold the samples of the step before until this step has run.
    constexpr int kSamplingRows = 1024;
    const int capacity_rows = std::max(count, kSamplingRows);
    const size_t param_bytes = rows.size() * sizeof(DeviceSamplingRow);
    if (copy_stream_ == nullptr) {
      SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
      SIEVE_CUDA_CHECK(cudaEventCreateWithFlags(&sampled_, cudaEventDisableTiming));
      SIEVE_CUDA_CHECK(cudaEventCreateWithFlags(&params_ready_, cudaEventDisableTiming));
    }
    const size_t sample_bytes = capacity_rows * (sizeof(DeviceSamplingRow) + 4);
    if (sample_bytes > sample_buffer_bytes_) {
      // The copy stream may still read the log-probabilities of the sampling before.
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
      EnsureWorkspace(sample_buffer_, sample_buffer_bytes_, sample_bytes);
    }
    auto* params = static_cast<cuda::SamplingRowParams*>(sample_buffer_);
    float* out_logprobs =
        reinterpret_cast<float*>(static_cast<char*>(sample_buffer_) + param_bytes);
    HostSamples& host = host_samples_[next_host_samples_];
    next_host_samples_ ^= 1;
    if (host.capacity < count) {
      cudaFreeHost(host.memory);
      host.capacity = std::max(capacity_rows, 2 * host.capacity);
      SIEVE_CUDA_CHECK(cudaMallocHost(&host.memory, static_cast<size_t>(host.capacity) * 8));
    }
    if (host.done == nullptr) {
      SIEVE_CUDA_CHECK(cudaEventCreateWithFlags(&host.done, cudaEventDisableTiming));
    }
    host.count = count;
    if (count == 0) {
      SIEVE_CUDA_CHECK(cudaEventRecord(host.done, stream_));
      begun_.push_back(&host);
      return true;
    }
    // The params go up and the samples come back on copy_stream_, beside the compute stream:
    // in its order they sat between the step's graph and the next step's, on the critical path
    // of every decode step. The params go up while the step runs, once the sampling before has
    // read its own (sampled_ still marks that one); the sampling waits for them, and for the
    // read-back before it (which reads the same tokens and log-probabilities).
    SIEVE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, sampled_, 0));
    StageAndCopy(params, rows.data(), param_bytes, copy_stream_);
    SIEVE_CUDA_CHECK(cudaEventRecord(params_ready_, copy_stream_));
    SIEVE_CUDA_CHECK(cudaStreamWaitEvent(stream_, params_ready_, 0));
    cuda::SampleTokens(logits.data_as<float>(), count, static_cast<int>(logits.dim(1)), params,
                       tokens.data_as<int32_t>(), out_logprobs, nullptr, 0, stream_);
    SIEVE_CUDA_CHECK(cudaEventRecord(sampled_, stream_));
    SIEVE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, sampled_, 0));
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(host.memory, tokens.data(), count * 4, cudaMemcpyDeviceToHost,
                                     copy_stream_));
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(static_cast<int32_t*>(host.memory) + count, out_logprobs,
                                     count * 4, cudaMemcpyDeviceToHost, copy_stream_));
    SIEVE_CUDA_CHECK(cudaEventRecord(host.done, copy_stream_));
    begun_.push_back(&host);
    return true;
  }

  void TakeSamples(std::vector<int32_t>& tokens, std::vector<float>& logprobs) override {
    SIEVE_CHECK(!begun_.empty()) << "no sampling was begun";
    HostSamples& host = *begun_.front();
    begun_.erase(begun_.begin());
    SIEVE_CUDA_CHECK(cudaEventSynchronize(host.done));
    const auto* values = static_cast<const int32_t*>(host.memory);
    tokens.assign(values, values + host.count);
    logprobs.resize(host.count);
    if (host.count > 0) std::memcpy(logprobs.data(), values + host.count, host.count * 4);
  }

  void GatherInt32(const Tensor& src, const Tensor& pairs, int count, Tensor& dst) override {
    CheckDevice(src, "gather source");
    CheckDevice(pairs, "gather pairs");
    CheckDevice(dst, "gather destination");
    if (count == 0) return;
    cuda::GatherInt32(src.data_as<int32_t>(), pairs.data_as<int32_t>(), count,
                      dst.data_as<int32_t>(), stream_);
  }

  std::vector<double> TimeGraphReplays(int graph, int count, int per_sample) override {
    // Every replay is queued before the first is waited on, so the device runs them back to back
    // and each pair of events brackets `per_sample` replays' kernels only.
    std::vector<cudaEvent_t> events(2 * static_cast<size_t>(count));
    for (cudaEvent_t& event : events) SIEVE_CUDA_CHECK(cudaEventCreate(&event));
    for (int i = 0; i < count; ++i) {
      SIEVE_CUDA_CHECK(cudaEventRecord(events[2 * i], stream_));
      for (int replay = 0; replay < per_sample; ++replay) ReplayGraph(graph);
      SIEVE_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream_));
    }
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> ms(count);
    for (int i = 0; i < count; ++i) {
      float elapsed = 0;
      SIEVE_CUDA_CHECK(cudaEventElapsedTime(&elapsed, events[2 * i], events[2 * i + 1]));
      ms[i] = elapsed / per_sample;
    }
    for (cudaEvent_t event : events) SIEVE_CUDA_CHECK(cudaEventDestroy(event));
    return ms;
  }

  void ReplayGraph(int graph) override {
    SIEVE_CHECK(graph >= 0 && graph < static_cast<int>(graphs_.size()) && graphs_[graph] != nullptr)
        << "graph " << graph << " was never captured or is destroyed";
    SIEVE_CUDA_CHECK(cudaGraphLaunch(graphs_[graph], stream_));
  }
  void DestroyGraph(int graph) override {
    SIEVE_CHECK(graph >= 0 && graph < static_cast<int>(graphs_.size()));
    if (graphs_[graph] == nullptr) return;
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no replay of it may still be queued
    SIEVE_CUDA_CHECK(cudaGraphExecDestroy(graphs_[graph]));
    graphs_[graph] = nullptr;
  }

  void MarkTuningScope() override { gemm_->MarkTuningScope(); }
  std::vector<TuningChoice> OpenTuningChoices() override {
    std::vector<TuningChoice> choices;
    for (cuda::GemmRunner::OpenPlan& plan : gemm_->OpenPlans()) {
      choices.push_back({"GEMM " + plan.shape, std::move(plan.options)});
    }
    return choices;
  }
  void SetTuningOption(int choice, int option) override {
    gemm_->SetOpenPlanOption(choice, option);
  }
  void CloseTuningChoice(int choice) override { gemm_->CloseOpenPlan(choice); }

 private:
  void SwapPages(const KvPool& pool, std::span<const int32_t> pages, std::span<const int32_t> slots,
                 uint8_t* host, bool to_host) {
    SIEVE_CHECK(pages.size() == slots.size());
    const size_t slot_bytes = KvPageSwapBytes(pool);
    size_t begin = 0;
    while (begin < pages.size()) {
      size_t end = begin + 1;
      while (end < pages.size() && pages[end] == pages[end - 1] + 1 &&
             slots[end] == slots[end - 1] + 1) {
        ++end;
      }
      SIEVE_CHECK(pages[begin] >= 0 && pages[end - 1] < pool.num_pages);
      const size_t rows = end - begin;
      size_t offset = 0;  // of the part in a slot
      for (const Tensor* part : KvPoolPageParts(pool)) {
        const size_t bytes = KvPoolPartBytes(pool, *part);
        if (bytes == 0) continue;
        CheckDevice(*part, "swapped pool");
        uint8_t* device = part->data_as<uint8_t>() + static_cast<size_t>(pages[begin]) * bytes;
        uint8_t* slot = host + static_cast<size_t>(slots[begin]) * slot_bytes + offset;
        if (to_host) {
          SIEVE_CUDA_CHECK(cudaMemcpy2DAsync(slot, slot_bytes, device, bytes, bytes, rows,
                                             cudaMemcpyDeviceToHost, stream_));
        } else {
          SIEVE_CUDA_CHECK(cudaMemcpy2DAsync(device, bytes, slot, slot_bytes, bytes, rows,
                                             cudaMemcpyHostToDevice, stream_));
        }
        offset += bytes;
      }
      begin = end;
    }
  }

  // Linear and LinearAdd: out (+)= x w^T through the GEMM runner.
  void RunLinear(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate);
  // RunLinear with an e4m3 weight: x quantized by rows into quantized_inputs_ (unless it is a
  // quantized activation already), then the FP8 runner (fp8_gemm.h).
  void RunLinearE4m3(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate);
  // The FP8 GEMM runner, made on first use (models without FP8 weights never need it).
  cuda::Fp8GemmRunner& Fp8Gemm() {
    if (fp8_gemm_ == nullptr) {
      fp8_gemm_ = std::make_unique<cuda::Fp8GemmRunner>(stream_);
      fp8_gemm_->SetBatchInvariant(batch_invariant_);
    }
    return *fp8_gemm_;
  }
  // A quantized activation's codes and scales for the kernels that write one (backend.h).
  cuda::E4m3Rows QuantizedRows(Tensor& out, const char* what) const {
    CheckDevice(out, what);
    SIEVE_CHECK(out.rank() == 2 && out.stride(1) == 1 && out.has_row_scales())
        << what << ": a quantized activation is e4m3 rows with row scales, got "
        << out.ShapeString();
    return {out.data_as<uint8_t>(), out.stride(0), out.row_scales().data_as<float>()};
  }
  static int64_t QuantizedInputStride(int64_t k) { return (k + 15) / 16 * 16; }
  static size_t QuantizedInputBytes(int64_t rows, int64_t k) {
    return static_cast<size_t>(rows * QuantizedInputStride(k) + 16 + rows * 4);
  }
  // Host-to-device copies of up to a quarter of the ring are staged in pinned memory: from
  // pageable memory the driver may wait for the stream's earlier work before it copies (CUDA's
  // "API synchronization behavior"), which would hold the engine's upload of a step until the
  // step before it has run (Engine's overlapped steps). A region of the ring is reused once
  // the copy out of it has happened.
  void StageAndCopy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    constexpr size_t kRingBytes = size_t{4} << 20;
    if (bytes == 0) return;
    if (bytes > kRingBytes / 4) {
      SIEVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
      return;
    }
    if (staging_ == nullptr) SIEVE_CUDA_CHECK(cudaMallocHost(&staging_, kRingBytes));
    // Copies done by now free their regions (oldest first: a later copy found done on the other
    // stream frees its region once the ones before it are done).
    while (!staged_.empty() && cudaEventQuery(staged_.front().copied) == cudaSuccess) {
      spare_events_.push_back(staged_.front().copied);
      staged_.erase(staged_.begin());
    }
    size_t offset = (staging_head_ + 255) / 256 * 256;
    if (offset + bytes > kRingBytes) offset = 0;
    for (const Staged& staged : staged_) {  // still being copied out of: wait for it
      if (staged.offset < offset + bytes && offset < staged.offset + staged.bytes) {
        SIEVE_CUDA_CHECK(cudaEventSynchronize(staged.copied));
      }
    }
    std::memcpy(static_cast<char*>(staging_) + offset, src, bytes);
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<char*>(staging_) + offset, bytes,
                                     cudaMemcpyHostToDevice, stream));
    cudaEvent_t copied = nullptr;
    if (spare_events_.empty()) {
      SIEVE_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    } else {
      copied = spare_events_.back();
      spare_events_.pop_back();
    }
    SIEVE_CUDA_CHECK(cudaEventRecord(copied, stream));
    staged_.push_back({offset, bytes, copied});
    staging_head_ = offset + bytes;
  }

  void EnsureWorkspace(void*& buffer, size_t& capacity, size_t bytes) {
    if (bytes <= capacity) return;
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaFree(buffer);
    capacity = std::max(bytes, capacity * 2);
    SIEVE_CUDA_CHECK(cudaMalloc(&buffer, capacity));
  }

  // A folded RMSNorm's rows: bf16, 16-byte aligned, width and stride multiples of 8 (the
  // kernels read them 16 bytes at a time).
  static cuda::RowRmsView View(const RowRms& norm) {
    cuda::RowRmsView view;
    if (norm.rows == nullptr) return view;
    const Tensor& rows = *norm.rows;
    CheckDevice(rows, "RMSNorm rows");
    SIEVE_CHECK(rows.dtype() == DType::kBF16 && rows.rank() == 2 && rows.stride(1) == 1 &&
                rows.dim(1) % 8 == 0 && rows.stride(0) % 8 == 0 && cuda::Aligned16(rows.data()))
        << "folded RMSNorm rows must be aligned bf16 rows, width a multiple of 8: "
        << rows.ShapeString();
    view.rows = Bf16(rows);
    view.stride = rows.stride(0);
    view.width = static_cast<int>(rows.dim(1));
    view.eps = norm.eps;
    return view;
  }
  static cuda::StepView View(const StepMeta& step) {
    cuda::StepView view{};
    view.token_ids = step.token_ids.data_as<int32_t>();
    view.positions = step.positions.data_as<int32_t>();
    view.query_start = step.query_start.data_as<int32_t>();
    view.key_start = step.key_start.data_as<int32_t>();
    view.context_lens = step.context_lens.data_as<int32_t>();
    view.seq_slots = step.seq_slots.data_as<int32_t>();
    view.write_start = step.write_start.data_as<int32_t>();
    view.compression_jobs = step.compression_jobs.data_as<int32_t>();
    view.eviction_jobs = step.eviction_jobs.data_as<int32_t>();
    view.num_tokens = step.num_tokens;
    view.num_prefill_tokens = step.num_prefill_tokens;
    view.num_seqs = step.num_seqs;
    view.num_prefill_seqs = step.num_prefill_seqs;
    view.max_query_len = step.max_query_len;
    view.max_kv_len = step.max_kv_len;
    view.num_prefill_keys = static_cast<int>(step.num_prefill_keys);
    return view;
  }
  // The step as one layer's decode attention sees it: max_kv_len is that layer's bound (the
  // workspace is still sized by the step's, which bounds every layer's).
  static cuda::StepView LayerView(const StepMeta& step, int layer) {
    cuda::StepView view = View(step);
    view.max_kv_len = step.MaxKvLen(layer);
    return view;
  }
  static cuda::PoolView View(const KvPool& pool) {
    cuda::PoolView view{};
    view.fp8 = pool.fp8();
    view.k = pool.k.data();
    view.v = pool.v.data();
    view.k_scales = view.fp8 ? pool.k_scales.data_as<float>() : nullptr;
    view.v_scales = view.fp8 ? pool.v_scales.data_as<float>() : nullptr;
    view.page_table = pool.page_table.data_as<int32_t>();
    view.kv_lens = pool.kv_lens.data_as<int32_t>();
    view.scores = pool.scores.defined() ? pool.scores.data_as<float>() : nullptr;
    view.positions = pool.positions.defined() ? pool.positions.data_as<int32_t>() : nullptr;
    view.page_size = pool.page_size;
    view.max_seqs = pool.max_seqs;
    view.max_pages_per_seq = pool.max_pages_per_seq;
    view.num_kv_heads = pool.num_kv_heads;
    view.head_dim = pool.head_dim;
    return view;
  }

  int device_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  bool batch_invariant_ = false;  // SetBatchInvariant
  std::unique_ptr<cuda::GemmRunner> gemm_;
  std::unique_ptr<cuda::Fp8GemmRunner> fp8_gemm_;  // made with the first FP8 weight
  // FP8 GEMMs' quantized inputs: [rows][k rounded up to 16] e4m3, then [rows] f32 scales.
  void* quantized_inputs_ = nullptr;
  size_t quantized_inputs_bytes_ = 0;
  void* attention_workspace_ = nullptr;
  size_t attention_workspace_bytes_ = 0;
  void* select_workspace_ = nullptr;
  size_t select_workspace_bytes_ = 0;
  std::vector<cudaGraphExec_t> graphs_;
  void* sample_buffer_ = nullptr;  // one sampling's params, then its log-probabilities
  int sampling_supported_ = -1;    // SampleTokensSupported(), asked once
  size_t sample_buffer_bytes_ = 0;
  // BeginSampling's results on their way to the host: tokens [count], then log-probabilities.
  struct HostSamples {
    void* memory = nullptr;  // pinned
    int capacity = 0;        // rows
    int count = 0;
    cudaEvent_t done = nullptr;  // the copies have landed
  };
  HostSamples host_samples_[2];
  int next_host_samples_ = 0;
  std::vector<HostSamples*> begun_;  // oldest first
  // BeginSampling's side stream for its params and read-backs, and its events: the last
  // sampling kernel has run (its params read, its results written); this sampling's params are
  // up (and the read-back before them done).
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t sampled_ = nullptr;
  cudaEvent_t params_ready_ = nullptr;
  // StageAndCopy's pinned ring and the copies out of it not known to be done, oldest first.
  struct Staged {
    size_t offset;
    size_t bytes;
    cudaEvent_t copied;
  };
  void* staging_ = nullptr;
  size_t staging_head_ = 0;
  std::vector<Staged> staged_;
  std::vector<cudaEvent_t> spare_events_;
};

void CudaBackend::RunLinear(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate) {
  // Row-major out[M][N] = x[M][K] w[N][K]^T is column-major out'(N x M) = w'(K x N)^T x'(K x M).
  const int64_t rows = x.dim(0);
  const int64_t inner = x.dim(1);
  const int64_t cols = w.dim(0);
  SIEVE_CHECK(w.dim(1) == inner && out.dim(0) == rows && out.dim(1) == cols)
      << "linear shapes " << x.ShapeString() << " x " << w.ShapeString() << " -> "
      << out.ShapeString();
  CheckDevice(x, "linear input");
  CheckDevice(w, "linear weight");
  if (w.dtype() == DType::kF8E4M3) {
    RunLinearE4m3(x, w, out, accumulate);
    return;
  }
  SIEVE_CHECK(x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16 && x.stride(1) == 1 &&
              w.stride(1) == 1 && out.stride(1) == 1)
      << "linear takes bf16 rows with unit column stride";
  gemm_->Run(rows, cols, inner, Bf16(w), w.stride(0), Bf16(x), x.stride(0), out.data(),
             out.stride(0), out.dtype() == DType::kF32, accumulate);
}

void CudaBackend::RunLinearE4m3(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate) {
  const int64_t rows = x.dim(0);
  const int64_t inner = x.dim(1);
  const int64_t cols = w.dim(0);
  SIEVE_CHECK((x.dtype() == DType::kBF16 || x.dtype() == DType::kF8E4M3) && x.stride(1) == 1 &&
              w.stride(1) == 1 && out.stride(1) == 1 && w.has_row_scales())
      << "an FP8 linear takes bf16 or quantized input rows and an e4m3 weight with row scales, "
         "got "
      << x.ShapeString() << " x " << w.ShapeString();
  if (rows == 0) return;
  if (x.dtype() == DType::kF8E4M3) {
    // A quantized activation: its producer did the quantizing pass.
    SIEVE_CHECK(x.has_row_scales() && x.stride(0) % 16 == 0 && cuda::Aligned16(x.data()))
        << "a quantized FP8 GEMM input needs row scales and 16-byte aligned rows, got "
        << x.ShapeString() << " (row stride " << x.stride(0) << ")";
    Fp8Gemm().Run(rows, cols, inner, w.data_as<uint8_t>(), w.stride(0),
                  w.row_scales().data_as<float>(), x.data_as<uint8_t>(), x.stride(0),
                  x.row_scales().data_as<float>(), out.data(), out.stride(0),
                  out.dtype() == DType::kF32, accumulate);
    return;
  }
  const int64_t stride = QuantizedInputStride(inner);
  const size_t bytes = QuantizedInputBytes(rows, inner);
  if (bytes > quantized_inputs_bytes_) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SIEVE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    SIEVE_CHECK(capture == cudaStreamCaptureStatusNone)
        << "an FP8 GEMM of " << rows << " x " << inner
        << " inputs in a captured step: ReserveQuantizedInputs was not called for it";
    EnsureWorkspace(quantized_inputs_, quantized_inputs_bytes_, bytes);
  }
  auto* codes = static_cast<uint8_t*>(quantized_inputs_);
  auto* scales = reinterpret_cast<float*>(codes + (rows * stride + 15) / 16 * 16);
  cuda::QuantizeRowsE4m3(Bf16(x), x.stride(0), rows, inner, codes, stride, scales, stream_);
  Fp8Gemm().Run(rows, cols, inner, w.data_as<uint8_t>(), w.stride(0),
                w.row_scales().data_as<float>(), codes, stride, scales, out.data(), out.stride(0),
                out.dtype() == DType::kF32, accumulate);
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

int CudaDeviceOf(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  return cuda_backend != nullptr ? cuda_backend->device_index() : -1;
}

void* CudaStreamOf(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  return cuda_backend != nullptr ? cuda_backend->stream() : nullptr;
}

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device_index) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    return UnavailableError(std::string("no CUDA device (") +
                            (error == cudaSuccess ? "none found" : cudaGetErrorString(error)) +
                            ")");
  }
  if (device_index < 0 || device_index >= count) {
    return InvalidArgumentError("CUDA device " + std::to_string(device_index) +
                                " does not exist (" + std::to_string(count) + " found)");
  }
  return std::unique_ptr<Backend>(new CudaBackend(device_index));
}

}  // namespace sieve
