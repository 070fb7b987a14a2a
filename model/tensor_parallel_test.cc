// Tensor parallelism at the model level: the same steps (chunked prefills, compression at each
// prompt's end under every KV policy, decode steps with their evictions, prefills beside decodes)
// run through one rank and through N ranks, each rank a thread with its own CPU backend, its model
// shard, its KV pool holding only its KV heads, and the in-process communicator. Every rank's
// logits must equal the one-rank logits, and every KV entry a rank holds (K, V, and the side
// pools' positions and scores) the one-rank entry of the same KV head.
//
// Tolerance: 1e-4 absolute on logits, K and V (all O(1) here) and accumulated scores. The ranks
// compute each head exactly as one rank does; only the o and down projections' sums are split
// into per-rank partial sums added in another order, which moves f32 results by ~1e-6. Positions
// of kept entries and every layer's length must be equal exactly: the same entries are kept.
// Every rank's logits must also be bit-identical to rank 0's (the all-reduce gives every rank the
// same residual stream). GpuTensorParallelTest (label gpu) runs one and two GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"
#include "core/testing.h"
#include "core/thread_pool.h"
#include "model/llama_model.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"
#include "model/tensor_parallel_testing.h"
#include "sparsity/kv_policy.h"

#ifdef SIEVE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_communicator.h"
#endif

namespace sieve {
namespace {

constexpr double kTolerance = 1e-4;
constexpr int kPageSize = 4;

ModelConfig TinyConfig(int heads, int kv_heads, bool tied = false) {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.model_type = "llama";
  config.vocab_size = 97;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_layers = 4;
  config.num_heads = heads;
  config.num_kv_heads = kv_heads;
  config.head_dim = 16;
  config.max_position_embeddings = 128;
  config.tie_word_embeddings = tied;
  SIEVE_CHECK(config.Validate().ok()) << config.Validate().ToString();
  return config;
}

// ---- the steps, planned once on the host and run by every rank ----

struct SeqSpec {
  std::vector<int32_t> prompt;
  std::vector<int32_t> decode;  // tokens fed one per decode step (teacher-forced)
  int start_step;               // first step its prompt takes part in
};

// One step's host arrays (StepMeta's layout) and the KV lengths around it.
struct HostStep {
  int num_tokens = 0, num_prefill_tokens = 0, num_seqs = 0, num_prefill_seqs = 0;
  int max_query_len = 0, max_kv_len = 0;
  int64_t num_prefill_keys = 0;
  std::vector<int32_t> token_ids, positions, query_start{0}, key_start{0}, context_lens, seq_slots,
      write_start;  // write_start [L][S]
  std::vector<CompressionJob> jobs;
  std::vector<int32_t> job_begin;
  std::vector<EvictionJob> evictions;
  std::vector<int32_t> eviction_begin;
  int64_t max_scores = 0, max_kept = 0;
  std::vector<int32_t> kv_lens;        // [L][max_seqs] as the step's attention sees them
  std::vector<int32_t> lengths_after;  // [L][max_seqs] entries held after the step
};

struct Scenario {
  ModelConfig config;
  KvPolicy policy;
  int max_seqs = 0;
  int max_pages = 0;                // per (sequence, layer)
  std::vector<int32_t> page_table;  // [L][max_seqs][max_pages]
  std::vector<HostStep> steps;
};

// Plans the steps the way the engine does: prefill chunks first (each prompt's final chunk holds
// the rows its policy scores), then one token per decoding sequence; compression jobs at each
// prompt's end, an eviction wherever a decode passes a layer's cap.
Scenario PlanScenario(const ModelConfig& config, const KvPolicy& policy,
                      const std::vector<SeqSpec>& seqs, int chunk, std::mt19937_64& rng) {
  Scenario scenario{config, policy};
  const int layers = config.num_layers;
  const int num_seqs = static_cast<int>(seqs.size());
  const int kv_heads = config.num_kv_heads;
  int longest = 0;
  for (const SeqSpec& seq : seqs) {
    longest = std::max<int>(longest, static_cast<int>(seq.prompt.size() + seq.decode.size()));
  }
  scenario.max_seqs = num_seqs;
  scenario.max_pages = (longest + kPageSize - 1) / kPageSize;
  scenario.page_table.resize(static_cast<size_t>(layers) * num_seqs * scenario.max_pages);
  std::iota(scenario.page_table.begin(), scenario.page_table.end(), 0);
  std::shuffle(scenario.page_table.begin(), scenario.page_table.end(), rng);

  // Chunk boundaries of each prompt: the last chunk holds at least FinalChunkRows.
  std::vector<std::vector<int>> chunk_ends(num_seqs);
  for (int seq = 0; seq < num_seqs; ++seq) {
    const int n = static_cast<int>(seqs[seq].prompt.size());
    const int last = std::max(std::min(n, policy.FinalChunkRows(n)), 1);
    for (int end = chunk; end < n - last; end += chunk) chunk_ends[seq].push_back(end);
    chunk_ends[seq].push_back(n);
  }
  std::vector<int> chunks_done(num_seqs, 0);
  std::vector<int> decoded(num_seqs, 0);
  std::vector<int32_t> lengths(static_cast<size_t>(layers) * num_seqs, 0);
  const auto length = [&](int layer, int slot) -> int32_t& {
    return lengths[static_cast<size_t>(layer) * num_seqs + slot];
  };
  for (int step_index = 0;; ++step_index) {
    std::vector<int> prefills, decodes;
    for (int seq = 0; seq < num_seqs; ++seq) {
      const bool prefilling = chunks_done[seq] < static_cast<int>(chunk_ends[seq].size());
      if (prefilling && seqs[seq].start_step <= step_index) prefills.push_back(seq);
      if (!prefilling && decoded[seq] < static_cast<int>(seqs[seq].decode.size())) {
        decodes.push_back(seq);
      }
    }
    bool remaining = false;
    for (int seq = 0; seq < num_seqs; ++seq) {
      remaining = remaining || decoded[seq] < static_cast<int>(seqs[seq].decode.size());
    }
    if (!remaining) break;
    if (prefills.empty() && decodes.empty()) continue;  // a sequence not started yet
    HostStep step;
    step.num_prefill_seqs = static_cast<int>(prefills.size());
    step.num_seqs = step.num_prefill_seqs + static_cast<int>(decodes.size());
    step.write_start.assign(static_cast<size_t>(layers) * step.num_seqs, -1);
    step.kv_lens = lengths;
    std::vector<std::vector<CompressionJob>> jobs(layers);
    std::vector<std::vector<EvictionJob>> evictions(layers);
    std::vector<int32_t> after = lengths;
    int index = 0;
    for (const int seq : prefills) {
      const int context = chunks_done[seq] == 0 ? 0 : chunk_ends[seq][chunks_done[seq] - 1];
      const int end = chunk_ends[seq][chunks_done[seq]];
      const bool final_chunk = chunks_done[seq] + 1 == static_cast<int>(chunk_ends[seq].size());
      for (int position = context; position < end; ++position) {
        step.token_ids.push_back(seqs[seq].prompt[position]);
        step.positions.push_back(position);
      }
      step.num_tokens += end - context;
      step.num_prefill_tokens += end - context;
      step.query_start.push_back(step.num_tokens);
      step.context_lens.push_back(context);
      step.seq_slots.push_back(seq);
      step.max_query_len = std::max(step.max_query_len, end - context);
      step.max_kv_len = std::max(step.max_kv_len, end);
      step.num_prefill_keys += end;
      step.key_start.push_back(static_cast<int32_t>(step.num_prefill_keys));
      const std::vector<LayerPlan> plans =
          final_chunk ? policy.PlanPrompt(end) : std::vector<LayerPlan>(layers);
      for (int layer = 0; layer < layers; ++layer) {
        const LayerPlan& plan = plans[layer];
        int32_t& held = after[static_cast<size_t>(layer) * num_seqs + seq];
        if (!plan.compress) {
          step.write_start[static_cast<size_t>(layer) * step.num_seqs + index] = context;
          held = end;
          continue;
        }
        jobs[layer].push_back(plan.Job(layer, index, end, seq));
        held = plan.budget;
      }
      ++chunks_done[seq];
      ++index;
    }
    for (const int seq : decodes) {
      const int position = static_cast<int>(seqs[seq].prompt.size()) + decoded[seq];
      step.token_ids.push_back(seqs[seq].decode[decoded[seq]]);
      step.positions.push_back(position);
      ++step.num_tokens;
      step.query_start.push_back(step.num_tokens);
      step.context_lens.push_back(position);
      step.seq_slots.push_back(seq);
      step.max_kv_len = std::max(step.max_kv_len, position + 1);
      for (int layer = 0; layer < layers; ++layer) {
        const int held = length(layer, seq);
        step.write_start[static_cast<size_t>(layer) * step.num_seqs + index] = held;
        step.kv_lens[static_cast<size_t>(layer) * num_seqs + seq] = held + 1;
        after[static_cast<size_t>(layer) * num_seqs + seq] = held + 1;
        const DecodeLimit& limit = policy.DecodeLimitFor(layer);
        if (limit.max_entries == 0 || held + 1 <= limit.max_entries) continue;
        EvictionJob job{};
        job.layer = layer;
        job.seq_slot = seq;
        job.length = held + 1;
        job.kind = limit.evict == DecodeLimit::Evict::kOldest ? EvictionJob::kOldest
                                                              : EvictionJob::kLowestScore;
        job.protect_recent = limit.protect_recent;
        job.sinks = limit.sinks;
        job.position = position;
        evictions[layer].push_back(job);
        after[static_cast<size_t>(layer) * num_seqs + seq] = held;
      }
      ++decoded[seq];
      ++index;
    }
    step.job_begin.assign(1, 0);
    step.eviction_begin.assign(1, 0);
    for (int layer = 0; layer < layers; ++layer) {
      int64_t scores = 0, kept = 0;
      for (CompressionJob& job : jobs[layer]) {
        // Offsets for the model's G KV heads: every rank uses the same step, and a rank's G_r
        // heads fit in the same rows.
        job.score_offset = static_cast<int32_t>(scores);
        job.index_offset = static_cast<int32_t>(kept);
        if (job.mode == SelectMode::kTopScores) scores += int64_t{kv_heads} * job.num_keys;
        kept += int64_t{kv_heads} * (job.budget - job.window);
        step.jobs.push_back(job);
      }
      step.job_begin.push_back(static_cast<int32_t>(step.jobs.size()));
      step.max_scores = std::max(step.max_scores, scores);
      step.max_kept = std::max(step.max_kept, kept);
      for (const EvictionJob& job : evictions[layer]) step.evictions.push_back(job);
      step.eviction_begin.push_back(static_cast<int32_t>(step.evictions.size()));
    }
    step.lengths_after = after;
    lengths = after;
    scenario.steps.push_back(std::move(step));
  }
  return scenario;
}

Tensor I32(Backend& backend, const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  Tensor tensor = backend.Allocate(std::move(shape), DType::kI32);
  if (!values.empty()) {
    backend.CopyFromHost(values.data(), values.size() * sizeof(int32_t), tensor);
  }
  return tensor;
}

StepMeta MakeStep(Backend& backend, const HostStep& host, int layers) {
  StepMeta step;
  step.num_tokens = host.num_tokens;
  step.num_prefill_tokens = host.num_prefill_tokens;
  step.num_seqs = host.num_seqs;
  step.num_prefill_seqs = host.num_prefill_seqs;
  step.num_layers = layers;
  step.max_query_len = host.max_query_len;
  step.max_kv_len = host.max_kv_len;
  step.num_prefill_keys = host.num_prefill_keys;
  for (int seq = 0; seq < host.num_prefill_seqs; ++seq) {
    step.prefill_chunks.push_back(
        {host.query_start[seq + 1] - host.query_start[seq], host.context_lens[seq]});
  }
  step.num_sample_rows = host.num_tokens;  // every row's logits
  const auto size = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  step.token_ids = I32(backend, host.token_ids, {size(host.token_ids)});
  step.positions = I32(backend, host.positions, {size(host.positions)});
  step.query_start = I32(backend, host.query_start, {size(host.query_start)});
  step.key_start = I32(backend, host.key_start, {size(host.key_start)});
  step.context_lens = I32(backend, host.context_lens, {size(host.context_lens)});
  step.seq_slots = I32(backend, host.seq_slots, {size(host.seq_slots)});
  step.write_start = I32(backend, host.write_start, {layers, host.num_seqs});
  std::vector<int32_t> rows(host.num_tokens);
  std::iota(rows.begin(), rows.end(), 0);
  step.sample_rows = I32(backend, rows, {host.num_tokens});
  std::vector<int32_t> job_ints(host.jobs.size() * kCompressionJobInts + 1);
  // (No memcpy from an empty vector: its data() may be null, which memcpy must not be given.)
  if (!host.jobs.empty()) {
    std::memcpy(job_ints.data(), host.jobs.data(), host.jobs.size() * sizeof(CompressionJob));
  }
  step.compression_jobs = I32(backend, job_ints, {size(job_ints)});
  std::vector<int32_t> eviction_ints(host.evictions.size() * kEvictionJobInts + 1);
  if (!host.evictions.empty()) {
    std::memcpy(eviction_ints.data(), host.evictions.data(),
                host.evictions.size() * sizeof(EvictionJob));
  }
  step.eviction_jobs = I32(backend, eviction_ints, {size(eviction_ints)});
  step.job_begin = host.job_begin;
  step.jobs_host = host.jobs;
  step.max_scores_per_layer = host.max_scores;
  step.max_indices_per_layer = host.max_kept;
  step.eviction_begin = host.eviction_begin;
  step.evictions_host = host.evictions;
  return step;
}

// ---- running a scenario on N ranks ----

using testing::ModelFactory;

// What one rank saw at the end of each step.
struct StepRecord {
  std::vector<float> logits;       // [T][V]
  std::vector<float> k, v;         // [pages][page_size][G_r][hd]
  std::vector<float> scores;       // [entries][G_r] (empty without a score pool)
  std::vector<int32_t> positions;  // [entries][G_r] (empty without a position pool)
  std::vector<int32_t> kv_lens;    // [L][max_seqs]
};

struct RankRun {
  ShardLayout layout;
  std::vector<StepRecord> steps;
};

// The ranks' devices: a backend and a communicator per rank.
struct Ranks {
  std::vector<std::unique_ptr<ThreadPool>> thread_pools;  // CPU ranks: one thread each
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> communicators;
  int size() const { return static_cast<int>(backends.size()); }
};

// `size` CPU ranks, each a backend with one thread (ranks run side by side as on separate GPUs).
Ranks CpuRanks(int size) {
  Ranks ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.thread_pools.push_back(std::make_unique<ThreadPool>(1));
    ranks.backends.push_back(std::make_unique<CpuBackend>(ranks.thread_pools.back().get()));
  }
  ranks.communicators = MakeInProcessCommunicators(size);
  return ranks;
}

// Runs the scenario on every rank, one thread each. `read_kv`: record the pools (f32 pools only).
std::vector<RankRun> RunRanks(const Scenario& scenario, const ModelFactory& factory, Ranks& ranks,
                              bool read_kv = true) {
  const ModelConfig& config = scenario.config;
  const int size = ranks.size();
  std::vector<RankRun> runs(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      Backend& backend = *ranks.backends[rank];
      backend.MakeCurrent();
      auto made = factory(backend, {rank, size}, ranks.communicators[rank].get());
      SIEVE_CHECK(made.ok()) << made.status().ToString();
      const LlamaModel& model = **made;
      const ShardLayout& layout = model.layout();
      runs[rank].layout = layout;
      const int layers = config.num_layers;
      const int num_pages = static_cast<int>(scenario.page_table.size());
      KvPool pool;
      pool.page_size = kPageSize;
      pool.num_pages = num_pages;
      pool.max_seqs = scenario.max_seqs;
      pool.max_pages_per_seq = scenario.max_pages;
      pool.num_kv_heads = layout.num_kv_heads;
      pool.head_dim = config.head_dim;
      pool.k = backend.Allocate({num_pages, kPageSize, layout.num_kv_heads, config.head_dim},
                                backend.activation_dtype());
      pool.v = backend.Allocate(pool.k.shape(), backend.activation_dtype());
      const int64_t entries = int64_t{num_pages} * kPageSize;
      if (scenario.policy.NeedsScorePool()) {
        pool.scores = backend.Allocate({entries, layout.num_kv_heads}, DType::kF32);
      }
      if (scenario.policy.NeedsPositionPool()) {
        pool.positions = backend.Allocate({entries, layout.num_kv_heads}, DType::kI32);
      }
      pool.page_table =
          I32(backend, scenario.page_table, {layers, scenario.max_seqs, scenario.max_pages});
      pool.kv_lens = backend.Allocate({layers, scenario.max_seqs}, DType::kI32);
      ForwardWorkspace workspace;
      for (const HostStep& host : scenario.steps) {
        const StepMeta step = MakeStep(backend, host, layers);
        backend.CopyFromHost(host.kv_lens.data(), host.kv_lens.size() * sizeof(int32_t),
                             pool.kv_lens);
        model.EnsureWorkspace(workspace, step.num_tokens,
                              std::max<int64_t>(1, step.num_prefill_keys), step.num_tokens,
                              std::max<int64_t>(1, step.max_scores_per_layer),
                              std::max<int64_t>(1, step.max_indices_per_layer));
        Tensor logits = backend.Allocate({step.num_tokens, config.vocab_size}, DType::kF32);
        model.Forward(step, pool, workspace, logits);
        StepRecord record;
        const auto read = [&](const Tensor& tensor, auto& host_values) {
          if (!tensor.defined()) return;
          host_values.resize(static_cast<size_t>(tensor.numel()));
          backend.CopyToHost(tensor, host_values.data());
        };
        read(logits, record.logits);
        read(pool.kv_lens, record.kv_lens);
        if (read_kv) {
          read(pool.k, record.k);
          read(pool.v, record.v);
          read(pool.scores, record.scores);
          read(pool.positions, record.positions);
        }
        runs[rank].steps.push_back(std::move(record));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return runs;
}

struct Errors {
  double logits = 0, kv = 0, scores = 0;
};

// Rank runs of N ranks against the one-rank run `reference`; returns the largest errors.
Errors CompareRanks(const Scenario& scenario, const RankRun& reference,
                    const std::vector<RankRun>& ranks, const std::string& what) {
  const ModelConfig& config = scenario.config;
  const int hd = config.head_dim;
  const int heads = config.num_kv_heads;
  Errors errors;
  for (size_t step = 0; step < scenario.steps.size(); ++step) {
    const StepRecord& expected = reference.steps[step];
    const HostStep& host = scenario.steps[step];
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      const std::string where = what + ", step " + std::to_string(step) + ", rank " +
                                std::to_string(rank) + " of " + std::to_string(ranks.size());
      const StepRecord& actual = ranks[rank].steps[step];
      const ShardLayout& layout = ranks[rank].layout;
      if (actual.logits.size() != expected.logits.size()) {
        ADD_FAILURE() << where << ": " << actual.logits.size() << " logits, expected "
                      << expected.logits.size();
        continue;
      }
      errors.logits =
          std::max(errors.logits, testing::MaxAbsError(actual.logits.data(), expected.logits.data(),
                                                       expected.logits.size()));
      EXPECT_EQ(std::memcmp(actual.logits.data(), ranks[0].steps[step].logits.data(),
                            actual.logits.size() * sizeof(float)),
                0)
          << where << ": logits differ from rank 0's";
      EXPECT_EQ(actual.kv_lens, expected.kv_lens) << where;
      // Every entry this rank's KV heads hold against the same entry of the same head.
      const int local = layout.num_kv_heads;
      int mismatched_positions = 0;
      for (int layer = 0; layer < config.num_layers; ++layer) {
        for (int slot = 0; slot < scenario.max_seqs; ++slot) {
          const int held =
              host.lengths_after[static_cast<size_t>(layer) * scenario.max_seqs + slot];
          for (int entry = 0; entry < held; ++entry) {
            const int64_t page =
                scenario.page_table[(static_cast<size_t>(layer) * scenario.max_seqs + slot) *
                                        scenario.max_pages +
                                    entry / kPageSize];
            const int64_t pool_entry = page * kPageSize + entry % kPageSize;
            for (int head = 0; head < local; ++head) {
              const int global = layout.kv_head_begin + head;
              const float* k = actual.k.data() + (pool_entry * local + head) * hd;
              const float* v = actual.v.data() + (pool_entry * local + head) * hd;
              const float* k_ref = expected.k.data() + (pool_entry * heads + global) * hd;
              const float* v_ref = expected.v.data() + (pool_entry * heads + global) * hd;
              errors.kv = std::max({errors.kv, testing::MaxAbsError(k, k_ref, hd),
                                    testing::MaxAbsError(v, v_ref, hd)});
              if (!actual.positions.empty() &&
                  actual.positions[pool_entry * local + head] !=
                      expected.positions[pool_entry * heads + global]) {
                ++mismatched_positions;
              }
              if (!actual.scores.empty()) {
                errors.scores = std::max(
                    errors.scores,
                    static_cast<double>(std::fabs(actual.scores[pool_entry * local + head] -
                                                  expected.scores[pool_entry * heads + global])));
              }
            }
          }
        }
      }
      EXPECT_EQ(mismatched_positions, 0) << where << ": kept entries differ";
    }
  }
  EXPECT_LE(errors.logits, kTolerance) << what;
  EXPECT_LE(errors.kv, kTolerance) << what;
  EXPECT_LE(errors.scores, kTolerance) << what;
  return errors;
}

KvPolicyOptions SmallBudgets() {
  KvPolicyOptions options;
  options.budget = 12;
  options.window = 4;
  options.kernel = 3;
  options.sinks = 2;
  options.recent = 6;
  options.heavy = 6;
  return options;
}

struct PolicyCase {
  std::string spec;
  KvPolicyOptions options;
};

std::vector<PolicyCase> EveryPolicy(int layers) {
  std::vector<PolicyCase> cases;
  for (const char* spec : {"full", "snapkv", "pyramidkv", "streamingllm", "h2o"}) {
    cases.push_back({spec, SmallBudgets()});
  }
  // The first half of the layers full, the rest SnapKV.
  const int full = layers / 2 - 1;
  cases.push_back({"full:0" + (full > 0 ? "-" + std::to_string(full) : std::string()) +
                       ",snapkv:" + std::to_string(full + 1) + "-" + std::to_string(layers - 1),
                   SmallBudgets()});
  // GQA max-reduce with average pooling, and a score-capped decode on top of SnapKV.
  PolicyCase pyramid_max{"pyramidkv", SmallBudgets()};
  pyramid_max.options.reduce = GroupReduce::kMax;
  pyramid_max.options.pool = PoolKind::kAvg;
  cases.push_back(pyramid_max);
  PolicyCase capped{"snapkv", SmallBudgets()};
  capped.options.decode_cap = 14;
  cases.push_back(capped);
  return cases;
}

std::vector<SeqSpec> RandomSeqs(const ModelConfig& config, std::mt19937_64& rng) {
  const auto tokens = [&](int count) {
    std::vector<int32_t> values(count);
    for (int32_t& value : values) value = static_cast<int32_t>(rng() % config.vocab_size);
    return values;
  };
  // Prompt lengths past every budget; the third prompt arrives while the others decode.
  return {{tokens(29), tokens(7), 0}, {tokens(23), tokens(7), 0}, {tokens(18), tokens(5), 3}};
}

// Runs every policy of EveryPolicy() through 1 rank and each of `sizes`, and compares.
void CheckEveryPolicy(const ModelConfig& config, const ModelFactory& factory,
                      const std::vector<int>& sizes, const std::string& name) {
  std::mt19937_64 rng = testing::MakeRng();
  Errors worst;
  for (const PolicyCase& policy_case : EveryPolicy(config.num_layers)) {
    auto policy = KvPolicy::Parse(policy_case.spec, config.num_layers, policy_case.options);
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    const Scenario scenario = PlanScenario(config, *policy, RandomSeqs(config, rng), 8, rng);
    // The steps exercise what the policy does: compressions of every sparse policy, evictions of
    // those with decode caps.
    size_t jobs = 0, evictions = 0;
    for (const HostStep& step : scenario.steps) {
      jobs += step.jobs.size();
      evictions += step.evictions.size();
    }
    EXPECT_EQ(jobs > 0, !policy->IsDense()) << policy->ToString();
    EXPECT_EQ(evictions > 0, policy->NeedsPositionPool()) << policy->ToString();
    Ranks one = CpuRanks(1);
    const std::vector<RankRun> reference = RunRanks(scenario, factory, one);
    for (const int size : sizes) {
      Ranks many = CpuRanks(size);
      const std::vector<RankRun> ranks = RunRanks(scenario, factory, many);
      const std::string what =
          name + ", " + policy->ToString() + ", " + std::to_string(size) + " ranks";
      const Errors errors = CompareRanks(scenario, reference[0], ranks, what);
      worst.logits = std::max(worst.logits, errors.logits);
      worst.kv = std::max(worst.kv, errors.kv);
      worst.scores = std::max(worst.scores, errors.scores);
    }
  }
  std::printf("%s: largest |error| against one rank: logits %.3g, K/V %.3g, scores %.3g\n",
              name.c_str(), worst.logits, worst.kv, worst.scores);
}

TEST(TensorParallelTest, MhaOnTwoAndFourRanksMatchesOneRank) {
  const ModelConfig config = TinyConfig(4, 4);
  CheckEveryPolicy(config, testing::RandomShardFactory(config, testing::MakeRng()()), {2, 4},
                   "MHA 4/4");
}

// G = 2 KV heads: split on 2 ranks; on 4 ranks each KV head is replicated on 2 ranks and its
// group (4 query heads) spans them.
TEST(TensorParallelTest, GqaWithTwoKvHeadsOnTwoAndFourRanksMatchesOneRank) {
  const ModelConfig config = TinyConfig(8, 2);
  CheckEveryPolicy(config, testing::RandomShardFactory(config, testing::MakeRng()()), {2, 4},
                   "GQA 8/2");
}

// One query head per rank (each KV head replicated on 2 ranks), and tied embeddings.
TEST(TensorParallelTest, OneQueryHeadPerRankAndTiedEmbeddingsOnFourRanks) {
  const ModelConfig config = TinyConfig(4, 2, /*tied=*/true);
  CheckEveryPolicy(config, testing::RandomShardFactory(config, testing::MakeRng()()), {4},
                   "GQA 4/2 tied");
}

// The fixture checkpoints loaded sharded (rows of q/k/v/gate/up and columns of o/down read from
// the safetensors): MHA, GQA with 2 KV heads, one KV head (tied), bf16, a sharded checkpoint,
// Mistral with head_dim != hidden / heads.
class TensorParallelLoadTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelLoadTest, LoadedShardsMatchOneRank) {
  const std::string dir = TestDataDir() + "/models/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir;
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  const SafetensorsCheckpoint& weights = **checkpoint;
  const ModelConfig model_config = *config;
  const ModelFactory factory = [&weights, model_config](Backend& backend,
                                                        const TensorParallelShard& shard,
                                                        Communicator* communicator) {
    return LlamaModel::Load(model_config, weights, backend, 64, shard, communicator);
  };
  CheckEveryPolicy(model_config, factory, {2, 4}, GetParam());
}

INSTANTIATE_TEST_SUITE_P(FixtureModels, TensorParallelLoadTest,
                         ::testing::Values("llama2_mha", "llama_gqa_bf16", "llama3_rope_sharded",
                                           "llama_tied", "mistral_gqa"));

// Each rank's weights are exactly its slices of the one-rank weights.
TEST(TensorParallelTest, RandomShardsAreSlicesOfTheFullWeights) {
  const ModelConfig config = TinyConfig(8, 2);
  const uint64_t seed = testing::MakeRng()();
  CpuBackend backend;
  const auto full = LlamaModel::Random(config, backend, seed, 32, 0.08f);
  for (const int size : {2, 4}) {
    std::vector<std::unique_ptr<Communicator>> communicators = MakeInProcessCommunicators(size);
    for (int rank = 0; rank < size; ++rank) {
      auto shard = LlamaModel::RandomShard(config, backend, seed, 32, {rank, size},
                                           communicators[rank].get(), 0.08f);
      ASSERT_TRUE(shard.ok()) << shard.status().ToString();
      const ShardLayout& layout = (*shard)->layout();
      const int64_t hd = config.head_dim;
      const int64_t d = config.hidden_size;
      for (int layer = 0; layer < config.num_layers; ++layer) {
        const LlamaLayerWeights& whole = full->weights().layers[layer];
        const LlamaLayerWeights& part = (*shard)->weights().layers[layer];
        const auto row = [](const Tensor& t, int64_t r) {
          return t.data_as<float>() + r * t.stride(0);
        };
        // q rows, then k rows, then v rows of this rank's heads.
        std::vector<int64_t> rows;
        for (int64_t r = 0; r < layout.num_q_heads * hd; ++r)
          rows.push_back(layout.q_head_begin * hd + r);
        for (int64_t r = 0; r < layout.num_kv_heads * hd; ++r)
          rows.push_back((config.num_heads + layout.kv_head_begin) * hd + r);
        for (int64_t r = 0; r < layout.num_kv_heads * hd; ++r)
          rows.push_back((config.num_heads + config.num_kv_heads + layout.kv_head_begin) * hd + r);
        ASSERT_EQ(part.qkv.dim(0), static_cast<int64_t>(rows.size()));
        for (size_t r = 0; r < rows.size(); ++r) {
          ASSERT_EQ(std::memcmp(row(part.qkv, r), row(whole.qkv, rows[r]), d * sizeof(float)), 0)
              << "rank " << rank << " of " << size << ", qkv row " << r;
        }
        for (int64_t r = 0; r < d; ++r) {
          ASSERT_EQ(std::memcmp(row(part.o, r), row(whole.o, r) + layout.out_head_begin * hd,
                                layout.num_out_heads * hd * sizeof(float)),
                    0);
          ASSERT_EQ(std::memcmp(row(part.down, r), row(whole.down, r) + layout.ffn_begin,
                                layout.ffn_size * sizeof(float)),
                    0);
        }
        for (int64_t r = 0; r < 2 * layout.ffn_size; ++r) {
          const int64_t source = r < layout.ffn_size ? layout.ffn_begin + r
                                                     : config.intermediate_size + layout.ffn_begin +
                                                           r - layout.ffn_size;
          ASSERT_EQ(
              std::memcmp(row(part.gate_up, r), row(whole.gate_up, source), d * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(TensorParallelTest, LayoutsOfTheSupportedSplits) {
  // MHA 4/4 on 2 ranks: rank 1 holds heads and KV heads 2-3.
  const ShardLayout mha = MakeShardLayout(TinyConfig(4, 4), {1, 2}).value();
  EXPECT_EQ(mha.q_head_begin, 2);
  EXPECT_EQ(mha.num_q_heads, 2);
  EXPECT_EQ(mha.out_head_begin, 2);
  EXPECT_EQ(mha.kv_head_begin, 2);
  EXPECT_EQ(mha.num_kv_heads, 2);
  EXPECT_EQ(mha.ffn_begin, 48);
  EXPECT_EQ(mha.ffn_size, 48);
  EXPECT_FALSE(mha.replicated_kv());
  // GQA 8/2 on 4 ranks: rank 3 holds KV head 1 (shared with rank 2) and attends with its whole
  // group, heads 4-7; its o slice takes heads 6-7.
  const ShardLayout gqa = MakeShardLayout(TinyConfig(8, 2), {3, 4}).value();
  EXPECT_EQ(gqa.kv_head_begin, 1);
  EXPECT_EQ(gqa.num_kv_heads, 1);
  EXPECT_EQ(gqa.q_head_begin, 4);
  EXPECT_EQ(gqa.num_q_heads, 4);
  EXPECT_EQ(gqa.out_head_begin, 6);
  EXPECT_EQ(gqa.num_out_heads, 2);
  EXPECT_TRUE(gqa.replicated_kv());
  const ShardLayout one = MakeShardLayout(TinyConfig(8, 2), {0, 1}).value();
  EXPECT_EQ(one.num_q_heads, 8);
  EXPECT_EQ(one.num_kv_heads, 2);
  EXPECT_EQ(one.ffn_size, 96);
}

TEST(TensorParallelTest, SplitsThatDoNotDivideAreClearErrors) {
  const auto error = [](const ModelConfig& config, int size) {
    const Status status = CheckTensorParallel(config, size);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << size << " ranks";
    return status.message();
  };
  EXPECT_NE(error(TinyConfig(4, 4), 0).find("at least 1"), std::string::npos);
  EXPECT_NE(error(TinyConfig(4, 4), 3).find("does not divide the model's 4 attention heads"),
            std::string::npos);
  EXPECT_NE(error(TinyConfig(4, 4), 8).find("exceeds the model's 4 attention heads"),
            std::string::npos);
  EXPECT_NE(error(TinyConfig(12, 6), 4).find("6 KV heads"), std::string::npos);
  EXPECT_NE(error(TinyConfig(12, 3), 4).find("not a multiple of the model's 3 KV heads"),
            std::string::npos);
  ModelConfig odd_mlp = TinyConfig(4, 4);
  odd_mlp.intermediate_size = 90;
  EXPECT_NE(error(odd_mlp, 4).find("intermediate size 90"), std::string::npos);
  EXPECT_TRUE(CheckTensorParallel(TinyConfig(8, 2), 4).ok());
  EXPECT_TRUE(CheckTensorParallel(TinyConfig(8, 2), 8).ok());

  // At load: the same errors, and a communicator that does not match the shard.
  CpuBackend backend;
  auto bad_split = LlamaModel::RandomShard(TinyConfig(4, 4), backend, 1, 16, {0, 3}, nullptr);
  EXPECT_EQ(bad_split.status().code(), StatusCode::kInvalidArgument);
  auto missing = LlamaModel::RandomShard(TinyConfig(4, 4), backend, 1, 16, {0, 2}, nullptr);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<Communicator>> communicators = MakeInProcessCommunicators(2);
  auto wrong_rank =
      LlamaModel::RandomShard(TinyConfig(4, 4), backend, 1, 16, {0, 2}, communicators[1].get());
  EXPECT_EQ(wrong_rank.status().code(), StatusCode::kInvalidArgument);
  auto out_of_range =
      LlamaModel::RandomShard(TinyConfig(4, 4), backend, 1, 16, {2, 2}, communicators[0].get());
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  const std::string dir = TestDataDir() + "/models/llama2_mha";
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  auto load = LlamaModel::Load(*config, **checkpoint, backend, 16, {0, 3}, nullptr);
  EXPECT_EQ(load.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(load.status().message().find("tensor parallel size 3"), std::string::npos)
      << load.status().ToString();
}

#ifdef SIEVE_HAVE_CUDA
// On the GPU machine: a random model (head_dim 64, which the CUDA kernels serve) on one GPU and,
// with two GPUs, on two through NCCL. bf16 weights and activations, and the split sums add
// roundings (each rank's partial product and the all-reduce round to bf16), so the bound on the
// dense logits is bf16's: relative L2 within 3e-2 of one GPU's. Under sparse policies bf16
// near-ties may keep other entries on two GPUs than on one (SPARSITY.md: near-ties are reported,
// not hidden): their relative L2 is printed, and their layer lengths must agree exactly.
Ranks GpuRanks(int size) {
  Ranks ranks;
  if (size == 1) {  // one rank needs no communicator
    auto backend = MakeCudaBackend(0);
    SIEVE_CHECK(backend.ok()) << backend.status().ToString();
    ranks.backends.push_back(std::move(backend).value());
    ranks.communicators.resize(1);
    return ranks;
  }
  auto made = MakeCudaRanks(0, size);
  SIEVE_CHECK(made.ok()) << made.status().ToString();
  ranks.backends = std::move(made->backends);
  ranks.communicators = std::move(made->communicators);
  return ranks;
}

TEST(GpuTensorParallelTest, TwoGpusMatchOne) {
  const int devices = CudaDeviceCount();
  if (devices < 1) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  ModelConfig config = TinyConfig(4, 2);
  config.vocab_size = 256;
  config.hidden_size = 256;
  config.head_dim = 64;
  config.intermediate_size = 512;
  ASSERT_TRUE(config.Validate().ok());
  std::mt19937_64 rng = testing::MakeRng();
  const ModelFactory factory = testing::RandomShardFactory(config, rng());
  const bool two = devices >= 2 && NcclAvailable();
  for (const char* spec : {"full", "snapkv", "streamingllm", "h2o"}) {
    auto policy = KvPolicy::Parse(spec, config.num_layers, SmallBudgets());
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    const Scenario scenario = PlanScenario(config, *policy, RandomSeqs(config, rng), 8, rng);
    Ranks one = GpuRanks(1);
    const std::vector<RankRun> reference = RunRanks(scenario, factory, one, /*read_kv=*/false);
    for (const StepRecord& record : reference[0].steps) {
      for (const float logit : record.logits) ASSERT_TRUE(std::isfinite(logit)) << spec;
    }
    if (!two) continue;
    Ranks pair = GpuRanks(2);
    const std::vector<RankRun> runs = RunRanks(scenario, factory, pair, /*read_kv=*/false);
    double worst = 0;
    for (size_t step = 0; step < scenario.steps.size(); ++step) {
      const std::vector<float>& expected = reference[0].steps[step].logits;
      for (int rank = 0; rank < 2; ++rank) {
        const StepRecord& actual = runs[rank].steps[step];
        ASSERT_EQ(actual.logits.size(), expected.size());
        worst = std::max(worst, testing::RelativeL2Error(actual.logits.data(), expected.data(),
                                                         expected.size()));
        EXPECT_EQ(actual.kv_lens, reference[0].steps[step].kv_lens)
            << spec << ", step " << step << ", rank " << rank;
      }
    }
    std::printf("%s: logits of 2 GPUs against 1, worst relative L2 %.3g\n", spec, worst);
    if (std::string(spec) == "full") {
      EXPECT_LE(worst, 3e-2);
    }
  }
  if (!two) {
    GTEST_SKIP() << "one GPU ran; two ranks need 2 GPUs and NCCL (" << devices << " GPUs, NCCL "
                 << (NcclAvailable() ? "built" : "absent") << ")";
  }
}
#endif

}  // namespace
}  // namespace sieve
