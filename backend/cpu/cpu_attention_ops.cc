// Attention ops of the CPU backend: RoPE (+ the folded RMSNorm's row scaling) + cache write, K/V
// gather, prefill and decode attention.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_kv_pool.h"
#include "backend/cpu/cpu_math.h"

namespace sieve {

namespace {

const int32_t* I32(const Tensor& tensor) { return tensor.data_as<int32_t>(); }

// Index of entry `entry` of (slot, layer) in the pool's [num_pages * page_size] entry space.
int64_t PoolEntry(const KvPool& pool, int layer, int slot, int entry) {
  const int32_t* row = I32(pool.page_table) + (static_cast<int64_t>(layer) * pool.max_seqs + slot) *
                                                  pool.max_pages_per_seq;
  const int page_index = entry / pool.page_size;
  SIEVE_CHECK(page_index < pool.max_pages_per_seq) << "entry " << entry << " past the page table";
  const int32_t page = row[page_index];
  SIEVE_CHECK(page >= 0 && page < pool.num_pages) << "bad page " << page;
  return static_cast<int64_t>(page) * pool.page_size + entry % pool.page_size;
}

void RotateHalf(float* x, const float* cos_sin, int head_dim) {
  const int half = head_dim / 2;
  for (int index = 0; index < half; ++index) {
    const float c = cos_sin[2 * index];
    const float s = cos_sin[2 * index + 1];
    const float a = x[index];
    const float b = x[index + half];
    x[index] = a * c - b * s;
    x[index + half] = b * c + a * s;
  }
}

}  // namespace

void CpuBackend::RopeAndCacheWrite(Tensor& qkv, const Tensor& rope_table, int num_heads,
                                   const StepMeta& step, int layer, KvPool& pool, RopeTokens tokens,
                                   RowRms norm) {
  const int head_dim = pool.head_dim;
  const int kv_heads = pool.num_kv_heads;
  const int64_t max_position = rope_table.dim(0);
  const int32_t* positions = I32(step.positions);
  const int first_token = tokens == RopeTokens::kDecode ? step.num_prefill_tokens : 0;
  const int end_token = tokens == RopeTokens::kPrefill ? step.num_prefill_tokens : step.num_tokens;
  const int64_t row_width = static_cast<int64_t>(num_heads + 2 * kv_heads) * head_dim;
  SIEVE_CHECK(qkv.rank() == 2 && qkv.dim(1) == row_width && qkv.stride(1) == 1)
      << "qkv " << qkv.ShapeString() << " for " << num_heads << " + 2 x " << kv_heads << " heads";
  CheckRowRms(norm, qkv.dim(0), "rope_and_cache_write");
  pool_.ParallelFor(end_token - first_token, 8, [&](int64_t begin, int64_t end) {
    for (int64_t token = first_token + begin; token < first_token + end; ++token) {
      const int32_t position = positions[token];
      SIEVE_CHECK(position >= 0 && position < max_position) << "position " << position;
      const float* cos_sin = rope_table.data_as<float>() + position * rope_table.stride(0);
      float* row = qkv.data_as<float>() + token * qkv.stride(0);
      // The folded RMSNorm: q, k and v scaled by the token's s in place, before rotating.
      if (norm.rows != nullptr) {
        const float s = RowRmsScale(norm, token);
        for (int64_t index = 0; index < row_width; ++index) row[index] *= s;
      }
      for (int head = 0; head < num_heads + kv_heads; ++head) {
        RotateHalf(row + head * head_dim, cos_sin, head_dim);
      }
    }
  });
  const int32_t* query_start = I32(step.query_start);
  const int32_t* write_start = I32(step.write_start) + static_cast<int64_t>(layer) * step.num_seqs;
  const int32_t* slots = I32(step.seq_slots);
  // Prefill sequences own tokens [0, T_p), decode sequences the rest.
  const int first_seq = tokens == RopeTokens::kDecode ? step.num_prefill_seqs : 0;
  const int end_seq = tokens == RopeTokens::kPrefill ? step.num_prefill_seqs : step.num_seqs;
  for (int seq = first_seq; seq < end_seq; ++seq) {
    if (write_start[seq] < 0) continue;
    for (int32_t token = query_start[seq]; token < query_start[seq + 1]; ++token) {
      const int entry_index = write_start[seq] + (token - query_start[seq]);
      const int64_t entry = PoolEntry(pool, layer, slots[seq], entry_index);
      const float* row = qkv.data_as<float>() + token * qkv.stride(0);
      for (int g = 0; g < kv_heads; ++g) {
        cpu::WritePoolEntry(pool, pool.k, pool.k_scales, layer, entry, g,
                            row + (num_heads + g) * head_dim);
        cpu::WritePoolEntry(pool, pool.v, pool.v_scales, layer, entry, g,
                            row + (num_heads + kv_heads + g) * head_dim);
        if (pool.positions.defined()) {
          pool.positions.data_as<int32_t>()[entry * kv_heads + g] = positions[token];
        }
        if (pool.scores.defined()) pool.scores.data_as<float>()[entry * kv_heads + g] = 0.0f;
      }
    }
  }
}

void CpuBackend::GatherPrefillKv(const Tensor& qkv, int num_heads, const StepMeta& step, int layer,
                                 const KvPool& pool, Tensor& k_out, Tensor& v_out) {
  const int head_dim = pool.head_dim;
  const int kv_heads = pool.num_kv_heads;
  const int64_t row_width = static_cast<int64_t>(kv_heads) * head_dim;
  const int32_t* query_start = I32(step.query_start);
  const int32_t* key_start = I32(step.key_start);
  const int32_t* context = I32(step.context_lens);
  const int32_t* slots = I32(step.seq_slots);
  for (int seq = 0; seq < step.num_prefill_seqs; ++seq) {
    float* k_rows = k_out.data_as<float>() + key_start[seq] * row_width;
    float* v_rows = v_out.data_as<float>() + key_start[seq] * row_width;
    for (int entry = 0; entry < context[seq]; ++entry) {
      const int64_t pool_entry = PoolEntry(pool, layer, slots[seq], entry);
      for (int g = 0; g < kv_heads; ++g) {
        cpu::ReadPoolEntry(pool, pool.k, pool.k_scales, layer, pool_entry, g,
                           k_rows + entry * row_width + g * head_dim);
        cpu::ReadPoolEntry(pool, pool.v, pool.v_scales, layer, pool_entry, g,
                           v_rows + entry * row_width + g * head_dim);
      }
    }
    const int chunk = query_start[seq + 1] - query_start[seq];
    for (int index = 0; index < chunk; ++index) {
      const float* row = qkv.data_as<float>() + (query_start[seq] + index) * qkv.stride(0);
      std::memcpy(k_rows + (context[seq] + index) * row_width, row + num_heads * head_dim,
                  row_width * sizeof(float));
      std::memcpy(v_rows + (context[seq] + index) * row_width,
                  row + (num_heads + kv_heads) * head_dim, row_width * sizeof(float));
    }
  }
}

void CpuBackend::PrefillAttention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                                  const StepMeta& step, Tensor& out, Tensor& lse) {
  const int kv_heads = static_cast<int>(k.dim(1));
  const int head_dim = static_cast<int>(k.dim(2));
  const int group = num_heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int32_t* query_start = I32(step.query_start);
  const int32_t* key_start = I32(step.key_start);
  const int32_t* context = I32(step.context_lens);
  const cpu::Isa isa = cpu::BestIsa();
  // A query row's attention is the same arithmetic in prefill and decode (so that a token
  // recomputed by a prefill, after a preemption, gets the bits its decode step got): the scores'
  // dot products, cpu::SoftmaxRow (which scales them), then the weighted sum of the value rows.
  // Work items: a tile of up to kQueryTile consecutive query rows of one sequence, one head. The
  // tile's rows share each key and value row they read; each row's arithmetic is its own.
  constexpr int kQueryTile = 4;
  struct Tile {
    int seq;
    int first_token;
  };
  std::vector<Tile> tiles;
  for (int seq = 0; seq < step.num_prefill_seqs; ++seq) {
    for (int token = query_start[seq]; token < query_start[seq + 1]; token += kQueryTile) {
      tiles.push_back({seq, token});
    }
  }
  // Longest first (a tile's work grows with the keys it sees): the threads' last chunks are then
  // the short ones, and they finish together.
  std::stable_sort(tiles.begin(), tiles.end(), [&](const Tile& a, const Tile& b) {
    return context[a.seq] + a.first_token - query_start[a.seq] >
           context[b.seq] + b.first_token - query_start[b.seq];
  });
  const int64_t key_stride = static_cast<int64_t>(kv_heads) * head_dim;
  pool_.ParallelFor(
      static_cast<int64_t>(tiles.size()) * num_heads, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> weights;
        for (int64_t item = begin; item < end; ++item) {
          const Tile& tile = tiles[item / num_heads];
          const int head = static_cast<int>(item % num_heads);
          const int seq = tile.seq;
          const int rows = std::min(kQueryTile, query_start[seq + 1] - tile.first_token);
          // Row r sees the sequence's first `first_visible + r` keys.
          const int first_visible = context[seq] + (tile.first_token - query_start[seq]) + 1;
          const int max_visible = first_visible + rows - 1;
          const int64_t kv_offset = static_cast<int64_t>(key_start[seq]) * key_stride +
                                    static_cast<int64_t>(head / group) * head_dim;
          const float* q_rows =
              q.data_as<float>() + tile.first_token * q.stride(0) + head * head_dim;
          float* out_rows =
              out.data_as<float>() + tile.first_token * out.stride(0) + head * head_dim;
          const auto keys = cpu::Rows::Strided(k.data_as<float>() + kv_offset, key_stride);
          const auto values = cpu::Rows::Strided(v.data_as<float>() + kv_offset, key_stride);
          weights.resize(static_cast<size_t>(rows) * max_visible);
          // Every row's dot products with the tile's keys (a row's past its own are not read).
          cpu::DotTable(isa, cpu::Rows::Strided(q_rows, q.stride(0)), rows, keys, max_visible,
                        head_dim, weights.data(), max_visible, /*accumulate=*/false);
          for (int r = 0; r < rows; ++r) {
            const int token = tile.first_token + r;
            lse.data_as<float>()[token * lse.stride(0) + head] =
                cpu::SoftmaxRow(isa, weights.data() + r * max_visible, first_visible + r, scale);
            std::memset(out_rows + r * out.stride(0), 0, head_dim * sizeof(float));
          }
          // The keys every row sees, for all rows at once; then each row's own last ones.
          cpu::WeightedSumRows(isa, weights.data(), max_visible, rows, values, first_visible,
                               head_dim, out_rows, out.stride(0));
          const auto later_values = cpu::Rows::Strided(
              v.data_as<float>() + kv_offset + first_visible * key_stride, key_stride);
          for (int r = 1; r < rows; ++r) {
            cpu::WeightedSumRows(isa, weights.data() + r * max_visible + first_visible, max_visible,
                                 1, later_values, r, head_dim, out_rows + r * out.stride(0),
                                 out.stride(0));
          }
        }
      });
}

void CpuBackend::DecodeAttention(const Tensor& q, int num_heads, const StepMeta& step, int layer,
                                 KvPool& pool, Tensor& out) {
  const int kv_heads = pool.num_kv_heads;
  const int head_dim = pool.head_dim;
  const int group = num_heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int num_decode = step.num_seqs - step.num_prefill_seqs;
  const int32_t* query_start = I32(step.query_start);
  const int32_t* slots = I32(step.seq_slots);
  const int32_t* lens = I32(pool.kv_lens) + static_cast<int64_t>(layer) * pool.max_seqs;
  const cpu::Isa isa = cpu::BestIsa();
  // One work item per (decode sequence, KV head): the group's query heads share the K/V reads,
  // and the side pool's per-entry scores are owned by exactly one item.
  pool_.ParallelFor(
      static_cast<int64_t>(num_decode) * kv_heads, 1, [&](int64_t begin, int64_t end) {
        std::vector<int64_t> entries;
        // The KV head's entries as f32 rows: the pool's own rows, or an FP8 pool's dequantized
        // into `dequantized` ([length][2][d]).
        std::vector<const float*> keys, values;
        std::vector<float> dequantized;
        std::vector<float> probs, weights;
        for (int64_t item = begin; item < end; ++item) {
          const int seq = step.num_prefill_seqs + static_cast<int>(item / kv_heads);
          const int kv_head = static_cast<int>(item % kv_heads);
          const int token = query_start[seq];
          const int length = lens[slots[seq]];
          entries.resize(length);
          keys.resize(length);
          values.resize(length);
          if (pool.fp8()) dequantized.resize(static_cast<size_t>(length) * 2 * head_dim);
          for (int entry = 0; entry < length; ++entry) {
            entries[entry] = PoolEntry(pool, layer, slots[seq], entry);
            const int64_t offset = (entries[entry] * kv_heads + kv_head) * head_dim;
            if (!pool.fp8()) {
              keys[entry] = pool.k.data_as<float>() + offset;
              values[entry] = pool.v.data_as<float>() + offset;
              continue;
            }
            float* k_row = dequantized.data() + static_cast<int64_t>(entry) * 2 * head_dim;
            cpu::ReadPoolEntry(pool, pool.k, pool.k_scales, layer, entries[entry], kv_head, k_row);
            cpu::ReadPoolEntry(pool, pool.v, pool.v_scales, layer, entries[entry], kv_head,
                               k_row + head_dim);
            keys[entry] = k_row;
            values[entry] = k_row + head_dim;
          }
          // The group's query heads as the rows of one table (consecutive heads of the token).
          const int first_head = kv_head * group;
          const float* q_rows = q.data_as<float>() + token * q.stride(0) + first_head * head_dim;
          float* out_rows = out.data_as<float>() + token * out.stride(0) + first_head * head_dim;
          weights.resize(static_cast<size_t>(group) * length);
          cpu::DotTable(isa, cpu::Rows::Strided(q_rows, head_dim), group,
                        cpu::Rows::Pointers(keys.data()), length, head_dim, weights.data(), length,
                        /*accumulate=*/false);
          for (int r = 0; r < group; ++r) {
            cpu::SoftmaxRow(isa, weights.data() + r * length, length, scale);
          }
          std::memset(out_rows, 0, static_cast<size_t>(group) * head_dim * sizeof(float));
          cpu::WeightedSumRows(isa, weights.data(), length, group,
                               cpu::Rows::Pointers(values.data()), length, head_dim, out_rows,
                               head_dim);
          if (pool.scores.defined()) {
            // H2O's accumulated attention: the group's probabilities, summed in head order.
            probs.assign(length, 0.0f);
            for (int r = 0; r < group; ++r) {
              for (int entry = 0; entry < length; ++entry)
                probs[entry] += weights[r * length + entry];
            }
            float* acc = pool.scores.data_as<float>();
            for (int entry = 0; entry < length; ++entry) {
              acc[entries[entry] * kv_heads + kv_head] += probs[entry] / static_cast<float>(group);
            }
          }
        }
      });
}

}  // namespace sieve
