// The scales of an FP8 KV cache (KvPool: entry x of layer l, KV head g is stored as
// e4m3(x / scale[l][g])), for the KV heads one rank holds.
#pragma once

#include <vector>

#include "model/llama_model.h"

namespace sieve {

struct KvCacheScales {
  std::vector<float> k;  // [L][G_r]
  std::vector<float> v;  // [L][G_r]
};

// From the checkpoint where it has K and V scales (LlamaModel::checkpoint_kv_scales(): one per
// layer, as vLLM reads them), else from the weights: a bound no input can exceed, over 448.
//
// Why a bound and not a calibration pass: each K or V element is a row of W_k (W_v) dotted with
// the normed hidden state x / rms(x) (times the norm weight g), whose L2 norm is at most
// sqrt(D). So |k_i| <= ||W_k[i] o g|| sqrt(D), and RoPE mixes the pair (i, i + d/2) into at most
// sqrt(b_i^2 + b_{i+d/2}^2). No prompt saturates the cache, whatever it holds. The bound is loose
// (a real K sits some binades below it), which costs nothing in e4m3's floating point: only
// values below 2^-6 of the scale lose mantissa bits, and at the top of the range there is room.
KvCacheScales ComputeKvCacheScales(const LlamaModel& model);

}  // namespace sieve
