// SPARSITY.md test 2: the CPU backend's fused scoring (WindowScores, from the prefill LSE) and
// selection (SelectKept) equal a direct, unfused computation of the formulas on random inputs:
// the full softmax of each scored row in double, column sums per query head, GQA reduction,
// pooling, then top-k with ties toward the lower position. Also checks StreamingLLM's
// kFirstPositions mode and that WriteKeptKv writes exactly the selected rows into the pages.
//
// Tolerances: the op scores in fp32, the reference in double. Each score is a sum of exp() terms
// (W of them per query head; n for H2O), all positive, so its relative error stays near fp32's
// rounding: the worst seen over 12 seeds was 2.3e-6, and kScoreTolerance leaves ~9x margin.
// Selections are compared as the sorted multisets of reference scores at the kept positions
// (relative kSelectionTolerance): an index may differ only where two candidates tie within fp32
// error, and such near-tie swaps are counted and printed, not failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/step_meta_testing.h"
#include "core/testing.h"
#include "sparsity/kv_policy.h"

namespace sieve {
namespace {

constexpr double kScoreTolerance = 2e-5;
constexpr double kSelectionTolerance = 1e-5;

using testing::MakePrefillStepMeta;
using testing::SeqChunk;

int Uniform(std::mt19937_64& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}

// One compression problem: a prompt of n keys, scored and selected with these knobs.
struct Problem {
  int n;
  int num_heads;   // H
  int kv_heads;    // G
  int head_dim;    // d
  int window;      // W
  int budget;      // C
  int score_rows;  // R: W for SnapKV, n for H2O
  PoolKind pool;
  int kernel;
  GroupReduce reduce;

  std::string ToString() const {
    return "n=" + std::to_string(n) + " H=" + std::to_string(num_heads) +
           " G=" + std::to_string(kv_heads) + " d=" + std::to_string(head_dim) +
           " W=" + std::to_string(window) + " C=" + std::to_string(budget) +
           " R=" + std::to_string(score_rows) + " pool=" + std::to_string(static_cast<int>(pool)) +
           " k=" + std::to_string(kernel) + " reduce=" + std::to_string(static_cast<int>(reduce));
  }
};

CompressionJob MakeJob(const Problem& problem, int layer, int prefill_seq, int score_offset,
                       int index_offset, SelectMode mode = SelectMode::kTopScores) {
  return CompressionJob{
      layer,          prefill_seq,  problem.n,      problem.window, problem.score_rows,
      problem.budget, problem.pool, problem.kernel, problem.reduce, mode,
      score_offset,   index_offset, prefill_seq};
}

// Inputs of one sequence as the prefill pass leaves them. q holds only the chunk's rows
// [context, n), as columns of a fused qkv buffer (so its row stride is not H * d); k and v hold
// every key; lse holds the chunk rows' log-sum-exp (NaN outside the scored rows, so a read of
// any other row shows up).
struct SeqInputs {
  int context = 0;
  Tensor qkv;  // [n - context][(H + 2G) d]
  Tensor q;    // Columns [0, H d) of qkv
  Tensor k;    // [n][G][d]
  Tensor v;    // [n][G][d]
  Tensor lse;  // [n - context][H]
};

double Scale(const Problem& problem) {
  return 1.0 / std::sqrt(static_cast<double>(problem.head_dim));
}

// Causal scaled scores of prompt row `row` for query head `head`, in double: s[j] for j <= row.
void RowScores(const Problem& problem, const SeqInputs& inputs, int row, int head,
               std::vector<double>& scores) {
  const int d = problem.head_dim;
  const int group = problem.num_heads / problem.kv_heads;
  const float* q_row =
      inputs.q.data_as<float>() + (row - inputs.context) * inputs.q.stride(0) + head * d;
  scores.resize(row + 1);
  for (int key = 0; key <= row; ++key) {
    const float* k_row = inputs.k.data_as<float>() +
                         (static_cast<int64_t>(key) * problem.kv_heads + head / group) * d;
    double dot = 0;
    for (int dim = 0; dim < d; ++dim) dot += static_cast<double>(q_row[dim]) * k_row[dim];
    scores[key] = Scale(problem) * dot;
  }
}

double LogSumExp(const std::vector<double>& scores) {
  const double top = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (double score : scores) sum += std::exp(score - top);
  return top + std::log(sum);
}

SeqInputs MakeInputs(const Problem& problem, int context, std::mt19937_64& rng) {
  SeqInputs inputs;
  inputs.context = context;
  const int rows = problem.n - context;
  const int hd = problem.num_heads * problem.head_dim;
  const int gd = problem.kv_heads * problem.head_dim;
  // A random spread of logits: from nearly flat attention to sharply peaked.
  const float stddev = std::uniform_real_distribution<float>(0.5f, 1.6f)(rng);
  inputs.qkv = testing::RandomTensor({rows, hd + 2 * gd}, rng, stddev);
  inputs.q = inputs.qkv.Columns(0, hd);
  inputs.k = testing::RandomTensor({problem.n, problem.kv_heads, problem.head_dim}, rng, stddev);
  inputs.v = testing::RandomTensor({problem.n, problem.kv_heads, problem.head_dim}, rng);
  inputs.lse = Tensor::Empty({rows, problem.num_heads}, DType::kF32);
  float* lse = inputs.lse.data_as<float>();
  std::fill(lse, lse + inputs.lse.numel(), std::numeric_limits<float>::quiet_NaN());
  std::vector<double> scores;
  for (int row = problem.n - problem.score_rows; row < problem.n; ++row) {
    for (int head = 0; head < problem.num_heads; ++head) {
      RowScores(problem, inputs, row, head, scores);
      lse[(row - context) * problem.num_heads + head] = static_cast<float>(LogSumExp(scores));
    }
  }
  return inputs;
}

// The unfused reference: a[g][j] for every key j < n ([G][n]), from each scored row's full
// softmax (its own log-sum-exp, recomputed here in double).
std::vector<double> ReferenceScores(const Problem& problem, const SeqInputs& inputs) {
  const int n = problem.n;
  const int group = problem.num_heads / problem.kv_heads;
  std::vector<double> reduced(static_cast<size_t>(problem.kv_heads) * n, 0.0);
  std::vector<double> head_sum(n), scores;
  for (int head = 0; head < problem.num_heads; ++head) {
    std::fill(head_sum.begin(), head_sum.end(), 0.0);
    for (int row = n - problem.score_rows; row < n; ++row) {
      RowScores(problem, inputs, row, head, scores);
      const double lse = LogSumExp(scores);
      for (int key = 0; key <= row; ++key) head_sum[key] += std::exp(scores[key] - lse);
    }
    double* out = reduced.data() + static_cast<size_t>(head / group) * n;
    for (int key = 0; key < n; ++key) {
      out[key] = problem.reduce == GroupReduce::kMax ? std::max(out[key], head_sum[key])
                                                     : out[key] + head_sum[key] / group;
    }
  }
  return reduced;
}

// Pooling over the prefix, stride 1, "same" length: max with -inf padding, or average with zero
// padding divided by the full kernel (PyTorch's count_include_pad=True).
std::vector<double> ReferencePool(const double* scores, int count, PoolKind pool, int kernel) {
  std::vector<double> pooled(scores, scores + count);
  if (pool == PoolKind::kNone || kernel <= 1) return pooled;
  const int half = kernel / 2;
  for (int position = 0; position < count; ++position) {
    double best = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int offset = -half; offset <= half; ++offset) {
      const int index = position + offset;
      const double value = index >= 0 && index < count ? scores[index]
                           : pool == PoolKind::kMax    ? -std::numeric_limits<double>::infinity()
                                                       : 0.0;
      best = std::max(best, value);
      sum += value;
    }
    pooled[position] = pool == PoolKind::kMax ? best : sum / kernel;
  }
  return pooled;
}

// The `keep` best positions, ascending; ties toward the lower position.
template <typename T>
std::vector<int> ReferenceTop(const std::vector<T>& pooled, int keep) {
  std::vector<int> order(pooled.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pooled[a] > pooled[b]; });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  return order;
}

// Counts of what the comparisons saw, printed once per test.
struct Tally {
  int cases = 0;
  int heads = 0;
  int heads_with_index_mismatch = 0;
  int mismatched_indices = 0;
  double worst_score_error = 0;
  double worst_selection_error = 0;

  void Print(const std::string& name) const {
    std::cout << "[" << name << "] " << cases << " cases, " << heads << " KV heads; near-tie index "
              << "mismatches: " << mismatched_indices << " positions in "
              << heads_with_index_mismatch << " heads; worst score rel. error " << worst_score_error
              << " (tol " << kScoreTolerance << "), worst kept-score rel. "
              << "error " << worst_selection_error << " (tol " << kSelectionTolerance << ")\n";
  }
};

double RelativeError(double actual, double expected) {
  const double scale = std::max(std::abs(expected), std::abs(actual));
  return scale == 0 ? 0 : std::abs(actual - expected) / scale;
}

// Checks one job's scores ([G][n] at job.score_offset) and kept positions ([G][C - W] at
// job.index_offset) against the reference.
void CheckJob(const Problem& problem, const SeqInputs& inputs, const CompressionJob& job,
              const Tensor& scores, const Tensor& kept, Tally& tally) {
  SCOPED_TRACE(problem.ToString());
  const int n = problem.n;
  const int prefix = n - problem.window;
  const int keep = problem.budget - problem.window;
  const std::vector<double> reference = ReferenceScores(problem, inputs);
  ++tally.cases;
  for (int kv_head = 0; kv_head < problem.kv_heads; ++kv_head) {
    SCOPED_TRACE("kv head " + std::to_string(kv_head));
    ++tally.heads;
    const float* actual = scores.data_as<float>() + job.score_offset + int64_t{kv_head} * n;
    const double* expected = reference.data() + static_cast<size_t>(kv_head) * n;
    for (int key = 0; key < n; ++key) {
      const double error = RelativeError(actual[key], expected[key]);
      tally.worst_score_error = std::max(tally.worst_score_error, error);
      ASSERT_LE(error, kScoreTolerance)
          << "key " << key << ": " << actual[key] << " vs " << expected[key];
    }

    const int32_t* selected = kept.data_as<int32_t>() + job.index_offset + int64_t{kv_head} * keep;
    const std::vector<int> chosen(selected, selected + keep);
    for (int index = 0; index < keep; ++index) {
      ASSERT_GE(chosen[index], 0);
      ASSERT_LT(chosen[index], prefix);
      if (index > 0) {
        ASSERT_LT(chosen[index - 1], chosen[index]) << "not ascending and unique";
      }
    }

    // Exact: on the op's own fp32 scores, max pooling is exact, so the kept set must be exactly
    // the top-k with ties toward the lower position.
    if (problem.pool != PoolKind::kAvg || problem.kernel <= 1) {
      std::vector<float> pooled(prefix);
      for (int position = 0; position < prefix; ++position) {
        float best = actual[position];
        if (problem.pool == PoolKind::kMax) {
          for (int index = std::max(0, position - problem.kernel / 2);
               index <= std::min(prefix - 1, position + problem.kernel / 2); ++index) {
            best = std::max(best, actual[index]);
          }
        }
        pooled[position] = best;
      }
      ASSERT_EQ(chosen, ReferenceTop(pooled, keep)) << "selection on the op's own scores";
    }

    // Against the double reference: the sorted reference scores at the kept positions equal those
    // at the reference's positions (so the k-th largest agrees too); indices may differ at
    // near-ties.
    const std::vector<double> pooled =
        ReferencePool(expected, prefix, problem.pool, problem.kernel);
    const std::vector<int> wanted = ReferenceTop(pooled, keep);
    std::vector<double> got_scores, wanted_scores;
    for (int index = 0; index < keep; ++index) {
      got_scores.push_back(pooled[chosen[index]]);
      wanted_scores.push_back(pooled[wanted[index]]);
    }
    std::sort(got_scores.rbegin(), got_scores.rend());
    std::sort(wanted_scores.rbegin(), wanted_scores.rend());
    for (int index = 0; index < keep; ++index) {
      const double error = RelativeError(got_scores[index], wanted_scores[index]);
      tally.worst_selection_error = std::max(tally.worst_selection_error, error);
      ASSERT_LE(error, kSelectionTolerance)
          << "rank " << index << ": " << got_scores[index] << " vs " << wanted_scores[index];
    }
    std::vector<int> missing;
    std::set_difference(wanted.begin(), wanted.end(), chosen.begin(), chosen.end(),
                        std::back_inserter(missing));
    if (!missing.empty()) {
      ++tally.heads_with_index_mismatch;
      tally.mismatched_indices += static_cast<int>(missing.size());
    }
  }
}

// Scores and selects one problem as the only prefill sequence of a step (context 0, the whole
// prompt in one chunk), then checks it.
void RunSingle(CpuBackend& backend, const Problem& problem, std::mt19937_64& rng, Tally& tally) {
  const SeqInputs inputs = MakeInputs(problem, 0, rng);
  const int layer = Uniform(rng, 0, 2);
  const int score_offset = Uniform(rng, 0, 9);
  const int index_offset = Uniform(rng, 0, 9);
  const CompressionJob job = MakeJob(problem, layer, 0, score_offset, index_offset);
  const StepMeta step = MakePrefillStepMeta({{problem.n, 0}}, 3, {job});
  Tensor scores =
      Tensor::Empty({score_offset + int64_t{problem.kv_heads} * problem.n}, DType::kF32);
  Tensor kept = Tensor::Empty(
      {index_offset + int64_t{problem.kv_heads} * (problem.budget - problem.window)}, DType::kI32);
  backend.WindowScores(inputs.q, inputs.k, inputs.lse, problem.num_heads, step, layer, scores);
  backend.SelectKept(scores, problem.kv_heads, step, layer, kept);
  CheckJob(problem, inputs, job, scores, kept, tally);
}

PoolKind RandomPool(std::mt19937_64& rng, int* kernel) {
  const PoolKind pool = static_cast<PoolKind>(Uniform(rng, 0, 2));
  *kernel = pool == PoolKind::kNone ? 1 : (Uniform(rng, 0, 1) ? 5 : 7);
  return pool;
}

TEST(SelectionReferenceTest, WindowScoresAndSelectionMatchTheUnfusedFormulas) {
  auto rng = testing::MakeRng();
  CpuBackend backend;
  Tally tally;
  struct Heads {
    int num_heads, kv_heads;
  };
  struct Pooling {
    PoolKind pool;
    int kernel;
  };
  constexpr Pooling kPoolings[] = {{PoolKind::kMax, 5},
                                   {PoolKind::kAvg, 7},
                                   {PoolKind::kNone, 1},
                                   {PoolKind::kMax, 7},
                                   {PoolKind::kAvg, 5}};
  size_t case_index = 0;
  for (const Heads heads : {Heads{4, 4}, Heads{8, 2}}) {
    for (int window : {1, 8, 32, 64}) {
      // n from W + 1 (only C = n fits: keep the whole one-position prefix) to a few thousand,
      // with budgets at the edges: keep one, keep all but one, keep all.
      std::vector<std::pair<int, int>> sizes;  // (n, C)
      sizes.push_back({window + 1, window + 1});
      for (int trial = 0; trial < 6; ++trial) {
        const int n = Uniform(rng, window + 2, trial < 4 ? 600 : 2500);
        int budget;
        switch (trial % 3) {
          case 0:
            budget = window + 1;
            break;
          case 1:
            budget = n - 1;
            break;
          default:
            budget = Uniform(rng, window + 1, n);
        }
        sizes.push_back({n, budget});
      }
      for (const auto& [n, budget] : sizes) {
        Problem problem{n,      heads.num_heads, heads.kv_heads, Uniform(rng, 0, 1) ? 64 : 16,
                        window, budget,          window};
        // Every pooling (max and avg at kernels 5 and 7, none) and both reductions, in turn.
        const Pooling& pooling = kPoolings[case_index % std::size(kPoolings)];
        problem.pool = pooling.pool;
        problem.kernel = pooling.kernel;
        problem.reduce =
            case_index / std::size(kPoolings) % 2 == 0 ? GroupReduce::kMean : GroupReduce::kMax;
        ++case_index;
        RunSingle(backend, problem, rng, tally);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  // The long prompt of SPARSITY.md's range, once per pooling kind.
  for (PoolKind pool : {PoolKind::kMax, PoolKind::kAvg, PoolKind::kNone}) {
    Problem problem{5000, 8, 2, 64, 64, Uniform(rng, 65, 2048), 64};
    problem.pool = pool;
    problem.kernel = pool == PoolKind::kNone ? 1 : (Uniform(rng, 0, 1) ? 5 : 7);
    problem.reduce = static_cast<GroupReduce>(Uniform(rng, 0, 1));
    RunSingle(backend, problem, rng, tally);
    if (::testing::Test::HasFatalFailure()) return;
  }
  tally.Print("window scores");
}

// H2O scores every prompt row (score_rows = n), so every row's LSE is read.
TEST(SelectionReferenceTest, AllRowScoresMatchForH2o) {
  auto rng = testing::MakeRng();
  CpuBackend backend;
  Tally tally;
  for (int trial = 0; trial < 8; ++trial) {
    const int n = Uniform(rng, 2, 400);
    const int window = Uniform(rng, 1, n - 1);  // recent
    const int budget = Uniform(rng, window + 1, n);
    const bool gqa = trial % 2 == 1;
    Problem problem{
        n,      gqa ? 8 : 4, gqa ? 2 : 4,     32, window,
        budget, n,           PoolKind::kNone, 1,  static_cast<GroupReduce>(Uniform(rng, 0, 1))};
    RunSingle(backend, problem, rng, tally);
    if (::testing::Test::HasFatalFailure()) return;
  }
  tally.Print("h2o scores");
}

// Several prefill sequences in one step, jobs in two layers, and a final chunk that starts after
// earlier chunks (context > 0): each job reads its own rows, keys and LSE.
TEST(SelectionReferenceTest, BatchedJobsWithEarlierChunks) {
  auto rng = testing::MakeRng();
  CpuBackend backend;
  Tally tally;
  const int num_heads = 8, kv_heads = 2, head_dim = 32;
  std::vector<Problem> problems;
  std::vector<SeqChunk> seqs;
  for (int seq = 0; seq < 3; ++seq) {
    const int window = Uniform(rng, 1, 32);
    const int n = Uniform(rng, window + 1, 1500);
    Problem problem{n, num_heads, kv_heads, head_dim, window, Uniform(rng, window + 1, n), window};
    problem.pool = RandomPool(rng, &problem.kernel);
    problem.reduce = static_cast<GroupReduce>(Uniform(rng, 0, 1));
    problems.push_back(problem);
    seqs.push_back({n, seq == 0 ? 0 : Uniform(rng, 0, n - window)});
  }
  std::vector<SeqInputs> inputs;
  for (int seq = 0; seq < 3; ++seq)
    inputs.push_back(MakeInputs(problems[seq], seqs[seq].context, rng));
  // Concatenate the sequences' rows and keys the way one step lays them out.
  int64_t rows = 0, keys = 0;
  for (const SeqChunk& seq : seqs) {
    rows += seq.num_keys - seq.context;
    keys += seq.num_keys;
  }
  const int qkv_width = (num_heads + 2 * kv_heads) * head_dim;
  Tensor qkv = Tensor::Empty({rows, qkv_width}, DType::kF32);
  Tensor k = Tensor::Empty({keys, kv_heads, head_dim}, DType::kF32);
  Tensor v = Tensor::Empty({keys, kv_heads, head_dim}, DType::kF32);
  Tensor lse = Tensor::Empty({rows, num_heads}, DType::kF32);
  int64_t row_offset = 0, key_offset = 0;
  for (int seq = 0; seq < 3; ++seq) {
    const int64_t seq_rows = seqs[seq].num_keys - seqs[seq].context;
    std::memcpy(qkv.data_as<float>() + row_offset * qkv_width, inputs[seq].qkv.data(),
                inputs[seq].qkv.nbytes());
    std::memcpy(lse.data_as<float>() + row_offset * num_heads, inputs[seq].lse.data(),
                inputs[seq].lse.nbytes());
    std::memcpy(k.data_as<float>() + key_offset * kv_heads * head_dim, inputs[seq].k.data(),
                inputs[seq].k.nbytes());
    row_offset += seq_rows;
    key_offset += seqs[seq].num_keys;
  }
  // Jobs: sequences 0 and 2 in layer 1, sequence 1 in layer 0; offsets packed per layer.
  const int layer_of[3] = {1, 0, 1};
  std::vector<CompressionJob> jobs;
  int score_offset[2] = {0, 0}, index_offset[2] = {0, 0};
  for (int seq = 0; seq < 3; ++seq) {
    const Problem& problem = problems[seq];
    const int layer = layer_of[seq];
    jobs.push_back(MakeJob(problem, layer, seq, score_offset[layer], index_offset[layer]));
    score_offset[layer] += problem.kv_heads * problem.n;
    index_offset[layer] += problem.kv_heads * (problem.budget - problem.window);
  }
  const StepMeta step = MakePrefillStepMeta(seqs, 2, jobs);
  const Tensor q = qkv.Columns(0, num_heads * head_dim);
  for (int layer = 0; layer < 2; ++layer) {
    Tensor scores = Tensor::Empty({std::max(score_offset[layer], 1)}, DType::kF32);
    Tensor kept = Tensor::Empty({std::max(index_offset[layer], 1)}, DType::kI32);
    backend.WindowScores(q, k, lse, num_heads, step, layer, scores);
    backend.SelectKept(scores, kv_heads, step, layer, kept);
    for (int seq = 0; seq < 3; ++seq) {
      if (layer_of[seq] != layer) continue;
      const CompressionJob& job = *std::find_if(
          step.jobs_host.begin(), step.jobs_host.end(),
          [&](const CompressionJob& candidate) { return candidate.prefill_seq == seq; });
      CheckJob(problems[seq], inputs[seq], job, scores, kept, tally);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  tally.Print("batched");
}

// StreamingLLM keeps the sinks: kFirstPositions selects 0 .. C-W-1 for every head and needs no
// scores (WindowScores leaves its buffer alone).
TEST(SelectionReferenceTest, FirstPositionsKeepTheSinks) {
  auto rng = testing::MakeRng();
  CpuBackend backend;
  KvPolicyOptions options;
  options.sinks = Uniform(rng, 0, 8);
  options.recent = Uniform(rng, 1, 64);
  Result<KvPolicy> policy = KvPolicy::Parse("streamingllm", 1, options);
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  const int n = options.sinks + options.recent + Uniform(rng, 1, 300);
  const LayerPlan plan = policy->PlanPrompt(n)[0];
  ASSERT_TRUE(plan.compress);
  const int kv_heads = Uniform(rng, 1, 4);
  Problem problem{n,           kv_heads * 2,    kv_heads,  16,          plan.window,
                  plan.budget, plan.score_rows, plan.pool, plan.kernel, plan.reduce};
  const SeqInputs inputs = MakeInputs(problem, 0, rng);
  const CompressionJob job = MakeJob(problem, 0, 0, 0, 0, plan.mode);
  const StepMeta step = MakePrefillStepMeta({{n, 0}}, 1, {job});
  Tensor scores = Tensor::Empty({int64_t{kv_heads} * n}, DType::kF32);
  std::fill(scores.data_as<float>(), scores.data_as<float>() + scores.numel(), -7.0f);
  Tensor kept = Tensor::Empty({int64_t{kv_heads} * options.sinks + 1}, DType::kI32);
  std::fill(kept.data_as<int32_t>(), kept.data_as<int32_t>() + kept.numel(), -1);
  backend.WindowScores(inputs.q, inputs.k, inputs.lse, problem.num_heads, step, 0, scores);
  for (int64_t index = 0; index < scores.numel(); ++index) {
    ASSERT_EQ(scores.data_as<float>()[index], -7.0f) << "scores written at " << index;
  }
  backend.SelectKept(scores, kv_heads, step, 0, kept);
  for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
    for (int index = 0; index < options.sinks; ++index) {
      EXPECT_EQ(kept.data_as<int32_t>()[kv_head * options.sinks + index], index);
    }
  }
  EXPECT_EQ(kept.data_as<int32_t>()[kv_heads * options.sinks], -1) << "wrote past the job";
}

// WriteKeptKv copies exactly the kept rows (per KV head) and then the window into the layer's
// pages, in entry order, sets the layer's length to C, fills the side pools, and touches nothing
// else.
TEST(SelectionReferenceTest, WriteKeptKvWritesTheSelectedRows) {
  auto rng = testing::MakeRng();
  CpuBackend backend;
  for (SelectMode mode : {SelectMode::kTopScores, SelectMode::kFirstPositions}) {
    const int kv_heads = Uniform(rng, 1, 4), head_dim = 8, num_layers = 3, layer = 1;
    const int window = Uniform(rng, 1, 12);
    const int n = Uniform(rng, window + 2, 200);
    const int budget = Uniform(rng, window + 1, n - 1);
    const int keep = budget - window;
    Problem problem{n,
                    kv_heads * 2,
                    kv_heads,
                    head_dim,
                    window,
                    budget,
                    mode == SelectMode::kTopScores ? window : 0,
                    PoolKind::kMax,
                    5,
                    GroupReduce::kMean};
    SCOPED_TRACE(problem.ToString() + " mode " + std::to_string(static_cast<int>(mode)));

    // Sequence 1 of two, so its keys start after sequence 0's (key_start[1] > 0).
    const int other_keys = Uniform(rng, 1, 50);
    const std::vector<SeqChunk> seqs = {{other_keys, 0}, {n, 0}};
    const int64_t total_keys = other_keys + n;
    Tensor k = testing::RandomTensor({total_keys, kv_heads, head_dim}, rng);
    Tensor v = testing::RandomTensor({total_keys, kv_heads, head_dim}, rng);
    Tensor scores = testing::RandomTensor({int64_t{kv_heads} * n}, rng);
    // Kept positions: any ascending subset of the prefix, per head.
    Tensor kept = Tensor::Empty({int64_t{kv_heads} * keep}, DType::kI32);
    for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
      std::vector<int> prefix(n - window);
      std::iota(prefix.begin(), prefix.end(), 0);
      std::shuffle(prefix.begin(), prefix.end(), rng);
      prefix.resize(keep);
      std::sort(prefix.begin(), prefix.end());
      if (mode == SelectMode::kFirstPositions) std::iota(prefix.begin(), prefix.end(), 0);
      std::copy(prefix.begin(), prefix.end(), kept.data_as<int32_t>() + kv_head * keep);
    }

    KvPool pool;
    pool.page_size = 4;
    pool.num_pages = 128;
    pool.max_seqs = 3;
    pool.max_pages_per_seq = (budget + pool.page_size - 1) / pool.page_size + 1;
    pool.num_kv_heads = kv_heads;
    pool.head_dim = head_dim;
    ASSERT_LE(pool.max_pages_per_seq, pool.num_pages);
    const int64_t pool_entries = int64_t{pool.num_pages} * pool.page_size;
    pool.k = Tensor::Empty({pool.num_pages, pool.page_size, kv_heads, head_dim}, DType::kF32);
    pool.v = Tensor::Empty({pool.num_pages, pool.page_size, kv_heads, head_dim}, DType::kF32);
    pool.scores = Tensor::Empty({pool_entries, kv_heads}, DType::kF32);
    pool.positions = Tensor::Empty({pool_entries, kv_heads}, DType::kI32);
    constexpr float kUntouched = 12345.0f;
    for (Tensor* tensor : {&pool.k, &pool.v, &pool.scores}) {
      std::fill(tensor->data_as<float>(), tensor->data_as<float>() + tensor->numel(), kUntouched);
    }
    std::fill(pool.positions.data_as<int32_t>(),
              pool.positions.data_as<int32_t>() + pool.positions.numel(), -1);
    // The sequence's pages in this layer: a random subset of the pool, in random order.
    std::vector<int32_t> pages(pool.num_pages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    pool.page_table =
        Tensor::Empty({num_layers, pool.max_seqs, pool.max_pages_per_seq}, DType::kI32);
    std::fill(pool.page_table.data_as<int32_t>(),
              pool.page_table.data_as<int32_t>() + pool.page_table.numel(), -1);
    const int slot = 2;
    int32_t* page_row = pool.page_table.data_as<int32_t>() +
                        (int64_t{layer} * pool.max_seqs + slot) * pool.max_pages_per_seq;
    std::copy(pages.begin(), pages.begin() + pool.max_pages_per_seq, page_row);
    pool.kv_lens = Tensor::Empty({num_layers, pool.max_seqs}, DType::kI32);
    std::fill(pool.kv_lens.data_as<int32_t>(),
              pool.kv_lens.data_as<int32_t>() + pool.kv_lens.numel(), 77);

    CompressionJob job = MakeJob(problem, layer, 1, 0, 0, mode);
    job.seq_slot = slot;
    const StepMeta step = MakePrefillStepMeta(seqs, num_layers, {job});
    backend.WriteKeptKv(k, v, scores, kept, step, layer, pool);

    std::vector<bool> written(pool_entries, false);
    for (int entry = 0; entry < budget; ++entry) {
      const int64_t pool_entry =
          int64_t{page_row[entry / pool.page_size]} * pool.page_size + entry % pool.page_size;
      written[pool_entry] = true;
      for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
        const int key = entry < keep ? kept.data_as<int32_t>()[kv_head * keep + entry]
                                     : n - window + (entry - keep);
        const int64_t src = ((other_keys + key) * int64_t{kv_heads} + kv_head) * head_dim;
        const int64_t dst = (pool_entry * kv_heads + kv_head) * head_dim;
        for (int dim = 0; dim < head_dim; ++dim) {
          ASSERT_EQ(pool.k.data_as<float>()[dst + dim], k.data_as<float>()[src + dim])
              << "entry " << entry << " head " << kv_head << " key " << key;
          ASSERT_EQ(pool.v.data_as<float>()[dst + dim], v.data_as<float>()[src + dim])
              << "entry " << entry << " head " << kv_head << " key " << key;
        }
        EXPECT_EQ(pool.positions.data_as<int32_t>()[pool_entry * kv_heads + kv_head], key);
        EXPECT_EQ(pool.scores.data_as<float>()[pool_entry * kv_heads + kv_head],
                  mode == SelectMode::kTopScores
                      ? scores.data_as<float>()[int64_t{kv_head} * n + key]
                      : 0.0f);
      }
    }
    for (int64_t pool_entry = 0; pool_entry < pool_entries; ++pool_entry) {
      if (written[pool_entry]) continue;
      for (int64_t index = 0; index < int64_t{kv_heads} * head_dim; ++index) {
        ASSERT_EQ(pool.k.data_as<float>()[pool_entry * kv_heads * head_dim + index], kUntouched)
            << "pool entry " << pool_entry << " written";
        ASSERT_EQ(pool.v.data_as<float>()[pool_entry * kv_heads * head_dim + index], kUntouched)
            << "pool entry " << pool_entry << " written";
      }
    }
    for (int row_layer = 0; row_layer < num_layers; ++row_layer) {
      for (int row_slot = 0; row_slot < pool.max_seqs; ++row_slot) {
        EXPECT_EQ(pool.kv_lens.data_as<int32_t>()[row_layer * pool.max_seqs + row_slot],
                  row_layer == layer && row_slot == slot ? budget : 77);
      }
    }
  }
}

}  // namespace
}  // namespace sieve
