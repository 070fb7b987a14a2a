#include "runtime/model_loader.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/logging.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer_loader.h"

namespace sieve {

ModelConfig TinyRandomModelConfig() {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.model_type = "llama";
  config.vocab_size = 261;
  config.hidden_size = 128;
  config.intermediate_size = 384;
  config.num_layers = 4;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 32;
  config.rms_norm_eps = 1e-5f;
  config.rope_theta = 10000.0;
  config.max_position_embeddings = 4096;
  config.tie_word_embeddings = false;
  config.dtype = DType::kF32;
  config.bos_token_id = 256;
  config.eos_token_ids = {257, 260};
  return config;
}

int DefaultMaxModelLen(const ModelConfig& config) {
  int limit = config.max_position_embeddings;
  if (config.sliding_window && *config.sliding_window < limit) limit = *config.sliding_window;
  return std::min(limit, 8192);
}

Result<std::string> FindDefaultModelDir() {
  namespace fs = std::filesystem;
  std::error_code error;
  if (const char* from_env = std::getenv("SIEVE_DEFAULT_MODEL"); from_env && *from_env) {
    if (!fs::is_directory(from_env, error)) {
      return NotFoundError(std::string("SIEVE_DEFAULT_MODEL='") + from_env +
                           "' is not a model directory");
    }
    return std::string(from_env);
  }
  std::vector<fs::path> candidates;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(executable.parent_path().parent_path() / "share" / "sieve" / "models" /
                         kDefaultModelName);
  }
#ifdef SIEVE_SOURCE_MODELS_DIR
  candidates.push_back(fs::path(SIEVE_SOURCE_MODELS_DIR) / kDefaultModelName);
#endif
  std::string looked;
  for (const fs::path& candidate : candidates) {
    if (fs::is_regular_file(candidate / "config.json", error)) return candidate.string();
    looked += (looked.empty() ? "" : ", ") + candidate.string();
  }
  return NotFoundError(std::string("the default model ") + kDefaultModelName +
                       " was not found (looked in " + looked +
                       "); pass --model DIR or set SIEVE_DEFAULT_MODEL");
}

namespace {

constexpr char kFp8WeightsDescription[] =
    ", FP8 weights (e4m3, per-channel scales, per-token activation scales; embeddings and LM head "
    "in the activation dtype)";

void AddUnique(std::vector<int32_t>& ids, int32_t id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

}  // namespace

Result<LoadedModel> LoadModel(const LoadModelOptions& options, Backend& backend) {
  LoadedModel loaded;
  ModelConfig config;
  // Checked before anything is read.
  SIEVE_ASSIGN_OR_RETURN(const WeightQuantization quantization,
                         ParseWeightQuantization(options.quantization));
  // Before any weight is read or memory allocated: a model the backend's kernels cannot run.
  const auto check_backend = [&backend](const ModelConfig& shape) {
    return backend.CheckHeadDim(shape.head_dim)
        .WithContext(backend.name() + " cannot run this model");
  };
  if (options.tiny_random) {
    config = TinyRandomModelConfig();
    SIEVE_RETURN_IF_ERROR(check_backend(config));
    loaded.tokenizer = MakeEmbeddedByteTokenizer();
    const int positions =
        options.max_model_len > 0 ? options.max_model_len : DefaultMaxModelLen(config);
    SIEVE_ASSIGN_OR_RETURN(
        loaded.model,
        LlamaModel::RandomShard(config, backend, kTinyRandomModelSeed, positions, options.shard,
                                options.communicator, 0.08f, quantization));
    loaded.description =
        "tiny random-weight Llama (4 layers, hidden 128, byte vocabulary; its output is noise)";
  } else if (options.model_dir.empty()) {
    SIEVE_ASSIGN_OR_RETURN(std::string dir, FindDefaultModelDir());
    LoadModelOptions from_dir = options;
    from_dir.model_dir = dir;
    SIEVE_ASSIGN_OR_RETURN(loaded, LoadModel(from_dir, backend));
    loaded.default_model = true;
    loaded.description = std::string("Sieve's default model ") + kDefaultModelName + " (" + dir +
                         "): a 10M-parameter Llama trained on long-context retrieval tasks, not "
                         "a chat model; pass --model for another";
    if (quantization != WeightQuantization::kNone) loaded.description += kFp8WeightsDescription;
    return loaded;
  } else {
    namespace fs = std::filesystem;
    std::error_code error;
    if (!fs::is_directory(options.model_dir, error)) {
      return NotFoundError("model directory '" + options.model_dir + "' does not exist");
    }
    SIEVE_ASSIGN_OR_RETURN(config, LoadModelConfig(options.model_dir));
    SIEVE_RETURN_IF_ERROR(check_backend(config));
    SIEVE_ASSIGN_OR_RETURN(loaded.generation_config, LoadGenerationConfig(options.model_dir));
    const int positions =
        options.max_model_len > 0 ? options.max_model_len : DefaultMaxModelLen(config);
    if (options.load_format == "dummy") {
      // With --quantization fp8 (or an FP8 checkpoint's config) each layer is quantized as it
      // is made: a 70B model's bf16 weights never exist whole.
      SIEVE_ASSIGN_OR_RETURN(
          loaded.model,
          LlamaModel::RandomShard(config, backend, options.dummy_seed, positions, options.shard,
                                  options.communicator, 0.02f,
                                  config.quantization ? WeightQuantization::kFp8 : quantization));
      loaded.description = config.architecture + " from " + options.model_dir +
                           " with random weights (--load-format dummy)";
      if (config.quantization) loaded.description += kFp8WeightsDescription;
    } else if (options.load_format == "auto" || options.load_format == "safetensors") {
      auto checkpoint = SafetensorsCheckpoint::Open(options.model_dir);
      if (!checkpoint.ok()) return checkpoint.status().WithContext("loading weights");
      auto model = LlamaModel::Load(config, **checkpoint, backend, positions, options.shard,
                                    options.communicator);
      if (!model.ok()) return model.status().WithContext("loading " + options.model_dir);
      loaded.model = std::move(model).value();
      loaded.description = config.architecture + " from " + options.model_dir;
      if (config.quantization) {
        const CheckpointQuantization& scheme = *config.quantization;
        loaded.description +=
            ", FP8 checkpoint (" + std::string(CheckpointFormatName(scheme.format)) +
            ": e4m3 weights as stored, " + std::string(WeightScalesName(scheme.weight_scales)) +
            " scales; per-token activation scales" +
            (scheme.static_input_scales ? ", its static input scales unused" : "") +
            (loaded.model->checkpoint_kv_scales().empty() ? "" : "; K/V scales read") + ")";
      }
    } else {
      return InvalidArgumentError("unknown --load-format '" + options.load_format +
                                  "' (expected auto, safetensors or dummy)");
    }
    const std::string tokenizer_path =
        options.tokenizer_path.empty() ? options.model_dir : options.tokenizer_path;
    auto tokenizer = LoadTokenizer(tokenizer_path);
    if (tokenizer.ok()) {
      loaded.tokenizer = std::move(tokenizer).value();
    } else if (options.load_format == "dummy" && options.tokenizer_path.empty() &&
               tokenizer.status().code() == StatusCode::kNotFound) {
      spdlog::warn("no tokenizer in {}: token ids only", options.model_dir);
    } else {
      return tokenizer.status().WithContext("loading the tokenizer");
    }
  }
  if (loaded.tokenizer && !options.chat_template.empty()) {
    loaded.tokenizer->SetChatTemplate(ChatTemplate::FromName(options.chat_template));
    if (!loaded.tokenizer->chat_template()) return loaded.tokenizer->chat_template_status();
  }
  for (const int32_t id : config.eos_token_ids) AddUnique(loaded.eos_ids, id);
  for (const int32_t id : loaded.generation_config.eos_token_ids) AddUnique(loaded.eos_ids, id);
  if (loaded.tokenizer) {
    for (const int32_t id : loaded.eos_ids) loaded.tokenizer->AddEosId(id);
    for (const int32_t id : loaded.tokenizer->eos_ids()) AddUnique(loaded.eos_ids, id);
    if (loaded.tokenizer->vocab_size() > config.vocab_size) {
      return InvalidArgumentError(
          "the tokenizer has " + std::to_string(loaded.tokenizer->vocab_size()) +
          " tokens but the model's vocabulary is " + std::to_string(config.vocab_size));
    }
  }
  // An FP8 checkpoint's weights are FP8 as loaded, and its description says so.
  if (quantization != WeightQuantization::kNone && !config.quantization) {
    SIEVE_RETURN_IF_ERROR(loaded.model->QuantizeWeights(quantization));
    loaded.description += kFp8WeightsDescription;
  }
  return loaded;
}

Result<LoadedShards> LoadModelShards(const LoadModelOptions& options,
                                     const std::vector<Backend*>& backends,
                                     const std::vector<Communicator*>& communicators) {
  const int size = static_cast<int>(backends.size());
  SIEVE_CHECK(size >= 1 && communicators.size() == backends.size())
      << size << " backends, " << communicators.size() << " communicators";
  LoadedShards shards;
  if (size == 1) {
    SIEVE_ASSIGN_OR_RETURN(shards.model, LoadModel(options, *backends[0]));
    return shards;
  }
  // The split is checked on the config alone, before any rank reads a weight.
  ModelConfig config;
  if (options.tiny_random) {
    config = TinyRandomModelConfig();
  } else {
    std::string dir = options.model_dir;
    if (dir.empty()) {
      SIEVE_ASSIGN_OR_RETURN(dir, FindDefaultModelDir());
    }
    SIEVE_ASSIGN_OR_RETURN(config, LoadModelConfig(dir));
  }
  SIEVE_RETURN_IF_ERROR(CheckTensorParallel(config, size).WithContext("loading the model"));
  // Every rank through LoadModel (ranks > 0 drop their tokenizer), in parallel: each rank reads
  // only its slices, and a device's copies overlap the others'.
  std::vector<Result<LoadedModel>> loaded;
  for (int rank = 0; rank < size; ++rank) loaded.emplace_back(InternalError("not loaded"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      backends[rank]->MakeCurrent();
      LoadModelOptions rank_options = options;
      rank_options.shard = {rank, size};
      rank_options.communicator = communicators[rank];
      loaded[rank] = LoadModel(rank_options, *backends[rank]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  backends[0]->MakeCurrent();
  for (int rank = 0; rank < size; ++rank) {
    if (!loaded[rank].ok()) {
      return loaded[rank].status().WithContext("rank " + std::to_string(rank) + " of " +
                                               std::to_string(size));
    }
  }
  shards.model = std::move(loaded[0]).value();
  for (int rank = 1; rank < size; ++rank) {
    shards.other_ranks.push_back(std::move(loaded[rank]).value().model);
  }
  return shards;
}

}  // namespace sieve
