#include "model/llama_model.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>

#include "core/logging.h"
#include "model/fp8_checkpoint.h"
#include "model/llama_checkpoint.h"
#include "model/rope.h"

namespace sieve {

namespace {

// Rows [row_begin, row_end) and columns [col_begin, col_end) of one checkpoint tensor (a 1-D
// tensor is one row); -1 ends take it to the end.
struct TensorSlice {
  std::string name;
  int64_t row_begin = 0;
  int64_t row_end = -1;
  int64_t col_begin = 0;
  int64_t col_end = -1;
};

// Concatenates slices of checkpoint tensors along rows and uploads them as one matrix. Only the
// slices' bytes are read from the mapping: a rank of a sharded model touches only its own part
// of the file. A tensor taken whole keeps its shape (1-D norms stay 1-D).
Result<Tensor> UploadSlices(Backend& backend, const SafetensorsCheckpoint& checkpoint,
                            const std::vector<TensorSlice>& slices) {
  struct Part {
    const SafetensorsTensor* tensor;
    int64_t cols;  // of the whole tensor
    int64_t row_begin, row_end, col_begin, col_end;
  };
  std::vector<Part> parts;
  int64_t rows = 0;
  int64_t width = -1;
  bool same_dtype = true;
  for (const TensorSlice& slice : slices) {
    const SafetensorsTensor* tensor = checkpoint.Find(slice.name);
    if (tensor == nullptr) return NotFoundError("tensor " + slice.name + " is missing");
    const bool matrix = tensor->shape.size() == 2;
    const int64_t tensor_rows = matrix ? tensor->shape[0] : 1;
    const int64_t tensor_cols = matrix ? tensor->shape[1] : tensor->shape[0];
    Part part{tensor,          tensor_cols,
              slice.row_begin, slice.row_end < 0 ? tensor_rows : slice.row_end,
              slice.col_begin, slice.col_end < 0 ? tensor_cols : slice.col_end};
    // The checkpoint was validated against the config the slices come from.
    SIEVE_CHECK(0 <= part.row_begin && part.row_begin <= part.row_end &&
                part.row_end <= tensor_rows && 0 <= part.col_begin &&
                part.col_begin < part.col_end && part.col_end <= tensor_cols)
        << slice.name << ": slice outside the tensor";
    const int64_t part_width = part.col_end - part.col_begin;
    if (width >= 0 && part_width != width) {
      return InvalidArgumentError("tensor " + slice.name + " has " + std::to_string(part_width) +
                                  " columns, expected " + std::to_string(width));
    }
    width = part_width;
    rows += part.row_end - part.row_begin;
    if (!parts.empty() && tensor->dtype != parts[0].tensor->dtype) same_dtype = false;
    parts.push_back(part);
  }
  const Part& first = parts[0];
  const bool whole =
      parts.size() == 1 && first.row_begin == 0 && first.col_begin == 0 &&
      first.row_end == (first.tensor->shape.size() == 2 ? first.tensor->shape[0] : 1) &&
      first.col_end == first.cols;
  std::vector<int64_t> shape = whole ? first.tensor->shape : std::vector<int64_t>{rows, width};
  const auto row_bytes = [](const Part& part, int64_t row) {
    const size_t element = DTypeSize(part.tensor->dtype);
    return static_cast<const uint8_t*>(part.tensor->data) +
           (row * part.cols + part.col_begin) * element;
  };
  if (parts.size() == 1 && first.col_begin == 0 && first.col_end == first.cols) {
    // Whole rows of one tensor are contiguous in the file: uploaded from the mapping directly.
    return backend.UploadWeight(row_bytes(first, first.row_begin), first.tensor->dtype, shape);
  }
  if (same_dtype) {
    const size_t element = DTypeSize(first.tensor->dtype);
    std::vector<uint8_t> joined;
    joined.reserve(static_cast<size_t>(rows * width) * element);
    for (const Part& part : parts) {
      const size_t bytes = static_cast<size_t>(part.col_end - part.col_begin) * element;
      for (int64_t row = part.row_begin; row < part.row_end; ++row) {
        const uint8_t* begin = row_bytes(part, row);
        joined.insert(joined.end(), begin, begin + bytes);
      }
    }
    return backend.UploadWeight(joined.data(), first.tensor->dtype, shape);
  }
  std::vector<float> joined(static_cast<size_t>(rows * width));
  float* out = joined.data();
  for (const Part& part : parts) {
    const size_t count = static_cast<size_t>(part.col_end - part.col_begin);
    for (int64_t row = part.row_begin; row < part.row_end; ++row, out += count) {
      ConvertToFloat(row_bytes(part, row), part.tensor->dtype, count, out);
    }
  }
  return backend.UploadWeight(joined.data(), DType::kF32, shape);
}

std::string LayerName(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

// Whether `backend` runs FP8 GEMMs over one rank's four layer linears (qkv, o, gate_up, down),
// checked before any weight is read or quantized.
Status CheckE4m3Linears(const Backend& backend, const ModelConfig& config,
                        const ShardLayout& layout, const std::string& context) {
  const int64_t d = config.hidden_size;
  const int64_t hd = config.head_dim;
  const std::pair<int64_t, int64_t> shapes[] = {
      {(layout.num_q_heads + 2 * layout.num_kv_heads) * hd, d},
      {d, layout.num_out_heads * hd},
      {2 * layout.ffn_size, d},
      {d, layout.ffn_size}};
  for (const auto& [rows, cols] : shapes) {
    SIEVE_RETURN_IF_ERROR(backend.CheckE4m3Weight(rows, cols).WithContext(context));
  }
  return Status::Ok();
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, Backend& backend, int max_positions,
                       const TensorParallelShard& shard, const ShardLayout& layout,
                       Communicator* communicator)
    : config_(config),
      backend_(backend),
      max_positions_(max_positions),
      shard_(shard),
      layout_(layout),
      communicator_(communicator) {}

Result<ShardLayout> LlamaModel::CheckShard(const ModelConfig& config,
                                           const TensorParallelShard& shard,
                                           const Communicator* communicator) {
  SIEVE_ASSIGN_OR_RETURN(ShardLayout layout, MakeShardLayout(config, shard));
  if (shard.size > 1 && communicator == nullptr) {
    return InvalidArgumentError("a model split over " + std::to_string(shard.size) +
                                " ranks needs a communicator");
  }
  // One rank may have one too: its all-reduces are then copies, which tests the path (and a
  // CUDA graph holding NCCL calls) on one GPU.
  if (communicator != nullptr) {
    if (communicator->size() != shard.size || communicator->rank() != shard.rank) {
      return InvalidArgumentError("rank " + std::to_string(shard.rank) + " of " +
                                  std::to_string(shard.size) + " given the communicator of rank " +
                                  std::to_string(communicator->rank()) + " of " +
                                  std::to_string(communicator->size()));
    }
  }
  return layout;
}

void LlamaModel::FoldNorms() {
  for (LlamaLayerWeights& w : weights_.layers) FoldNorms(w);
}

void LlamaModel::FoldNorms(LlamaLayerWeights& w) {
  backend_.ScaleColumns(w.qkv, w.attn_norm);
  backend_.ScaleColumns(w.gate_up, w.mlp_norm);
}

RowRms LlamaModel::FoldedNorm(const Tensor& rows) const {
  return norms_folded_ ? RowRms{&rows, config_.rms_norm_eps} : RowRms{};
}

Tensor GemmInput(const Tensor& weight, const Tensor& plain, const Tensor& quantized, int64_t rows) {
  const bool e4m3 = weight.dtype() == DType::kF8E4M3 && quantized.defined();
  return (e4m3 ? quantized : plain).Rows(0, rows);
}

Tensor LlamaModel::NormedInput(const Tensor& x, const Tensor& weight, const Tensor& gemm_weight,
                               ForwardWorkspace& ws) const {
  if (norms_folded_) return x;
  Tensor normed = GemmInput(gemm_weight, ws.normed, ws.normed_e4m3, x.dim(0));
  backend_.RmsNorm(x, weight, config_.rms_norm_eps, normed);
  return normed;
}

void LlamaModel::UploadRopeTable() {
  const std::vector<float> table = BuildRopeTable(config_, max_positions_);
  rope_table_ = backend_.Allocate({max_positions_, config_.head_dim / 2, 2}, DType::kF32);
  backend_.CopyFromHost(table.data(), table.size() * sizeof(float), rope_table_);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Load(const ModelConfig& config,
                                                     const SafetensorsCheckpoint& checkpoint,
                                                     Backend& backend, int max_positions,
                                                     const TensorParallelShard& shard,
                                                     Communicator* communicator, bool fold_norms) {
  SIEVE_RETURN_IF_ERROR(config.Validate());
  SIEVE_ASSIGN_OR_RETURN(const ShardLayout layout, CheckShard(config, shard, communicator));
  SIEVE_RETURN_IF_ERROR(ValidateLlamaCheckpoint(checkpoint, config));
  const bool fp8_checkpoint = config.quantization.has_value();
  if (fp8_checkpoint) {
    SIEVE_RETURN_IF_ERROR(CheckE4m3Linears(backend, config, layout, "an FP8 checkpoint"));
  }
  std::unique_ptr<LlamaModel> model(
      new LlamaModel(config, backend, max_positions, shard, layout, communicator));
  // A linear of an FP8 checkpoint as stored: e4m3 rows with their own scales (a column slice of
  // a row keeps the row's scale, so row-parallel shards are exact too), or a float weight the
  // producer left unquantized.
  const auto linear = [&](const std::vector<TensorSlice>& slices) -> Result<Tensor> {
    constexpr std::string_view kWeight = ".weight";
    const auto prefix = [&](const TensorSlice& slice) {
      return slice.name.substr(0, slice.name.size() - kWeight.size());
    };
    if (!fp8_checkpoint || !IsE4m3Linear(checkpoint, prefix(slices[0]))) {
      return UploadSlices(backend, checkpoint, slices);
    }
    std::vector<E4m3Slice> parts;
    for (const TensorSlice& slice : slices) {
      parts.push_back(
          {prefix(slice), slice.row_begin, slice.row_end, slice.col_begin, slice.col_end});
    }
    SIEVE_ASSIGN_OR_RETURN(const E4m3Rows rows, ReadE4m3Slices(checkpoint, parts));
    return backend.UploadWeightE4m3(rows.codes.data(), rows.scales.data(), rows.rows, rows.cols);
  };
  LlamaWeights& weights = model->weights_;
  SIEVE_ASSIGN_OR_RETURN(weights.embed,
                         UploadSlices(backend, checkpoint, {{"model.embed_tokens.weight"}}));
  SIEVE_ASSIGN_OR_RETURN(weights.final_norm,
                         UploadSlices(backend, checkpoint, {{"model.norm.weight"}}));
  if (config.tie_word_embeddings) {
    weights.lm_head = weights.embed;
  } else {
    SIEVE_ASSIGN_OR_RETURN(weights.lm_head,
                           UploadSlices(backend, checkpoint, {{"lm_head.weight"}}));
  }
  // This rank's rows of the column-parallel matrices and columns of the row-parallel ones
  // (unsharded: all of them).
  const int64_t hd = config.head_dim;
  const int64_t q_begin = layout.q_head_begin * hd;
  const int64_t q_end = q_begin + layout.num_q_heads * hd;
  const int64_t kv_begin = layout.kv_head_begin * hd;
  const int64_t kv_end = kv_begin + layout.num_kv_heads * hd;
  const int64_t out_begin = layout.out_head_begin * hd;
  const int64_t out_end = out_begin + layout.num_out_heads * hd;
  const int64_t ffn_begin = layout.ffn_begin;
  const int64_t ffn_end = ffn_begin + layout.ffn_size;
  weights.layers.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    LlamaLayerWeights& w = weights.layers[layer];
    const auto rows = [&](const char* suffix, int64_t begin, int64_t end) {
      return TensorSlice{LayerName(layer, suffix), begin, end};
    };
    const auto columns = [&](const char* suffix, int64_t begin, int64_t end) {
      return TensorSlice{LayerName(layer, suffix), 0, -1, begin, end};
    };
    SIEVE_ASSIGN_OR_RETURN(
        w.attn_norm,
        UploadSlices(backend, checkpoint, {{LayerName(layer, "input_layernorm.weight")}}));
    SIEVE_ASSIGN_OR_RETURN(w.qkv, linear({rows("self_attn.q_proj.weight", q_begin, q_end),
                                          rows("self_attn.k_proj.weight", kv_begin, kv_end),
                                          rows("self_attn.v_proj.weight", kv_begin, kv_end)}));
    SIEVE_ASSIGN_OR_RETURN(w.o, linear({columns("self_attn.o_proj.weight", out_begin, out_end)}));
    SIEVE_ASSIGN_OR_RETURN(
        w.mlp_norm,
        UploadSlices(backend, checkpoint, {{LayerName(layer, "post_attention_layernorm.weight")}}));
    SIEVE_ASSIGN_OR_RETURN(w.gate_up, linear({rows("mlp.gate_proj.weight", ffn_begin, ffn_end),
                                              rows("mlp.up_proj.weight", ffn_begin, ffn_end)}));
    SIEVE_ASSIGN_OR_RETURN(w.down, linear({columns("mlp.down_proj.weight", ffn_begin, ffn_end)}));
  }
  if (fp8_checkpoint) {
    // Folding the norms would requantize the checkpoint's weights: they run unfolded.
    model->quantization_ = WeightQuantization::kFp8;
    model->norms_folded_ = false;
    SIEVE_ASSIGN_OR_RETURN(model->checkpoint_kv_scales_,
                           ReadCheckpointKvScales(checkpoint, config));
    if (config.quantization->static_input_scales) {
      spdlog::info(
          "{}: the checkpoint's static input_scale tensors are checked and not used: Sieve "
          "quantizes each GEMM's input per token as it runs",
          checkpoint.dir());
    }
  } else if (fold_norms) {
    model->FoldNorms();
  } else {
    model->norms_folded_ = false;
  }
  model->UploadRopeTable();
  return model;
}

std::unique_ptr<LlamaModel> LlamaModel::Random(const ModelConfig& config, Backend& backend,
                                               uint64_t seed, int max_positions, float init_std) {
  auto model = RandomShard(config, backend, seed, max_positions, {}, nullptr, init_std);
  SIEVE_CHECK(model.ok()) << model.status().ToString();  // one rank: nothing to split
  return std::move(model).value();
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::RandomShard(
    const ModelConfig& config, Backend& backend, uint64_t seed, int max_positions,
    const TensorParallelShard& shard, Communicator* communicator, float init_std,
    WeightQuantization quantization) {
  SIEVE_ASSIGN_OR_RETURN(const ShardLayout layout, CheckShard(config, shard, communicator));
  const bool quantize = quantization == WeightQuantization::kFp8;
  if (quantize) {
    SIEVE_RETURN_IF_ERROR(CheckE4m3Linears(backend, config, layout, "--quantization fp8"));
  }
  std::unique_ptr<LlamaModel> model(
      new LlamaModel(config, backend, max_positions, shard, layout, communicator));
  const int64_t d = config.hidden_size;
  const int64_t hd = config.head_dim;
  const DType dtype = backend.activation_dtype();
  const bool sharded = shard.size > 1;
  // Every rank draws every full matrix with the same seeds in the same order as one rank does,
  // so the slices below are exactly one rank's weights.
  uint64_t tensor_seed = seed;
  const auto matrix = [&](int64_t rows, int64_t cols) {
    Tensor tensor = backend.Allocate({rows, cols}, dtype);
    backend.FillRandom(tensor, tensor_seed++, init_std);
    return tensor;
  };
  // Row ranges [begin, end) of `full`, stacked.
  const auto take_rows = [&](const Tensor& full,
                             std::initializer_list<std::pair<int64_t, int64_t>> ranges) {
    int64_t rows = 0;
    for (const auto& [begin, end] : ranges) rows += end - begin;
    Tensor part = backend.Allocate({rows, full.dim(1)}, dtype);
    int64_t offset = 0;
    for (const auto& [begin, end] : ranges) {
      Tensor destination = part.Rows(offset, offset + end - begin);
      backend.Copy(full.Rows(begin, end), destination);
      offset += end - begin;
    }
    backend.Synchronize();  // the caller drops `full` next
    return part;
  };
  const auto take_columns = [&](const Tensor& full, int64_t begin, int64_t end) {
    Tensor part = backend.Allocate({full.dim(0), end - begin}, dtype);
    backend.Copy(full.Columns(begin, end), part);
    backend.Synchronize();
    return part;
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
  const int64_t heads = config.num_heads;
  const int64_t kv_heads = config.num_kv_heads;
  const int64_t ffn = config.intermediate_size;
  for (LlamaLayerWeights& w : weights.layers) {
    w.attn_norm = norm();
    w.qkv = matrix((heads + 2 * kv_heads) * hd, d);
    w.o = matrix(d, heads * hd);
    w.mlp_norm = norm();
    w.gate_up = matrix(2 * ffn, d);
    w.down = matrix(d, ffn);
    // Each layer folded and quantized as soon as it is cut (QuantizeWeights' ops in its order), so
    // that its activation-dtype matrices are dropped before the next layer's are made.
    const auto quantize_layer = [&] {
      if (!quantize) return;
      model->FoldNorms(w);
      for (Tensor* weight : {&w.qkv, &w.o, &w.gate_up, &w.down}) {
        *weight = backend.QuantizeWeightE4m3(*weight);
      }
      backend.Synchronize();
    };
    if (!sharded) {
      quantize_layer();
      continue;
    }
    const int64_t q_begin = layout.q_head_begin * hd;
    const int64_t q_end = q_begin + layout.num_q_heads * hd;
    const int64_t k_begin = (heads + layout.kv_head_begin) * hd;
    const int64_t k_end = k_begin + layout.num_kv_heads * hd;
    const int64_t v_begin = k_begin + kv_heads * hd;
    const int64_t v_end = k_end + kv_heads * hd;
    w.qkv = take_rows(w.qkv, {{q_begin, q_end}, {k_begin, k_end}, {v_begin, v_end}});
    w.o = take_columns(w.o, layout.out_head_begin * hd,
                       (layout.out_head_begin + layout.num_out_heads) * hd);
    const int64_t ffn_end = layout.ffn_begin + layout.ffn_size;
    w.gate_up = take_rows(w.gate_up,
                          {{layout.ffn_begin, ffn_end}, {ffn + layout.ffn_begin, ffn + ffn_end}});
    w.down = take_columns(w.down, layout.ffn_begin, ffn_end);
    quantize_layer();
  }
  if (quantize) {
    model->quantization_ = quantization;
  } else {
    model->FoldNorms();
  }
  model->UploadRopeTable();
  return model;
}

Result<WeightQuantization> ParseWeightQuantization(std::string_view name) {
  if (name == "none") return WeightQuantization::kNone;
  if (name == "fp8") return WeightQuantization::kFp8;
  return InvalidArgumentError("unknown --quantization '" + std::string(name) +
                              "' (expected none or fp8)");
}

std::string_view WeightQuantizationName(WeightQuantization quantization) {
  switch (quantization) {
    case WeightQuantization::kNone:
      return "none";
    case WeightQuantization::kFp8:
      return "fp8";
  }
  return "?";
}

Status LlamaModel::QuantizeWeights(WeightQuantization quantization) {
  if (quantization == WeightQuantization::kNone || quantization == quantization_) {
    return Status::Ok();
  }
  SIEVE_CHECK(quantization_ == WeightQuantization::kNone)
      << "weights already quantized as " << WeightQuantizationName(quantization_);
  SIEVE_RETURN_IF_ERROR(CheckE4m3Linears(backend_, config_, layout_, "--quantization fp8"));
  for (LlamaLayerWeights& w : weights_.layers) {
    for (Tensor* matrix : {&w.qkv, &w.o, &w.gate_up, &w.down}) {
      *matrix = backend_.QuantizeWeightE4m3(*matrix);
    }
  }
  quantization_ = quantization;
  return Status::Ok();
}

int64_t HeldBytes(const Tensor& weight) {
  int64_t total = weight.numel() * static_cast<int64_t>(weight.element_size());
  if (weight.has_row_scales()) total += weight.row_scales().numel() * 4;
  return total;
}

int64_t LlamaModel::WeightBytes() const {
  int64_t total = HeldBytes(weights_.embed) + HeldBytes(weights_.final_norm);
  if (weights_.lm_head.data() != weights_.embed.data()) total += HeldBytes(weights_.lm_head);
  for (const LlamaLayerWeights& w : weights_.layers) {
    for (const Tensor* tensor : {&w.attn_norm, &w.qkv, &w.o, &w.mlp_norm, &w.gate_up, &w.down}) {
      total += HeldBytes(*tensor);
    }
  }
  return total;
}

void LlamaModel::EnsureWorkspace(ForwardWorkspace& ws, int max_tokens, int64_t max_prefill_keys,
                                 int max_sample_rows, int64_t max_scores, int64_t max_kept) const {
  const DType act = backend_.activation_dtype();
  const int64_t d = config_.hidden_size;
  const int64_t hd = config_.head_dim;
  const int64_t heads = layout_.num_q_heads;
  const int64_t kv_heads = layout_.num_kv_heads;
  // The MLP's activation in the activation dtype, for the layers whose down weight is not e4m3
  // (all of them unquantized, a checkpoint's unquantized layers); the others' SiLU writes
  // `act_e4m3`.
  const bool plain_act =
      std::any_of(weights_.layers.begin(), weights_.layers.end(),
                  [](const LlamaLayerWeights& w) { return w.down.dtype() != DType::kF8E4M3; });
  if (max_tokens > ws.max_tokens) {
    ws.max_tokens = max_tokens;
    ws.hidden = backend_.Allocate({max_tokens, d}, act);
    ws.normed = backend_.Allocate({max_tokens, d}, act);
    ws.qkv = backend_.Allocate({max_tokens, (heads + 2 * kv_heads) * hd}, act);
    ws.attn = backend_.Allocate({max_tokens, heads * hd}, act);
    ws.gate_up = backend_.Allocate({max_tokens, 2 * layout_.ffn_size}, act);
    ws.act = Tensor();
    ws.lse = backend_.Allocate({max_tokens, heads}, DType::kF32);
    ws.act_e4m3 = Tensor();
    ws.normed_e4m3 = Tensor();
  }
  if (plain_act && !ws.act.defined()) {
    ws.act = backend_.Allocate({ws.max_tokens, layout_.ffn_size}, act);
  }
  if (quantization_ != WeightQuantization::kNone) {
    // The quantized activations (README.md "FP8 weights"), allocated here, outside any capture.
    const auto quantized_activation = [&](int64_t cols) {
      return backend_.Allocate({ws.max_tokens, cols}, DType::kF8E4M3)
          .WithRowScales(backend_.Allocate({ws.max_tokens}, DType::kF32));
    };
    if (!ws.act_e4m3.defined()) ws.act_e4m3 = quantized_activation(layout_.ffn_size);
    if (!norms_folded_ && !ws.normed_e4m3.defined()) ws.normed_e4m3 = quantized_activation(d);
    // The inputs the FP8 GEMMs quantize themselves (the residual stream of folded norms, the
    // attention output), and the outputs (qkv, the residual stream, gate_up).
    backend_.ReserveQuantizedInputs(
        std::max(max_tokens, max_sample_rows), std::max(d, heads * hd),
        std::max({d, (heads + 2 * kv_heads) * hd, 2 * static_cast<int64_t>(layout_.ffn_size)}));
  }
  if (max_prefill_keys > ws.max_prefill_keys) {
    ws.max_prefill_keys = max_prefill_keys;
    ws.k_scratch = backend_.Allocate({max_prefill_keys, kv_heads, hd}, act);
    ws.v_scratch = backend_.Allocate({max_prefill_keys, kv_heads, hd}, act);
  }
  if (max_sample_rows > ws.max_sample_rows) {
    ws.max_sample_rows = max_sample_rows;
    ws.last = backend_.Allocate({max_sample_rows, d}, act);
    ws.last_attn = backend_.Allocate({max_sample_rows, heads * hd}, act);
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

void LlamaModel::RowParallelAdd(const Tensor& x, const Tensor& w, Tensor& residual) const {
  if (communicator_ == nullptr) {
    backend_.LinearAdd(x, w, residual);
    return;
  }
  // The sum over ranks of (residual + p_0) and p_1 .. p_{N-1} is residual + x W^T.
  if (shard_.rank == 0) {
    backend_.LinearAdd(x, w, residual);
  } else {
    backend_.Linear(x, w, residual);
  }
  communicator_->AllReduceSum(residual);
}

void LlamaModel::OutputAndMlp(const LlamaLayerWeights& w, const Tensor& attn, Tensor& residual,
                              ForwardWorkspace& ws) const {
  const int64_t rows = residual.dim(0);
  // The heads whose outputs this rank's o slice takes: all of its heads, except on a rank that
  // holds a replicated KV head and attends with its whole group (tensor_parallel.h).
  const int64_t hd = config_.head_dim;
  const int64_t out_offset = (layout_.out_head_begin - layout_.q_head_begin) * hd;
  const Tensor attn_out = layout_.replicated_kv()
                              ? attn.Columns(out_offset, out_offset + layout_.num_out_heads * hd)
                              : attn;
  Tensor gate_up = ws.gate_up.Rows(0, rows);
  // Before an e4m3 down GEMM, SiLU writes its input quantized.
  Tensor act = GemmInput(w.down, ws.act, ws.act_e4m3, rows);
  RowParallelAdd(attn_out, w.o, residual);
  // Folded norm: LinearSiluMul reads `residual` raw and scales by its rows' inverse RMS; it does
  // not write `residual`, so the scale is that of the GEMM's input. Unfolded: it reads the normed
  // rows and scales nothing.
  backend_.LinearSiluMul(NormedInput(residual, w.mlp_norm, w.gate_up, ws), w.gate_up, gate_up, act,
                         FoldedNorm(residual));
  RowParallelAdd(act, w.down, residual);
}

void LlamaModel::Forward(const StepMeta& step, KvPool& pool, ForwardWorkspace& ws,
                         Tensor& logits) const {
  const int tokens = step.num_tokens;
  const int prefill_tokens = step.num_prefill_tokens;
  // This rank's attention heads (all of them unsharded).
  const int heads = layout_.num_q_heads;
  const int64_t hd = config_.head_dim;
  const int64_t q_width = heads * hd;
  const float eps = config_.rms_norm_eps;
  SIEVE_CHECK(tokens > 0 && tokens <= ws.max_tokens) << "step of " << tokens << " tokens";
  SIEVE_CHECK(step.num_prefill_keys <= ws.max_prefill_keys);
  SIEVE_CHECK(step.max_scores_per_layer <= ws.max_scores &&
              step.max_indices_per_layer <= ws.max_kept);
  SIEVE_CHECK(pool.num_kv_heads == layout_.num_kv_heads)
      << "a pool of " << pool.num_kv_heads << " KV heads for a rank holding "
      << layout_.num_kv_heads;

  Tensor hidden = ws.hidden.Rows(0, tokens);
  Tensor qkv = ws.qkv.Rows(0, tokens);
  Tensor attn = ws.attn.Rows(0, tokens);
  Tensor q = qkv.Columns(0, q_width);
  Tensor k_scratch = ws.k_scratch.Rows(0, step.num_prefill_keys);
  Tensor v_scratch = ws.v_scratch.Rows(0, step.num_prefill_keys);

  backend_.Embedding(weights_.embed, step.token_ids, hidden);
  // Folded norms (top of llama_model.h): the qkv and gate_up GEMMs read the residual stream
  // `hidden` itself and the ops after them scale each row by its inverse RMS; `hidden` does not
  // change between a layer's qkv GEMM and its attention ops, nor within LinearSiluMul.
  const RowRms norm = FoldedNorm(hidden);
  // Past the last layer's attention only the rows whose logits are read matter: every row's K/V
  // and the policy's scores come from the attention ops, and nothing reads the other rows'
  // outputs. So where a step samples fewer rows than it computes (prefill chunks: one row a
  // finished prompt, none for a chunk before its last), the last layer's output projection and
  // MLP run on the sampled rows alone, gathered (llama.cpp's inp_out_ids): at 4000-token prompts
  // of Llama-3-8B, 2.8% of a prefill's GEMM FLOPs (computed). The decision is the host's and
  // every rank's alike, so the ranks' all-reduces stay in step.
  const int sampled = step.num_sample_rows;
  const bool sampled_rows_only = sampled < tokens;
  const int last_layer = config_.num_layers - 1;
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    const LlamaLayerWeights& w = weights_.layers[layer];
    backend_.Linear(NormedInput(hidden, w.attn_norm, w.qkv, ws), w.qkv, qkv);
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
        backend_.SelectKept(ws.scores, layout_.num_kv_heads, step, layer, ws.kept);
        backend_.WriteKeptKv(k_scratch, v_scratch, ws.scores, ws.kept, step, layer, pool);
      }
    }
    if (step.num_seqs > step.num_prefill_seqs) {
      backend_.RopeDecodeAttention(qkv, rope_table_, heads, step, layer, pool, attn, norm);
      if (step.eviction_begin[layer + 1] > step.eviction_begin[layer]) {
        backend_.EvictEntries(step, layer, pool);
      }
    }
    if (layer == last_layer && sampled_rows_only) break;
    OutputAndMlp(w, attn, hidden, ws);
  }
  // The rows whose final state was computed: every row, or the sampled ones gathered.
  Tensor residual = hidden;
  if (sampled_rows_only) {
    if (sampled == 0) return;  // no row's logits: the last layer ends at its attention
    Tensor attn_rows = ws.last_attn.Rows(0, sampled);
    residual = ws.last.Rows(0, sampled);
    backend_.GatherRows(attn, step.sample_rows, attn_rows);
    backend_.GatherRows(hidden, step.sample_rows, residual);
    OutputAndMlp(weights_.layers[last_layer], attn_rows, residual, ws);
  }
  if (!logits.defined()) return;
  Tensor normed = ws.normed.Rows(0, residual.dim(0));
  backend_.RmsNorm(residual, weights_.final_norm, eps, normed);
  if (!sampled_rows_only) {
    Tensor last = ws.last.Rows(0, sampled);
    backend_.GatherRows(normed, step.sample_rows, last);
    normed = last;
  }
  backend_.Linear(normed, weights_.lm_head, logits);
}

}  // namespace sieve
