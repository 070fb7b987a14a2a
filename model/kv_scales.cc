#include "model/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/float8.h"

namespace sieve {

namespace {

// Rows [first, first + count) of `weight` [N][K] (act, or e4m3 with row scales) as f32 on the
// host.
std::vector<float> RowsToHost(Backend& backend, const Tensor& weight, int64_t first,
                              int64_t count) {
  const Tensor rows = weight.Rows(first, first + count);
  const int64_t width = weight.dim(1);
  std::vector<float> out(static_cast<size_t>(count * width));
  if (rows.dtype() == DType::kF8E4M3) {
    std::vector<uint8_t> bytes(out.size());
    backend.CopyToHost(rows, bytes.data());
    std::vector<float> scales(static_cast<size_t>(count));
    backend.CopyToHost(rows.row_scales(), scales.data());
    for (int64_t row = 0; row < count; ++row) {
      for (int64_t col = 0; col < width; ++col) {
        out[row * width + col] = E4m3ToFloat(bytes[row * width + col]) * scales[row];
      }
    }
    return out;
  }
  std::vector<uint8_t> raw(out.size() * DTypeSize(rows.dtype()));
  backend.CopyToHost(rows, raw.data());
  ConvertToFloat(raw.data(), rows.dtype(), out.size(), out.data());
  return out;
}

// Per KV head, the largest bound of an element of K (rotated pairs) or V over this layer's rows.
std::vector<float> HeadBounds(const std::vector<float>& rows, const std::vector<float>& norm,
                              int heads, int head_dim, int64_t width, bool rotated) {
  std::vector<float> element(static_cast<size_t>(heads) * head_dim);
  const double sqrt_width = std::sqrt(static_cast<double>(width));
  for (int64_t row = 0; row < static_cast<int64_t>(element.size()); ++row) {
    double sum = 0.0;
    for (int64_t col = 0; col < width; ++col) {
      const double w = rows[row * width + col] * (norm.empty() ? 1.0f : norm[col]);
      sum += w * w;
    }
    element[row] = static_cast<float>(std::sqrt(sum) * sqrt_width);
  }
  std::vector<float> bounds(heads, 0.0f);
  const int half = head_dim / 2;
  for (int head = 0; head < heads; ++head) {
    const float* b = element.data() + static_cast<int64_t>(head) * head_dim;
    for (int index = 0; index < head_dim; ++index) {
      const float bound = rotated ? std::hypot(b[index % half], b[index % half + half]) : b[index];
      bounds[head] = std::max(bounds[head], bound);
    }
  }
  return bounds;
}

}  // namespace

KvCacheScales ComputeKvCacheScales(const LlamaModel& model) {
  const ModelConfig& config = model.config();
  const ShardLayout& layout = model.layout();
  const int heads = layout.num_kv_heads;
  const int head_dim = config.head_dim;
  KvCacheScales scales;
  scales.k.resize(static_cast<size_t>(config.num_layers) * heads);
  scales.v.resize(scales.k.size());
  const auto& from_checkpoint = model.checkpoint_kv_scales();
  if (!from_checkpoint.empty()) {
    for (int layer = 0; layer < config.num_layers; ++layer) {
      for (int head = 0; head < heads; ++head) {
        scales.k[layer * heads + head] = from_checkpoint[layer][0];
        scales.v[layer * heads + head] = from_checkpoint[layer][1];
      }
    }
    return scales;
  }
  Backend& backend = model.backend();
  const int64_t width = config.hidden_size;
  const int64_t k_first = static_cast<int64_t>(layout.num_q_heads) * head_dim;
  const int64_t kv_rows = static_cast<int64_t>(heads) * head_dim;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const LlamaLayerWeights& weights = model.weights().layers[layer];
    // Folded norms are already in the weight's columns; unfolded ones scale x before the GEMM.
    std::vector<float> norm;
    if (!model.norms_folded()) {
      norm.resize(width);
      std::vector<uint8_t> raw(width * DTypeSize(weights.attn_norm.dtype()));
      backend.CopyToHost(weights.attn_norm, raw.data());
      ConvertToFloat(raw.data(), weights.attn_norm.dtype(), width, norm.data());
    }
    const std::vector<float> rows = RowsToHost(backend, weights.qkv, k_first, 2 * kv_rows);
    const std::vector<float> v_rows(rows.begin() + kv_rows * width, rows.end());
    const std::vector<float> k_bounds = HeadBounds(rows, norm, heads, head_dim, width, true);
    const std::vector<float> v_bounds = HeadBounds(v_rows, norm, heads, head_dim, width, false);
    for (int head = 0; head < heads; ++head) {
      scales.k[layer * heads + head] = std::max(k_bounds[head], kE4m3MinAmax) / kE4m3Max;
      scales.v[layer * heads + head] = std::max(v_bounds[head], kE4m3MinAmax) / kE4m3Max;
    }
  }
  return scales;
}

}  // namespace sieve
