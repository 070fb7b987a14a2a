// KV-sparsity ops of the CPU backend: window scores from the prefill LSE, pooling + top-k
// selection, and the write of the kept entries into the layer's pages (SPARSITY.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kv_pool.h"
#include "backend/cpu/cpu_math.h"
#include "core/logits.h"

namespace sieve {

namespace {

const int32_t* I32(const Tensor& tensor) { return tensor.data_as<int32_t>(); }

}  // namespace

void PoolScores(const float* scores, int count, PoolKind pool, int kernel, float* pooled) {
  if (pool == PoolKind::kNone || kernel <= 1) {
    // std::copy_n, not memcpy: an empty prefix comes as null pointers, which memcpy may not take.
    std::copy_n(scores, count, pooled);
    return;
  }
  const int half = kernel / 2;
  for (int position = 0; position < count; ++position) {
    const int begin = std::max(0, position - half);
    const int end = std::min(count, position + half + 1);
    if (pool == PoolKind::kMax) {
      float best = scores[begin];  // padding counts as -inf, so only real positions compete
      for (int index = begin + 1; index < end; ++index) best = std::max(best, scores[index]);
      pooled[position] = best;
    } else {
      float sum = 0.0f;  // zero padding, divided by the full kernel (count_include_pad=True)
      for (int index = begin; index < end; ++index) sum += scores[index];
      pooled[position] = sum / static_cast<float>(kernel);
    }
  }
}

void SelectTopPositions(const float* pooled, int count, int keep, int32_t* kept) {
  SIEVE_CHECK(keep >= 0 && keep <= count) << "keep " << keep << " of " << count;
  std::vector<int32_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  const auto better = [&](int32_t a, int32_t b) {
    return pooled[a] > pooled[b] || (pooled[a] == pooled[b] && a < b);
  };
  std::nth_element(order.begin(), order.begin() + keep, order.end(), better);
  std::sort(order.begin(), order.begin() + keep);
  std::copy(order.begin(), order.begin() + keep, kept);
}

void CpuBackend::WindowScores(const Tensor& q, const Tensor& k, const Tensor& lse, int num_heads,
                              const StepMeta& step, int layer, Tensor& scores) {
  const int kv_heads = static_cast<int>(k.dim(1));
  const int head_dim = static_cast<int>(k.dim(2));
  const int group = num_heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int32_t* query_start = I32(step.query_start);
  const int32_t* key_start = I32(step.key_start);
  const int32_t* context = I32(step.context_lens);
  const int64_t key_stride = static_cast<int64_t>(kv_heads) * head_dim;
  for (int job_index = step.job_begin[layer]; job_index < step.job_begin[layer + 1]; ++job_index) {
    const CompressionJob& job = step.jobs_host[job_index];
    if (job.mode != SelectMode::kTopScores) continue;
    const int seq = job.prefill_seq;
    const int n = job.num_keys;
    const int window = job.score_rows;
    // Scored row i of the prompt is token row query_start + (i - context): the scheduler keeps
    // every scored row inside the last chunk.
    SIEVE_CHECK(n - window >= context[seq]) << "scored rows not inside the final chunk";
    float* job_scores = scores.data_as<float>() + job.score_offset;
    pool_.ParallelFor(kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> head_sum(n);
      for (int64_t kv_head = begin; kv_head < end; ++kv_head) {
        float* out = job_scores + kv_head * n;
        std::fill(out, out + n, 0.0f);  // probabilities are >= 0, so 0 also starts a max
        for (int head = static_cast<int>(kv_head) * group; head < (kv_head + 1) * group; ++head) {
          std::fill(head_sum.begin(), head_sum.end(), 0.0f);
          for (int row = n - window; row < n; ++row) {
            const int token = query_start[seq] + (row - context[seq]);
            const float* q_row = q.data_as<float>() + token * q.stride(0) + head * head_dim;
            const float row_lse = lse.data_as<float>()[token * lse.stride(0) + head];
            const float* k_rows =
                k.data_as<float>() + (key_start[seq] * key_stride) + kv_head * head_dim;
            for (int key = 0; key <= row; ++key) {
              head_sum[key] +=
                  std::exp(scale * cpu::Dot(q_row, k_rows + key * key_stride, head_dim) - row_lse);
            }
          }
          for (int key = 0; key < n; ++key) {
            out[key] = job.reduce == GroupReduce::kMax ? std::max(out[key], head_sum[key])
                                                       : out[key] + head_sum[key];
          }
        }
        if (job.reduce == GroupReduce::kMean) {
          for (int key = 0; key < n; ++key) out[key] /= static_cast<float>(group);
        }
      }
    });
  }
}

void CpuBackend::SelectKept(const Tensor& scores, int num_kv_heads, const StepMeta& step, int layer,
                            Tensor& kept) {
  for (int job_index = step.job_begin[layer]; job_index < step.job_begin[layer + 1]; ++job_index) {
    const CompressionJob& job = step.jobs_host[job_index];
    const int prefix = job.num_keys - job.window;
    const int keep = job.budget - job.window;
    pool_.ParallelFor(num_kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> pooled(prefix);
      for (int64_t kv_head = begin; kv_head < end; ++kv_head) {
        int32_t* out = kept.data_as<int32_t>() + job.index_offset + kv_head * keep;
        if (job.mode == SelectMode::kFirstPositions) {
          std::iota(out, out + keep, 0);
          continue;
        }
        const float* head_scores =
            scores.data_as<float>() + job.score_offset + kv_head * job.num_keys;
        PoolScores(head_scores, prefix, job.pool, job.pool_kernel, pooled.data());
        SelectTopPositions(pooled.data(), prefix, keep, out);
      }
    });
  }
}

void CpuBackend::WriteKeptKv(const Tensor& k, const Tensor& v, const Tensor& scores,
                             const Tensor& kept, const StepMeta& step, int layer, KvPool& pool) {
  const int kv_heads = pool.num_kv_heads;
  const int head_dim = pool.head_dim;
  const int32_t* key_start = I32(step.key_start);
  const int64_t key_stride = static_cast<int64_t>(kv_heads) * head_dim;
  for (int job_index = step.job_begin[layer]; job_index < step.job_begin[layer + 1]; ++job_index) {
    const CompressionJob& job = step.jobs_host[job_index];
    const int keep = job.budget - job.window;
    const int32_t* page_row =
        I32(pool.page_table) +
        (static_cast<int64_t>(layer) * pool.max_seqs + job.seq_slot) * pool.max_pages_per_seq;
    for (int entry = 0; entry < job.budget; ++entry) {
      const int list_entry = job.kept_offset + entry;
      const int64_t pool_entry =
          static_cast<int64_t>(page_row[list_entry / pool.page_size]) * pool.page_size +
          list_entry % pool.page_size;
      for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
        const int key = entry < keep
                            ? kept.data_as<int32_t>()[job.index_offset + kv_head * keep + entry]
                            : job.num_keys - job.budget + entry;
        const int64_t src = (key_start[job.prefill_seq] + key) * key_stride + kv_head * head_dim;
        cpu::WritePoolEntry(pool, pool.k, pool.k_scales, layer, pool_entry, kv_head,
                            k.data_as<float>() + src);
        cpu::WritePoolEntry(pool, pool.v, pool.v_scales, layer, pool_entry, kv_head,
                            v.data_as<float>() + src);
        if (pool.positions.defined())
          pool.positions.data_as<int32_t>()[pool_entry * kv_heads + kv_head] = key;
        if (pool.scores.defined()) {
          pool.scores.data_as<float>()[pool_entry * kv_heads + kv_head] =
              job.mode == SelectMode::kTopScores
                  ? scores.data_as<float>()[job.score_offset + kv_head * job.num_keys + key]
                  : 0.0f;
        }
      }
    }
    pool.kv_lens.data_as<int32_t>()[static_cast<int64_t>(layer) * pool.max_seqs + job.seq_slot] =
        job.budget;
  }
}

void CpuBackend::EvictEntries(const StepMeta& step, int layer, KvPool& pool) {
  const int kv_heads = pool.num_kv_heads;
  int32_t* positions = pool.positions.data_as<int32_t>();
  float* scores = pool.scores.defined() ? pool.scores.data_as<float>() : nullptr;
  for (int job_index = step.eviction_begin[layer]; job_index < step.eviction_begin[layer + 1];
       ++job_index) {
    const EvictionJob& job = step.evictions_host[job_index];
    const int32_t* page_row =
        I32(pool.page_table) +
        (static_cast<int64_t>(layer) * pool.max_seqs + job.seq_slot) * pool.max_pages_per_seq;
    const auto entry_of = [&](int entry) {
      return static_cast<int64_t>(page_row[entry / pool.page_size]) * pool.page_size +
             entry % pool.page_size;
    };
    const int64_t last = entry_of(job.length - 1);
    for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
      int victim = -1;
      for (int entry = 0; entry < job.length; ++entry) {
        const int64_t e = entry_of(entry) * kv_heads + kv_head;
        const int32_t position = positions[e];
        if (position < job.sinks || position > job.position - job.protect_recent) continue;
        if (victim < 0) {
          victim = entry;
          continue;
        }
        const int64_t v = entry_of(victim) * kv_heads + kv_head;
        const bool better =
            job.kind == EvictionJob::kOldest
                ? position < positions[v]
                : (scores[e] < scores[v] || (scores[e] == scores[v] && position < positions[v]));
        if (better) victim = entry;
      }
      SIEVE_CHECK(victim >= 0) << "nothing evictable: cap smaller than sinks + recent";
      const int64_t dst = entry_of(victim);
      if (dst == last) continue;
      cpu::MovePoolEntry(pool, last, dst, kv_head);
      positions[dst * kv_heads + kv_head] = positions[last * kv_heads + kv_head];
      if (scores) scores[dst * kv_heads + kv_head] = scores[last * kv_heads + kv_head];
    }
    pool.kv_lens.data_as<int32_t>()[static_cast<int64_t>(layer) * pool.max_seqs + job.seq_slot] =
        job.length - 1;
  }
}

void CpuBackend::ScatterInt32(const Tensor& patches, int count, Tensor& dst) {
  const int32_t* pairs = I32(patches);
  int32_t* out = dst.data_as<int32_t>();
  const int64_t size = dst.numel();
  for (int index = 0; index < count; ++index) {
    SIEVE_CHECK(pairs[2 * index] >= 0 && pairs[2 * index] < size);
    out[pairs[2 * index]] = pairs[2 * index + 1];
  }
}

void CpuBackend::GatherInt32(const Tensor& src, const Tensor& pairs, int count, Tensor& dst) {
  const int32_t* pair = I32(pairs);
  const int32_t* from = I32(src);
  int32_t* out = dst.data_as<int32_t>();
  for (int index = 0; index < count; ++index) {
    SIEVE_CHECK(pair[2 * index] >= 0 && pair[2 * index] < dst.numel() && pair[2 * index + 1] >= 0 &&
                pair[2 * index + 1] < src.numel());
    out[pair[2 * index]] = from[pair[2 * index + 1]];
  }
}

bool CpuBackend::BeginSampling(const Tensor& logits, const std::vector<DeviceSamplingRow>& rows,
                               Tensor& tokens) {
  SIEVE_CHECK(begun_.size() < 2) << "at most two samplings may be outstanding";
  for (const DeviceSamplingRow& row : rows) {
    if (row.temperature > 0) return false;
  }
  SIEVE_CHECK(logits.dtype() == DType::kF32 && logits.dim(0) >= static_cast<int64_t>(rows.size()) &&
              tokens.numel() >= static_cast<int64_t>(rows.size()));
  const size_t vocab = static_cast<size_t>(logits.dim(1));
  Samples samples;
  for (size_t row = 0; row < rows.size(); ++row) {
    // As runtime/sampler.cc's greedy row.
    const std::span<const float> values(logits.data_as<float>() + row * logits.stride(0), vocab);
    const int32_t best = ArgMax(values);
    samples.tokens.push_back(best);
    samples.logprobs.push_back(LogSoftmaxAt(values, best));
  }
  std::copy(samples.tokens.begin(), samples.tokens.end(), tokens.data_as<int32_t>());
  begun_.push_back(std::move(samples));
  return true;
}

void CpuBackend::TakeSamples(std::vector<int32_t>& tokens, std::vector<float>& logprobs) {
  SIEVE_CHECK(!begun_.empty()) << "no sampling was begun";
  tokens = std::move(begun_.front().tokens);
  logprobs = std::move(begun_.front().logprobs);
  begun_.erase(begun_.begin());
}

}  // namespace sieve
