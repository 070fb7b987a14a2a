// Published FP8 checkpoints (model/fp8_checkpoint.h, checkpoint_quantization.h) on the CPU
// backend, and --load-format dummy with FP8 made layer by layer.
//
// Each test writes fresh random checkpoints: e4m3 codes with one code of each row at +-448 (what
// a per-channel quantizer stores) and scales of 8 significant bits, beside the same weights
// dequantized to f32. Then:
//   - the FP8 checkpoint's forward equals, bit for bit, the dequantized checkpoint's run the
//     same way (norms unfolded) with its weights quantized at load: requantizing such rows gives
//     back the same codes and scales exactly, so this checks every code and scale as loaded and
//     fused;
//   - unfolded norms equal folded ones to f32 rounding (max |logit error| 1e-4; logits O(1)),
//     the folded forward being the one tested against transformers (llama_model_test.cc);
//   - against the dequantized weights in f32 (no activation quantization) the logits move by
//     e4m3 activation rounding only: relative L2 at most 0.1 (per-token e4m3 rounding is up to
//     2^-4 of each value; measured 0.012-0.030; wrong or dropped scales give O(1));
//   - under tensor parallelism each rank's weights are exactly its slices of one rank's, and two
//     ranks' logits track one rank's within FP8's bound (measured 0.015-0.018).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"
#include "core/dtype.h"
#include "core/fixtures.h"
#include "core/float8.h"
#include "core/testing.h"
#include "core/thread_pool.h"
#include "model/full_prefill.h"
#include "model/llama_model.h"
#include "model/safetensors.h"

#ifdef SIEVE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace sieve {
namespace {

using json = nlohmann::json;
using testing::TempDir;

json TinyConfig() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", 97},
              {"hidden_size", 64},
              {"intermediate_size", 96},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 16},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"max_position_embeddings", 128},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"}};
}

enum class Producer { kCompressedTensors, kModelOpt, kModelOptSideFile };

struct Fp8Options {
  Producer producer = Producer::kCompressedTensors;
  bool per_tensor = false;  // one scale per weight (shape []) instead of [N, 1]
  bool kv_scales = true;
};

json QuantizationConfig(const Fp8Options& options) {
  if (options.producer != Producer::kCompressedTensors) {
    json fields{{"quant_algo", "FP8"}, {"exclude_modules", {"lm_head"}}};
    if (options.kv_scales) fields["kv_cache_quant_algo"] = "FP8";
    if (options.producer == Producer::kModelOptSideFile) {
      return json{{"producer", {{"name", "modelopt"}}}, {"quantization", fields}};
    }
    fields["quant_method"] = "modelopt";
    return fields;
  }
  const json fp8{{"num_bits", 8}, {"type", "float"}, {"symmetric", true}};
  json weights = fp8;
  weights["strategy"] = options.per_tensor ? "tensor" : "channel";
  json inputs = fp8;
  inputs["strategy"] = "token";
  inputs["dynamic"] = true;
  json config{
      {"quant_method", "compressed-tensors"},
      {"format", "float-quantized"},
      {"config_groups", {{"group_0", {{"weights", weights}, {"input_activations", inputs}}}}},
      {"ignore", {"lm_head"}}};
  if (options.kv_scales) {
    json kv = fp8;
    kv["strategy"] = "tensor";
    config["kv_cache_scheme"] = kv;
  }
  return config;
}

Tensor Scalar(float value) {
  Tensor tensor = Tensor::Empty({}, DType::kF32);
  *tensor.data_as<float>() = value;
  return tensor;
}

// A random FP8 checkpoint in `fp8_dir` and the same weights dequantized to f32 (a plain
// checkpoint) in `dequantized_dir`.
void WriteCheckpoints(const std::string& fp8_dir, const std::string& dequantized_dir,
                      const Fp8Options& options, std::mt19937_64& rng,
                      const json& config = TinyConfig()) {
  const int64_t d = config["hidden_size"], f = config["intermediate_size"];
  const int64_t v = config["vocab_size"], hd = config["head_dim"];
  const int64_t heads = config["num_attention_heads"], kv_heads = config["num_key_value_heads"];
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::pair<std::string, Tensor>> fp8, plain;
  const auto both = [&](const std::string& name, const Tensor& tensor) {
    fp8.emplace_back(name, tensor);
    plain.emplace_back(name, tensor);
  };
  const auto norm = [&] {
    Tensor tensor = Tensor::Empty({d}, DType::kF32);
    for (int64_t i = 0; i < d; ++i) tensor.data_as<float>()[i] = 1.0f + 0.2f * normal(rng);
    return tensor;
  };
  // 8 significant bits (bf16's): a code times it, and 448 times it, are exact in f32.
  const auto scale = [&] {
    return Bf16ToFloat(FloatToBf16(0.08f / 448.0f * std::exp2(uniform(rng))));
  };
  const auto linear = [&](const std::string& prefix, int64_t rows, int64_t cols) {
    Tensor codes = Tensor::Empty({rows, cols}, DType::kF8E4M3);
    Tensor dequantized = Tensor::Empty({rows, cols}, DType::kF32);
    const float tensor_scale = scale();
    Tensor scales =
        options.per_tensor ? Scalar(tensor_scale) : Tensor::Empty({rows, 1}, DType::kF32);
    for (int64_t row = 0; row < rows; ++row) {
      const float row_scale = options.per_tensor ? tensor_scale : scale();
      if (!options.per_tensor) scales.data_as<float>()[row] = row_scale;
      uint8_t* out = codes.data_as<uint8_t>() + row * cols;
      for (int64_t col = 0; col < cols; ++col) out[col] = FloatToE4m3(120.0f * normal(rng));
      out[rng() % cols] = rng() % 2 ? 0x7e : 0xfe;  // +-448, the row's amax
      for (int64_t col = 0; col < cols; ++col) {
        dequantized.data_as<float>()[row * cols + col] = E4m3ToFloat(out[col]) * row_scale;
      }
    }
    fp8.emplace_back(prefix + ".weight", codes);
    fp8.emplace_back(prefix + ".weight_scale", scales);
    plain.emplace_back(prefix + ".weight", dequantized);
  };
  // Embeddings as small as the layers' outputs, so that those outputs move the logits.
  both("model.embed_tokens.weight", testing::RandomTensor({v, d}, rng, 0.05f));
  for (int layer = 0; layer < static_cast<int>(config["num_hidden_layers"]); ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    both(prefix + "input_layernorm.weight", norm());
    linear(prefix + "self_attn.q_proj", heads * hd, d);
    linear(prefix + "self_attn.k_proj", kv_heads * hd, d);
    linear(prefix + "self_attn.v_proj", kv_heads * hd, d);
    linear(prefix + "self_attn.o_proj", d, heads * hd);
    both(prefix + "post_attention_layernorm.weight", norm());
    linear(prefix + "mlp.gate_proj", f, d);
    linear(prefix + "mlp.up_proj", f, d);
    linear(prefix + "mlp.down_proj", d, f);
    if (options.producer != Producer::kCompressedTensors) {
      fp8.emplace_back(prefix + "self_attn.q_proj.input_scale", Scalar(0.02f));
    }
    if (options.kv_scales) {
      const bool modelopt = options.producer != Producer::kCompressedTensors;
      fp8.emplace_back(prefix + (modelopt ? "self_attn.k_proj.k_scale" : "self_attn.k_scale"),
                       Scalar(0.01f * (layer + 1)));
      fp8.emplace_back(prefix + (modelopt ? "self_attn.v_proj.v_scale" : "self_attn.v_scale"),
                       Scalar(0.02f * (layer + 1)));
    }
  }
  both("model.norm.weight", norm());
  both("lm_head.weight", testing::RandomTensor({v, d}, rng, 0.08f));

  std::filesystem::create_directories(fp8_dir);
  std::filesystem::create_directories(dequantized_dir);
  json fp8_config = config;
  if (options.producer == Producer::kModelOptSideFile) {
    std::ofstream(fp8_dir + "/hf_quant_config.json") << QuantizationConfig(options).dump();
  } else {
    fp8_config["quantization_config"] = QuantizationConfig(options);
  }
  std::ofstream(fp8_dir + "/config.json") << fp8_config.dump();
  std::ofstream(dequantized_dir + "/config.json") << config.dump();
  ASSERT_TRUE(WriteSafetensors(fp8_dir + "/model.safetensors", fp8).ok());
  ASSERT_TRUE(WriteSafetensors(dequantized_dir + "/model.safetensors", plain).ok());
}

Result<std::unique_ptr<LlamaModel>> LoadDir(Backend& backend, const std::string& dir,
                                            bool fold_norms = true) {
  SIEVE_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir));
  SIEVE_ASSIGN_OR_RETURN(auto checkpoint, SafetensorsCheckpoint::Open(dir));
  // The model reads the mapping only while loading.
  return LlamaModel::Load(config, *checkpoint, backend, 64, {}, nullptr, fold_norms);
}

std::unique_ptr<LlamaModel> MustLoad(Backend& backend, const std::string& dir,
                                     bool fold_norms = true) {
  auto model = LoadDir(backend, dir, fold_norms);
  SIEVE_CHECK(model.ok()) << model.status().ToString();
  return std::move(model).value();
}

std::vector<int32_t> RandomIds(std::mt19937_64& rng, int count, int vocab) {
  std::vector<int32_t> ids(count);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// The host values of an e4m3 weight, dequantized.
std::vector<float> Dequantized(const Tensor& weight) {
  SIEVE_CHECK(weight.dtype() == DType::kF8E4M3 && weight.has_row_scales());
  std::vector<float> values(static_cast<size_t>(weight.numel()));
  for (int64_t row = 0; row < weight.dim(0); ++row) {
    for (int64_t col = 0; col < weight.dim(1); ++col) {
      values[row * weight.dim(1) + col] =
          E4m3ToFloat(weight.data_as<uint8_t>()[row * weight.stride(0) + col]) *
          weight.row_scales().data_as<float>()[row];
    }
  }
  return values;
}

TEST(Fp8CheckpointTest, ForwardEqualsTheDequantizedCheckpointQuantizedAtLoad) {
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  WriteCheckpoints(dir.File("fp8"), dir.File("f32"), {}, rng);
  auto backend = MakeCpuBackend();
  auto fp8 = MustLoad(*backend, dir.File("fp8"));
  EXPECT_EQ(fp8->quantization(), WeightQuantization::kFp8);
  EXPECT_FALSE(fp8->norms_folded());
  auto reference = MustLoad(*backend, dir.File("f32"), /*fold_norms=*/false);
  ASSERT_TRUE(reference->QuantizeWeights(WeightQuantization::kFp8).ok());
  for (size_t layer = 0; layer < fp8->weights().layers.size(); ++layer) {
    const LlamaLayerWeights& got = fp8->weights().layers[layer];
    const LlamaLayerWeights& want = reference->weights().layers[layer];
    for (const auto& [a, b] :
         {std::pair{&got.qkv, &want.qkv}, std::pair{&got.o, &want.o},
          std::pair{&got.gate_up, &want.gate_up}, std::pair{&got.down, &want.down}}) {
      ASSERT_EQ(a->shape(), b->shape());
      EXPECT_TRUE(Dequantized(*a) == Dequantized(*b)) << "layer " << layer;
    }
  }
  const std::vector<int32_t> ids = RandomIds(rng, 24, 97);
  const std::vector<float> logits = testing::FullPrefillLogits(*fp8, ids);
  const std::vector<float> expected = testing::FullPrefillLogits(*reference, ids);
  ASSERT_EQ(logits.size(), expected.size());
  EXPECT_TRUE(logits == expected) << "max |error| "
                                  << testing::MaxAbsError(logits.data(), expected.data(),
                                                          expected.size());
}

TEST(Fp8CheckpointTest, UnfoldedNormsEqualFoldedOnes) {
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  WriteCheckpoints(dir.File("fp8"), dir.File("f32"), {}, rng);
  auto backend = MakeCpuBackend();
  auto folded = MustLoad(*backend, dir.File("f32"));
  auto unfolded = MustLoad(*backend, dir.File("f32"), /*fold_norms=*/false);
  EXPECT_TRUE(folded->norms_folded());
  EXPECT_FALSE(unfolded->norms_folded());
  const std::vector<int32_t> ids = RandomIds(rng, 24, 97);
  const std::vector<float> a = testing::FullPrefillLogits(*folded, ids);
  const std::vector<float> b = testing::FullPrefillLogits(*unfolded, ids);
  const double error = testing::MaxAbsError(b.data(), a.data(), a.size());
  std::printf("unfolded norms against folded: max |logit error| %.3g\n", error);
  EXPECT_LE(error, 1e-4);
}

// Per-channel and per-tensor scales, compressed-tensors and ModelOpt (its config in config.json
// and in hf_quant_config.json): the logits track the dequantized weights run in f32.
TEST(Fp8CheckpointTest, EveryFormatTracksTheDequantizedWeightsInF32) {
  const Fp8Options cases[] = {{Producer::kCompressedTensors, false, true},
                              {Producer::kCompressedTensors, true, false},
                              {Producer::kModelOpt, true, true},
                              {Producer::kModelOptSideFile, true, true}};
  auto backend = MakeCpuBackend();
  for (const Fp8Options& options : cases) {
    SCOPED_TRACE("producer " + std::to_string(static_cast<int>(options.producer)) +
                 (options.per_tensor ? ", per tensor" : ", per channel"));
    std::mt19937_64 rng = testing::MakeRng();
    TempDir dir;
    WriteCheckpoints(dir.File("fp8"), dir.File("f32"), options, rng);
    auto fp8 = MustLoad(*backend, dir.File("fp8"));
    auto f32 = MustLoad(*backend, dir.File("f32"));
    auto f32_unfolded = MustLoad(*backend, dir.File("f32"), /*fold_norms=*/false);
    const ModelConfig& config = fp8->config();
    ASSERT_TRUE(config.quantization.has_value());
    EXPECT_EQ(config.quantization->format, options.producer == Producer::kCompressedTensors
                                               ? CheckpointQuantization::Format::kCompressedTensors
                                               : CheckpointQuantization::Format::kModelOpt);
    // Each weight as loaded is the checkpoint's, dequantized (a per-tensor scale on every row).
    for (int layer = 0; layer < config.num_layers; ++layer) {
      const LlamaLayerWeights& got = fp8->weights().layers[layer];
      const LlamaLayerWeights& want = f32_unfolded->weights().layers[layer];
      for (const auto& [a, b] :
           {std::pair{&got.qkv, &want.qkv}, std::pair{&got.o, &want.o},
            std::pair{&got.gate_up, &want.gate_up}, std::pair{&got.down, &want.down}}) {
        const std::vector<float> values = Dequantized(*a);
        EXPECT_TRUE(std::equal(values.begin(), values.end(), b->data_as<float>()));
      }
    }
    if (options.kv_scales) {
      const std::vector<std::array<float, 2>> expected = {{0.01f, 0.02f}, {0.02f, 0.04f}};
      EXPECT_EQ(fp8->checkpoint_kv_scales(), expected);
    } else {
      EXPECT_TRUE(fp8->checkpoint_kv_scales().empty());
    }
    const std::vector<int32_t> ids = RandomIds(rng, 24, 97);
    const std::vector<float> logits = testing::FullPrefillLogits(*fp8, ids);
    const std::vector<float> expected = testing::FullPrefillLogits(*f32, ids);
    const double error = testing::RelativeL2Error(logits.data(), expected.data(), expected.size());
    std::printf("FP8 checkpoint against its dequantized weights in f32: relative L2 %.4f\n", error);
    EXPECT_GT(error, 0.0);
    EXPECT_LE(error, 0.1);
  }
}

// The committed fixture (scripts/make_fp8_checkpoint.py): what the config declares, the weights
// bit for bit (codes and per-row scales of q, k and v fused), the K/V scales.
TEST(Fp8CheckpointTest, CommittedCompressedTensorsFixtureLoads) {
  const std::string dir = TestDataDir() + "/models/llama_fp8_compressed";
  auto backend = MakeCpuBackend();
  auto model = MustLoad(*backend, dir);
  const ModelConfig& config = model->config();
  ASSERT_TRUE(config.quantization.has_value());
  EXPECT_EQ(config.quantization->weight_scales, CheckpointQuantization::WeightScales::kChannel);
  EXPECT_TRUE(config.quantization->static_input_scales);
  EXPECT_TRUE(config.quantization->kv_cache_scales);
  EXPECT_EQ(config.quantization->ignored, std::vector<std::string>{"lm_head"});
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
    const Tensor& qkv = model->weights().layers[layer].qkv;
    ASSERT_EQ(qkv.dtype(), DType::kF8E4M3);
    int64_t row = 0;
    for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
      const SafetensorsTensor* codes = (*file)->Find(prefix + name + ".weight");
      const SafetensorsTensor* scales = (*file)->Find(prefix + name + ".weight_scale");
      ASSERT_TRUE(codes != nullptr && scales != nullptr);
      EXPECT_EQ(std::memcmp(qkv.data_as<uint8_t>() + row * qkv.dim(1), codes->data, codes->nbytes),
                0)
          << prefix << name;
      EXPECT_EQ(std::memcmp(qkv.row_scales().data_as<float>() + row, scales->data, scales->nbytes),
                0)
          << prefix << name;
      row += codes->shape[0];
    }
    EXPECT_EQ(row, qkv.dim(0));
    float k_scale, v_scale;
    std::memcpy(&k_scale, (*file)->Find(prefix + "k_scale")->data, 4);
    std::memcpy(&v_scale, (*file)->Find(prefix + "v_scale")->data, 4);
    ASSERT_EQ(model->checkpoint_kv_scales().size(), static_cast<size_t>(config.num_layers));
    EXPECT_EQ(model->checkpoint_kv_scales()[layer][0], k_scale);
    EXPECT_EQ(model->checkpoint_kv_scales()[layer][1], v_scale);
  }
  // lm_head is ignored by the producer: in the activation dtype.
  EXPECT_EQ(model->weights().lm_head.dtype(), backend->activation_dtype());
}

// Host copies of every tensor of a safetensors file.
std::map<std::string, Tensor> ReadAll(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  SIEVE_CHECK(file.ok()) << file.status().ToString();
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, tensor] : (*file)->tensors()) {
    Tensor copy = Tensor::Empty(tensor.shape, tensor.dtype);
    std::memcpy(copy.data(), tensor.data, tensor.nbytes);
    tensors[name] = copy;
  }
  return tensors;
}

// A layer linear the producer left unquantized (listed in `ignore`, stored as a float weight with
// no scales) runs in the activation dtype beside the e4m3 ones.
TEST(Fp8CheckpointTest, LinearsLeftUnquantizedRunInTheActivationDtype) {
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  WriteCheckpoints(dir.File("fp8"), dir.File("f32"), {}, rng);
  const std::string down = "model.layers.0.mlp.down_proj";
  std::map<std::string, Tensor> tensors = ReadAll(dir.File("fp8") + "/model.safetensors");
  tensors[down + ".weight"] = ReadAll(dir.File("f32") + "/model.safetensors")[down + ".weight"];
  tensors.erase(down + ".weight_scale");
  ASSERT_TRUE(
      WriteSafetensors(dir.File("fp8") + "/model.safetensors", {tensors.begin(), tensors.end()})
          .ok());
  auto backend = MakeCpuBackend();
  auto fp8 = MustLoad(*backend, dir.File("fp8"));
  auto f32 = MustLoad(*backend, dir.File("f32"));
  const Tensor& kept = fp8->weights().layers[0].down;
  ASSERT_EQ(kept.dtype(), backend->activation_dtype());
  EXPECT_FALSE(kept.has_row_scales());
  const Tensor& reference = f32->weights().layers[0].down;
  EXPECT_TRUE(std::equal(kept.data_as<float>(), kept.data_as<float>() + kept.numel(),
                         reference.data_as<float>()));
  EXPECT_EQ(fp8->weights().layers[1].down.dtype(), DType::kF8E4M3);
  const std::vector<int32_t> ids = RandomIds(rng, 24, 97);
  const std::vector<float> logits = testing::FullPrefillLogits(*fp8, ids);
  const std::vector<float> expected = testing::FullPrefillLogits(*f32, ids);
  EXPECT_LE(testing::RelativeL2Error(logits.data(), expected.data(), expected.size()), 0.1);
}

// Broken checkpoints are errors that name what is wrong, never aborts.
TEST(Fp8CheckpointTest, MalformedCheckpointsAreClearErrors) {
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  WriteCheckpoints(dir.File("good"), dir.File("f32"), {}, rng);
  const std::map<std::string, Tensor> good = ReadAll(dir.File("good") + "/model.safetensors");
  const std::string q = "model.layers.1.self_attn.q_proj";
  struct Case {
    const char* what;
    std::function<void(std::map<std::string, Tensor>&)> edit;
    std::vector<std::string> expected;  // in the message
  };
  const std::vector<Case> cases = {
      {"missing weight_scale",
       [&](auto& t) { t.erase(q + ".weight_scale"); },
       {q + ".weight_scale is missing"}},
      {"weight_scale of an int dtype",
       [&](auto& t) {
         t[q + ".weight_scale"] = Tensor::Empty({64, 1}, DType::kI32);
       },
       {q + ".weight_scale is I32"}},
      {"weight_scale of the wrong shape",
       [&](auto& t) { t[q + ".weight_scale"] = Tensor::Empty({63}, DType::kF32); },
       {q + ".weight_scale has shape [63]"}},
      {"block-wise weight_scale",
       [&](auto& t) {
         t[q + ".weight_scale"] = Tensor::Empty({1, 1, 4}, DType::kF32);
       },
       {"block-wise"}},
      {"zero weight_scale",
       [&](auto& t) { t[q + ".weight_scale"] = Scalar(0.0f); },
       {q + ".weight_scale[0]"}},
      {"e4m3 weight of the wrong shape",
       [&](auto& t) {
         t[q + ".weight"] = Tensor::Empty({64, 32}, DType::kF8E4M3);
       },
       {q + ".weight (expected [64, 64]"}},
      {"q in bf16 beside e4m3 k and v",
       [&](auto& t) {
         t.erase(q + ".weight_scale");
         t[q + ".weight"] = Tensor::Empty({64, 64}, DType::kBF16);
       },
       {"mixes F8_E4M3 and float weights in q/k/v_proj"}},
      {"K/V scales of one layer only",
       [&](auto& t) { t.erase("model.layers.1.self_attn.v_scale"); },
       {"K/V scales are missing for 1 of 2 layers", "kv_cache_scheme"}},
      {"a negative k_scale",
       [&](auto& t) { t["model.layers.0.self_attn.k_scale"] = Scalar(-1.0f); },
       {"model.layers.0.self_attn.k_scale is -1"}},
  };
  auto backend = MakeCpuBackend();
  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.what);
    std::map<std::string, Tensor> tensors = good;  // views: an edit replaces, never writes
    test_case.edit(tensors);
    TempDir bad;
    std::filesystem::copy_file(dir.File("good") + "/config.json", bad.File("config.json"));
    ASSERT_TRUE(
        WriteSafetensors(bad.File("model.safetensors"), {tensors.begin(), tensors.end()}).ok());
    const auto model = LoadDir(*backend, bad.path());
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
    for (const std::string& text : test_case.expected) {
      EXPECT_NE(model.status().message().find(text), std::string::npos) << model.status().message();
    }
  }
}

TEST(Fp8CheckpointTest, OtherQuantizationMethodsAreUnimplementedAndNamed) {
  const json fp8{{"num_bits", 8}, {"type", "float"}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"quant_method", "awq"}, {"bits", 4}}, "awq"},
      {{{"quant_method", "gptq"}, {"bits", 4}}, "gptq"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}, "fp8"},
      {{{"quant_method", "bitsandbytes"}}, "bitsandbytes"},
      {{{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}, "NVFP4"},
      {{{"quant_method", "compressed-tensors"},
        {"config_groups",
         {{"g", {{"weights", {{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}}}}}}}},
       "int8"},
      {{{"quant_method", "compressed-tensors"},
        {"config_groups",
         {{"g", {{"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}}}}}}}},
       "block"},
      {{{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}}, "pack-quantized"},
      {{{"quant_method", "compressed-tensors"},
        {"config_groups",
         {{"g", {{"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}}}}}},
        {"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}, {"strategy", "attn_head"}}}},
       "attn_head"},
  };
  for (const auto& [quantization, name] : cases) {
    json config = TinyConfig();
    config["quantization_config"] = quantization;
    const Result<ModelConfig> parsed = ParseHfConfig(config);
    ASSERT_FALSE(parsed.ok()) << quantization.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kUnimplemented) << quantization.dump();
    EXPECT_NE(parsed.status().message().find(name), std::string::npos) << parsed.status().message();
  }
}

// Tensor parallelism: each rank holds its rows of qkv and gate_up with their scales, and its
// columns of o and down with every row's scale, exactly the one-rank weights' slices.
TEST(Fp8CheckpointTest, ShardsAreSlicesOfTheOneRankWeights) {
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  WriteCheckpoints(dir.File("fp8"), dir.File("f32"), {}, rng);
  auto config = LoadModelConfig(dir.File("fp8"));
  ASSERT_TRUE(config.ok());
  auto checkpoint = SafetensorsCheckpoint::Open(dir.File("fp8"));
  ASSERT_TRUE(checkpoint.ok());
  auto backend = MakeCpuBackend();
  auto whole = LlamaModel::Load(*config, **checkpoint, *backend, 64);
  ASSERT_TRUE(whole.ok());
  const int64_t hd = config->head_dim;
  std::vector<std::unique_ptr<Communicator>> communicators = MakeInProcessCommunicators(2);
  for (int rank = 0; rank < 2; ++rank) {
    auto shard =
        LlamaModel::Load(*config, **checkpoint, *backend, 64, {rank, 2}, communicators[rank].get());
    ASSERT_TRUE(shard.ok()) << shard.status().ToString();
    const ShardLayout& layout = (*shard)->layout();
    for (int layer = 0; layer < config->num_layers; ++layer) {
      const LlamaLayerWeights& full = (*whole)->weights().layers[layer];
      const LlamaLayerWeights& part = (*shard)->weights().layers[layer];
      const std::vector<float> full_qkv = Dequantized(full.qkv), part_qkv = Dequantized(part.qkv);
      const int64_t d = config->hidden_size;
      // Row ranges of the full qkv: this rank's q heads, k heads, v heads.
      const int64_t q_rows = layout.num_q_heads * hd, kv_rows = layout.num_kv_heads * hd;
      const int64_t k_full = config->num_heads * hd, v_full = k_full + config->num_kv_heads * hd;
      const std::pair<int64_t, int64_t> ranges[] = {{layout.q_head_begin * hd, q_rows},
                                                    {k_full + layout.kv_head_begin * hd, kv_rows},
                                                    {v_full + layout.kv_head_begin * hd, kv_rows}};
      int64_t part_row = 0;
      for (const auto& [begin, count] : ranges) {
        EXPECT_TRUE(std::equal(part_qkv.begin() + part_row * d,
                               part_qkv.begin() + (part_row + count) * d,
                               full_qkv.begin() + begin * d))
            << "rank " << rank << " layer " << layer;
        part_row += count;
      }
      const std::vector<float> full_down = Dequantized(full.down),
                               part_down = Dequantized(part.down);
      const int64_t f = config->intermediate_size;
      ASSERT_EQ(part.down.dim(0), d);
      for (int64_t row = 0; row < d; ++row) {
        EXPECT_TRUE(std::equal(part_down.begin() + row * layout.ffn_size,
                               part_down.begin() + (row + 1) * layout.ffn_size,
                               full_down.begin() + row * f + layout.ffn_begin));
      }
    }
  }
}

#ifdef SIEVE_HAVE_CUDA
// The FP8 checkpoint on the GPU against its CPU twin, at a head dim the CUDA kernels serve. As for
// --quantization fp8 (llama_model_test.cc, GpuFp8WeightsTest), the GPU's bf16 activations against
// the CPU's f32 ones can cross e4m3 rounding boundaries, so the bound is FP8's: relative L2 of
// the logits within 0.1 and nearly every argmax the same.
TEST(GpuFp8CheckpointTest, MatchesTheCpuTwin) {
  auto gpu = MakeCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status().message();
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  json config = TinyConfig();
  config["hidden_size"] = 256;
  config["intermediate_size"] = 512;
  config["head_dim"] = 64;
  WriteCheckpoints(dir.File("fp8"), dir.File("f32"), {}, rng, config);
  auto cpu = MakeCpuBackend();
  auto on_cpu = MustLoad(*cpu, dir.File("fp8"));
  auto on_gpu = MustLoad(**gpu, dir.File("fp8"));
  const std::vector<int32_t> ids = RandomIds(rng, 40, 97);
  const std::vector<float> twin = testing::FullPrefillLogits(*on_cpu, ids);
  const std::vector<float> logits = testing::FullPrefillLogits(*on_gpu, ids);
  ASSERT_EQ(logits.size(), twin.size());
  const double error = testing::RelativeL2Error(logits.data(), twin.data(), twin.size());
  int same = 0;
  for (size_t row = 0; row < ids.size(); ++row) {
    const auto a = logits.begin() + static_cast<std::ptrdiff_t>(row * 97);
    const auto b = twin.begin() + static_cast<std::ptrdiff_t>(row * 97);
    same += std::max_element(a, a + 97) - a == std::max_element(b, b + 97) - b;
  }
  std::printf("FP8 checkpoint, GPU against CPU: relative L2 %.4f, argmax same at %d of %zu\n",
              error, same, ids.size());
  EXPECT_LE(error, 0.1);
  EXPECT_GE(same, static_cast<int>(ids.size() * 85 / 100));
}
#endif

// Two ranks run the FP8 checkpoint's forward together (each on its own backend and thread, the
// in-process communicator between them). Both get the same logits, bit for bit, and they track
// one rank's: each rank quantizes the input of its o and down slices (a slice of each row) with
// that slice's own per-token scale, so the ranks round differently from one rank, as
// --quantization fp8 does under tensor parallelism. Bound: FP8's, relative L2 within 0.1.
TEST(Fp8CheckpointTest, TwoRanksTrackOneRank) {
  std::mt19937_64 rng = testing::MakeRng();
  TempDir dir;
  WriteCheckpoints(dir.File("fp8"), dir.File("f32"), {}, rng);
  auto config = LoadModelConfig(dir.File("fp8"));
  ASSERT_TRUE(config.ok());
  auto checkpoint = SafetensorsCheckpoint::Open(dir.File("fp8"));
  ASSERT_TRUE(checkpoint.ok());
  const std::vector<int32_t> ids = RandomIds(rng, 24, config->vocab_size);
  auto one_backend = MakeCpuBackend();
  auto one = LlamaModel::Load(*config, **checkpoint, *one_backend, 64);
  ASSERT_TRUE(one.ok());
  const std::vector<float> expected = testing::FullPrefillLogits(**one, ids);
  constexpr int kRanks = 2;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<std::unique_ptr<CpuBackend>> backends;
  for (int rank = 0; rank < kRanks; ++rank) {
    pools.push_back(std::make_unique<ThreadPool>(1));
    backends.push_back(std::make_unique<CpuBackend>(pools.back().get()));
  }
  std::vector<std::unique_ptr<Communicator>> communicators = MakeInProcessCommunicators(kRanks);
  std::vector<std::vector<float>> logits(kRanks);
  std::vector<Status> statuses(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      Backend& backend = *backends[rank];
      auto model = LlamaModel::Load(*config, **checkpoint, backend, 64, {rank, kRanks},
                                    communicators[rank].get());
      if (!model.ok()) {
        statuses[rank] = model.status();
        return;
      }
      testing::PrefillFixture fixture = testing::MakeFullPrefill(backend, *config, ids);
      // The rank's pool holds its KV heads only.
      KvPool& pool = fixture.pool;
      pool.num_kv_heads = (*model)->layout().num_kv_heads;
      pool.k = backend.Allocate({pool.num_pages, pool.page_size, pool.num_kv_heads, pool.head_dim},
                                backend.activation_dtype());
      pool.v = backend.Allocate(pool.k.shape(), backend.activation_dtype());
      const int n = static_cast<int>(ids.size());
      ForwardWorkspace workspace;
      (*model)->EnsureWorkspace(workspace, n, n, n, 1, 1);
      Tensor out = backend.Allocate({n, config->vocab_size}, DType::kF32);
      (*model)->Forward(fixture.step, pool, workspace, out);
      logits[rank].resize(static_cast<size_t>(out.numel()));
      backend.CopyToHost(out, logits[rank].data());
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Status& status : statuses) ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(logits[0] == logits[1]);
  ASSERT_EQ(logits[0].size(), expected.size());
  const double error = testing::RelativeL2Error(logits[0].data(), expected.data(), expected.size());
  std::printf("FP8 checkpoint on 2 ranks against 1: relative L2 %.4f\n", error);
  EXPECT_LE(error, 0.1);
}

// A Backend that forwards to the CPU backend and counts the bytes of the tensors it allocates
// that are alive, and the most that ever were.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& inner) : inner_(inner) {}
  int64_t peak_bytes() const { return peak_; }

  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  size_t FreeMemoryBytes() const override { return inner_.FreeMemoryBytes(); }
  Tensor Allocate(std::vector<int64_t> shape, DType dtype) override {
    return Counted(inner_.Allocate(std::move(shape), dtype));
  }
  void CopyFromHost(const void* src, size_t bytes, Tensor& dst) override {
    inner_.CopyFromHost(src, bytes, dst);
  }
  void CopyToHost(const Tensor& src, void* dst) override { inner_.CopyToHost(src, dst); }
  void Synchronize() override { inner_.Synchronize(); }
  Tensor UploadWeight(const void* src, DType src_dtype, std::vector<int64_t> shape) override {
    return Counted(inner_.UploadWeight(src, src_dtype, std::move(shape)));
  }
  void FillRandom(Tensor& tensor, uint64_t seed, float stddev) override {
    inner_.FillRandom(tensor, seed, stddev);
  }
  void Copy(const Tensor& src, Tensor& dst) override { inner_.Copy(src, dst); }
  void Embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    inner_.Embedding(table, ids, out);
  }
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    inner_.RmsNorm(x, weight, eps, out);
  }
  void Linear(const Tensor& x, const Tensor& w, Tensor& out) override { inner_.Linear(x, w, out); }
  void LinearAdd(const Tensor& x, const Tensor& w, Tensor& out) override {
    inner_.LinearAdd(x, w, out);
  }
  void ScaleColumns(Tensor& w, const Tensor& scale) override { inner_.ScaleColumns(w, scale); }
  void SiluMul(const Tensor& gate_up, Tensor& out, RowRms norm) override {
    inner_.SiluMul(gate_up, out, norm);
  }
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    inner_.GatherRows(x, rows, out);
  }
  Tensor QuantizeWeightE4m3(const Tensor& w) override {
    const Tensor quantized = inner_.QuantizeWeightE4m3(w);
    return Counted(quantized).WithRowScales(Counted(quantized.row_scales()));
  }
  Tensor UploadWeightE4m3(const uint8_t* codes, const float* row_scales, int64_t rows,
                          int64_t cols) override {
    const Tensor uploaded = inner_.UploadWeightE4m3(codes, row_scales, rows, cols);
    return Counted(uploaded).WithRowScales(Counted(uploaded.row_scales()));
  }
  Status CheckE4m3Weight(int64_t rows, int64_t cols) const override {
    return inner_.CheckE4m3Weight(rows, cols);
  }
  void RopeAndCacheWrite(Tensor& qkv, const Tensor& rope_table, int num_heads, const StepMeta& step,
                         int layer, KvPool& pool, RopeTokens tokens, RowRms norm) override {
    inner_.RopeAndCacheWrite(qkv, rope_table, num_heads, step, layer, pool, tokens, norm);
  }
  void GatherPrefillKv(const Tensor& qkv, int num_heads, const StepMeta& step, int layer,
                       const KvPool& pool, Tensor& k_out, Tensor& v_out) override {
    inner_.GatherPrefillKv(qkv, num_heads, step, layer, pool, k_out, v_out);
  }
  void PrefillAttention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                        const StepMeta& step, Tensor& out, Tensor& lse) override {
    inner_.PrefillAttention(q, k, v, num_heads, step, out, lse);
  }
  void DecodeAttention(const Tensor& q, int num_heads, const StepMeta& step, int layer,
                       KvPool& pool, Tensor& out) override {
    inner_.DecodeAttention(q, num_heads, step, layer, pool, out);
  }
  void WindowScores(const Tensor& q, const Tensor& k, const Tensor& lse, int num_heads,
                    const StepMeta& step, int layer, Tensor& scores) override {
    inner_.WindowScores(q, k, lse, num_heads, step, layer, scores);
  }
  void SelectKept(const Tensor& scores, int num_kv_heads, const StepMeta& step, int layer,
                  Tensor& kept) override {
    inner_.SelectKept(scores, num_kv_heads, step, layer, kept);
  }
  void WriteKeptKv(const Tensor& k, const Tensor& v, const Tensor& scores, const Tensor& kept,
                   const StepMeta& step, int layer, KvPool& pool) override {
    inner_.WriteKeptKv(k, v, scores, kept, step, layer, pool);
  }
  void EvictEntries(const StepMeta& step, int layer, KvPool& pool) override {
    inner_.EvictEntries(step, layer, pool);
  }
  void ScatterInt32(const Tensor& patches, int count, Tensor& dst) override {
    inner_.ScatterInt32(patches, count, dst);
  }
  void GatherInt32(const Tensor& src, const Tensor& pairs, int count, Tensor& dst) override {
    inner_.GatherInt32(src, pairs, count, dst);
  }
  HostBuffer AllocateHostBuffer(size_t bytes) override { return inner_.AllocateHostBuffer(bytes); }
  void SwapOutPages(const KvPool& pool, std::span<const int32_t> pages,
                    std::span<const int32_t> slots, uint8_t* host) override {
    inner_.SwapOutPages(pool, pages, slots, host);
  }
  void SwapInPages(const uint8_t* host, std::span<const int32_t> slots,
                   std::span<const int32_t> pages, KvPool& pool) override {
    inner_.SwapInPages(host, slots, pages, pool);
  }

 private:
  // The same view, owned through a token that counts its bytes while any copy of it lives.
  Tensor Counted(const Tensor& tensor) {
    const int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    std::shared_ptr<void> token(nullptr, [this, bytes, tensor](void*) { live_ -= bytes; });
    Tensor counted = Tensor::Wrap(tensor.data(), tensor.shape(), tensor.dtype(), tensor.device(),
                                  std::shared_ptr<void>(token, tensor.data()));
    return counted;
  }

  Backend& inner_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

// --load-format dummy --quantization fp8: the layers are quantized as they are made, so the
// most held at once is the FP8 model plus one layer in the activation dtype (a 70B model's 140
// GB of bf16 never exist; inspect prints its FP8 bytes), and the weights are exactly those of
// RandomShard followed by QuantizeWeights.
TEST(DummyFp8Test, LayersAreQuantizedAsTheyAreMade) {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.model_type = "llama";
  config.vocab_size = 128;
  config.hidden_size = 128;
  config.intermediate_size = 384;
  config.num_layers = 8;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 32;
  config.max_position_embeddings = 64;
  const uint64_t seed = testing::MakeRng()();
  auto cpu = MakeCpuBackend();
  CountingBackend streaming(*cpu);
  auto quantized = LlamaModel::RandomShard(config, streaming, seed, 64, {}, nullptr, 0.02f,
                                           WeightQuantization::kFp8);
  ASSERT_TRUE(quantized.ok()) << quantized.status().ToString();
  EXPECT_EQ((*quantized)->quantization(), WeightQuantization::kFp8);
  EXPECT_TRUE((*quantized)->norms_folded());
  CountingBackend whole(*cpu);
  auto afterwards = LlamaModel::RandomShard(config, whole, seed, 64, {}, nullptr, 0.02f);
  ASSERT_TRUE(afterwards.ok());
  ASSERT_TRUE((*afterwards)->QuantizeWeights(WeightQuantization::kFp8).ok());
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const LlamaLayerWeights& a = (*quantized)->weights().layers[layer];
    const LlamaLayerWeights& b = (*afterwards)->weights().layers[layer];
    for (const auto& [x, y] : {std::pair{&a.qkv, &b.qkv}, std::pair{&a.o, &b.o},
                               std::pair{&a.gate_up, &b.gate_up}, std::pair{&a.down, &b.down}}) {
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->nbytes()), 0) << "layer " << layer;
      EXPECT_EQ(
          std::memcmp(x->row_scales().data(), y->row_scales().data(), x->row_scales().nbytes()), 0);
    }
  }
  // One layer's four matrices in the activation dtype (f32 here).
  const int64_t layer_bytes = config.LinearParametersPerLayer() * 4;
  const int64_t held = (*quantized)->WeightBytes();
  std::printf(
      "dummy fp8: peak %lld bytes, held %lld, one layer %lld; quantized afterwards: peak "
      "%lld\n",
      static_cast<long long>(streaming.peak_bytes()), static_cast<long long>(held),
      static_cast<long long>(layer_bytes), static_cast<long long>(whole.peak_bytes()));
  // The rope table is the only other allocation.
  const int64_t rope = 64 * config.head_dim / 2 * 2 * 4;
  EXPECT_LE(streaming.peak_bytes(), held + layer_bytes + rope);
  EXPECT_GE(whole.peak_bytes(), config.num_layers * layer_bytes);
}

}  // namespace
}  // namespace sieve
