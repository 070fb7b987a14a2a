// RoPE: the per-position rotation table of a model, computed once on the host at load.
#pragma once

#include <vector>

#include "model/model_config.h"

namespace sieve {

// Inverse frequencies [head_dim / 2] after the config's rope scaling, computed in fp32 the way
// transformers does (so positions rotate by the same fp32 angles as the reference).
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

// [max_positions][head_dim / 2][2] f32: cos and sin of position * inv_freq[i].
std::vector<float> BuildRopeTable(const ModelConfig& config, int max_positions);

}  // namespace sieve
