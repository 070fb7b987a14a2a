// sieve inspect: what a model directory holds, without loading its weights.
#include <cstdio>
#include <iostream>

#include "model/fp8_checkpoint.h"
#include "model/llama_checkpoint.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "runtime/model_loader.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/commands.h"

namespace sieve {

CommandRunner AddInspectCommand(CLI::App& app) {
  auto model_dir = std::make_shared<std::string>();
  app.add_option("--model", *model_dir,
                 "Hugging Face model directory (default: Sieve's default model)");
  return [model_dir]() {
    if (model_dir->empty()) {
      auto found = FindDefaultModelDir();
      if (!found.ok()) {
        std::cerr << "error: " << found.status().message() << "\n";
        return 1;
      }
      *model_dir = *found;
    }
    ModelConfig config;
    std::string checkpoint_line;
    std::string fp8_line;  // an FP8 checkpoint: what it holds
    {
      auto parsed = LoadModelConfig(*model_dir);
      if (!parsed.ok()) {
        std::cerr << "error: " << parsed.status().message() << "\n";
        return 1;
      }
      config = *parsed;
      auto checkpoint = SafetensorsCheckpoint::Open(*model_dir);
      if (!checkpoint.ok()) {
        checkpoint_line = "not readable: " + checkpoint.status().message();
      } else {
        const Status valid = ValidateLlamaCheckpoint(**checkpoint, config);
        char size[64];
        std::snprintf(size, sizeof(size), "%.2f GB", (*checkpoint)->TotalBytes() / 1e9);
        checkpoint_line = std::string(size) + " in safetensors, " +
                          (valid.ok() ? "matches the config" : "INVALID: " + valid.message());
        if (config.quantization) {
          const CheckpointQuantization& scheme = *config.quantization;
          const Fp8CheckpointSummary summary = SummarizeFp8Checkpoint(**checkpoint, config);
          fp8_line = "FP8 checkpoint, " + std::string(CheckpointFormatName(scheme.format)) +
                     "; e4m3 weights with scales " + std::to_string(summary.linears_per_channel) +
                     " linears per channel, " + std::to_string(summary.linears_per_tensor) +
                     " per tensor (config: " + std::string(WeightScalesName(scheme.weight_scales)) +
                     ")";
          if (summary.linears_float > 0) {
            fp8_line += ", " + std::to_string(summary.linears_float) + " linears kept in bf16";
          }
          fp8_line += "\n                   activations: " +
                      std::string(scheme.static_input_scales ? "static per tensor" : "dynamic") +
                      " in the config (" + std::to_string(summary.input_scales) +
                      " input_scale tensors, not used: Sieve scales each token as its GEMM runs)";
          fp8_line += "\n                   K/V scales: " +
                      (summary.kv_scale_layers > 0
                           ? "present (" + std::to_string(summary.kv_scale_layers) + " of " +
                                 std::to_string(config.num_layers) + " layers)"
                           : std::string("none"));
          if (!scheme.ignored.empty()) {
            std::string ignored;
            for (const std::string& name : scheme.ignored) {
              ignored += (ignored.empty() ? "" : ", ") + name;
            }
            fp8_line += "; left unquantized by the producer: " + ignored;
          }
        }
      }
    }
    const int64_t params = config.NumParameters();
    std::printf("architecture:      %s\n", config.architecture.c_str());
    if (params >= 1'000'000'000) {
      std::printf("parameters:        %lld (%.2f B)\n", static_cast<long long>(params),
                  params / 1e9);
    } else {
      std::printf("parameters:        %lld (%.1f M)\n", static_cast<long long>(params),
                  params / 1e6);
    }
    std::printf("dtype:             %s\n", std::string(DTypeName(config.dtype)).c_str());
    std::printf("layers:            %d\n", config.num_layers);
    std::printf("hidden / ffn:      %d / %d\n", config.hidden_size, config.intermediate_size);
    std::printf("heads / kv heads:  %d / %d (head dim %d)\n", config.num_heads, config.num_kv_heads,
                config.head_dim);
    std::printf("vocabulary:        %d\n", config.vocab_size);
    std::printf("rope:              theta %.0f, scaling %s\n", config.rope_theta,
                std::string(RopeScalingTypeName(config.rope_scaling.type)).c_str());
    std::printf("context:           %d positions%s\n", config.max_position_embeddings,
                config.sliding_window
                    ? (", sliding window " + std::to_string(*config.sliding_window)).c_str()
                    : "");
    std::printf("KV bytes / token:  %lld (bf16), %lld (f32)\n",
                static_cast<long long>(config.KvBytesPerToken(DType::kBF16)),
                static_cast<long long>(config.KvBytesPerToken(DType::kF32)));
    std::printf("weights:           %s\n", checkpoint_line.c_str());
    if (!fp8_line.empty()) std::printf("quantization:      %s\n", fp8_line.c_str());
    {
      // --quantization fp8 on the GPU: the layers' linear weights as e4m3 (1 byte where bf16 has
      // 2) with an f32 scale per output channel; the rest bf16.
      const double bf16_bytes = 2.0 * static_cast<double>(params);
      const double fp8_bytes =
          bf16_bytes - static_cast<double>(config.num_layers) *
                           static_cast<double>(config.LinearParametersPerLayer() -
                                               4 * config.LinearOutputsPerLayer());
      if (config.quantization) {
        // As stored: e4m3 layer linears with a scale per row, the rest bf16.
        std::printf("weights on a GPU:  %.2f GB (FP8 as stored)\n", fp8_bytes / 1e9);
      } else {
        std::printf("weights on a GPU:  %.2f GB bf16, %.2f GB with --quantization fp8\n",
                    bf16_bytes / 1e9, fp8_bytes / 1e9);
      }
    }
    if (!model_dir->empty()) {
      auto tokenizer = LoadTokenizer(*model_dir);
      if (tokenizer.ok()) {
        std::printf("tokenizer:         %s, %d tokens, chat template %s\n",
                    std::string((*tokenizer)->kind()).c_str(), (*tokenizer)->vocab_size(),
                    (*tokenizer)->chat_template() ? "yes" : "none");
      } else {
        std::printf("tokenizer:         %s\n", tokenizer.status().message().c_str());
      }
    }
    return 0;
  };
}

}  // namespace sieve
