// sieve serve: the OpenAI-compatible HTTP server (server/) over one engine.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>

#include "core/logging.h"
#include "runtime/async_engine.h"
#include "server/http_server.h"
#include "tools/bench/progress_bar.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace sieve {

namespace {

struct ServeFlags {
  EngineFlags engine;
  ServerOptions server;
  std::vector<std::string> served_model_names;
  std::string max_body = "8M";
  int max_queue = 0;
  std::string generation_config = "auto";
  bool no_warm_up = false;
  bool no_progress = false;
};

// vLLM's --generation-config auto: the model's generation_config.json sets the defaults of the
// sampling fields a request leaves out.
SamplingParams SamplingDefaults(const GenerationConfig& config) {
  SamplingParams defaults;
  if (config.temperature) defaults.temperature = *config.temperature;
  if (config.top_p) defaults.top_p = *config.top_p;
  if (config.top_k) defaults.top_k = *config.top_k;
  if (config.repetition_penalty) defaults.repetition_penalty = *config.repetition_penalty;
  return defaults;
}

std::vector<std::string> DefaultModelNames(const std::string& model_dir) {
  if (model_dir.empty()) return {kDefaultModelName};
  std::string base = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (base.empty()) base = std::filesystem::path(model_dir).parent_path().filename().string();
  if (base.empty() || base == model_dir) return {model_dir};
  // The basename is what responses carry; the path as given is accepted too (as vLLM names it).
  return {base, model_dir};
}

int Run(ServeFlags& flags) {
  auto max_body = ParseByteSize(flags.max_body);
  if (!max_body.ok()) {
    std::cerr << "error: --max-body-bytes: " << max_body.status().message() << "\n";
    return 2;
  }
  if (flags.generation_config != "auto" && flags.generation_config != "none") {
    std::cerr << "error: --generation-config must be auto or none\n";
    return 2;
  }
  if (flags.max_queue < 0) {
    std::cerr << "error: --max-queue must be >= 0\n";
    return 2;
  }
  auto bundle = BuildEngine(flags.engine);
  if (!bundle.ok()) {
    std::cerr << "error: " << bundle.status().message() << "\n";
    return 1;
  }
  if (bundle->loaded.default_model) spdlog::info("{}", bundle->loaded.description);
  ServerOptions options = flags.server;
  options.max_body_bytes = *max_body;
  options.served_model_names = flags.served_model_names.empty()
                                   ? DefaultModelNames(flags.engine.load.model_dir)
                                   : flags.served_model_names;
  options.handle_signals = true;
  if (flags.generation_config == "auto") {
    options.sampling_defaults = SamplingDefaults(bundle->loaded.generation_config);
  }
  // Warm start: the server listens at once and answers /health with 503 while the engine thread
  // captures the decode graphs and plans the GEMM shapes that first use would otherwise do while
  // requests wait; requests sent meanwhile are queued.
  AsyncEngineOptions engine_options;
  engine_options.max_queue = flags.max_queue;
  engine_options.warm_up = !flags.no_warm_up;
  std::unique_ptr<bench::ProgressBar> progress;
  std::atomic<bool> warm_up_failed{false};
  HttpServer* server_for_failure = nullptr;  // set before the engine thread can finish warming up
  std::mutex server_mutex;
  engine_options.warm_up_progress = [&](int done, int total) {
    if (!progress)
      progress =
          std::make_unique<bench::ProgressBar>("warm-up", total, !flags.no_progress, "steps");
    progress->Update(done);
  };
  engine_options.warm_up_done = [&](const Result<WarmUpReport>& report) {
    if (progress) progress->Finish();
    if (report.ok()) {
      if (report->decode_graphs + report->prefill_steps == 0) return;  // the CPU: nothing to do
      spdlog::info(
          "warm-up {} in {:.1f} s: {} decode graphs ({} batch buckets x {} length bounds), {} "
          "prefill sizes; ready",
          report->stopped ? "stopped" : "done", report->seconds, report->decode_graphs,
          report->decode_buckets, report->layer_bounds, report->prefill_steps);
      return;
    }
    spdlog::error("{}; shutting down", report.status().message());
    warm_up_failed = true;
    std::lock_guard lock(server_mutex);
    if (server_for_failure != nullptr) server_for_failure->RequestShutdown();
  };
  AsyncEngine engine(std::move(bundle->engine), engine_options);
  HttpServer server(engine, options);
  const Status started = server.Start();
  if (!started.ok()) {
    std::cerr << "error: " << started.message() << "\n";
    return 1;
  }
  {
    std::lock_guard lock(server_mutex);
    server_for_failure = &server;
    if (warm_up_failed) server.RequestShutdown();
  }
  server.Wait();
  engine.Shutdown();
  return warm_up_failed ? 1 : 0;
}

}  // namespace

CommandRunner AddServeCommand(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  app.footer(
      "Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, "
      "GET /metrics (Prometheus), GET /version. SIGINT/SIGTERM shut down gracefully (a second "
      "signal aborts requests in flight). See docs/server.md.");
  AddEngineFlags(app, flags->engine);
  ServerOptions& server = flags->server;
  app.add_option("--host", server.host,
                 "Address to listen on (0.0.0.0: every interface; a name is resolved)")
      ->capture_default_str();
  app.add_option("--port", server.port, "TCP port (0: any free port, logged at start-up)")
      ->capture_default_str();
  app.add_option("--served-model-name", flags->served_model_names,
                 "Model name(s) clients send in \"model\" (the first is reported). Default: the "
                 "--model directory's basename (its path is accepted too), or sieve-tiny-10m");
  app.add_option("--api-key", server.api_key,
                 "Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise); /health and "
                 "/metrics stay open")
      ->envname("SIEVE_API_KEY");
  app.add_option("--max-queue", flags->max_queue,
                 "Most requests waiting to run (each choice of n counts); more get 429. 0: no "
                 "limit")
      ->capture_default_str();
  app.add_option("--max-body-bytes", flags->max_body,
                 "Largest request body, e.g. 8M; larger ones get 413")
      ->capture_default_str();
  app.add_option("--http-threads", server.http_threads,
                 "I/O threads serving connections (all generation runs on one engine thread)")
      ->capture_default_str();
  app.add_option("--shutdown-timeout", server.shutdown_timeout_s,
                 "Seconds requests in flight may take to finish after SIGINT/SIGTERM before they "
                 "are aborted")
      ->capture_default_str();
  app.add_option("--max-n", server.max_n, "Most choices ('n') one request may ask for")
      ->capture_default_str();
  app.add_flag("--no-warm-up", flags->no_warm_up,
               "Answer /health at once and capture each decode batch size's CUDA graph and plan "
               "each prefill size's GEMMs on first use instead, while requests wait (by default "
               "this is done at start-up, /health answering 503 until it ends)");
  app.add_flag("--no-progress", flags->no_progress, "No progress bar for the warm-up");
  app.add_option("--generation-config", flags->generation_config,
                 "auto: the model's generation_config.json sets default temperature, top_p, "
                 "top_k, repetition_penalty (as vLLM); none: OpenAI's defaults")
      ->capture_default_str();
  return [flags]() { return Run(*flags); };
}

}  // namespace sieve
