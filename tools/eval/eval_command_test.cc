// `sieve eval` end to end on the CPU with testdata's llama2_mha (2 layers, hidden 64, byte-level
// tokenizer; its context raised to 2048 in a copy, so the test stays fast whatever the embedded
// default model becomes): every task, dense plus two policies at two budgets; the JSON has every
// setting, configuration, cell and record, the sparse configurations kept fewer KV entries than
// dense, and the charts are SVG files. Then the settings of an FP8 run, and a few bad inputs that
// must fail cleanly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/fixtures.h"
#include "core/testing.h"

namespace sieve {
namespace {

struct CommandRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

class EvalCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sieve_eval_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  CommandRun Sieve(const std::string& args) {
    const std::string command = std::string(SIEVE_BINARY_PATH) + " eval --device cpu " +
                                "--kv-memory 256M --log-level warn " + args + " > " +
                                (dir_ / "out").string() + " 2> " + (dir_ / "err").string();
    CommandRun run;
    const int status = std::system(command.c_str());
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    run.out = ReadAll(dir_ / "out");
    run.err = ReadAll(dir_ / "err");
    return run;
  }

  // A copy of llama2_mha with its context raised to 2048 (room for the tasks' prompts, one byte a
  // token).
  std::filesystem::path CopyModel() {
    const std::filesystem::path model = dir_ / "model";
    std::filesystem::copy(TestDataDir() + "/models/llama2_mha", model);
    std::string config = ReadAll(model / "config.json");
    const std::string field = "\"max_position_embeddings\": 256";
    EXPECT_NE(config.find(field), std::string::npos);
    config.replace(config.find(field), field.size(), "\"max_position_embeddings\": 2048");
    std::ofstream(model / "config.json") << config;
    return model;
  }

  std::filesystem::path dir_;
};

TEST_F(EvalCommandTest, EveryTaskDenseAndSparse) {
  auto rng = testing::MakeRng();
  // Held-out text for perplexity and a few jsonl records, fresh each run.
  const char* words[] = {"river", "stone", "light", "garden", "paper", "window", "music", "cloud"};
  std::ofstream text(dir_ / "text.txt");
  for (int index = 0; index < 600; ++index) {
    text << words[rng() % 8] << (rng() % 9 == 0 ? ". " : " ");
  }
  text.close();
  std::ofstream data(dir_ / "data.jsonl");
  for (int index = 0; index < 3; ++index) {
    const std::string answer = std::to_string(rng() % 100000);
    data << nlohmann::json({{"context", std::string(200 + rng() % 800, 'x') + " code " + answer},
                            {"input", "What is the code?"},
                            {"answers", {answer}}})
                .dump()
         << "\n";
  }
  data.close();
  const std::filesystem::path model = CopyModel();
  const std::string json_path = (dir_ / "result.json").string();
  const CommandRun run =
      Sieve("--model " + model.string() +
            " --task passkey,niah,niah-multikey,niah-multivalue,kv-retrieval,variable-tracking,"
            "common-words,perplexity,jsonl --lengths 800,1100 --depths 0,1 --samples 1 --seed " +
            std::to_string(rng() % 1000) +
            " --kv-policy snapkv --kv-policy full:0,h2o:1 --kv-budget 48,96 --kv-window 8 "
            "--ppl-tokens 16 --text " +
            (dir_ / "text.txt").string() + " --data " + (dir_ / "data.jsonl").string() +
            " --result-json " + json_path + " --plot-dir " + (dir_ / "plots").string() +
            " --no-progress");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("summary"), std::string::npos) << run.out;
  const nlohmann::json json = nlohmann::json::parse(ReadAll(json_path));
  for (const char* key :
       {"model", "device", "tasks", "lengths", "depths", "samples", "seed", "haystack",
        "prompt_suffix", "policies", "budgets", "window", "sieve_version"}) {
    EXPECT_TRUE(json["settings"].contains(key)) << key;
  }
  // What the run held its weights, activations and KV cache in, auto resolved (CPU: f32).
  EXPECT_EQ(json["settings"]["quantization"], "none");
  EXPECT_EQ(json["settings"]["activation_dtype"], "f32");
  EXPECT_EQ(json["settings"]["kv_cache_dtype"], "f32");
  const std::vector<std::string> labels = {"full", "snapkv@48", "snapkv@96", "full:0,h2o:1@48",
                                           "full:0,h2o:1@96"};
  ASSERT_EQ(json["configs"].size(), labels.size());
  for (size_t index = 0; index < labels.size(); ++index) {
    const nlohmann::json& config = json["configs"][index];
    EXPECT_EQ(config["label"], labels[index]);
    const double kept = config["kv"]["kept_fraction"].get<double>();
    EXPECT_GT(config["kv"]["prompt_tokens"].get<int64_t>(), 0);
    if (index == 0) {
      EXPECT_DOUBLE_EQ(kept, 1.0) << "dense keeps everything";
    } else {
      // Half the layers stay full under full:0,h2o:1; budgets are ~1/10 of the prompts.
      EXPECT_LT(kept, labels[index].starts_with("snapkv") ? 0.2 : 0.6)
          << labels[index] << " did not evict";
    }
  }
  // Records: every sample under every configuration. Synthetic: 4 depth tasks x 2 lengths x 2
  // depths + 3 others x 2 lengths; perplexity 2; jsonl 3.
  const size_t samples = 4 * 2 * 2 + 3 * 2 + 2 + 3;
  EXPECT_EQ(json["records"].size(), samples * labels.size());
  std::set<std::string> tasks_seen;
  for (const nlohmann::json& record : json["records"]) {
    tasks_seen.insert(record["task"].get<std::string>());
    if (record["task"] == "perplexity") {
      EXPECT_EQ(record["scored_tokens"], 16);
      EXPECT_GT(record["nll"].get<double>(), 0.0);
    } else {
      EXPECT_LE(record["prompt_tokens"].get<int>(), record["length"].get<int>());
      const double score = record["score"].get<double>();
      EXPECT_TRUE(score >= 0.0 && score <= 1.0);
      EXPECT_TRUE(record["output"].is_string());
      EXPECT_FALSE(record["expected"].empty());
    }
  }
  EXPECT_EQ(tasks_seen.size(), 9u);
  for (const nlohmann::json& cell : json["cells"]) {
    if (cell["task"] == "perplexity") {
      const double perplexity = cell["perplexity"].get<double>();
      EXPECT_TRUE(std::isfinite(perplexity) && perplexity > 1.0) << perplexity;
    }
  }
  EXPECT_EQ(json["summary"].size(), 9 * labels.size());
  // Heatmaps: 4 depth tasks x 5 configurations; budget charts: 9 tasks.
  int heatmaps = 0, budget_charts = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "plots")) {
    const std::string name = entry.path().filename().string();
    const std::string svg = ReadAll(entry.path());
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_TRUE(svg.ends_with("</svg>\n")) << name;
    heatmaps += name.starts_with("needle_") ? 1 : 0;
    budget_charts += name.starts_with("budget_") ? 1 : 0;
  }
  EXPECT_EQ(heatmaps, 4 * 5);
  EXPECT_EQ(budget_charts, 9);
}
// FP8 weights and an FP8 KV cache: the record says so (the weights as loaded, the cache's dtype
// as the engine holds it), whatever the command line spelt.
TEST_F(EvalCommandTest, RecordsQuantizationAndKvCacheDtype) {
  const std::string json_path = (dir_ / "result.json").string();
  const CommandRun run = Sieve("--model " + CopyModel().string() +
                               " --task passkey --lengths 800 --depths 0 --samples 1 "
                               "--quantization fp8 --kv-cache-dtype fp8 --no-progress "
                               "--result-json " +
                               json_path);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json settings = nlohmann::json::parse(ReadAll(json_path))["settings"];
  EXPECT_EQ(settings["quantization"], "fp8");
  EXPECT_EQ(settings["activation_dtype"], "f32");
  EXPECT_EQ(settings["kv_cache_dtype"], "f8_e4m3");
}

// The committed held-out set as a task: the records at the lengths asked for, under their own
// task name, the set's path in the settings.
TEST_F(EvalCommandTest, HeldoutTaskReadsTheCommittedSet) {
  const std::filesystem::path model = CopyModel();
  const std::string json_path = (dir_ / "heldout.json").string();
  const CommandRun run = Sieve("--model " + model.string() +
                               " --task heldout --lengths 1000 --max-tokens 2 --result-json " +
                               json_path + " --no-progress");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json json = nlohmann::json::parse(ReadAll(json_path));
  EXPECT_TRUE(json["settings"]["heldout"].get<std::string>().ends_with(
      "testdata/eval/heldout_needles.jsonl"));
  ASSERT_EQ(json["records"].size(), 40u);
  for (const nlohmann::json& record : json["records"]) {
    EXPECT_EQ(record["task"], "heldout");
    EXPECT_EQ(record["length"], 1000);
    EXPECT_EQ(record["expected"].size(), 1u);
  }
}

// niah-two-turn both ways: turn 2 as a new request over the whole conversation (prefill; its
// prompt finds turn 1's pages in the prefix cache) and on turn 1's own cache (reuse: no lookup
// covers more than turn 1's prompt). Records carry both turns; configurations each turn's usage.
TEST_F(EvalCommandTest, TwoTurnTaskRunsTurnTwoBothWays) {
  const std::filesystem::path model = CopyModel();
  for (const std::string mode : {"prefill", "reuse"}) {
    const std::string json_path = (dir_ / (mode + ".json")).string();
    const CommandRun run = Sieve("--model " + model.string() +
                                 " --task niah-two-turn --lengths 800 --depths 0,1 --samples 1 "
                                 "--kv-policy snapkv --kv-budget 48 --kv-window 8 --second-turn " +
                                 mode + " --result-json " + json_path + " --no-progress");
    ASSERT_EQ(run.exit_code, 0) << mode << ": " << run.err;
    const nlohmann::json json = nlohmann::json::parse(ReadAll(json_path));
    EXPECT_EQ(json["settings"]["second_turn"], mode);
    ASSERT_EQ(json["configs"].size(), 2u);
    for (const nlohmann::json& config : json["configs"]) {
      const nlohmann::json& turns = config["kv"]["turns"];
      ASSERT_EQ(turns.size(), 2u) << mode;
      const int64_t first_prompts = turns[0]["prompt_tokens"].get<int64_t>();
      EXPECT_GT(first_prompts, 0);
      // Turn 2 of prefill mode looks up turn 1's prompt and more (its answer and question);
      // reuse mode's requests are turn 1's prompts again.
      const int64_t looked_up = turns[1]["prefix_cache_queries"].get<int64_t>();
      if (mode == "prefill") {
        EXPECT_GT(looked_up, turns[0]["prefix_cache_queries"].get<int64_t>()) << config["label"];
      } else {
        EXPECT_EQ(looked_up, turns[0]["prefix_cache_queries"].get<int64_t>()) << config["label"];
      }
      EXPECT_GT(turns[1]["prefix_cache_hits"].get<int64_t>(), 0) << mode << " " << config["label"];
    }
    ASSERT_EQ(json["records"].size(), 2u * 2u);
    for (const nlohmann::json& record : json["records"]) {
      EXPECT_EQ(record["task"], "niah-two-turn");
      EXPECT_TRUE(record["first_turn_output"].is_string());
      EXPECT_NE(record["expected"], record["first_turn_expected"]);
      EXPECT_TRUE(record["follow_up"].get<std::string>().starts_with("\nWhat is"));
    }
  }
}

TEST_F(EvalCommandTest, BadInputFailsCleanly) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--task nonsense", "unknown task 'nonsense'"},
      {"--depths 0,1.5", "--depths must be in [0, 1]"},
      {"--samples 0", "--samples must be at least 1"},
      {"--kv-policy snapkv --kv-budget 16 --kv-window 32", "not above the observation window"},
      {"--task niah --haystack /nonexistent/essays", "--haystack"},
      {"--task perplexity", "needs --text"},
      {"--task jsonl --data /nonexistent.jsonl", "cannot read"},
      {"--task heldout --lengths 1500", "--task heldout has records at --lengths 1000,2000,4000"},
      {"--lengths 100000", "max model length"},
      {"--task perplexity --text x --base-url http://127.0.0.1:9", "in-process engine"},
      {"--task niah-two-turn --second-turn both", "--second-turn is prefill or reuse"},
      {"--task niah-two-turn --second-turn reuse --base-url http://127.0.0.1:9",
       "only the in-process engine"},
      {"--lengths 1024 --kv-policy nonsense --kv-budget 64", "nonsense"},
      {"--lengths 1024 --kv-policy h2o --kv-budget 64 --max-num-batched-tokens 512",
       "--max-num-batched-tokens"},
  };
  for (const auto& [args, message] : cases) {
    const CommandRun run = Sieve(args);
    EXPECT_TRUE(run.exit_code == 1 || run.exit_code == 2) << args << ": exit " << run.exit_code;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << ":\n" << run.err;
  }
}

}  // namespace
}  // namespace sieve
