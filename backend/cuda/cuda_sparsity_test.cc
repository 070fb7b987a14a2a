// The CUDA KV-sparsity kernels (sparsity_kernels.cu) and the GPU sampler (sampling_kernels.cu)
// against the CPU reference (SPARSITY.md test 4). Every input is fresh random data rounded to
// bf16, and the CPU gets the same values as f32, so both sides compute from identical inputs.
//
// Tolerances, and why:
// - WindowScores: relative L2 per job <= kScoreTolerance (5e-5). Both sides compute in f32 from the
//   same bf16 inputs and the same LSE; they differ only in the order of the d-term dot products
//   and of the sums over rows and heads. Each score is a sum of positive exp() terms, so its
//   relative error is that of one term, the rounding of its exponent s - lse (|s| up to ~10):
//   a few 1e-6 (the CPU against double: 2.3e-6 worst, selection_reference_test.cc); 5e-5 leaves
//   ~10x, and any indexing error is orders of magnitude larger.
// - SelectKept on identical scores: exactly equal index arrays (ties toward the lower position).
// - SelectKept after GPU scores: indices may differ only at near-ties of the pooled scores; such
//   swaps are counted and printed, and the sorted kept scores (under the CPU's pooled scores) must
//   agree within kNearTie relative to the head's largest score.
// - WriteKeptKv, EvictEntries: bitwise equal pools, side pools and lengths (they copy bf16).
// - Sampling: greedy and top-k = 1 equal the argmax exactly; seeded draws repeat exactly; the
//   empirical distribution of many draws passes a chi-square test against the host's
//   distribution (runtime/sampler.cc semantics), false-failure probability below 1.6e-4 a run,
//   and no token outside the kept set ever appears. The cases cover the GPU sampler's edge cases:
//   ties at the top-k and top-p cuts, top_p near 1, flat and nearly flat rows (one histogram bin
//   holds tens of thousands of tokens), vocabularies no multiple of any tile, greedy rows in the
//   same launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_test_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/sampling_kernels.h"
#include "backend/step_meta_testing.h"
#include "core/testing.h"

namespace sieve::cuda {
namespace {

using ::sieve::cuda::testing::DeviceBuffer;
using ::sieve::cuda::testing::ToBf16;
using ::sieve::cuda::testing::ToFloat;
using ::sieve::testing::HostI32;
using ::sieve::testing::MakePrefillStepMeta;
using ::sieve::testing::SeqChunk;

constexpr double kScoreTolerance = 5e-5;
constexpr double kNearTie = 1e-4;

int Uniform(std::mt19937_64& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}

// N(0, stddev) values rounded to bf16.
std::vector<float> RandomBf16Values(size_t count, std::mt19937_64& rng, float stddev = 1.0f) {
  std::vector<float> values(count);
  ::sieve::testing::FillRandom(values.data(), count, rng, stddev);
  ::sieve::cuda::testing::RoundToBf16(values);
  return values;
}

Tensor HostF32(const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
  SIEVE_CHECK(static_cast<size_t>(tensor.numel()) == values.size());
  std::copy(values.begin(), values.end(), tensor.data_as<float>());
  return tensor;
}

std::vector<float> ToVector(const Tensor& tensor) {
  return std::vector<float>(tensor.data_as<float>(), tensor.data_as<float>() + tensor.numel());
}

std::vector<int32_t> ToVectorI32(const Tensor& tensor) {
  return std::vector<int32_t>(tensor.data_as<int32_t>(),
                              tensor.data_as<int32_t>() + tensor.numel());
}

// ---------------------------------------------------------------------------------------------
// One step's metadata, built once and handed to both backends: the CPU's StepMeta (host tensors)
// and the device arrays behind a StepView.

struct Step {
  StepMeta meta;  // for the CPU backend
  std::unique_ptr<DeviceBuffer<int32_t>> query_start, key_start, context_lens, seq_slots,
      compression_jobs, eviction_jobs;  // the same arrays on the device
  StepView view{};

  const CompressionJob* jobs() const { return meta.jobs_host.data(); }
  int job_begin(int layer) const { return meta.job_begin[layer]; }
  int job_end(int layer) const { return meta.job_begin[layer + 1]; }
  const EvictionJob* evictions() const { return meta.evictions_host.data(); }
  int eviction_begin(int layer) const { return meta.eviction_begin[layer]; }
  int eviction_end(int layer) const { return meta.eviction_begin[layer + 1]; }
};

// A device copy of `values`; an empty array still gets one (unused) element, so that no copy
// of zero bytes from a null pointer is ever asked for.
std::unique_ptr<DeviceBuffer<int32_t>> Upload(std::vector<int32_t> values) {
  if (values.empty()) values.push_back(0);
  return std::make_unique<DeviceBuffer<int32_t>>(values);
}

// The host StepMeta as selection_reference_test.cc builds it (step_meta_testing.h), and the same
// arrays uploaded for the kernels' StepView.
std::unique_ptr<Step> MakeStep(const std::vector<SeqChunk>& seqs, int num_layers,
                               std::vector<CompressionJob> jobs,
                               std::vector<EvictionJob> evictions = {}) {
  auto step = std::make_unique<Step>();
  step->meta = MakePrefillStepMeta(seqs, num_layers, std::move(jobs), std::move(evictions));
  const StepMeta& meta = step->meta;
  step->query_start = Upload(ToVectorI32(meta.query_start));
  step->key_start = Upload(ToVectorI32(meta.key_start));
  step->context_lens = Upload(ToVectorI32(meta.context_lens));
  step->seq_slots = Upload(ToVectorI32(meta.seq_slots));
  step->compression_jobs = Upload(ToVectorI32(meta.compression_jobs));
  step->eviction_jobs = Upload(ToVectorI32(meta.eviction_jobs));
  StepView& view = step->view;
  view.query_start = step->query_start->get();
  view.key_start = step->key_start->get();
  view.context_lens = step->context_lens->get();
  view.seq_slots = step->seq_slots->get();
  view.compression_jobs = step->compression_jobs->get();
  view.eviction_jobs = step->eviction_jobs->get();
  view.num_tokens = meta.num_tokens;
  view.num_prefill_tokens = meta.num_prefill_tokens;
  view.num_seqs = meta.num_seqs;
  view.num_prefill_seqs = meta.num_prefill_seqs;
  return step;
}

// ---------------------------------------------------------------------------------------------
// Scoring inputs: what the prefill pass leaves for one step.

struct ScoreSeq {
  int num_keys;    // n
  int context;     // the chunk holds rows [context, n)
  int window;      // W
  int score_rows;  // R (W for SnapKV, n for H2O)
  int budget;      // C
  PoolKind pool = PoolKind::kMax;
  int kernel = 7;
  GroupReduce reduce = GroupReduce::kMean;
  SelectMode mode = SelectMode::kTopScores;
  int layer = 0;
};

struct ScoreProblem {
  int num_heads;  // H
  int kv_heads;   // G
  int head_dim;   // d
  std::vector<ScoreSeq> seqs;
  int num_layers = 2;
};

// Inputs as both sides see them: the CPU's f32 copies of the bf16 values and the device buffers.
struct ScoreInputs {
  int64_t rows = 0, keys = 0, qkv_width = 0;
  std::vector<float> qkv;  // [rows][(H + 2G) d]
  std::vector<float> k;    // [keys][G][d]
  std::vector<float> v;    // [keys][G][d]
  std::vector<float> lse;  // [rows][H]; NaN outside the scored rows
};

// log(sum_{j <= row} exp(scale q.k_j)) in double, for each scored row and head.
void FillLse(const ScoreProblem& problem, const ScoreSeq& seq, int64_t row_offset,
             int64_t key_offset, ScoreInputs& inputs) {
  const int d = problem.head_dim, group = problem.num_heads / problem.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> logits;
  for (int row = seq.num_keys - seq.score_rows; row < seq.num_keys; ++row) {
    const int64_t token = row_offset + row - seq.context;
    for (int head = 0; head < problem.num_heads; ++head) {
      const float* q_row = inputs.qkv.data() + token * inputs.qkv_width + head * d;
      logits.assign(row + 1, 0.0);
      double top = -std::numeric_limits<double>::infinity();
      for (int key = 0; key <= row; ++key) {
        const float* k_row =
            inputs.k.data() + ((key_offset + key) * problem.kv_heads + head / group) * d;
        double dot = 0;
        for (int dim = 0; dim < d; ++dim) dot += static_cast<double>(q_row[dim]) * k_row[dim];
        logits[key] = scale * dot;
        top = std::max(top, logits[key]);
      }
      double sum = 0;
      for (double logit : logits) sum += std::exp(logit - top);
      inputs.lse[token * problem.num_heads + head] = static_cast<float>(top + std::log(sum));
    }
  }
}

ScoreInputs MakeScoreInputs(const ScoreProblem& problem, std::mt19937_64& rng) {
  ScoreInputs inputs;
  const int d = problem.head_dim;
  inputs.qkv_width = static_cast<int64_t>(problem.num_heads + 2 * problem.kv_heads) * d;
  for (const ScoreSeq& seq : problem.seqs) {
    inputs.rows += seq.num_keys - seq.context;
    inputs.keys += seq.num_keys;
  }
  // A random spread of logits: from nearly flat attention to sharply peaked.
  const float stddev = std::uniform_real_distribution<float>(0.5f, 1.6f)(rng);
  inputs.qkv = RandomBf16Values(inputs.rows * inputs.qkv_width, rng, stddev);
  inputs.k = RandomBf16Values(inputs.keys * problem.kv_heads * d, rng, stddev);
  inputs.v = RandomBf16Values(inputs.keys * problem.kv_heads * d, rng);
  inputs.lse.assign(inputs.rows * problem.num_heads, std::numeric_limits<float>::quiet_NaN());
  int64_t row_offset = 0, key_offset = 0;
  for (const ScoreSeq& seq : problem.seqs) {
    if (seq.mode == SelectMode::kTopScores) FillLse(problem, seq, row_offset, key_offset, inputs);
    row_offset += seq.num_keys - seq.context;
    key_offset += seq.num_keys;
  }
  return inputs;
}

// Jobs with per-layer packed score and index offsets (starting past a random gap, so offsets
// are exercised), plus the buffer sizes each layer needs.
struct Packing {
  std::vector<CompressionJob> jobs;
  std::vector<int64_t> score_floats, index_ints;  // [L]
};

Packing PackJobs(const ScoreProblem& problem, std::mt19937_64& rng) {
  Packing packing;
  packing.score_floats.assign(problem.num_layers, 0);
  packing.index_ints.assign(problem.num_layers, 0);
  for (int layer = 0; layer < problem.num_layers; ++layer) {
    packing.score_floats[layer] = Uniform(rng, 0, 9);
    packing.index_ints[layer] = Uniform(rng, 0, 9);
  }
  for (size_t seq_index = 0; seq_index < problem.seqs.size(); ++seq_index) {
    const ScoreSeq& seq = problem.seqs[seq_index];
    CompressionJob job{};
    job.layer = seq.layer;
    job.prefill_seq = static_cast<int32_t>(seq_index);
    job.num_keys = seq.num_keys;
    job.window = seq.window;
    job.score_rows = seq.mode == SelectMode::kTopScores ? seq.score_rows : 0;
    job.budget = seq.budget;
    job.pool = seq.pool;
    job.pool_kernel = seq.kernel;
    job.reduce = seq.reduce;
    job.mode = seq.mode;
    job.score_offset = static_cast<int32_t>(packing.score_floats[seq.layer]);
    job.index_offset = static_cast<int32_t>(packing.index_ints[seq.layer]);
    job.seq_slot = static_cast<int32_t>(seq_index);
    packing.score_floats[seq.layer] += int64_t{problem.kv_heads} * seq.num_keys;
    packing.index_ints[seq.layer] += int64_t{problem.kv_heads} * (seq.budget - seq.window);
    packing.jobs.push_back(job);
  }
  for (int layer = 0; layer < problem.num_layers; ++layer) {
    packing.score_floats[layer] += Uniform(rng, 1, 9);  // a tail that must stay untouched
    packing.index_ints[layer] += Uniform(rng, 1, 9);
  }
  return packing;
}

std::string Describe(const ScoreProblem& problem, const ScoreSeq& seq) {
  return "H=" + std::to_string(problem.num_heads) + " G=" + std::to_string(problem.kv_heads) +
         " d=" + std::to_string(problem.head_dim) + " n=" + std::to_string(seq.num_keys) +
         " context=" + std::to_string(seq.context) + " W=" + std::to_string(seq.window) +
         " R=" + std::to_string(seq.score_rows) + " C=" + std::to_string(seq.budget) +
         " pool=" + std::to_string(static_cast<int>(seq.pool)) +
         " k=" + std::to_string(seq.kernel) +
         " reduce=" + std::to_string(static_cast<int>(seq.reduce)) +
         " mode=" + std::to_string(static_cast<int>(seq.mode)) +
         " layer=" + std::to_string(seq.layer);
}

struct SelectionTally {
  int64_t heads = 0, heads_with_swaps = 0, swapped_indices = 0;
  double worst_score_error = 0;
  void Print(const char* what) const {
    std::printf(
        "%s: %lld heads, %lld with near-tie swaps (%lld indices), worst relative score "
        "error %.3g\n",
        what, static_cast<long long>(heads), static_cast<long long>(heads_with_swaps),
        static_cast<long long>(swapped_indices), worst_score_error);
  }
};

constexpr float kScoreSentinel = -7.0f;
constexpr int32_t kIndexSentinel = -1;

// Scores and selects `problem` on both backends, layer by layer, and compares: scores within
// kScoreTolerance, untouched memory outside the jobs, selections equal up to near-ties.
void RunScoreProblem(const ScoreProblem& problem, std::mt19937_64& rng, SelectionTally& tally) {
  const ScoreInputs inputs = MakeScoreInputs(problem, rng);
  const Packing packing = PackJobs(problem, rng);
  std::vector<SeqChunk> chunks;
  for (const ScoreSeq& seq : problem.seqs) chunks.push_back({seq.num_keys, seq.context});
  const std::unique_ptr<Step> step = MakeStep(chunks, problem.num_layers, packing.jobs);
  const int hd = problem.num_heads * problem.head_dim;

  // CPU tensors.
  const Tensor qkv = HostF32(inputs.qkv, {inputs.rows, inputs.qkv_width});
  const Tensor q = qkv.Columns(0, hd);
  const Tensor k = HostF32(inputs.k, {inputs.keys, problem.kv_heads, problem.head_dim});
  const Tensor lse = HostF32(inputs.lse, {inputs.rows, problem.num_heads});
  // Device buffers.
  const DeviceBuffer<bf16> qkv_gpu(ToBf16(inputs.qkv));
  const DeviceBuffer<bf16> k_gpu(ToBf16(inputs.k));
  const DeviceBuffer<float> lse_gpu(inputs.lse);

  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  for (int layer = 0; layer < problem.num_layers; ++layer) {
    const int begin = step->job_begin(layer), end = step->job_end(layer);
    if (begin == end) continue;
    const std::vector<float> score_init(packing.score_floats[layer], kScoreSentinel);
    const std::vector<int32_t> index_init(packing.index_ints[layer], kIndexSentinel);
    Tensor scores_cpu = HostF32(score_init, {packing.score_floats[layer]});
    Tensor kept_cpu = HostI32(index_init, {packing.index_ints[layer]});
    cpu->WindowScores(q, k, lse, problem.num_heads, step->meta, layer, scores_cpu);
    cpu->SelectKept(scores_cpu, problem.kv_heads, step->meta, layer, kept_cpu);

    DeviceBuffer<float> scores_gpu(score_init);
    DeviceBuffer<int32_t> kept_gpu(index_init);
    DeviceBuffer<uint8_t> workspace(
        SelectKeptWorkspaceBytes(step->jobs(), begin, end, problem.kv_heads));
    WindowScores(qkv_gpu.get(), inputs.qkv_width, k_gpu.get(), lse_gpu.get(), problem.num_heads,
                 problem.num_heads, problem.kv_heads, problem.head_dim, step->view, step->jobs(),
                 begin, end, scores_gpu.get(), nullptr);
    SelectKept(scores_gpu.get(), problem.kv_heads, step->view, step->jobs(), begin, end,
               kept_gpu.get(), workspace.get(), workspace.size(), nullptr);
    SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> gpu_scores = scores_gpu.ToHost();
    const std::vector<int32_t> gpu_kept = kept_gpu.ToHost();
    const std::vector<float> cpu_scores = ToVector(scores_cpu);
    const std::vector<int32_t> cpu_kept = ToVectorI32(kept_cpu);

    std::vector<bool> score_written(gpu_scores.size(), false), index_written(gpu_kept.size());
    for (int job_index = begin; job_index < end; ++job_index) {
      const CompressionJob& job = step->jobs()[job_index];
      const ScoreSeq& seq = problem.seqs[job.prefill_seq];
      SCOPED_TRACE(Describe(problem, seq));
      const int n = job.num_keys, keep = job.budget - job.window;
      if (job.mode == SelectMode::kTopScores) {
        const int64_t count = int64_t{problem.kv_heads} * n;
        for (int64_t index = 0; index < count; ++index)
          score_written[job.score_offset + index] = true;
        const double error = ::sieve::testing::RelativeL2Error(
            gpu_scores.data() + job.score_offset, cpu_scores.data() + job.score_offset, count);
        EXPECT_LE(error, kScoreTolerance) << "window scores, relative L2";
        tally.worst_score_error = std::max(tally.worst_score_error, error);
      }
      for (int kv_head = 0; kv_head < problem.kv_heads; ++kv_head) {
        const int64_t at = job.index_offset + int64_t{kv_head} * keep;
        for (int slot = 0; slot < keep; ++slot) index_written[at + slot] = true;
        const std::vector<int32_t> gpu_set(gpu_kept.begin() + at, gpu_kept.begin() + at + keep);
        const std::vector<int32_t> cpu_set(cpu_kept.begin() + at, cpu_kept.begin() + at + keep);
        ++tally.heads;
        ASSERT_TRUE(std::is_sorted(gpu_set.begin(), gpu_set.end())) << "head " << kv_head;
        ASSERT_TRUE(std::adjacent_find(gpu_set.begin(), gpu_set.end()) == gpu_set.end());
        for (int32_t position : gpu_set) ASSERT_TRUE(position >= 0 && position < n - job.window);
        if (gpu_set == cpu_set) continue;
        ASSERT_EQ(job.mode, SelectMode::kTopScores) << "sinks must match exactly";
        // Near-ties: judge both selections by the CPU's pooled scores.
        std::vector<float> pooled(n - job.window);
        PoolScores(cpu_scores.data() + job.score_offset + int64_t{kv_head} * n, n - job.window,
                   job.pool, job.pool_kernel, pooled.data());
        std::vector<float> gpu_values, cpu_values;
        for (int32_t position : gpu_set) gpu_values.push_back(pooled[position]);
        for (int32_t position : cpu_set) cpu_values.push_back(pooled[position]);
        std::sort(gpu_values.begin(), gpu_values.end());
        std::sort(cpu_values.begin(), cpu_values.end());
        const float top = *std::max_element(pooled.begin(), pooled.end());
        for (int slot = 0; slot < keep; ++slot) {
          ASSERT_LE(std::abs(gpu_values[slot] - cpu_values[slot]), kNearTie * top)
              << "head " << kv_head << ": the GPU kept a clearly worse position (sorted slot "
              << slot << ", kth score cpu " << cpu_values[0] << " gpu " << gpu_values[0] << ")";
        }
        std::vector<int32_t> only_gpu;
        std::set_difference(gpu_set.begin(), gpu_set.end(), cpu_set.begin(), cpu_set.end(),
                            std::back_inserter(only_gpu));
        ++tally.heads_with_swaps;
        tally.swapped_indices += static_cast<int64_t>(only_gpu.size());
      }
    }
    for (size_t index = 0; index < gpu_scores.size(); ++index) {
      if (!score_written[index]) {
        ASSERT_EQ(gpu_scores[index], kScoreSentinel) << "scores written outside a job at " << index;
      }
    }
    for (size_t index = 0; index < gpu_kept.size(); ++index) {
      if (!index_written[index]) {
        ASSERT_EQ(gpu_kept[index], kIndexSentinel) << "kept written outside a job at " << index;
      }
    }
  }
}

// A job of n keys with a random budget at the edges or inside: keep one, all but one, all.
ScoreSeq RandomSeq(std::mt19937_64& rng, int n, int window, int trial) {
  ScoreSeq seq{};
  seq.num_keys = n;
  seq.window = window;
  seq.score_rows = window;
  const int prefix = n - window;
  switch (trial % 4) {
    case 0:
      seq.budget = window + 1;
      break;
    case 1:
      seq.budget = window + std::max(1, prefix - 1);
      break;
    case 2:
      seq.budget = n;
      break;
    default:
      seq.budget = window + Uniform(rng, 1, prefix);
  }
  seq.context = Uniform(rng, 0, 1) ? 0 : Uniform(rng, 0, n - window);
  constexpr struct {
    PoolKind pool;
    int kernel;
  } kPoolings[] = {{PoolKind::kMax, 7},
                   {PoolKind::kAvg, 5},
                   {PoolKind::kNone, 1},
                   {PoolKind::kMax, 5},
                   {PoolKind::kAvg, 7}};
  seq.pool = kPoolings[trial % 5].pool;
  seq.kernel = kPoolings[trial % 5].kernel;
  seq.reduce = static_cast<GroupReduce>(Uniform(rng, 0, 1));
  return seq;
}

TEST(CudaSparsityTest, WindowScoresMatchCpu) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  SelectionTally tally;
  struct Heads {
    int num_heads, kv_heads, head_dim;
  };
  int trial = 0;
  // d = 64 and 128 run on the tensor cores in passes of 4 heads of a group: groups of 1, 4, 6 (a
  // full pass and a partial one) and 8 (two full passes); d = 16 on the f32 kernel.
  for (const Heads heads :
       {Heads{4, 4, 64}, Heads{8, 2, 128}, Heads{12, 2, 64}, Heads{16, 2, 128}, Heads{6, 3, 16}}) {
    // Every window of SPARSITY.md's range, two layers, several sequences per step.
    ScoreProblem problem{heads.num_heads, heads.kv_heads, heads.head_dim, {}};
    for (int window : {1, 8, 32, 64}) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        const int n = repeat == 0 && window < 64 ? window + 1 : Uniform(rng, window + 2, 2500);
        ScoreSeq seq = RandomSeq(rng, n, window, trial++);
        seq.layer = Uniform(rng, 0, 1);
        problem.seqs.push_back(seq);
      }
    }
    SCOPED_TRACE("heads " + std::to_string(heads.num_heads) + "/" + std::to_string(heads.kv_heads));
    RunScoreProblem(problem, rng, tally);
    if (HasFatalFailure()) return;
  }
  // The long prompt of SPARSITY.md's range.
  {
    ScoreProblem problem{8, 2, 128, {RandomSeq(rng, 5000, 64, 3)}};
    problem.seqs[0].context = 5000 - 100;
    RunScoreProblem(problem, rng, tally);
    if (HasFatalFailure()) return;
  }
  tally.Print("window scores");
}

// Llama-3-8B's shape (32 query heads, 8 KV heads, d = 128) at the headline prompt length, next to
// a StreamingLLM job in the same layer (kFirstPositions: no scores written, sinks kept).
TEST(CudaSparsityTest, WindowScoresLlama3Shape) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  SelectionTally tally;
  ScoreSeq snap{4000, 4000 - 48, 32, 32, 400, PoolKind::kMax, 7, GroupReduce::kMean};
  ScoreSeq sinks{
      700, 0, 64, 0, 68, PoolKind::kNone, 1, GroupReduce::kMean, SelectMode::kFirstPositions};
  ScoreProblem problem{32, 8, 128, {snap, sinks}, 1};
  RunScoreProblem(problem, rng, tally);
  tally.Print("llama-3-8b shape");
}

// H2O scores every prompt row (R = n): the kernel's row chunks tile thousands of rows, and the
// causal skip of chunks before each key tile matters.
TEST(CudaSparsityTest, AllRowScoresMatchCpuForH2o) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  SelectionTally tally;
  for (int trial = 0; trial < 4; ++trial) {
    const bool gqa = trial % 2 == 1;
    const int n = trial < 2 ? Uniform(rng, 2, 300) : Uniform(rng, 600, 1200);
    ScoreSeq seq{};
    seq.num_keys = n;
    seq.context = 0;
    seq.window = Uniform(rng, 1, n - 1);
    seq.score_rows = n;
    seq.budget = Uniform(rng, seq.window + 1, n);
    seq.pool = PoolKind::kNone;
    seq.kernel = 1;
    seq.reduce = static_cast<GroupReduce>(Uniform(rng, 0, 1));
    ScoreProblem problem{gqa ? 8 : 4, gqa ? 2 : 4, trial < 2 ? 32 : 64, {seq}, 1};
    RunScoreProblem(problem, rng, tally);
    if (HasFatalFailure()) return;
  }
  tally.Print("h2o scores");
}

// ---------------------------------------------------------------------------------------------
// SelectKept on identical scores: the CPU's scores are copied to the GPU, so the selections must
// be equal index for index (SPARSITY.md test 4), ties included.

enum class ScorePattern { kContinuous, kPlateaus, kSignedWithZeros, kRuns };

std::vector<float> PatternScores(ScorePattern pattern, size_t count, std::mt19937_64& rng) {
  std::vector<float> scores(count);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  switch (pattern) {
    case ScorePattern::kContinuous:
      for (float& score : scores) score = unit(rng);
      break;
    case ScorePattern::kPlateaus:  // few distinct values: ties everywhere
      for (float& score : scores) score = static_cast<float>(Uniform(rng, 0, 7)) / 8.0f;
      break;
    case ScorePattern::kSignedWithZeros: {  // +-0.0 must tie; negative values order correctly
      constexpr float kValues[] = {0.0f, -0.0f, 0.5f, -0.5f, 1e-30f, -1e-30f, 3.0f, -3.0f};
      for (float& score : scores) score = kValues[Uniform(rng, 0, 7)];
      break;
    }
    case ScorePattern::kRuns: {  // long runs of one value, as max-pooling makes them
      float value = unit(rng);
      for (float& score : scores) {
        if (Uniform(rng, 0, 9) == 0) value = unit(rng);
        score = value;
      }
      break;
    }
  }
  return scores;
}

struct SelectJob {
  int num_keys, window, budget;
  PoolKind pool;
  int kernel;
  SelectMode mode = SelectMode::kTopScores;
};

// One layer of `jobs`, scores of `pattern`, selected on both backends from the same scores.
void RunSelectionOnIdenticalScores(const std::vector<SelectJob>& select_jobs, int kv_heads,
                                   ScorePattern pattern, std::mt19937_64& rng) {
  std::vector<CompressionJob> jobs;
  std::vector<SeqChunk> chunks;
  int64_t score_floats = Uniform(rng, 0, 5), index_ints = Uniform(rng, 0, 5);
  for (size_t index = 0; index < select_jobs.size(); ++index) {
    const SelectJob& select = select_jobs[index];
    CompressionJob job{};
    job.layer = 0;
    job.prefill_seq = static_cast<int32_t>(index);
    job.num_keys = select.num_keys;
    job.window = select.window;
    job.score_rows = select.window;
    job.budget = select.budget;
    job.pool = select.pool;
    job.pool_kernel = select.kernel;
    job.mode = select.mode;
    job.score_offset = static_cast<int32_t>(score_floats);
    job.index_offset = static_cast<int32_t>(index_ints);
    job.seq_slot = static_cast<int32_t>(index);
    score_floats += int64_t{kv_heads} * select.num_keys;
    index_ints += int64_t{kv_heads} * (select.budget - select.window);
    jobs.push_back(job);
    chunks.push_back({select.num_keys, 0});
  }
  index_ints += 3;  // an untouched tail
  const std::unique_ptr<Step> step = MakeStep(chunks, 1, jobs);
  const std::vector<float> scores = PatternScores(pattern, score_floats, rng);
  const std::vector<int32_t> index_init(index_ints, kIndexSentinel);

  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const Tensor scores_cpu = HostF32(scores, {score_floats});
  Tensor kept_cpu = HostI32(index_init, {index_ints});
  cpu->SelectKept(scores_cpu, kv_heads, step->meta, 0, kept_cpu);

  const DeviceBuffer<float> scores_gpu(scores);
  DeviceBuffer<int32_t> kept_gpu(index_init);
  DeviceBuffer<uint8_t> workspace(
      SelectKeptWorkspaceBytes(step->jobs(), 0, step->job_end(0), kv_heads));
  SelectKept(scores_gpu.get(), kv_heads, step->view, step->jobs(), 0, step->job_end(0),
             kept_gpu.get(), workspace.get(), workspace.size(), nullptr);
  const std::vector<int32_t> gpu_kept = kept_gpu.ToHost();
  const std::vector<int32_t> cpu_kept = ToVectorI32(kept_cpu);
  for (size_t index = 0; index < cpu_kept.size(); ++index) {
    if (gpu_kept[index] == cpu_kept[index]) continue;
    // Name the job and head of the first difference.
    for (const CompressionJob& job : step->meta.jobs_host) {
      const int keep = job.budget - job.window;
      const int64_t begin = job.index_offset, end = begin + int64_t{kv_heads} * keep;
      if (static_cast<int64_t>(index) < begin || static_cast<int64_t>(index) >= end) continue;
      FAIL() << "n=" << job.num_keys << " W=" << job.window << " C=" << job.budget
             << " pool=" << static_cast<int>(job.pool) << " k=" << job.pool_kernel
             << " mode=" << static_cast<int>(job.mode) << " G=" << kv_heads
             << " pattern=" << static_cast<int>(pattern) << ": head " << (index - begin) / keep
             << " slot " << (index - begin) % keep << " gpu " << gpu_kept[index] << " cpu "
             << cpu_kept[index];
    }
    FAIL() << "kept written outside every job at " << index << ": " << gpu_kept[index];
  }
}

TEST(CudaSparsityTest, SelectKeptEqualsCpuOnIdenticalScores) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  constexpr struct {
    PoolKind pool;
    int kernel;
  } kPoolings[] = {{PoolKind::kMax, 5}, {PoolKind::kMax, 7},  {PoolKind::kAvg, 5},
                   {PoolKind::kAvg, 7}, {PoolKind::kNone, 1}, {PoolKind::kMax, 4}};
  constexpr ScorePattern kPatterns[] = {ScorePattern::kContinuous, ScorePattern::kPlateaus,
                                        ScorePattern::kSignedWithZeros, ScorePattern::kRuns};
  int trial = 0;
  for (int kv_heads : {1, 2, 8}) {
    for (const auto& pooling : kPoolings) {
      for (ScorePattern pattern : kPatterns) {
        // Several jobs in the layer: every window, budgets at the edges and inside, and a
        // StreamingLLM job.
        std::vector<SelectJob> jobs;
        for (int window : {1, 8, 32, 64}) {
          const int n = Uniform(rng, window + 1, trial % 3 == 0 ? 5000 : 800);
          const int prefix = n - window;
          int keep;
          switch (trial++ % 4) {
            case 0:
              keep = 1;
              break;
            case 1:
              keep = std::max(1, prefix - 1);
              break;
            case 2:
              keep = prefix;
              break;
            default:
              keep = Uniform(rng, 1, prefix);
          }
          jobs.push_back({n, window, window + keep, pooling.pool, pooling.kernel});
        }
        const int sink_n = Uniform(rng, 20, 400);
        jobs.push_back(
            {sink_n, 16, 16 + Uniform(rng, 1, 4), PoolKind::kNone, 1, SelectMode::kFirstPositions});
        RunSelectionOnIdenticalScores(jobs, kv_heads, pattern, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Long contexts: n = 100000, a few thousand kept (the common case) and most kept.
TEST(CudaSparsityTest, SelectKeptEqualsCpuOnLongPrompts) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  for (ScorePattern pattern :
       {ScorePattern::kContinuous, ScorePattern::kPlateaus, ScorePattern::kRuns}) {
    const std::vector<SelectJob> jobs = {
        {100000, 32, 32 + Uniform(rng, 1000, 4000), PoolKind::kMax, 7},
        {100000, 64, 64 + Uniform(rng, 50000, 90000), PoolKind::kAvg, 5}};
    RunSelectionOnIdenticalScores(jobs, 8, pattern, rng);
    if (HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------------------------------------
// WriteKeptKv and EvictEntries: the pools, side pools and lengths, bitwise.

// A pool on both backends: the CPU's f32 tensors hold the same (bf16) values as the GPU's.
struct TestPool {
  KvPool cpu;
  std::unique_ptr<DeviceBuffer<bf16>> k, v;
  std::unique_ptr<DeviceBuffer<int32_t>> page_table, kv_lens, positions;
  std::unique_ptr<DeviceBuffer<float>> scores;
  PoolView view{};

  // Compares every array of the GPU pool with the CPU's.
  void ExpectEqual() const {
    const std::vector<float> gpu_k = ToFloat(k->ToHost()), gpu_v = ToFloat(v->ToHost());
    const std::vector<float> cpu_k = ToVector(cpu.k), cpu_v = ToVector(cpu.v);
    ASSERT_EQ(gpu_k.size(), cpu_k.size());
    for (size_t index = 0; index < cpu_k.size(); ++index) {
      ASSERT_EQ(std::memcmp(&gpu_k[index], &cpu_k[index], sizeof(float)), 0)
          << "k at " << index << ": gpu " << gpu_k[index] << " cpu " << cpu_k[index];
      ASSERT_EQ(std::memcmp(&gpu_v[index], &cpu_v[index], sizeof(float)), 0)
          << "v at " << index << ": gpu " << gpu_v[index] << " cpu " << cpu_v[index];
    }
    EXPECT_EQ(kv_lens->ToHost(), ToVectorI32(cpu.kv_lens)) << "kv_lens";
    EXPECT_EQ(positions->ToHost(), ToVectorI32(cpu.positions)) << "positions side pool";
    const std::vector<float> gpu_scores = scores->ToHost(), cpu_scores = ToVector(cpu.scores);
    ASSERT_EQ(gpu_scores.size(), cpu_scores.size());
    for (size_t index = 0; index < cpu_scores.size(); ++index) {
      ASSERT_EQ(std::memcmp(&gpu_scores[index], &cpu_scores[index], sizeof(float)), 0)
          << "scores side pool at " << index;
    }
  }
};

// `page_table` [L][max_seqs][max_pages] (-1 where unused); every other array random, so that an
// unwritten entry differs from a written one.
std::unique_ptr<TestPool> MakePool(int num_layers, int max_seqs, int max_pages, int num_pages,
                                   int page_size, int kv_heads, int head_dim,
                                   const std::vector<int32_t>& page_table, std::mt19937_64& rng) {
  auto pool = std::make_unique<TestPool>();
  KvPool& cpu = pool->cpu;
  cpu.page_size = page_size;
  cpu.num_pages = num_pages;
  cpu.max_seqs = max_seqs;
  cpu.max_pages_per_seq = max_pages;
  cpu.num_kv_heads = kv_heads;
  cpu.head_dim = head_dim;
  const int64_t entries = int64_t{num_pages} * page_size;
  const std::vector<float> k = RandomBf16Values(entries * kv_heads * head_dim, rng);
  const std::vector<float> v = RandomBf16Values(entries * kv_heads * head_dim, rng);
  std::vector<float> scores = RandomBf16Values(entries * kv_heads, rng);
  std::vector<int32_t> positions(entries * kv_heads), kv_lens(int64_t{num_layers} * max_seqs);
  for (int32_t& position : positions) position = Uniform(rng, -1000, -1);
  for (int32_t& length : kv_lens) length = Uniform(rng, 1000, 2000);
  cpu.k = HostF32(k, {num_pages, page_size, kv_heads, head_dim});
  cpu.v = HostF32(v, {num_pages, page_size, kv_heads, head_dim});
  cpu.scores = HostF32(scores, {entries, kv_heads});
  cpu.positions = HostI32(positions, {entries, kv_heads});
  cpu.page_table = HostI32(page_table, {num_layers, max_seqs, max_pages});
  cpu.kv_lens = HostI32(kv_lens, {num_layers, max_seqs});
  pool->k = std::make_unique<DeviceBuffer<bf16>>(ToBf16(k));
  pool->v = std::make_unique<DeviceBuffer<bf16>>(ToBf16(v));
  pool->scores = std::make_unique<DeviceBuffer<float>>(scores);
  pool->positions = std::make_unique<DeviceBuffer<int32_t>>(positions);
  pool->page_table = std::make_unique<DeviceBuffer<int32_t>>(page_table);
  pool->kv_lens = std::make_unique<DeviceBuffer<int32_t>>(kv_lens);
  PoolView& view = pool->view;
  view.k = pool->k->get();
  view.v = pool->v->get();
  view.page_table = pool->page_table->get();
  view.kv_lens = pool->kv_lens->get();
  view.scores = pool->scores->get();
  view.positions = pool->positions->get();
  view.page_size = page_size;
  view.max_seqs = max_seqs;
  view.max_pages_per_seq = max_pages;
  view.num_kv_heads = kv_heads;
  view.head_dim = head_dim;
  return pool;
}

// Each (layer, slot) in `lengths` gets distinct random pages for that many entries.
std::vector<int32_t> RandomPageTable(int num_layers, int max_seqs, int max_pages, int num_pages,
                                     int page_size, const std::vector<std::vector<int>>& lengths,
                                     std::mt19937_64& rng) {
  std::vector<int32_t> table(int64_t{num_layers} * max_seqs * max_pages, -1);
  std::vector<int32_t> free_pages(num_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  size_t next = 0;
  for (int layer = 0; layer < num_layers; ++layer) {
    for (int slot = 0; slot < max_seqs; ++slot) {
      const int pages = (lengths[layer][slot] + page_size - 1) / page_size;
      SIEVE_CHECK(pages <= max_pages && next + pages <= free_pages.size());
      for (int page = 0; page < pages; ++page) {
        table[(int64_t{layer} * max_seqs + slot) * max_pages + page] = free_pages[next++];
      }
    }
  }
  return table;
}

TEST(CudaSparsityTest, WriteKeptKvEqualsCpu) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  struct Shape {
    int kv_heads, head_dim, page_size;
  };
  for (const Shape shape : {Shape{8, 128, 16}, Shape{2, 64, 4}, Shape{3, 16, 1}}) {
    const int kv_heads = shape.kv_heads, head_dim = shape.head_dim;
    const int num_layers = 3, layer = 1, num_seqs = 3;
    SCOPED_TRACE("G=" + std::to_string(kv_heads) + " d=" + std::to_string(head_dim) +
                 " page=" + std::to_string(shape.page_size));
    // Three sequences compressed in one layer: top scores, sinks, and top scores again.
    std::vector<SeqChunk> chunks;
    std::vector<CompressionJob> jobs;
    std::vector<std::vector<int>> lengths(num_layers, std::vector<int>(num_seqs, 0));
    int64_t score_floats = 0, index_ints = 0;
    for (int seq = 0; seq < num_seqs; ++seq) {
      CompressionJob job{};
      job.layer = layer;
      job.prefill_seq = seq;
      job.num_keys = Uniform(rng, 70, 600);
      job.window = Uniform(rng, 1, 64);
      job.budget = Uniform(rng, job.window + 1, job.num_keys);
      job.mode = seq == 1 ? SelectMode::kFirstPositions : SelectMode::kTopScores;
      job.score_rows = job.mode == SelectMode::kTopScores ? job.window : 0;
      job.pool = PoolKind::kMax;
      job.pool_kernel = 7;
      job.score_offset = static_cast<int32_t>(score_floats);
      job.index_offset = static_cast<int32_t>(index_ints);
      job.seq_slot = num_seqs - 1 - seq;  // slots differ from sequence indices
      // The last one keeps its prompt's pages (a prefix-caching sequence): kept entries after them.
      job.kept_offset = seq == num_seqs - 1 ? Uniform(rng, 1, job.num_keys) : 0;
      score_floats += int64_t{kv_heads} * job.num_keys;
      index_ints += int64_t{kv_heads} * (job.budget - job.window);
      lengths[layer][job.seq_slot] = job.kept_offset + job.budget;
      lengths[0][job.seq_slot] = Uniform(rng, 1, 100);  // other layers' pages: must stay
      jobs.push_back(job);
      chunks.push_back({job.num_keys, 0});
    }
    const std::unique_ptr<Step> step = MakeStep(chunks, num_layers, jobs);
    int64_t keys = 0;
    for (const SeqChunk& chunk : chunks) keys += chunk.num_keys;
    const std::vector<float> k = RandomBf16Values(keys * kv_heads * head_dim, rng);
    const std::vector<float> v = RandomBf16Values(keys * kv_heads * head_dim, rng);
    const std::vector<float> scores = RandomBf16Values(score_floats, rng);
    // Kept: any ascending subset of each head's prefix (sinks: the first positions).
    std::vector<int32_t> kept(index_ints);
    for (const CompressionJob& job : step->meta.jobs_host) {
      const int keep = job.budget - job.window;
      for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
        std::vector<int32_t> prefix(job.num_keys - job.window);
        std::iota(prefix.begin(), prefix.end(), 0);
        if (job.mode == SelectMode::kTopScores) std::shuffle(prefix.begin(), prefix.end(), rng);
        prefix.resize(keep);
        std::sort(prefix.begin(), prefix.end());
        std::copy(prefix.begin(), prefix.end(),
                  kept.begin() + job.index_offset + int64_t{kv_head} * keep);
      }
    }
    const int max_pages = 1200 / shape.page_size + 2;
    const int num_pages = num_seqs * max_pages * 2;
    const std::vector<int32_t> page_table =
        RandomPageTable(num_layers, num_seqs, max_pages, num_pages, shape.page_size, lengths, rng);
    const std::unique_ptr<TestPool> pool =
        MakePool(num_layers, num_seqs, max_pages, num_pages, shape.page_size, kv_heads, head_dim,
                 page_table, rng);

    std::unique_ptr<Backend> cpu = MakeCpuBackend();
    cpu->WriteKeptKv(HostF32(k, {keys, kv_heads, head_dim}), HostF32(v, {keys, kv_heads, head_dim}),
                     HostF32(scores, {score_floats}), HostI32(kept, {index_ints}), step->meta,
                     layer, pool->cpu);
    const DeviceBuffer<bf16> k_gpu(ToBf16(k)), v_gpu(ToBf16(v));
    const DeviceBuffer<float> scores_gpu(scores);
    const DeviceBuffer<int32_t> kept_gpu(kept);
    WriteKeptKv(k_gpu.get(), v_gpu.get(), scores_gpu.get(), kept_gpu.get(), step->view,
                step->jobs(), step->job_begin(layer), step->job_end(layer), layer, pool->view,
                nullptr);
    SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
    pool->ExpectEqual();
    if (HasFatalFailure()) return;
  }
}

TEST(CudaSparsityTest, EvictEntriesEqualsCpu) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  for (int trial = 0; trial < 6; ++trial) {
    const int kv_heads = trial % 3 == 0 ? 8 : Uniform(rng, 1, 4);
    const int head_dim = trial % 2 == 0 ? 128 : 64;
    const int page_size = trial % 3 == 2 ? 1 : 16;
    const int num_layers = 2, layer = trial % 2, max_seqs = 5;
    SCOPED_TRACE("trial " + std::to_string(trial));
    // Jobs for 4 of the 5 slots in `layer`, one in the other layer (which must not run).
    std::vector<EvictionJob> evictions;
    std::vector<std::vector<int>> lengths(num_layers, std::vector<int>(max_seqs, 0));
    for (int slot = 0; slot < max_seqs; ++slot) {
      const int job_layer = slot == 4 ? 1 - layer : layer;
      EvictionJob job{};
      job.layer = job_layer;
      job.seq_slot = slot;
      job.length = slot == 0 ? Uniform(rng, 2, 8) : Uniform(rng, 40, 700);
      job.kind = (slot + trial) % 2 == 0 ? EvictionJob::kLowestScore : EvictionJob::kOldest;
      job.position = job.length + Uniform(rng, 0, 5000);
      job.sinks = Uniform(rng, 0, 4);
      // protect_recent = 0 lets the newest entry (the last) be the victim.
      job.protect_recent = slot == 3 ? 0 : Uniform(rng, 1, std::max(1, job.length / 3));
      lengths[job_layer][slot] = job.length;
      evictions.push_back(job);
    }
    const int max_pages = 700 / page_size + 2;
    const int num_pages = max_seqs * max_pages * 2;
    const std::vector<int32_t> page_table =
        RandomPageTable(num_layers, max_seqs, max_pages, num_pages, page_size, lengths, rng);
    std::unique_ptr<TestPool> pool = MakePool(num_layers, max_seqs, max_pages, num_pages, page_size,
                                              kv_heads, head_dim, page_table, rng);
    // Each head's entries hold distinct positions below the token's, the last one the token's
    // own; scores are few distinct values (ties) or continuous.
    std::vector<int32_t> positions = ToVectorI32(pool->cpu.positions);
    std::vector<float> scores = ToVector(pool->cpu.scores);
    for (EvictionJob& job : evictions) {
      const int32_t* row =
          page_table.data() + (int64_t{job.layer} * max_seqs + job.seq_slot) * max_pages;
      const bool ties = Uniform(rng, 0, 1) == 1;
      for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
        std::vector<int32_t> held(job.position);
        std::iota(held.begin(), held.end(), 0);
        std::shuffle(held.begin(), held.end(), rng);
        held.resize(job.length - 1);
        held.push_back(job.position);
        for (int entry = 0; entry < job.length; ++entry) {
          const int64_t side =
              (int64_t{row[entry / page_size]} * page_size + entry % page_size) * kv_heads +
              kv_head;
          positions[side] = held[entry];
          scores[side] = ties ? static_cast<float>(Uniform(rng, 0, 3))
                              : std::uniform_real_distribution<float>(0.0f, 5.0f)(rng);
        }
        if (job.seq_slot == 3) {  // make the last entry the lowest score on some heads
          const int64_t last = (int64_t{row[(job.length - 1) / page_size]} * page_size +
                                (job.length - 1) % page_size) *
                                   kv_heads +
                               kv_head;
          if (kv_head % 2 == 0) scores[last] = -1.0f;
        }
      }
      // The CPU aborts when a head has nothing evictable; widen the window if so.
      const int lowest_recent = job.position - job.protect_recent;
      bool evictable = false;
      for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
        bool head_evictable = false;
        for (int entry = 0; entry < job.length; ++entry) {
          const int64_t side =
              (int64_t{row[entry / page_size]} * page_size + entry % page_size) * kv_heads +
              kv_head;
          head_evictable |= positions[side] >= job.sinks && positions[side] <= lowest_recent;
        }
        evictable = head_evictable;
        if (!evictable) break;
      }
      if (!evictable) {
        job.sinks = 0;
        job.protect_recent = 0;
      }
    }
    std::copy(positions.begin(), positions.end(), pool->cpu.positions.data_as<int32_t>());
    std::copy(scores.begin(), scores.end(), pool->cpu.scores.data_as<float>());
    SIEVE_CUDA_CHECK(cudaMemcpy(pool->view.positions, positions.data(),
                                positions.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    SIEVE_CUDA_CHECK(cudaMemcpy(pool->view.scores, scores.data(), scores.size() * sizeof(float),
                                cudaMemcpyHostToDevice));

    const std::unique_ptr<Step> step = MakeStep({}, num_layers, {}, evictions);
    std::unique_ptr<Backend> cpu = MakeCpuBackend();
    cpu->EvictEntries(step->meta, layer, pool->cpu);
    EvictEntries(step->view, step->evictions(), step->eviction_begin(layer),
                 step->eviction_end(layer), layer, pool->view, nullptr);
    SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
    pool->ExpectEqual();
    if (HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------------------------------------
// Sampling.

// Logits of `rows` rows: N(0, stddev) with a few planted peaks, so that the distribution has a
// head worth sampling; `ties` plants two equal maxima (the lower id must win).
std::vector<float> RandomLogits(int rows, int vocab, float stddev, bool ties,
                                std::mt19937_64& rng) {
  std::vector<float> logits(int64_t{rows} * vocab);
  ::sieve::testing::FillRandom(logits.data(), logits.size(), rng, stddev);
  for (int row = 0; row < rows; ++row) {
    float* x = logits.data() + int64_t{row} * vocab;
    for (int peak = 0; peak < 8; ++peak) x[Uniform(rng, 0, vocab - 1)] += 3.0f * stddev;
    if (ties) {
      const float top = *std::max_element(x, x + vocab) + 1.0f;
      const int a = Uniform(rng, 0, vocab - 1), b = Uniform(rng, 0, vocab - 1);
      x[a] = top;
      x[b] = top;
    }
  }
  return logits;
}

int HostArgmax(const float* x, int vocab) {
  int best = 0;
  for (int id = 1; id < vocab; ++id) {
    if (x[id] > x[best]) best = id;
  }
  return best;
}

double HostLogSoftmax(const float* x, int vocab, int token) {
  const double top = *std::max_element(x, x + vocab);
  double sum = 0;
  for (int id = 0; id < vocab; ++id) sum += std::exp(static_cast<double>(x[id]) - top);
  return x[token] - top - std::log(sum);
}

struct SampleRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

SampleRun RunSampler(const DeviceBuffer<float>& logits, int rows, int vocab,
                     const std::vector<SamplingRowParams>& params) {
  const DeviceBuffer<SamplingRowParams> params_gpu(params);
  DeviceBuffer<int32_t> tokens(std::vector<int32_t>(rows, -1));
  DeviceBuffer<float> logprobs(std::vector<float>(rows, std::numeric_limits<float>::quiet_NaN()));
  DeviceBuffer<uint8_t> workspace(SampleTokensWorkspaceBytes(rows, vocab));
  SampleTokens(logits.get(), rows, vocab, params_gpu.get(), tokens.get(), logprobs.get(),
               workspace.get(), workspace.size(), nullptr);
  return {tokens.ToHost(), logprobs.ToHost()};
}

SamplingRowParams Knobs(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                        uint64_t offset) {
  return SamplingRowParams{temperature, top_k, top_p, min_p, seed, offset};
}

TEST(CudaSamplingTest, PhiloxMatchesRandom123KnownAnswers) {
  // Host-side: the generator the sampler draws from (no GPU needed).
  const uint32_t zero_counter[4] = {0, 0, 0, 0}, zero_key[2] = {0, 0};
  const uint32_t ones_counter[4] = {~0u, ~0u, ~0u, ~0u}, ones_key[2] = {~0u, ~0u};
  const uint32_t pi_counter[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  const uint32_t pi_key[2] = {0xa4093822u, 0x299f31d0u};
  const struct {
    const uint32_t (&counter)[4];
    const uint32_t (&key)[2];
    uint32_t expected[4];
  } kCases[] = {{zero_counter, zero_key, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
                {ones_counter, ones_key, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
                {pi_counter, pi_key, {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}};
  for (const auto& test_case : kCases) {
    const Philox4x32Out out = Philox4x32_10(test_case.counter, test_case.key);
    for (int word = 0; word < 4; ++word) EXPECT_EQ(out.words[word], test_case.expected[word]);
  }
}

TEST(CudaSamplingTest, GreedyIsArgmaxAndLogprobIsRaw) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  for (int vocab : {1, 7, 1000, 128256}) {
    const int rows = vocab == 128256 ? 64 : 256;
    const std::vector<float> logits = RandomLogits(rows, vocab, 2.0f, vocab > 1, rng);
    const DeviceBuffer<float> logits_gpu(logits);
    // Greedy rows mixed with sampled rows in one launch: each row follows its own knobs.
    std::vector<SamplingRowParams> params;
    for (int row = 0; row < rows; ++row) {
      params.push_back(row % 3 == 2 ? Knobs(0.9f, 0, 0.9f, 0.0f, row, 1)
                                    : Knobs(row % 3 == 0 ? 0.0f : -1.0f, 5, 0.5f, 0.1f, row, 1));
    }
    const SampleRun run = RunSampler(logits_gpu, rows, vocab, params);
    for (int row = 0; row < rows; ++row) {
      const float* x = logits.data() + int64_t{row} * vocab;
      if (params[row].temperature <= 0) {
        ASSERT_EQ(run.tokens[row], HostArgmax(x, vocab)) << "vocab " << vocab << " row " << row;
      }
      ASSERT_TRUE(run.tokens[row] >= 0 && run.tokens[row] < vocab);
      EXPECT_NEAR(run.logprobs[row], HostLogSoftmax(x, vocab, run.tokens[row]), 1e-4)
          << "vocab " << vocab << " row " << row;
    }
  }
}

TEST(CudaSamplingTest, TopKOneIsGreedy) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  const int rows = 128, vocab = 32000;
  const std::vector<float> logits = RandomLogits(rows, vocab, 1.5f, true, rng);
  const DeviceBuffer<float> logits_gpu(logits);
  std::vector<SamplingRowParams> params;
  for (int row = 0; row < rows; ++row) {
    params.push_back(
        Knobs(row % 2 == 0 ? 1.0f : 0.5f, 1, row % 4 < 2 ? 1.0f : 0.3f, 0.0f, rng(), row));
  }
  const SampleRun run = RunSampler(logits_gpu, rows, vocab, params);
  for (int row = 0; row < rows; ++row) {
    EXPECT_EQ(run.tokens[row], HostArgmax(logits.data() + int64_t{row} * vocab, vocab))
        << "row " << row;
  }
}

TEST(CudaSamplingTest, SeededDrawsRepeatWhateverTheRow) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  const int rows = 200, vocab = 128256;
  // One logits row repeated, so that a row's token depends only on its knobs.
  const std::vector<float> row_logits = RandomLogits(1, vocab, 3.0f, false, rng);
  std::vector<float> logits;
  for (int row = 0; row < rows; ++row) {
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
  }
  const DeviceBuffer<float> logits_gpu(logits);
  std::vector<SamplingRowParams> params;
  for (int row = 0; row < rows; ++row) {
    params.push_back(Knobs(1.0f, row % 2 == 0 ? 0 : 50, row % 3 == 0 ? 1.0f : 0.95f,
                           row % 5 == 0 ? 0.01f : 0.0f, rng(), Uniform(rng, 0, 1000)));
  }
  const SampleRun first = RunSampler(logits_gpu, rows, vocab, params);
  const SampleRun second = RunSampler(logits_gpu, rows, vocab, params);
  EXPECT_EQ(first.tokens, second.tokens);
  EXPECT_EQ(std::memcmp(first.logprobs.data(), second.logprobs.data(), rows * sizeof(float)), 0);
  // The same knobs in other rows give the same tokens.
  std::vector<SamplingRowParams> reversed(params.rbegin(), params.rend());
  const SampleRun moved = RunSampler(logits_gpu, rows, vocab, reversed);
  for (int row = 0; row < rows; ++row) EXPECT_EQ(moved.tokens[rows - 1 - row], first.tokens[row]);
  // Different offsets draw differently (a sanity check that the counter is used).
  int distinct = 0;
  std::vector<SamplingRowParams> shifted = params;
  for (SamplingRowParams& knobs : shifted) {
    knobs.top_k = 0;
    knobs.top_p = 1.0f;
    knobs.min_p = 0.0f;
  }
  const SampleRun base = RunSampler(logits_gpu, rows, vocab, shifted);
  for (SamplingRowParams& knobs : shifted) knobs.offset += 1;
  const SampleRun next = RunSampler(logits_gpu, rows, vocab, shifted);
  for (int row = 0; row < rows; ++row) distinct += base.tokens[row] != next.tokens[row];
  EXPECT_GT(distinct, rows / 10);
}

// The host Sampler's distribution (runtime/sampler.cc) in double: temperature, top-k (ties to the
// lower id), top-p over the renormalised top-k, min-p, renormalised.
std::vector<double> ExpectedDistribution(const float* x, int vocab,
                                         const SamplingRowParams& knobs) {
  std::vector<double> scaled(vocab);
  for (int id = 0; id < vocab; ++id) scaled[id] = static_cast<double>(x[id] / knobs.temperature);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scaled[a] > scaled[b]; });
  int count = knobs.top_k > 0 ? std::min(knobs.top_k, vocab) : vocab;
  std::vector<double> probs(count);
  double total = 0;
  for (int index = 0; index < count; ++index) {
    probs[index] = std::exp(scaled[order[index]] - scaled[order[0]]);
    total += probs[index];
  }
  for (double& p : probs) p /= total;
  if (knobs.top_p < 1.0f) {
    double cumulative = 0;
    int keep = 0;
    while (keep < count) {
      cumulative += probs[keep++];
      if (cumulative >= knobs.top_p) break;
    }
    count = keep;
  }
  if (knobs.min_p > 0.0f) {
    int keep = 1;
    while (keep < count && probs[keep] >= knobs.min_p * probs[0]) ++keep;
    count = keep;
  }
  std::vector<double> out(vocab, 0.0);
  double mass = 0;
  for (int index = 0; index < count; ++index) mass += probs[index];
  for (int index = 0; index < count; ++index) out[order[index]] = probs[index] / mass;
  return out;
}

// The sorted probabilities after temperature and top-k, for placing top-p and min-p cuts midway
// between two neighbours (so float-vs-double rounding cannot move them).
std::vector<double> SortedTopKProbs(const float* x, int vocab, float temperature, int top_k) {
  SamplingRowParams knobs = Knobs(temperature, top_k, 1.0f, 0.0f, 0, 0);
  std::vector<double> probs = ExpectedDistribution(x, vocab, knobs);
  std::sort(probs.rbegin(), probs.rend());
  while (!probs.empty() && probs.back() == 0.0) probs.pop_back();
  return probs;
}

// Shapes of logits rows for the statistical test, each an edge case of the GPU sampler's
// histogram-then-collect design (sampling_kernels.cu).
enum class Shape {
  kPeaked,     // N(0, 1) with planted peaks (RandomLogits): the common case
  kTiesAtCut,  // kPeaked, then ranks [kTieStart, kTieStart + kTieCount) set equal: ties at the cut
  kFlat,       // every logit the same random value: one bin holds the whole row
  kNarrow,     // N(0, 0.01): a few bins of s hold everything, far more tokens than one collect
};
constexpr int kTieStart = 40, kTieCount = 300;

std::vector<float> ShapedLogits(Shape shape, int vocab, std::mt19937_64& rng) {
  switch (shape) {
    case Shape::kPeaked:
      return RandomLogits(1, vocab, 1.0f, false, rng);
    case Shape::kTiesAtCut: {
      std::vector<float> x = RandomLogits(1, vocab, 1.0f, false, rng);
      std::vector<int> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
      const float tied = x[order[kTieStart]];
      for (int rank = kTieStart; rank < kTieStart + kTieCount; ++rank) x[order[rank]] = tied;
      return x;
    }
    case Shape::kFlat:
      return std::vector<float>(vocab, std::normal_distribution<float>(0.0f, 3.0f)(rng));
    case Shape::kNarrow: {
      std::vector<float> x(vocab);
      ::sieve::testing::FillRandom(x.data(), x.size(), rng, 0.01f);
      return x;
    }
  }
  return {};
}

TEST(CudaSamplingTest, DrawsFollowTheFilteredDistribution) {
  SIEVE_REQUIRE_GPU();
  auto rng = ::sieve::testing::MakeRng();
  struct Case {
    int vocab;
    float temperature;
    int top_k;
    int top_p_length;  // > 0: top_p placed so that exactly this many tokens stay
    int min_p_length;  // > 0: min_p placed so that this many of the top-k tokens pass it
    Shape shape = Shape::kPeaked;
    double top_p_mass = 0;  // > 0: top_p_length is the shortest prefix with this much mass
    float min_p = 0;        // > 0: this min_p as it is
  };
  const Case kCases[] = {
      {50, 1.0f, 0, 0, 0},        // the whole softmax
      {128256, 0.8f, 40, 0, 0},   // top-k at Llama-3's vocabulary (drawn from its head)
      {1000, 1.3f, 0, 25, 0},     // top-p
      {1000, 1.0f, 100, 60, 30},  // all three: min-p is the tightest
      {32000, 0.7f, 0, 0, 12},    // min-p alone
      {32000, 0.7f, 60, 0, 25},   // top-k with min-p (from the head)
      {5000, 1.0f, 200, 150, 0},  // top-p inside top-k (from the head)
      // A vocabulary that is no multiple of any tile, with top-k and top-p; the head (the bins up
      // to top-k's cut bin, ~540 tokens) is too large to be sorted: the general path.
      {100003, 0.9f, 500, 200, 0},
      // top_p near 1: the cut deep in the tail.
      {32000, 1.0f, 0, 0, 0, Shape::kPeaked, 0.999},
      // Equal logits straddling the top-k cut and the top-p cut: the lower ids win.
      {3000, 1.0f, 100, 0, 0, Shape::kTiesAtCut},
      {3000, 1.0f, 0, 120, 0, Shape::kTiesAtCut},
      // A flat row: top-k, top-p and min-p all cut inside one bin of 20000 tokens.
      {20000, 1.0f, 3000, 0, 0, Shape::kFlat, 0, 0.05f},
      {20000, 0.7f, 0, 2000, 0, Shape::kFlat},
      // Nearly flat: tens of thousands of tokens a bin, narrowed by radix passes.
      {128256, 1.0f, 5000, 0, 0, Shape::kNarrow},
      {128256, 1.0f, 0, 3000, 0, Shape::kNarrow},
      // Both, top-p's cut inside top-k's narrowed bin.
      {128256, 1.0f, 5000, 3000, 0, Shape::kNarrow},
  };
  // Every fifth row is greedy (and must give the argmax): rows with different knobs share the
  // launch. 256 sampled rows x 64 launches = 16384 draws a case.
  constexpr int kRows = 320, kLaunches = 64;
  const auto greedy_row = [](int row) { return row % 5 == 4; };
  for (const Case& test_case : kCases) {
    const int vocab = test_case.vocab;
    const std::vector<float> row_logits = ShapedLogits(test_case.shape, vocab, rng);
    const float* x = row_logits.data();
    SamplingRowParams knobs = Knobs(test_case.temperature, test_case.top_k, 1.0f, 0.0f, 0, 0);
    const std::vector<double> sorted = SortedTopKProbs(x, vocab, knobs.temperature, knobs.top_k);
    int top_p_length = test_case.top_p_length;
    if (test_case.top_p_mass > 0) {
      double cumulative = 0;
      while (top_p_length < static_cast<int>(sorted.size()) && cumulative < test_case.top_p_mass) {
        cumulative += sorted[top_p_length++];
      }
    }
    if (top_p_length > 0) {
      // Midway through the last kept token's probability: float-vs-double rounding and the GPU's
      // fixed-point weights cannot move the cut.
      double below = 0;
      for (int index = 0; index < top_p_length - 1; ++index) below += sorted[index];
      knobs.top_p = static_cast<float>(below + sorted[top_p_length - 1] / 2);
    }
    if (test_case.min_p_length > 0) {
      const int last = test_case.min_p_length - 1;
      knobs.min_p = static_cast<float>((sorted[last] + sorted[last + 1]) / 2 / sorted[0]);
    }
    if (test_case.min_p > 0) knobs.min_p = test_case.min_p;
    const std::vector<double> expected = ExpectedDistribution(x, vocab, knobs);
    const int argmax = HostArgmax(x, vocab);
    std::vector<float> logits;
    for (int row = 0; row < kRows; ++row) {
      logits.insert(logits.end(), row_logits.begin(), row_logits.end());
    }
    const DeviceBuffer<float> logits_gpu(logits);
    std::vector<int64_t> counts(vocab, 0);
    const uint64_t seed = rng();
    for (int launch = 0; launch < kLaunches; ++launch) {
      std::vector<SamplingRowParams> params(kRows, knobs);
      for (int row = 0; row < kRows; ++row) {
        params[row].seed = seed + row;
        params[row].offset = launch;
        if (greedy_row(row)) params[row].temperature = 0.0f;
      }
      const SampleRun run = RunSampler(logits_gpu, kRows, vocab, params);
      for (int row = 0; row < kRows; ++row) {
        const int32_t token = run.tokens[row];
        if (greedy_row(row)) {
          ASSERT_EQ(token, argmax) << "vocab " << vocab << " row " << row;
          continue;
        }
        ASSERT_TRUE(token >= 0 && token < vocab);
        ++counts[token];
      }
    }
    const double draws = static_cast<double>(kRows - kRows / 5) * kLaunches;
    // Chi-square over the tokens expected >= 5 times; the rest pooled into one bin.
    double chi_square = 0, pooled_expected = 0, pooled_observed = 0;
    int bins = 0;
    for (int id = 0; id < vocab; ++id) {
      if (expected[id] == 0.0) {
        ASSERT_EQ(counts[id], 0) << "token " << id << " is outside the kept set (vocab " << vocab
                                 << ")";
        continue;
      }
      const double wanted = expected[id] * draws;
      if (wanted < 5.0) {
        pooled_expected += wanted;
        pooled_observed += static_cast<double>(counts[id]);
        continue;
      }
      chi_square += (counts[id] - wanted) * (counts[id] - wanted) / wanted;
      ++bins;
    }
    if (pooled_expected >= 5.0) {
      chi_square += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) /
                    pooled_expected;
      ++bins;
    }
    const double dof = std::max(1, bins - 1);
    // Limit: dof + 6 sd (sd = sqrt(2 dof)) + 10. Under the right distribution the chi-square
    // statistic exceeds it with probability P(chi2_dof > limit) <= 1.0e-5 (the worst case, dof 1:
    // P(chi2_1 > 19.5); 1.0e-6 at dof 10, 5e-9 at dof 1000), so this test fails falsely with
    // probability below 16 cases x 1.0e-5 = 1.6e-4 a run (up to the chi-square approximation,
    // kept honest by pooling tokens expected fewer than 5 times). A wrong distribution (a token
    // off by 10% of a few percent of the mass) exceeds it by far.
    const double limit = dof + 6.0 * std::sqrt(2.0 * dof) + 10.0;
    std::printf(
        "vocab %d T %.2f top_k %d top_p %.4f min_p %.4f: chi2 %.1f over %d bins (limit "
        "%.1f)\n",
        vocab, knobs.temperature, knobs.top_k, knobs.top_p, knobs.min_p, chi_square, bins, limit);
    EXPECT_LE(chi_square, limit) << "vocab " << vocab;
  }
}

}  // namespace
}  // namespace sieve::cuda
