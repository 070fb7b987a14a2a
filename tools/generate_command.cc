// sieve generate: one prompt streamed to stdout, or a file of prompts run as one batch.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "core/utf8.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace sieve {

namespace {

struct GenerateFlags {
  EngineFlags engine;
  std::string prompt;
  std::string prompts_file;
  bool chat = false;
  std::string system;
  SamplingParams sampling;
  int64_t seed = -1;
  std::string stats_json;
  bool show_ids = false;
};

Result<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer, const std::string& text,
                                          const GenerateFlags& flags) {
  if (!IsValidUtf8(text)) {
    return InvalidArgumentError("the prompt is not valid UTF-8 (first bad byte at offset " +
                                std::to_string(FirstInvalidUtf8Offset(text)) + ")");
  }
  if (!flags.chat) return tokenizer.Encode(text, /*add_bos=*/true);
  const ChatTemplate* chat = tokenizer.chat_template();
  if (chat == nullptr) return tokenizer.chat_template_status();
  std::vector<ChatMessage> messages;
  if (!flags.system.empty()) messages.push_back({"system", flags.system});
  messages.push_back({"user", text});
  SIEVE_ASSIGN_OR_RETURN(std::string rendered,
                         chat->Apply(messages, /*add_generation_prompt=*/true));
  return tokenizer.Encode(rendered, /*add_bos=*/false);
}

nlohmann::json StatsJson(const Engine& engine, double seconds) {
  const EngineStats stats = engine.Stats();
  nlohmann::json json;
  json["kv_policy"] = engine.default_policy().ToString();
  json["num_pages"] = stats.num_pages;
  json["page_size"] = engine.options().page_size;
  json["peak_pages_used"] = stats.peak_pages_used;
  json["preemptions"] = stats.num_preemptions;
  json["swapped_out"] = stats.num_swapped_out;
  json["swap_fallbacks"] = stats.num_swap_fallbacks;
  json["replayed_tokens"] = stats.num_replayed_tokens;
  json["prompt_tokens_prefilled"] = stats.prompt_tokens;
  json["generation_tokens"] = stats.generation_tokens;
  json["steps"] = stats.steps;
  json["prompt_tokens"] = stats.compressed_prompt_tokens;
  json["entries_kept_by_layer"] = stats.entries_kept_by_layer;
  json["compression_ratio"] = stats.compression_ratio();
  json["seconds"] = seconds;
  return json;
}

int Run(GenerateFlags& flags) {
  std::vector<std::string> prompts;
  if (!flags.prompts_file.empty()) {
    std::ifstream file(flags.prompts_file);
    if (!file) {
      std::cerr << "error: cannot read --prompts-file " << flags.prompts_file << "\n";
      return 1;
    }
    for (std::string line; std::getline(file, line);) {
      if (!line.empty()) prompts.push_back(line);
    }
    if (prompts.empty()) {
      std::cerr << "error: --prompts-file " << flags.prompts_file << " has no prompts\n";
      return 1;
    }
  } else {
    prompts.push_back(flags.prompt);
  }
  if (flags.seed >= 0) flags.sampling.seed = static_cast<uint64_t>(flags.seed);
  auto bundle = BuildEngine(flags.engine);
  if (!bundle.ok()) {
    std::cerr << "error: " << bundle.status().message() << "\n";
    return 1;
  }
  Engine& engine = *bundle->engine;
  const Tokenizer* tokenizer = bundle->loaded.tokenizer.get();
  if (tokenizer == nullptr) {
    std::cerr << "error: the model has no tokenizer; pass --tokenizer\n";
    return 1;
  }
  if (bundle->loaded.default_model) {
    std::fprintf(stderr, "note: %s\n", bundle->loaded.description.c_str());
  }
  std::map<RequestId, size_t> index_of;
  for (size_t index = 0; index < prompts.size(); ++index) {
    auto ids = EncodePrompt(*tokenizer, prompts[index], flags);
    if (!ids.ok()) {
      std::cerr << "error: prompt " << index + 1 << ": " << ids.status().message() << "\n";
      return 1;
    }
    Request request;
    request.prompt = std::move(ids).value();
    request.sampling = flags.sampling;
    if (flags.sampling.seed && prompts.size() > 1)
      request.sampling.seed = *flags.sampling.seed + index;
    auto id = engine.Add(std::move(request));
    if (!id.ok()) {
      std::cerr << "error: prompt " << index + 1 << ": " << id.status().message() << "\n";
      return 1;
    }
    index_of[*id] = index;
  }
  const bool stream = prompts.size() == 1;
  std::vector<std::string> texts(prompts.size());
  std::vector<RequestOutput> finals(prompts.size());
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_token;
  int64_t generated = 0;
  while (engine.HasWork()) {
    for (RequestOutput& output : engine.Step()) {
      const size_t index = index_of.at(output.id);
      generated += static_cast<int64_t>(output.new_tokens.size());
      if (!first_token && !output.new_tokens.empty())
        first_token = std::chrono::steady_clock::now();
      texts[index] += output.new_text;
      if (stream) {
        std::fwrite(output.new_text.data(), 1, output.new_text.size(), stdout);
        std::fflush(stdout);
      }
      if (output.finished) finals[index] = output;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stream) {
    std::fputc('\n', stdout);
  } else {
    for (size_t index = 0; index < prompts.size(); ++index) {
      std::printf("=== [%zu] %s\n%s\n", index + 1, prompts[index].c_str(), texts[index].c_str());
    }
  }
  const double ttft = first_token ? std::chrono::duration<double>(*first_token - start).count() : 0;
  std::fprintf(stderr,
               "%zu prompt(s), %lld tokens generated in %.2f s (%.1f tok/s, first token %.3f s)",
               prompts.size(), static_cast<long long>(generated), seconds,
               seconds > 0 ? generated / seconds : 0.0, ttft);
  if (stream) {
    std::fprintf(stderr, ", finish: %s",
                 std::string(FinishReasonName(finals[0].finish_reason)).c_str());
  }
  std::fprintf(stderr, "\n");
  if (!flags.stats_json.empty()) {
    std::ofstream out(flags.stats_json);
    out << StatsJson(engine, seconds).dump(2) << "\n";
    if (!out) {
      std::cerr << "error: cannot write --stats-json " << flags.stats_json << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace

CommandRunner AddGenerateCommand(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  AddEngineFlags(app, flags->engine);
  auto* prompt = app.add_option("--prompt", flags->prompt, "The prompt text");
  auto* file = app.add_option("--prompts-file", flags->prompts_file,
                              "A file with one prompt per line, generated as one batch");
  prompt->excludes(file);
  app.add_flag("--chat", flags->chat, "Wrap the prompt in the model's chat template");
  app.add_option("--system", flags->system, "System message (with --chat)");
  SamplingParams& s = flags->sampling;
  s.max_tokens = 128;
  app.add_option("--max-tokens,-n", s.max_tokens, "New tokens at most")->capture_default_str();
  app.add_option("--temperature", s.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: off)")
      ->capture_default_str();
  app.add_option("--top-p", s.top_p, "Nucleus sampling mass (1: off)")->capture_default_str();
  app.add_option("--min-p", s.min_p, "Drop tokens below min-p x the top probability (0: off)")
      ->capture_default_str();
  app.add_option("--repetition-penalty", s.repetition_penalty, "1: off")->capture_default_str();
  app.add_option("--presence-penalty", s.presence_penalty, "OpenAI presence penalty")
      ->capture_default_str();
  app.add_option("--frequency-penalty", s.frequency_penalty, "OpenAI frequency penalty")
      ->capture_default_str();
  app.add_option("--seed", flags->seed, "Sampling seed (reproducible output; -1: random)")
      ->capture_default_str();
  app.add_option("--stop", s.stop, "Stop string (repeatable; not included in the output)");
  app.add_flag("--ignore-eos", s.ignore_eos, "Keep generating past end-of-sequence tokens");
  app.add_option("--stats-json", flags->stats_json,
                 "Write KV statistics (entries kept per layer, pages, compression, preemptions)");
  return [flags]() {
    if (flags->prompt.empty() && flags->prompts_file.empty()) {
      std::cerr << "error: give --prompt TEXT or --prompts-file FILE\n";
      return 2;
    }
    return Run(*flags);
  };
}

}  // namespace sieve
