#include "model/llama_checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/testing.h"

namespace sieve {
namespace {

using testing::TempDir;

// A small Mistral-shaped model: grouped-query attention and head_dim != hidden / heads, so that
// swapped or transposed dimensions show up as shape errors.
ModelConfig TinyConfig() {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.model_type = "llama";
  config.vocab_size = 64;
  config.hidden_size = 16;
  config.intermediate_size = 40;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 6;
  config.max_position_embeddings = 128;
  return config;
}

// Random bf16 tensors with the shapes `specs` asks for.
std::vector<std::pair<std::string, Tensor>> MakeTensors(const std::vector<ExpectedTensor>& specs,
                                                        std::mt19937_64& rng) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ExpectedTensor& spec : specs) {
    const Tensor values = testing::RandomTensor(spec.shape, rng, 0.02f);
    Tensor bf16 = Tensor::Empty(spec.shape, DType::kBF16);
    ConvertFromFloat(values.data_as<float>(), static_cast<size_t>(values.numel()), DType::kBF16,
                     bf16.data());
    tensors.emplace_back(spec.name, bf16);
  }
  return tensors;
}

Status ValidateDir(const TempDir& dir, const ModelConfig& config) {
  Result<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(dir.path());
  if (!checkpoint.ok()) return checkpoint.status();
  return ValidateLlamaCheckpoint(**checkpoint, config);
}

int64_t TotalElements(const std::vector<ExpectedTensor>& specs) {
  int64_t total = 0;
  for (const ExpectedTensor& spec : specs) {
    int64_t count = 1;
    for (int64_t extent : spec.shape) count *= extent;
    total += count;
  }
  return total;
}

TEST(LlamaCheckpointTest, SpecsOfLlama3_8B) {
  ModelConfig config = TinyConfig();
  config.vocab_size = 128256;
  config.hidden_size = 4096;
  config.intermediate_size = 14336;
  config.num_layers = 32;
  config.num_heads = 32;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  const std::vector<ExpectedTensor> specs = LlamaTensorSpecs(config);
  ASSERT_EQ(specs.size(), 32u * 9 + 3);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.front().shape, (std::vector<int64_t>{128256, 4096}));
  EXPECT_EQ(specs[3].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(specs[9].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(specs[9].shape, (std::vector<int64_t>{4096, 14336}));
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_EQ(TotalElements(specs), 8'030'261'248);
  EXPECT_EQ(TotalElements(specs), config.NumParameters());

  config.tie_word_embeddings = true;
  const std::vector<ExpectedTensor> tied = LlamaTensorSpecs(config);
  EXPECT_EQ(tied.size(), 32u * 9 + 2);
  EXPECT_EQ(tied.back().name, "model.norm.weight");
  EXPECT_EQ(TotalElements(tied), config.NumParameters());
}

TEST(LlamaCheckpointTest, AcceptsCompleteCheckpoint) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  const ModelConfig config = TinyConfig();
  std::vector<std::pair<std::string, Tensor>> tensors = MakeTensors(LlamaTensorSpecs(config), rng);
  // Old exports carry RoPE's buffer; it is harmless.
  tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq",
                       testing::RandomTensor({3}, rng));
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
  const Status status = ValidateDir(dir, config);
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(LlamaCheckpointTest, AcceptsShardedCheckpoint) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  const ModelConfig config = TinyConfig();
  const std::vector<std::pair<std::string, Tensor>> tensors =
      MakeTensors(LlamaTensorSpecs(config), rng);
  const size_t half = tensors.size() / 2;
  const std::vector<std::pair<std::string, Tensor>> first(tensors.begin(), tensors.begin() + half);
  const std::vector<std::pair<std::string, Tensor>> second(tensors.begin() + half, tensors.end());
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), first).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), second).ok());
  std::string index = R"({"metadata": {}, "weight_map": {)";
  for (size_t position = 0; position < tensors.size(); ++position) {
    index += (position > 0 ? ", \"" : "\"") + tensors[position].first + "\": \"model-0000" +
             (position < half ? "1" : "2") + "-of-00002.safetensors\"";
  }
  index += "}}";
  std::ofstream(dir.File("model.safetensors.index.json")) << index;
  const Status status = ValidateDir(dir, config);
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(LlamaCheckpointTest, NamesMissingMisshapedAndExtraTensors) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  const ModelConfig config = TinyConfig();
  std::vector<ExpectedTensor> specs = LlamaTensorSpecs(config);
  std::vector<ExpectedTensor> written;
  for (ExpectedTensor spec : specs) {
    if (spec.name == "model.layers.1.mlp.up_proj.weight" || spec.name == "model.norm.weight") {
      continue;
    }
    if (spec.name == "model.layers.0.self_attn.k_proj.weight") spec.shape = {24, 16};
    written.push_back(spec);
  }
  written.push_back({"model.layers.2.input_layernorm.weight", {16}});
  written.push_back({"model.layers.0.self_attn.q_proj.bias", {24}});
  std::vector<std::pair<std::string, Tensor>> tensors = MakeTensors(written, rng);
  Tensor int_norm = Tensor::Empty({16}, DType::kI32);
  for (auto& [name, tensor] : tensors) {
    if (name == "model.layers.1.input_layernorm.weight") tensor = int_norm;
  }
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok());

  const Status status = ValidateDir(dir, config);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  const std::string parts[] = {
      "missing tensors (2): model.layers.1.mlp.up_proj.weight, model.norm.weight",
      "tensors with the wrong shape (1): model.layers.0.self_attn.k_proj.weight (expected [12, "
      "16], got [24, 16] in model.safetensors)",
      "model.layers.1.input_layernorm.weight (I32",
      "unexpected tensors (2): model.layers.0.self_attn.q_proj.bias, "
      "model.layers.2.input_layernorm.weight",
      dir.path(),
  };
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

TEST(LlamaCheckpointTest, LongListsAreCut) {
  TempDir dir;
  ModelConfig config = TinyConfig();
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model.safetensors"),
                       {{"model.embed_tokens.weight", Tensor::Empty({64, 16}, DType::kF32)}})
          .ok());
  config.num_layers = 4;  // 36 layer tensors, norm and lm_head missing
  const Status status = ValidateDir(dir, config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("missing tensors (38)"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("and 28 more"), std::string::npos) << status.message();
}

TEST(LlamaCheckpointTest, TiedEmbeddings) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  ModelConfig config = TinyConfig();
  // A checkpoint without lm_head passes with a tied config, and fails naming it with an untied one.
  config.tie_word_embeddings = true;
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model.safetensors"), MakeTensors(LlamaTensorSpecs(config), rng))
          .ok());
  EXPECT_TRUE(ValidateDir(dir, config).ok());
  config.tie_word_embeddings = false;
  const Status status = ValidateDir(dir, config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("missing tensors (1): lm_head.weight"), std::string::npos)
      << status.message();

  // Tied config, checkpoint with lm_head: accepted, lm_head ignored.
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model.safetensors"), MakeTensors(LlamaTensorSpecs(config), rng))
          .ok());
  config.tie_word_embeddings = true;
  EXPECT_TRUE(ValidateDir(dir, config).ok());
}

}  // namespace
}  // namespace sieve
