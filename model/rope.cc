#include "model/rope.h"

#include <cmath>
#include <numbers>

namespace sieve {

std::vector<float> RopeInverseFrequencies(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int index = 0; index < half; ++index) {
    const float exponent = static_cast<float>(2 * index) / static_cast<float>(config.head_dim);
    inv_freq[index] = 1.0f / std::pow(static_cast<float>(config.rope_theta), exponent);
  }
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq) f /= scaling.factor;
  } else if (scaling.type == RopeScaling::Type::kLlama3) {
    // transformers' _compute_llama3_parameters: low frequencies (long wavelengths) are divided
    // by `factor`, high ones kept, and the band between blended linearly in 1 / wavelength.
    const float old_context = static_cast<float>(scaling.original_max_position_embeddings);
    const float low_freq_wavelen = old_context / scaling.low_freq_factor;
    const float high_freq_wavelen = old_context / scaling.high_freq_factor;
    for (float& f : inv_freq) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      if (wavelen > low_freq_wavelen) {
        f = f / scaling.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const float smooth = (old_context / wavelen - scaling.low_freq_factor) /
                             (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1.0f - smooth) * f / scaling.factor + smooth * f;
      }
    }
  }
  return inv_freq;
}

std::vector<float> BuildRopeTable(const ModelConfig& config, int max_positions) {
  const std::vector<float> inv_freq = RopeInverseFrequencies(config);
  const size_t half = inv_freq.size();
  std::vector<float> table(static_cast<size_t>(max_positions) * half * 2);
  for (int position = 0; position < max_positions; ++position) {
    for (size_t index = 0; index < half; ++index) {
      // fp32 product as transformers forms it; cos/sin of that fp32 angle.
      const float angle = static_cast<float>(position) * inv_freq[index];
      table[(position * half + index) * 2] =
          static_cast<float>(std::cos(static_cast<double>(angle)));
      table[(position * half + index) * 2 + 1] =
          static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return table;
}

}  // namespace sieve
