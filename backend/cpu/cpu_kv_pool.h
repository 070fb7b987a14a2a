// How the CPU backend reads and writes a KV pool's entries: f32 as they are, or e4m3 with the
// pool's per-(layer, KV head) scales (KvPool). The twin of the CUDA kernels' FP8 pool accesses.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/step_meta.h"
#include "core/float8.h"
#include "core/tensor.h"

namespace sieve::cpu {

// The K (or V) of KV head `kv_head` at pool entry `entry` of `layer`, read into `out` [d] f32:
// the f32 pool's values, or an FP8 pool's e4m3 values times the (layer, head)'s scale.
inline void ReadPoolEntry(const KvPool& pool, const Tensor& data, const Tensor& scales, int layer,
                          int64_t entry, int kv_head, float* out) {
  const int64_t offset = (entry * pool.num_kv_heads + kv_head) * pool.head_dim;
  if (!pool.fp8()) {
    std::memcpy(out, data.data_as<float>() + offset, pool.head_dim * sizeof(float));
    return;
  }
  const uint8_t* bytes = data.data_as<uint8_t>() + offset;
  const float scale =
      scales.data_as<float>()[static_cast<int64_t>(layer) * pool.num_kv_heads + kv_head];
  for (int index = 0; index < pool.head_dim; ++index) {
    out[index] = E4m3ToFloat(bytes[index]) * scale;
  }
}
// Writes `values` [d] f32 as the K (or V) of `kv_head` at pool entry `entry` of `layer`: as they
// are, or quantized with the (layer, head)'s scale into an FP8 pool (KvPool).
inline void WritePoolEntry(const KvPool& pool, Tensor& data, const Tensor& scales, int layer,
                           int64_t entry, int kv_head, const float* values) {
  const int64_t offset = (entry * pool.num_kv_heads + kv_head) * pool.head_dim;
  if (!pool.fp8()) {
    std::memcpy(data.data_as<float>() + offset, values, pool.head_dim * sizeof(float));
    return;
  }
  uint8_t* bytes = data.data_as<uint8_t>() + offset;
  const float inverse =
      1.0f / scales.data_as<float>()[static_cast<int64_t>(layer) * pool.num_kv_heads + kv_head];
  for (int index = 0; index < pool.head_dim; ++index) {
    bytes[index] = FloatToE4m3(values[index] * inverse);
  }
}

// Copies pool entry `from` of `kv_head` to entry `to` (K and V), as bytes: compaction within a
// pool never requantizes.
inline void MovePoolEntry(KvPool& pool, int64_t from, int64_t to, int kv_head) {
  const size_t bytes = static_cast<size_t>(pool.head_dim) * DTypeSize(pool.k.dtype());
  const int64_t stride = static_cast<int64_t>(pool.head_dim) * DTypeSize(pool.k.dtype());
  for (Tensor* data : {&pool.k, &pool.v}) {
    auto* base = data->data_as<uint8_t>();
    std::memmove(base + (to * pool.num_kv_heads + kv_head) * stride,
                 base + (from * pool.num_kv_heads + kv_head) * stride, bytes);
  }
}

}  // namespace sieve::cpu
