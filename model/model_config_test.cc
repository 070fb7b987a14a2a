#include "model/model_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/testing.h"
#include "model/generation_config.h"

namespace sieve {
namespace {

using nlohmann::json;
using testing::TempDir;

// meta-llama/Llama-2-7b-hf
json Llama2Config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "tie_word_embeddings": false, "torch_dtype": "float16", "use_cache": true,
    "vocab_size": 32000})");
}

// meta-llama/Meta-Llama-3-8B
json Llama3Config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
}

// meta-llama/Llama-3.1-8B-Instruct
json Llama31Config() {
  json config = Llama3Config();
  config["eos_token_id"] = {128001, 128008, 128009};
  config["max_position_embeddings"] = 131072;
  config["mlp_bias"] = false;
  config["rope_scaling"] = json::parse(R"({"factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"})");
  return config;
}

// mistralai/Mistral-7B-v0.1
json MistralConfig() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 32000})");
}

// meta-llama/Llama-3.2-1B
json Llama32Config() {
  json config = Llama31Config();
  config["hidden_size"] = 2048;
  config["intermediate_size"] = 8192;
  config["num_hidden_layers"] = 16;
  config["head_dim"] = 64;
  config["tie_word_embeddings"] = true;
  config["rope_scaling"]["factor"] = 32.0;
  return config;
}

TEST(ModelConfigTest, ParsesLlama2) {
  const Result<ModelConfig> config = ParseHfConfig(Llama2Config());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->vocab_size, 32000);
  EXPECT_EQ(config->num_kv_heads, 32);
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_EQ(config->intermediate_size, 11008);
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-5f);
  EXPECT_EQ(config->rope_theta, 10000.0);  // absent: transformers' default
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(config->dtype, DType::kF16);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_FALSE(config->sliding_window.has_value());
  EXPECT_EQ(config->NumParameters(), 6'738'415'616);
}

TEST(ModelConfigTest, ParsesLlama3AndCountsLlama3_8B) {
  const Result<ModelConfig> config = ParseHfConfig(Llama3Config());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->num_kv_heads, 8);
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_EQ(config->rope_theta, 500000.0);
  EXPECT_EQ(config->dtype, DType::kBF16);
  EXPECT_EQ(config->eos_token_ids, std::vector<int32_t>{128001});
  EXPECT_EQ(config->NumParameters(), 8'030'261'248);
  EXPECT_EQ(config->KvBytesPerToken(DType::kBF16), 131072);
  EXPECT_EQ(config->KvBytesPerToken(DType::kF32), 262144);
  const std::string summary = config->Summary();
  EXPECT_NE(summary.find("LlamaForCausalLM"), std::string::npos) << summary;
  EXPECT_NE(summary.find("32 layers"), std::string::npos) << summary;
  EXPECT_NE(summary.find("8.03B"), std::string::npos) << summary;
}

TEST(ModelConfigTest, ParsesLlama31RopeScaling) {
  const Result<ModelConfig> config = ParseHfConfig(Llama31Config());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(config->rope_scaling.factor, 8.0f);
  EXPECT_EQ(config->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(config->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(config->max_position_embeddings, 131072);
  EXPECT_EQ(config->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_NE(config->Summary().find("llama3 x8"), std::string::npos) << config->Summary();
}

TEST(ModelConfigTest, ParsesMistralSlidingWindow) {
  Result<ModelConfig> config = ParseHfConfig(MistralConfig());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->architecture, "MistralForCausalLM");
  EXPECT_EQ(config->model_type, "mistral");
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_EQ(config->NumParameters(), 7'241'732'096);

  json no_window = MistralConfig();
  no_window["sliding_window"] = nullptr;  // Mistral v0.2 and later
  config = ParseHfConfig(no_window);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_FALSE(config->sliding_window.has_value());

  // transformers' Llama has no sliding window, whatever the file says.
  json llama = Llama3Config();
  llama["sliding_window"] = 4096;
  config = ParseHfConfig(llama);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_FALSE(config->sliding_window.has_value());
}

TEST(ModelConfigTest, ParsesTiedEmbeddingsAndExplicitHeadDim) {
  Result<ModelConfig> config = ParseHfConfig(Llama32Config());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->rope_scaling.factor, 32.0f);
  EXPECT_EQ(config->NumParameters(), 1'235'814'400);  // Llama 3.2 1B

  // Mistral NeMo: head_dim 128 although hidden / heads = 160.
  json nemo = MistralConfig();
  nemo["hidden_size"] = 5120;
  nemo["head_dim"] = 128;
  nemo["sliding_window"] = nullptr;
  config = ParseHfConfig(nemo);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_EQ(config->KvBytesPerToken(DType::kBF16), 2 * 32 * 8 * 128 * 2);
}

TEST(ModelConfigTest, ReadsTransformersV5RopeParameters) {
  json config = Llama31Config();
  json parameters = config["rope_scaling"];
  parameters["rope_theta"] = 500000.0;
  config.erase("rope_scaling");
  config.erase("rope_theta");
  config["rope_parameters"] = parameters;
  config.erase("torch_dtype");
  config["dtype"] = "float32";
  const Result<ModelConfig> parsed = ParseHfConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->rope_theta, 500000.0);
  EXPECT_EQ(parsed->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(parsed->dtype, DType::kF32);
}

TEST(ModelConfigTest, RopeScalingTypes) {
  json config = Llama2Config();
  config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older key
  Result<ModelConfig> parsed = ParseHfConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(parsed->rope_scaling.factor, 2.0f);

  config["rope_scaling"] = {{"rope_type", "default"}};
  parsed = ParseHfConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->rope_scaling.type, RopeScaling::Type::kNone);

  for (const char* type : {"dynamic", "yarn", "longrope"}) {
    config["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    parsed = ParseHfConfig(config);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(parsed.status().message().find(type), std::string::npos) << parsed.status().message();
  }

  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  parsed = ParseHfConfig(config);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("rope_scaling.low_freq_factor"), std::string::npos)
      << parsed.status().message();
}

TEST(ModelConfigTest, RejectsUnsupportedArchitecture) {
  json config = Llama3Config();
  config["architectures"] = {"Qwen2ForCausalLM"};
  const Result<ModelConfig> parsed = ParseHfConfig(config);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(parsed.status().message().find(
                "unsupported architecture Qwen2ForCausalLM (Sieve supports LlamaForCausalLM, "
                "MistralForCausalLM)"),
            std::string::npos)
      << parsed.status().message();

  // Old configs without the list still name their model_type.
  config.erase("architectures");
  Result<ModelConfig> from_type = ParseHfConfig(config);
  ASSERT_TRUE(from_type.ok()) << from_type.status().ToString();
  EXPECT_EQ(from_type->architecture, "LlamaForCausalLM");
  config["model_type"] = "gemma";
  from_type = ParseHfConfig(config);
  EXPECT_EQ(from_type.status().code(), StatusCode::kUnimplemented);
}

TEST(ModelConfigTest, RejectsWhatSieveCannotRun) {
  const std::pair<const char*, json> cases[] = {
      {"attention_bias", true},
      {"mlp_bias", true},
      {"hidden_act", "gelu"},
      {"quantization_config", {{"quant_method", "awq"}, {"bits", 4}}},
      {"torch_dtype", "float8_e4m3fn"},
  };
  for (const auto& [key, value] : cases) {
    json config = Llama3Config();
    config[key] = value;
    const Result<ModelConfig> parsed = ParseHfConfig(config);
    ASSERT_FALSE(parsed.ok()) << key;
    EXPECT_EQ(parsed.status().code(), StatusCode::kUnimplemented) << key;
  }
}

TEST(ModelConfigTest, MissingOrMistypedFieldsNameTheFieldAndFile) {
  TempDir dir;
  json config = Llama3Config();
  config.erase("num_hidden_layers");
  const std::string path = dir.Write("config.json", config.dump());
  Result<ModelConfig> parsed = LoadModelConfig(dir.path());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("num_hidden_layers"), std::string::npos);
  EXPECT_NE(parsed.status().message().find(path), std::string::npos) << parsed.status().message();

  config = Llama3Config();
  config["hidden_size"] = "4096";
  parsed = ParseHfConfig(config);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("'hidden_size' must be a 32-bit integer, got string"),
            std::string::npos)
      << parsed.status().message();

  config = Llama3Config();
  config["eos_token_id"] = {128001, "x"};
  EXPECT_EQ(ParseHfConfig(config).status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(ParseHfConfig(json::array()).status().code(), StatusCode::kInvalidArgument);

  dir.Write("config.json", "{\"hidden_size\": 4096,");
  parsed = LoadModelConfig(dir.path());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("not valid JSON"), std::string::npos);
}

TEST(ModelConfigTest, ValidateChecksShapes) {
  ModelConfig config = *ParseHfConfig(Llama3Config());
  ASSERT_TRUE(config.Validate().ok());

  ModelConfig bad = config;
  bad.num_kv_heads = 5;
  EXPECT_NE(bad.Validate().message().find("multiple of num_kv_heads"), std::string::npos);
  bad = config;
  bad.head_dim = 127;
  EXPECT_NE(bad.Validate().message().find("head_dim must be even"), std::string::npos);
  bad = config;
  bad.num_layers = 0;
  EXPECT_NE(bad.Validate().message().find("num_layers must be positive"), std::string::npos);
  bad = config;
  bad.bos_token_id = 128256;
  EXPECT_FALSE(bad.Validate().ok());
  bad = config;
  bad.rope_scaling.type = RopeScaling::Type::kLlama3;
  bad.rope_scaling.high_freq_factor = 1.0f;
  EXPECT_FALSE(bad.Validate().ok());
  bad = config;
  bad.dtype = DType::kI32;
  EXPECT_FALSE(bad.Validate().ok());

  json odd = Llama3Config();
  odd["num_key_value_heads"] = 7;
  const Result<ModelConfig> parsed = ParseHfConfig(odd, "my/config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message().rfind("my/config.json: ", 0), 0u)
      << parsed.status().message();
}

TEST(ModelConfigTest, ParsesMetaParams) {
  TempDir dir;
  // Meta-Llama-3-8B/original/params.json
  dir.Write("params.json", R"({"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
      "vocab_size": 128256, "multiple_of": 1024, "ffn_dim_multiplier": 1.3, "norm_eps": 1e-05,
      "rope_theta": 500000.0})");
  Result<ModelConfig> config = LoadModelConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->intermediate_size, 14336);
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(config->max_position_embeddings, 8192);
  EXPECT_EQ(config->NumParameters(), 8'030'261'248);

  // Llama-3.1-70B/original/params.json
  config = ParseMetaParams(json::parse(R"({"dim": 8192, "ffn_dim_multiplier": 1.3,
      "multiple_of": 4096, "n_heads": 64, "n_kv_heads": 8, "n_layers": 80, "norm_eps": 1e-05,
      "rope_theta": 500000.0, "use_scaled_rope": true, "vocab_size": 128256})"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->intermediate_size, 28672);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(config->rope_scaling.factor, 8.0f);
  EXPECT_EQ(config->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(config->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(config->max_position_embeddings, 131072);

  // Llama-2-7b: multiple_of 256, no multiplier; its vocab_size is left to the tokenizer.
  json llama2 = json::parse(R"({"dim": 4096, "multiple_of": 256, "n_heads": 32, "n_layers": 32,
      "norm_eps": 1e-05, "vocab_size": -1})");
  config = ParseMetaParams(llama2);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("vocab_size"), std::string::npos);
  llama2["vocab_size"] = 32000;
  config = ParseMetaParams(llama2);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->intermediate_size, 11008);
  EXPECT_EQ(config->num_kv_heads, 32);
  EXPECT_EQ(config->rope_theta, 10000.0);
  EXPECT_EQ(config->NumParameters(), 6'738'415'616);

  // config.json wins when both are there.
  dir.Write("config.json", Llama2Config().dump());
  config = LoadModelConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->vocab_size, 32000);
}

// Undefined behaviour that UBSan reported on these inputs (fuzz/corpus/model_config_fuzzer/
// regression_*): sizes whose parameter count overflowed int64 in NumParameters, and an FFN
// multiplier whose product overflowed the conversion to an integer. Both are InvalidArgument now.
TEST(ModelConfigTest, SizesBeyond64BitCountsAreRefused) {
  json config = json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 2147483647,
      "hidden_size": 2147483647, "intermediate_size": 2147483647,
      "num_hidden_layers": 2147483647, "num_attention_heads": 2147483647,
      "head_dim": 2147483646, "rms_norm_eps": 1e-5, "max_position_embeddings": 2147483647})");
  Result<ModelConfig> parsed = ParseHfConfig(config);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("64-bit"), std::string::npos)
      << parsed.status().message();

  // A head count that only overflows the KV bytes per token.
  config = json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
      "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2147483647,
      "num_attention_heads": 2147483647, "head_dim": 2147483646, "rms_norm_eps": 1e-5,
      "max_position_embeddings": 16})");
  EXPECT_EQ(ParseHfConfig(config).status().code(), StatusCode::kInvalidArgument);

  for (const char* multiplier : {"1e300", "-1e300", "1e-300", "-2"}) {
    const Result<ModelConfig> meta =
        ParseMetaParams(json::parse(std::string(R"({"dim": 256, "n_layers": 1, "n_heads": 4,
            "vocab_size": 10, "ffn_dim_multiplier": )") +
                                    multiplier + "}"));
    ASSERT_FALSE(meta.ok()) << multiplier;
    EXPECT_NE(meta.status().message().find("ffn_dim_multiplier"), std::string::npos)
        << meta.status().message();
  }
}

// configs/ holds the shapes benchmarks load with --load-format dummy: each Llama 3.1 one is its
// Llama 3 twin with the 3.1 context (RoPE scaled by llama3 x8 to 131072 positions, 3 EOS ids), so
// a 16000-token benchmark runs the same weights' shape as a 4000-token one.
TEST(ModelConfigTest, ShippedLlama31ShapesAreTheirLlama3TwinsWithLongContext) {
  for (const auto& [base, long_context, parameters] :
       {std::tuple{"llama-3-8b", "llama-3.1-8b", int64_t{8'030'261'248}},
        std::tuple{"llama-3-70b", "llama-3.1-70b", int64_t{70'553'706'496}}}) {
    SCOPED_TRACE(long_context);
    const auto llama3 = LoadModelConfig(ProjectSourceDir() + "/configs/" + base);
    const auto llama31 = LoadModelConfig(ProjectSourceDir() + "/configs/" + long_context);
    ASSERT_TRUE(llama3.ok()) << llama3.status().ToString();
    ASSERT_TRUE(llama31.ok()) << llama31.status().ToString();
    EXPECT_EQ(llama31->NumParameters(), parameters);
    EXPECT_EQ(llama3->NumParameters(), parameters);
    EXPECT_EQ(llama31->KvBytesPerToken(DType::kBF16), llama3->KvBytesPerToken(DType::kBF16));
    EXPECT_EQ(std::tie(llama31->hidden_size, llama31->intermediate_size, llama31->num_layers,
                       llama31->num_heads, llama31->num_kv_heads, llama31->head_dim,
                       llama31->vocab_size, llama31->rope_theta),
              std::tie(llama3->hidden_size, llama3->intermediate_size, llama3->num_layers,
                       llama3->num_heads, llama3->num_kv_heads, llama3->head_dim,
                       llama3->vocab_size, llama3->rope_theta));
    EXPECT_EQ(llama3->max_position_embeddings, 8192);
    EXPECT_EQ(llama3->rope_scaling.type, RopeScaling::Type::kNone);
    EXPECT_EQ(llama31->max_position_embeddings, 131072);
    EXPECT_EQ(llama31->rope_scaling.type, RopeScaling::Type::kLlama3);
    EXPECT_EQ(llama31->rope_scaling.factor, 8.0f);
    EXPECT_EQ(llama31->rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_EQ(llama31->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  }
}

TEST(ModelConfigTest, MissingConfigIsNotFound) {
  TempDir dir;
  EXPECT_EQ(LoadModelConfig(dir.path()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LoadModelConfig(dir.path() + "/nope").status().code(), StatusCode::kNotFound);
}

TEST(GenerationConfigTest, AbsentFileIsEmpty) {
  TempDir dir;
  const Result<GenerationConfig> config = LoadGenerationConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->eos_token_ids.empty());
  EXPECT_FALSE(config->temperature.has_value());
}

TEST(GenerationConfigTest, ParsesLlama31Instruct) {
  TempDir dir;
  dir.Write("generation_config.json", R"({"bos_token_id": 128000, "do_sample": true,
      "eos_token_id": [128001, 128008, 128009], "temperature": 0.6, "top_p": 0.9,
      "transformers_version": "4.42.3"})");
  const Result<GenerationConfig> config = LoadGenerationConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->bos_token_id, 128000);
  EXPECT_EQ(config->do_sample, true);
  EXPECT_EQ(config->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_FLOAT_EQ(*config->temperature, 0.6f);
  EXPECT_FLOAT_EQ(*config->top_p, 0.9f);
  EXPECT_FALSE(config->top_k.has_value());
}

TEST(GenerationConfigTest, MalformedIsAnError) {
  TempDir dir;
  const std::string path = dir.Write("generation_config.json", R"({"temperature": "hot"})");
  Result<GenerationConfig> config = LoadGenerationConfig(dir.path());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("temperature"), std::string::npos);
  EXPECT_NE(config.status().message().find(path), std::string::npos);

  dir.Write("generation_config.json", R"({"top_k": -1})");
  EXPECT_FALSE(LoadGenerationConfig(dir.path()).ok());
  dir.Write("generation_config.json", R"({"eos_token_id": 2,)");
  EXPECT_FALSE(LoadGenerationConfig(dir.path()).ok());
}

}  // namespace
}  // namespace sieve
