// End to end through the real binaries: `sieve serve` (embedded model, CPU, small KV cache, a
// free port) and `sieve bench serve` against it, checking the table, the result JSON and the
// bound, whose KV pool comes from the server's GET /server_info.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/fixtures.h"
#include "tools/bench/fake_openai_server.h"
#include "tools/bench/http_client.h"
#include "tools/bench/report.h"

extern char** environ;

namespace sieve::bench {
namespace {

constexpr std::chrono::seconds kServerStartTimeout{90};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("sieve_real_server_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

CommandResult RunCommand(const std::string& arguments) {
  const std::string log = TempPath("command.log");
  const std::string command =
      std::string(SIEVE_BINARY_PATH) + " " + arguments + " >" + log + " 2>&1";
  const int status = std::system(command.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.output = ReadFile(log);
  std::filesystem::remove(log);
  return result;
}

int FreePort() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(
      io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  return acceptor.local_endpoint().port();
}

// A `sieve serve` child process, stopped (SIGTERM, then SIGKILL) when this goes away.
class ServerProcess {
 public:
  ServerProcess(const std::vector<std::string>& arguments, const std::string& log_path)
      : log_path_(log_path) {
    std::vector<std::string> argv_storage = {SIEVE_BINARY_PATH};
    argv_storage.insert(argv_storage.end(), arguments.begin(), arguments.end());
    std::vector<char*> argv;
    for (std::string& argument : argv_storage) argv.push_back(argument.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }

  ~ServerProcess() {
    if (pid_ <= 0 || exited_) return;
    kill(pid_, SIGTERM);
    for (int attempt = 0; attempt < 100; ++attempt) {
      if (Exited()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  bool started() const { return pid_ > 0; }
  bool Exited() {
    if (!exited_ && waitpid(pid_, nullptr, WNOHANG) == pid_) exited_ = true;
    return exited_;
  }
  std::string Log() const { return ReadFile(log_path_); }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_path_;
};

TEST(BenchCliTest, HelpExplainsEveryFlag) {
  const CommandResult serve = RunCommand("bench serve --help");
  ASSERT_EQ(serve.exit_code, 0) << serve.output;
  for (const char* flag : {"--base-url",
                           "--endpoint",
                           "--model",
                           "--tokenizer",
                           "--input-len",
                           "--output-len",
                           "--range-ratio",
                           "--num-prompts",
                           "--seed",
                           "--dataset-path",
                           "--max-concurrency",
                           "--request-rate",
                           "--burstiness",
                           "--ignore-eos",
                           "--warmup",
                           "--result-json",
                           "--label",
                           "--metadata",
                           "prefix-repetition",
                           "--prefix-repetition-prefix-len",
                           "--prefix-repetition-suffix-len",
                           "--prefix-repetition-num-prefixes",
                           "--prefix-repetition-output-len",
                           "multi-turn",
                           "--multi-turn-num-turns",
                           "--multi-turn-first-len",
                           "--multi-turn-message-len",
                           "--multi-turn-output-len"}) {
    EXPECT_NE(serve.output.find(flag), std::string::npos) << flag;
  }
  const CommandResult sweep = RunCommand("bench sweep --help");
  ASSERT_EQ(sweep.exit_code, 0);
  EXPECT_NE(sweep.output.find("--concurrency"), std::string::npos);
  EXPECT_NE(sweep.output.find("--plot"), std::string::npos);
  EXPECT_EQ(RunCommand("bench plot --help").exit_code, 0);
}

TEST(BenchCliTest, UnreachableServerExitsNonZeroWithAMessage) {
  const CommandResult result = RunCommand(
      "bench serve --no-progress --num-prompts 2 --base-url "
      "http://127.0.0.1:" +
      std::to_string(FreePort()));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("error: cannot reach the server"), std::string::npos)
      << result.output;
  const CommandResult bad_url = RunCommand("bench serve --base-url https://example.com");
  EXPECT_EQ(bad_url.exit_code, 1);
  EXPECT_NE(bad_url.output.find("only http://"), std::string::npos) << bad_url.output;
}

// The prefix-repetition dataset from the command line: either spelling, its own flags only, and
// the prefix cache's line in the report, or the note that the server has no such counters.
TEST(BenchCliTest, PrefixRepetitionDatasetAndThePrefixCacheLine) {
  const CommandResult mixed = RunCommand(
      "bench serve --no-progress --dataset-name prefix-repetition --input-len 100 --base-url "
      "http://127.0.0.1:" +
      std::to_string(FreePort()));
  EXPECT_EQ(mixed.exit_code, 1);
  EXPECT_NE(mixed.output.find("--input-len does not apply to --dataset-name prefix-repetition"),
            std::string::npos)
      << mixed.output;
  const CommandResult stray = RunCommand(
      "bench sweep --no-progress --prefix-repetition-num-prefixes 3 --base-url http://127.0.0.1:" +
      std::to_string(FreePort()));
  EXPECT_EQ(stray.exit_code, 1);
  EXPECT_NE(
      stray.output.find("--prefix-repetition-num-prefixes needs --dataset-name prefix-repetition"),
      std::string::npos)
      << stray.output;
  for (const bool counters : {true, false}) {
    testing::FakeServerOptions options;
    options.max_tokens_cap = 2;
    options.first_token_delay = std::chrono::milliseconds(1);
    options.token_delay = std::chrono::milliseconds(1);
    options.prefix_cache_metrics = counters;
    testing::FakeOpenAiServer server(options);
    const CommandResult run = RunCommand(
        "bench serve --no-progress --base-url " + server.base_url() +
        " --dataset-name prefix_repetition --num-prompts 9 --prefix-repetition-num-prefixes 2 "
        "--prefix-repetition-prefix-len 40 --prefix-repetition-suffix-len 8 "
        "--prefix-repetition-output-len 2");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(server.generation_requests(), 1 + 9);
    if (!counters) {
      EXPECT_NE(run.output.find("prefix cache: not reported by the server"), std::string::npos)
          << run.output;
      continue;
    }
    const std::string line = "Prefix cache hit rate: ";
    const size_t at = run.output.find(line);
    ASSERT_NE(at, std::string::npos) << run.output;
    // 7 of the 9 prompts find their 40-byte prefix cached: 280 of 432 bytes (64.8%), and the
    // random suffixes a few bytes more by chance.
    const double percent = std::stod(run.output.substr(at + line.size()));
    EXPECT_GE(percent, 64.8) << run.output;
    EXPECT_LT(percent, 70.0) << run.output;
  }
}

// The multi-turn dataset from the command line: either spelling, its own flags only, every turn
// a request, and the first turns' TTFT beside the later turns'.
TEST(BenchCliTest, MultiTurnDatasetRefusesOtherDatasetsFlags) {
  const std::string unreachable = " --base-url http://127.0.0.1:" + std::to_string(FreePort());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"bench serve --no-progress --dataset-name multi-turn --output-len 5",
       "--output-len does not apply to --dataset-name multi-turn"},
      {"bench serve --no-progress --dataset-name multi_turn --input-len 5",
       "--input-len does not apply to --dataset-name multi-turn"},
      {"bench serve --no-progress --dataset-name multi-turn --prefix-repetition-prefix-len 5",
       "--prefix-repetition-prefix-len needs --dataset-name prefix-repetition"},
      {"bench serve --no-progress --multi-turn-num-turns 3",
       "--multi-turn-num-turns needs --dataset-name multi-turn"},
      {"bench serve --no-progress --dataset-name prefix-repetition --multi-turn-output-len 3",
       "--multi-turn-output-len needs --dataset-name multi-turn"},
  };
  for (const auto& [command, message] : refused) {
    const CommandResult result = RunCommand(command + unreachable);
    EXPECT_EQ(result.exit_code, 1) << command;
    EXPECT_NE(result.output.find(message), std::string::npos) << command << "\n" << result.output;
  }
  testing::FakeServerOptions options;
  options.max_tokens_cap = 2;
  options.first_token_delay = std::chrono::milliseconds(1);
  options.token_delay = std::chrono::milliseconds(1);
  testing::FakeOpenAiServer server(options);
  const CommandResult bad = RunCommand("bench serve --no-progress --base-url " + server.base_url() +
                                       " --dataset-name multi-turn --multi-turn-first-len 0");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("--multi-turn-first-len must be positive"), std::string::npos)
      << bad.output;
  const CommandResult run =
      RunCommand("bench serve --no-progress --base-url " + server.base_url() +
                 " --dataset-name multi-turn --num-prompts 2 --multi-turn-num-turns 3 "
                 "--multi-turn-first-len 20 --multi-turn-message-len 5 --multi-turn-output-len 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(server.generation_requests(), 1 + 2 * 3);  // the test request, 2 x 3 turns
  EXPECT_NE(run.output.find("Multi-turn TTFT P50: first turns"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("later turns"), std::string::npos) << run.output;
}

TEST(RealServerTest, BenchServeAgainstSieveServe) {
  const CommandResult help = RunCommand("serve --help");
  ASSERT_NE(help.output.find("--port"), std::string::npos) << help.output;
  const int port = FreePort();
  std::vector<std::string> arguments = {"serve",  "--device",          "cpu", "--kv-memory", "64M",
                                        "--port", std::to_string(port)};
  if (help.output.find("--host") != std::string::npos) {
    arguments.insert(arguments.end(), {"--host", "127.0.0.1"});
  }
  ServerProcess server(arguments, TempPath("server.log"));
  ASSERT_TRUE(server.started());
  const HttpUrl url = *ParseHttpUrl("http://127.0.0.1:" + std::to_string(port));
  const auto deadline = std::chrono::steady_clock::now() + kServerStartTimeout;
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    if (server.Exited()) FAIL() << "sieve serve exited before serving:\n" << server.Log();
    HttpRequestSpec spec;
    spec.target = "/v1/models";
    spec.timeout = std::chrono::milliseconds(2000);
    auto response = HttpFetch(url, spec);
    ready = response.ok() && response->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(ready) << "sieve serve did not answer GET /v1/models within "
                     << kServerStartTimeout.count() << " s:\n"
                     << server.Log();

  const std::string json_path = TempPath("result.json");
  const CommandResult bench =
      RunCommand("bench serve --no-progress --base-url " + url.ToString() +
                 " --num-prompts 8 --input-len 32 --output-len 16 --max-concurrency 4 --ignore-eos "
                 "--warmup 1 --label ci --metadata device=cpu --request-timeout 60 "
                 "--bound-model-config " +
                 ProjectSourceDir() +
                 "/models/sieve-tiny-10m --bound-gemm-tflops 0.01 --bound-copy-gbs 10 "
                 "--result-json " +
                 json_path);
  // A request the server never answers fails after --request-timeout instead of hanging CI.
  ASSERT_EQ(bench.exit_code, 0) << bench.output << "\nserver log:\n" << server.Log();
  EXPECT_NE(bench.output.find("============ Serving Benchmark Result ============"),
            std::string::npos)
      << bench.output;
  std::printf("%s", bench.output.c_str());
  auto json = ReadJsonFile(json_path);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  const nlohmann::json& metrics = (*json)["metrics"];
  EXPECT_EQ(metrics["completed"], 8);
  EXPECT_EQ(metrics["failed"], 0);
  // --ignore-eos: every request generates all 16 tokens.
  EXPECT_EQ(metrics["total_output_tokens"], 8 * 16);
  EXPECT_EQ(metrics["total_input_tokens"], 8 * 32);
  EXPECT_GT(metrics["mean_ttft_ms"].get<double>(), 0);
  EXPECT_GT(metrics["mean_tpot_ms"].get<double>(), 0);
  EXPECT_GT(metrics["output_throughput"].get<double>(), 0);
  EXPECT_LE(metrics["max_concurrent_requests"].get<int>(), 4);
  EXPECT_TRUE((*json)["server"].contains("models"));
  // The server describes its engine, and the bound decodes within the pool it reports.
  const nlohmann::json& info = (*json)["server"]["server_info"];
  ASSERT_TRUE(info.is_object()) << (*json)["server"].dump();
  EXPECT_GT(info["kv_cache_pages"].get<int64_t>(), 0);
  EXPECT_EQ((*json)["bound"]["kv_pool_pages"], info["kv_cache_pages"]);
  EXPECT_EQ((*json)["bound"]["page_size"], info["page_size"]);
  EXPECT_EQ((*json)["bound"]["kv_policy"], info["kv_policy"]);  // no --bound-kv-policy: its own
  EXPECT_EQ(bench.output.find("warning"), std::string::npos) << bench.output;
  EXPECT_GE((*json)["bound"]["decode_steps"].get<int64_t>(), 16);
  EXPECT_NE(bench.output.find("Bound:"), std::string::npos) << bench.output;
  // A GEMM rate of 10 GFLOP/s against a copy rate of 10 GB/s puts the ridge at one row a step
  // (2 FLOPs a bf16 weight of 2 bytes): at 4 in flight the GEMMs' FLOPs outlast their bytes.
  EXPECT_NE(bench.output.find("Roofline:"), std::string::npos) << bench.output;
  EXPECT_GT((*json)["bound"]["compute_bound_steps"].get<int64_t>(), 0);
  EXPECT_GT((*json)["bound"]["decode_roofline_s"].get<double>(),
            (*json)["bound"]["decode_s"].get<double>());
  EXPECT_GT((*json)["bound"]["roofline_fraction"].get<double>(),
            (*json)["bound"]["fraction"].get<double>());
  EXPECT_EQ((*json)["label"], "ci");
  EXPECT_EQ((*json)["metadata"]["device"], "cpu");
  ASSERT_EQ((*json)["requests"].size(), 8u);
  for (const nlohmann::json& request : (*json)["requests"]) {
    EXPECT_TRUE(request["success"].get<bool>()) << request.dump();
    EXPECT_EQ(request["output_tokens"], 16);
  }
  std::filesystem::remove(json_path);
}

}  // namespace
}  // namespace sieve::bench
