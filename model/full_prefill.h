// Test support: one sequence prefilled densely in one step, straight through LlamaModel::Forward
// (no engine, no scheduler), the reference the forward-pass and teacher-forcing tests compare with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/step_meta.h"
#include "model/llama_model.h"
#include "model/model_config.h"

namespace sieve::testing {

struct PrefillFixture {
  StepMeta step;
  KvPool pool;
};

// One sequence of n tokens prefilled in one step, logits of every row sampled, on `backend`.
inline PrefillFixture MakeFullPrefill(Backend& backend, const ModelConfig& config,
                                      const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  const int layers = config.num_layers;
  PrefillFixture f;
  StepMeta& step = f.step;
  const auto i32 = [&](std::vector<int32_t> values, std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
    Tensor tensor = backend.Allocate(std::move(shape), DType::kI32);
    backend.CopyFromHost(values.data(), values.size() * sizeof(int32_t), tensor);
    return tensor;
  };
  std::vector<int32_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  step.num_tokens = step.num_prefill_tokens = n;
  step.num_seqs = step.num_prefill_seqs = 1;
  step.num_layers = layers;
  step.max_query_len = step.max_kv_len = n;
  step.num_prefill_keys = n;
  step.prefill_chunks = {{n, 0}};
  step.num_sample_rows = n;
  step.token_ids = i32(ids);
  step.positions = i32(rows);
  step.query_start = i32({0, n});
  step.key_start = i32({0, n});
  step.context_lens = i32({0});
  step.seq_slots = i32({0});
  step.write_start = i32(std::vector<int32_t>(layers, 0));
  step.sample_rows = i32(rows);
  step.compression_jobs = i32({0});
  step.eviction_jobs = i32({0});
  step.job_begin.assign(layers + 1, 0);
  step.eviction_begin.assign(layers + 1, 0);
  KvPool& pool = f.pool;
  pool.page_size = 16;
  pool.max_seqs = 1;
  pool.max_pages_per_seq = (n + 15) / 16;
  pool.num_pages = pool.max_pages_per_seq * layers;
  pool.num_kv_heads = config.num_kv_heads;
  pool.head_dim = config.head_dim;
  pool.k = backend.Allocate({pool.num_pages, 16, config.num_kv_heads, config.head_dim},
                            backend.activation_dtype());
  pool.v = backend.Allocate(pool.k.shape(), backend.activation_dtype());
  std::vector<int32_t> table(pool.num_pages);
  std::iota(table.begin(), table.end(), 0);
  pool.page_table = i32(table, {layers, 1, pool.max_pages_per_seq});
  pool.kv_lens = i32(std::vector<int32_t>(layers, n), {layers, 1});
  return f;
}

// One dense prefill of the whole of `ids` in one step that samples `rows` only (any order; none:
// no logits at all): their logits [rows][V], and the bytes of the pool's K and V after the step.
struct PrefillSample {
  std::vector<float> logits;
  std::vector<uint8_t> k, v;
};

inline PrefillSample PrefillSamplingRows(LlamaModel& model, const std::vector<int32_t>& ids,
                                         const std::vector<int32_t>& rows) {
  Backend& backend = model.backend();
  const ModelConfig& config = model.config();
  const int n = static_cast<int>(ids.size());
  const int sampled = static_cast<int>(rows.size());
  PrefillFixture fixture = MakeFullPrefill(backend, config, ids);
  fixture.step.num_sample_rows = sampled;
  if (sampled > 0) {
    fixture.step.sample_rows = backend.Allocate({sampled}, DType::kI32);
    backend.CopyFromHost(rows.data(), rows.size() * sizeof(int32_t), fixture.step.sample_rows);
  }
  ForwardWorkspace workspace;
  model.EnsureWorkspace(workspace, n, n, std::max(1, sampled), 1, 1);
  Tensor logits;
  if (sampled > 0) logits = backend.Allocate({sampled, config.vocab_size}, DType::kF32);
  model.Forward(fixture.step, fixture.pool, workspace, logits);
  PrefillSample out;
  out.logits.resize(static_cast<size_t>(sampled) * config.vocab_size);
  if (sampled > 0) backend.CopyToHost(logits, out.logits.data());
  out.k.resize(fixture.pool.k.nbytes());
  out.v.resize(fixture.pool.v.nbytes());
  backend.CopyToHost(fixture.pool.k, out.k.data());
  backend.CopyToHost(fixture.pool.v, out.v.data());
  return out;
}

// Logits [n][V] of every position of `ids` from one dense prefill of the whole sequence.
inline std::vector<float> FullPrefillLogits(LlamaModel& model, const std::vector<int32_t>& ids) {
  std::vector<int32_t> rows(ids.size());
  std::iota(rows.begin(), rows.end(), 0);
  return PrefillSamplingRows(model, ids, rows).logits;
}

}  // namespace sieve::testing
