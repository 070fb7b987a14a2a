#include "model/llama_model.h"

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "model/llama_checkpoint.h"
#include "model/rope.h"

namespace sieve {

namespace {

// Concatenates checkpoint tensors along rows (dimension 0) and uploads them as one matrix.
Result<Tensor> UploadFused(Backend& backend, const SafetensorsCheckpoint& checkpoint,
                           const std::vector<std::string>& names) {
  std::vector<const SafetensorsTensor*> parts;
  int64_t rows = 0;
  int64_t cols = -1;
  bool same_dtype = true;
  for (const std::string& name : names) {
    const SafetensorsTensor* part = checkpoint.Find(name);
    if (part == nullptr) return NotFoundError("tensor " + name + " is missing");
    const int64_t part_cols = part->shape.size() == 2 ? part->shape[1] : part->shape[0];
    if (cols >= 0 && part_cols != cols) {
      return InvalidArgumentError("tensor " + name + " has " + std::to_string(part_cols) +
                                  " columns, expected " + std::to_string(cols));
    }
    cols = part_cols;
    rows += part->shape.size() == 2 ? part->shape[0] : 1;
    if (!parts.empty() && part->dtype != parts[0]->dtype) same_dtype = false;
    parts.push_back(part);
  }
  std::vector<int64_t> shape =
      parts.size() == 1 ? parts[0]->shape : std::vector<int64_t>{rows, cols};
  if (parts.size() == 1) return backend.UploadWeight(parts[0]->data, parts[0]->dtype, shape);
  if (same_dtype) {
    std::vector<uint8_t> joined;
    for (const SafetensorsTensor* part : parts) {
      const auto* bytes = static_cast<const uint8_t*>(part->data);
      joined.insert(joined.end(), bytes, bytes + part->nbytes);
    }
    return backend.UploadWeight(joined.data(), parts[0]->dtype, shape);
  }
  std::vector<float> joined;
  for (const SafetensorsTensor* part : parts) {
    const size_t count = part->nbytes / DTypeSize(part->dtype);
    const size_t offset = joined.size();
    joined.resize(offset + count);
    ConvertToFloat(part->data, part->dtype, count, joined.data() + offset);
  }
  return backend.UploadWeight(joined.data(), DType::kF32, shape);
}

std::string LayerName(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

// Folded norms unless SIEVE_FOLD_NORMS is "0".
bool FoldNormsFromEnv() {
  const char* value = std::getenv("SIEVE_FOLD_NORMS");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, Backend& backend, int max_positions)
    : config_(config),
      backend_(backend),
      max_positions_(max_positions),
      folded_norms_(FoldNormsFromEnv()) {}

void LlamaModel::FoldNorms() {
  if (!folded_norms_) return;
  for (LlamaLayerWeights& w : weights_.layers) {
    backend_.ScaleColumns(w.qkv, w.attn_norm);
    backend_.ScaleColumns(w.gate_up, w.mlp_norm);
  }
}

void LlamaModel::UploadRopeTable() {
  const std::vector<float> table = BuildRopeTable(config_, max_positions_);
  rope_table_ = backend_.Allocate({max_positions_, config_.head_dim / 2, 2}, DType::kF32);
  backend_.CopyFromHost(table.data(), table.size() * sizeof(float), rope_table_);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Load(const ModelConfig& config,
                                                     const SafetensorsCheckpoint& checkpoint,
                                                     Backend& backend, int max_positions) {
  SIEVE_RETURN_IF_ERROR(config.Validate());
  SIEVE_RETURN_IF_ERROR(ValidateLlamaCheckpoint(checkpoint, config));
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, backend, max_positions));
  LlamaWeights& weights = model->weights_;
  SIEVE_ASSIGN_OR_RETURN(weights.embed,
                         UploadFused(backend, checkpoint, {"model.embed_tokens.weight"}));
  SIEVE_ASSIGN_OR_RETURN(weights.final_norm,
                         UploadFused(backend, checkpoint, {"model.norm.weight"}));
  if (config.tie_word_embeddings) {
    weights.lm_head = weights.embed;
  } else {
    SIEVE_ASSIGN_OR_RETURN(weights.lm_head, UploadFused(backend, checkpoint, {"lm_head.weight"}));
  }
  weights.layers.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    LlamaLayerWeights& w = weights.layers[layer];
    SIEVE_ASSIGN_OR_RETURN(w.attn_norm, UploadFused(backend, checkpoint,
                                                    {LayerName(layer, "input_layernorm.weight")}));
    SIEVE_ASSIGN_OR_RETURN(w.qkv, UploadFused(backend, checkpoint,
                                              {LayerName(layer, "self_attn.q_proj.weight"),
                                               LayerName(layer, "self_attn.k_proj.weight"),
                                               LayerName(layer, "self_attn.v_proj.weight")}));
    SIEVE_ASSIGN_OR_RETURN(
        w.o, UploadFused(backend, checkpoint, {LayerName(layer, "self_attn.o_proj.weight")}));
    SIEVE_ASSIGN_OR_RETURN(
        w.mlp_norm,
        UploadFused(backend, checkpoint, {LayerName(layer, "post_attention_layernorm.weight")}));
    SIEVE_ASSIGN_OR_RETURN(w.gate_up, UploadFused(backend, checkpoint,
                                                  {LayerName(layer, "mlp.gate_proj.weight"),
                                                   LayerName(layer, "mlp.up_proj.weight")}));
    SIEVE_ASSIGN_OR_RETURN(
        w.down, UploadFused(backend, checkpoint, {LayerName(layer, "mlp.down_proj.weight")}));
  }
  model->FoldNorms();
  model->UploadRopeTable();
  return model;
}

std::unique_ptr<LlamaModel> LlamaModel::Random(const ModelConfig& config, Backend& backend,
                                               uint64_t seed, int max_positions, float init_std) {
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, backend, max_positions));
  const int64_t d = config.hidden_size;
  const int64_t hd = config.head_dim;
  const DType dtype = backend.activation_dtype();
  uint64_t tensor_seed = seed;
  const auto matrix = [&](int64_t rows, int64_t cols) {
    Tensor tensor = backend.Allocate({rows, cols}, dtype);
    backend.FillRandom(tensor, tensor_seed++, init_std);
    return tensor;
  };
  std::mt19937_64 norm_rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  const auto norm = [&]() {
    std::vector<float> values(d);
    for (float& value : values) value = 1.0f + normal(norm_rng);
    return backend.UploadWeight(values.data(), DType::kF32, {d});
  };
  LlamaWeights& weights = model->weights_;
  weights.embed = matrix(config.vocab_size, d);
  weights.final_norm = norm();
  weights.lm_head = config.tie_word_embeddings ? weights.embed : matrix(config.vocab_size, d);
  weights.layers.resize(config.num_layers);
  for (LlamaLayerWeights& w : weights.layers) {
    w.attn_norm = norm();
    w.qkv = matrix((config.num_heads + 2 * config.num_kv_heads) * hd, d);
    w.o = matrix(d, config.num_heads * hd);
    w.mlp_norm = norm();
    w.gate_up = matrix(2 * static_cast<int64_t>(config.intermediate_size), d);
    w.down = matrix(d, config.intermediate_size);
  }
  model->FoldNorms();
  model->UploadRopeTable();
  return model;
}

void LlamaModel::EnsureWorkspace(ForwardWorkspace& ws, int max_tokens, int64_t max_prefill_keys,
                                 int max_sample_rows, int64_t max_scores, int64_t max_kept) const {
  const DType act = backend_.activation_dtype();
  const int64_t d = config_.hidden_size;
  const int64_t hd = config_.head_dim;
  const int64_t heads = config_.num_heads;
  const int64_t kv_heads = config_.num_kv_heads;
  if (max_tokens > ws.max_tokens) {
    ws.max_tokens = max_tokens;
    ws.hidden = backend_.Allocate({max_tokens, d}, act);
    ws.normed = backend_.Allocate({max_tokens, d}, act);
    ws.qkv = backend_.Allocate({max_tokens, (heads + 2 * kv_heads) * hd}, act);
    ws.attn = backend_.Allocate({max_tokens, heads * hd}, act);
    ws.proj = backend_.Allocate({max_tokens, d}, act);
    ws.gate_up =
        backend_.Allocate({max_tokens, 2 * static_cast<int64_t>(config_.intermediate_size)}, act);
    ws.act = backend_.Allocate({max_tokens, config_.intermediate_size}, act);
    ws.lse = backend_.Allocate({max_tokens, heads}, DType::kF32);
  }
  if (max_prefill_keys > ws.max_prefill_keys) {
    ws.max_prefill_keys = max_prefill_keys;
    ws.k_scratch = backend_.Allocate({max_prefill_keys, kv_heads, hd}, act);
    ws.v_scratch = backend_.Allocate({max_prefill_keys, kv_heads, hd}, act);
  }
  if (max_sample_rows > ws.max_sample_rows) {
    ws.max_sample_rows = max_sample_rows;
    ws.last = backend_.Allocate({max_sample_rows, d}, act);
  }
  if (max_scores > ws.max_scores) {
    ws.max_scores = max_scores;
    ws.scores = backend_.Allocate({max_scores}, DType::kF32);
  }
  if (max_kept > ws.max_kept) {
    ws.max_kept = max_kept;
    ws.kept = backend_.Allocate({max_kept}, DType::kI32);
  }
}

void LlamaModel::Forward(const StepMeta& step, KvPool& pool, ForwardWorkspace& ws,
                         Tensor& logits) const {
  const int tokens = step.num_tokens;
  const int prefill_tokens = step.num_prefill_tokens;
  const int heads = config_.num_heads;
  const int64_t q_width = static_cast<int64_t>(heads) * config_.head_dim;
  const float eps = config_.rms_norm_eps;
  SIEVE_CHECK(tokens > 0 && tokens <= ws.max_tokens) << "step of " << tokens << " tokens";
  SIEVE_CHECK(step.num_prefill_keys <= ws.max_prefill_keys);
  SIEVE_CHECK(step.max_scores_per_layer <= ws.max_scores &&
              step.max_indices_per_layer <= ws.max_kept);

  Tensor hidden = ws.hidden.Rows(0, tokens);
  Tensor normed = ws.normed.Rows(0, tokens);
  Tensor qkv = ws.qkv.Rows(0, tokens);
  Tensor attn = ws.attn.Rows(0, tokens);
  Tensor proj = ws.proj.Rows(0, tokens);
  Tensor gate_up = ws.gate_up.Rows(0, tokens);
  Tensor act = ws.act.Rows(0, tokens);
  Tensor q = qkv.Columns(0, q_width);
  Tensor k_scratch = ws.k_scratch.Rows(0, step.num_prefill_keys);
  Tensor v_scratch = ws.v_scratch.Rows(0, step.num_prefill_keys);

  backend_.Embedding(weights_.embed, step.token_ids, hidden);
  // Folded norms: the GEMMs after the norms read the residual stream `hidden` itself and the ops
  // after them scale each row by its inverse RMS; `hidden` does not change between a layer's qkv
  // GEMM and its attention ops, nor between its gate_up GEMM and SiluMul. Unfolded: `normed`
  // holds RmsNorm(hidden) and no op scales.
  const RowRms norm = folded_norms_ ? RowRms{&hidden, eps} : RowRms{};
  const Tensor& gemm_input = folded_norms_ ? hidden : normed;
  if (!folded_norms_) backend_.RmsNorm(hidden, weights_.layers[0].attn_norm, eps, normed);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    const LlamaLayerWeights& w = weights_.layers[layer];
    backend_.Linear(gemm_input, w.qkv, qkv);
    // Decode tokens are rotated and written by RopeDecodeAttention below; nothing in between
    // reads them (the prefill ops touch prefill sequences only).
    if (prefill_tokens > 0) {
      backend_.RopeAndCacheWrite(qkv, rope_table_, heads, step, layer, pool, RopeTokens::kPrefill,
                                 norm);
    }
    if (step.num_prefill_seqs > 0) {
      Tensor q_prefill = q.Rows(0, prefill_tokens);
      Tensor attn_prefill = attn.Rows(0, prefill_tokens);
      Tensor lse = ws.lse.Rows(0, prefill_tokens);
      backend_.GatherPrefillKv(qkv, heads, step, layer, pool, k_scratch, v_scratch);
      backend_.PrefillAttention(q_prefill, k_scratch, v_scratch, heads, step, attn_prefill, lse);
      if (step.job_begin[layer + 1] > step.job_begin[layer]) {
        backend_.WindowScores(q_prefill, k_scratch, lse, heads, step, layer, ws.scores);
        backend_.SelectKept(ws.scores, config_.num_kv_heads, step, layer, ws.kept);
        backend_.WriteKeptKv(k_scratch, v_scratch, ws.scores, ws.kept, step, layer, pool);
      }
    }
    if (step.num_seqs > step.num_prefill_seqs) {
      backend_.RopeDecodeAttention(qkv, rope_table_, heads, step, layer, pool, attn, norm);
      if (step.eviction_begin[layer + 1] > step.eviction_begin[layer]) {
        backend_.EvictEntries(step, layer, pool);
      }
    }
    if (folded_norms_) {
      backend_.LinearAdd(attn, w.o, hidden);
      backend_.Linear(hidden, w.gate_up, gate_up);
      backend_.SiluMul(gate_up, act, norm);
      backend_.LinearAdd(act, w.down, hidden);
      continue;
    }
    backend_.Linear(attn, w.o, proj);
    backend_.AddRmsNorm(hidden, proj, w.mlp_norm, eps, normed);
    backend_.Linear(normed, w.gate_up, gate_up);
    backend_.SiluMul(gate_up, act, RowRms{});
    backend_.Linear(act, w.down, proj);
    const Tensor& next_norm =
        layer + 1 < config_.num_layers ? weights_.layers[layer + 1].attn_norm : weights_.final_norm;
    backend_.AddRmsNorm(hidden, proj, next_norm, eps, normed);
  }
  if (folded_norms_) backend_.RmsNorm(hidden, weights_.final_norm, eps, normed);
  Tensor last = ws.last.Rows(0, step.num_sample_rows);
  backend_.GatherRows(normed, step.sample_rows, last);
  backend_.Linear(last, weights_.lm_head, logits);
}

}  // namespace sieve
