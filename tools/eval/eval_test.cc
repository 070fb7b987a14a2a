// sieve eval's pieces without a model: prompts built to token targets in tasks.json's wording
// (byte-level and, when the fixtures are there, Llama 3 BPE with the Paul Graham haystack),
// scoring, jsonl parsing and truncation, sentence splitting, and well-formed SVG.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/testing.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/eval/eval_results.h"
#include "tools/eval/jsonl_dataset.h"
#include "tools/eval/scoring.h"
#include "tools/eval/svg_chart.h"
#include "tools/eval/task_generator.h"
#include "tools/eval/text_source.h"
#include "tools/eval/two_turn.h"

namespace sieve::eval {
namespace {

int Count(const std::string& text, const std::string& piece) {
  int count = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) {
    ++count;
  }
  return count;
}

struct TokenizerCase {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> haystack;
  std::string name;
};

// The byte-level tokenizer with the noise sentence, and Llama 3's BPE (committed in testdata/)
// with a natural haystack: the essays of the fixtures when they exist, else this project's own
// prose (its READMEs; the essays may not be committed).
std::vector<TokenizerCase> Tokenizers() {
  std::vector<TokenizerCase> cases;
  cases.push_back({MakeEmbeddedByteTokenizer(), {}, "bytes"});
  auto bpe = LoadTokenizer(TestDataDir() + "/tokenizers/llama3/tokenizer.json");
  EXPECT_TRUE(bpe.ok()) << bpe.status().ToString();
  if (!bpe.ok()) return cases;
  const auto fixtures = FindFixturesDir();
  std::string text;
  if (fixtures) {
    auto essays = ReadTextSource(*fixtures + "/haystack", "--haystack");
    if (essays.ok()) text = std::move(essays).value();
  }
  if (text.empty()) {
    for (const char* readme : {"README.md", "tools/eval/README.md", "runtime/README.md",
                               "sparsity/README.md", "kv/README.md", "server/README.md"}) {
      auto prose = ReadTextSource(ProjectSourceDir() + "/" + readme, "haystack");
      if (prose.ok()) text += *prose + "\n";
    }
  }
  std::vector<std::string> haystack = SplitSentences(text);
  EXPECT_GE(haystack.size(), 20u) << "too little haystack text";
  cases.push_back({std::move(bpe).value(), std::move(haystack), "llama3"});
  return cases;
}

// Tokens of the largest unit a task grows by: the slack a prompt may fall short of its target.
int UnitTokens(const Tokenizer& tokenizer, const std::string& task,
               const std::vector<std::string>& haystack) {
  const TaskSpec& spec = TaskSpec::Embedded();
  std::string unit = spec.noise_sentence();
  if (task == "niah" || task == "niah-multikey" || task == "niah-multivalue" ||
      task == "niah-two-turn") {
    for (const std::string& sentence : haystack) {
      if (sentence.size() > unit.size()) unit = sentence;
    }
  }
  if (task == "kv-retrieval") {
    // Random hex keys tokenize into anywhere from a few tokens to one a character: bound a pair
    // by its bytes (no byte-level BPE makes more tokens than bytes).
    const std::string pair =
        Fill(spec.Text("kv_retrieval", "pair"), {{"key", "0123abcd"}, {"value", "4567cdef"}}) +
        ",\n ";
    return static_cast<int>(pair.size()) + 4;
  }
  // common-words grows by a line and, every few lines, one more repeat of each common word.
  if (task == "common-words") unit = std::string(120, 'w');
  return static_cast<int>(tokenizer.Encode(unit, false)->size()) + 4;
}

TEST(TaskGeneratorTest, PromptsFitTheirTargetClosely) {
  auto rng = testing::MakeRng();
  const TaskSpec& spec = TaskSpec::Embedded();
  for (const TokenizerCase& tc : Tokenizers()) {
    std::printf("tokenizer %s, %zu haystack sentences\n", tc.name.c_str(), tc.haystack.size());
    TaskGenerator generator(spec, *tc.tokenizer, tc.haystack);
    for (const std::string& task : AllTaskNames()) {
      if (!IsSyntheticTask(task)) continue;
      for (const int length : {256, 512, 1024, 2048, 4096}) {
        if (tc.name == "bytes" && length < 1024) continue;  // 4 needles need ~600 bytes
        const double depth = std::uniform_real_distribution<double>(0, 1)(rng);
        auto sample = generator.Generate(task, length, depth, 0, rng());
        ASSERT_TRUE(sample.ok()) << tc.name << " " << task << " " << length << ": "
                                 << sample.status().ToString();
        const int tokens = static_cast<int>(sample->prompt_ids.size());
        EXPECT_LE(tokens, length) << tc.name << " " << task;
        EXPECT_GE(tokens, length - UnitTokens(*tc.tokenizer, task, tc.haystack))
            << tc.name << " " << task << " " << length;
        EXPECT_EQ(*tc.tokenizer->Encode(sample->prompt, true), sample->prompt_ids);
        EXPECT_EQ(sample->depth.has_value(), HasDepthAxis(task));
      }
    }
  }
}

TEST(TaskGeneratorTest, TooShortATargetIsAnError) {
  auto tokenizer = MakeEmbeddedByteTokenizer();
  TaskGenerator generator(TaskSpec::Embedded(), *tokenizer, {});
  auto sample = generator.Generate("passkey", 64, 0.5, 0, 1);
  EXPECT_EQ(sample.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(sample.status().message().find("64"), std::string::npos);
  EXPECT_FALSE(generator.Generate("nonsense", 1024, 0.5, 0, 1).ok());
}

// A prompt suffix ends every synthetic prompt, inside its length, and leaves the values drawn for
// the sample as they were (kv-retrieval's asked pair depends on how many pairs fit, so may move).
TEST(TaskGeneratorTest, PromptSuffixEndsThePromptWithinItsLength) {
  auto rng = testing::MakeRng();
  auto tokenizer = MakeEmbeddedByteTokenizer();
  TaskGenerator plain(TaskSpec::Embedded(), *tokenizer, {});
  TaskGenerator suffixed(TaskSpec::Embedded(), *tokenizer, {});
  const std::string suffix = std::uniform_int_distribution<int>(0, 1)(rng) ? " " : " (answer)";
  suffixed.set_prompt_suffix(suffix);
  const uint64_t seed = rng();
  const int length = std::uniform_int_distribution<int>(600, 1500)(rng);
  for (const std::string task : {"passkey", "niah", "kv-retrieval", "variable-tracking"}) {
    auto a = plain.Generate(task, length, 0.5, 1, seed);
    auto b = suffixed.Generate(task, length, 0.5, 1, seed);
    ASSERT_TRUE(a.ok() && b.ok()) << task;
    EXPECT_TRUE(b->prompt.ends_with(suffix)) << task;
    EXPECT_FALSE(a->prompt.ends_with(suffix)) << task;
    EXPECT_LE(static_cast<int>(b->prompt_ids.size()), length) << task;
    if (task != "kv-retrieval") {
      EXPECT_EQ(a->expected, b->expected) << task;
    }
  }
}

// The needle sits before unit round(depth * n) of the n noise sentences; its value appears
// as often as the needle holds it, and nowhere else.
TEST(TaskGeneratorTest, NeedleAtTheRequestedDepth) {
  auto rng = testing::MakeRng();
  const TaskSpec& spec = TaskSpec::Embedded();
  auto tokenizer = MakeEmbeddedByteTokenizer();
  TaskGenerator generator(spec, *tokenizer, {});
  const std::string& noise = spec.noise_sentence();
  for (const double depth :
       {0.0, 0.25, 0.5, 0.75, 1.0, std::uniform_real_distribution<double>(0, 1)(rng)}) {
    auto sample = generator.Generate("passkey", 2048, depth, 3, rng());
    ASSERT_TRUE(sample.ok());
    const std::string& value = sample->expected.at(0);
    const std::string needle = Fill(spec.Text("passkey", "needle"), {{"value", value}});
    const size_t at = sample->prompt.find(needle);
    ASSERT_NE(at, std::string::npos);
    const int before = Count(sample->prompt.substr(0, at), noise);
    const int total = Count(sample->prompt, noise);
    EXPECT_EQ(before, static_cast<int>(std::nearbyint(depth * total))) << depth;
    EXPECT_EQ(Count(sample->prompt, value), Count(needle, value));
    EXPECT_EQ(sample->prompt.rfind(spec.Text("passkey", "prefix"), 0), 0u);
    EXPECT_TRUE(sample->prompt.ends_with(spec.Text("passkey", "question")));
  }
  for (const std::string task : {"niah", "niah-multikey", "kv-retrieval"}) {
    const double depth = std::uniform_real_distribution<double>(0, 1)(rng);
    auto sample = generator.Generate(task, 1500, depth, 0, rng());
    ASSERT_TRUE(sample.ok());
    ASSERT_EQ(sample->expected.size(), 1u);
    EXPECT_EQ(Count(sample->prompt, sample->expected[0]), 1) << task;
    const size_t at = sample->prompt.find(sample->expected[0]);
    // The queried value's place in the context follows the depth (within a unit or two).
    const double where = static_cast<double>(at) / static_cast<double>(sample->prompt.size());
    EXPECT_NEAR(where, depth, 0.35) << task;
  }
}

// niah-two-turn: two needles of different keys in one context; turn 1's question asks the
// first, turn 2's (follow_up, with the prompt suffix too) the second, which sits at the sample's
// depth.
TEST(TaskGeneratorTest, TwoTurnsAskTwoNeedlesOfOneContext) {
  auto rng = testing::MakeRng();
  const TaskSpec& spec = TaskSpec::Embedded();
  auto tokenizer = MakeEmbeddedByteTokenizer();
  TaskGenerator generator(spec, *tokenizer, {});
  generator.set_prompt_suffix(" ");
  const std::string asks = "\nWhat is the special magic number for ";
  for (const double depth : {0.0, 0.5, 1.0, std::uniform_real_distribution<double>(0, 1)(rng)}) {
    auto sample = generator.Generate("niah-two-turn", 1500, depth, 0, rng());
    ASSERT_TRUE(sample.ok()) << sample.status().ToString();
    ASSERT_EQ(sample->expected.size(), 1u);
    ASSERT_EQ(sample->follow_up_expected.size(), 1u);
    const std::string& first = sample->expected[0];
    const std::string& second = sample->follow_up_expected[0];
    EXPECT_NE(first, second);
    EXPECT_EQ(Count(sample->prompt, first), 1);
    EXPECT_EQ(Count(sample->prompt, second), 1);
    // Each question names the key of its own needle.
    const auto key_of = [&](const std::string& text, size_t from) {
      const size_t at = text.find(asks, from);
      EXPECT_NE(at, std::string::npos);
      const size_t begin = at + asks.size();
      return text.substr(begin, text.find(' ', begin) - begin);
    };
    const std::string first_key = key_of(sample->prompt, sample->prompt.rfind(asks));
    const std::string second_key = key_of(sample->follow_up, 0);
    EXPECT_NE(first_key, second_key);
    EXPECT_NE(sample->prompt.find("for " + first_key + " is: " + first + "."), std::string::npos);
    EXPECT_NE(sample->prompt.find("for " + second_key + " is: " + second + "."), std::string::npos);
    EXPECT_TRUE(sample->follow_up.starts_with(asks));
    EXPECT_TRUE(sample->follow_up.ends_with(" text is ")) << "the prompt suffix ends turn 2 too";
    EXPECT_EQ(sample->follow_up_ids, *tokenizer->Encode(sample->follow_up, false));
    EXPECT_TRUE(sample->prompt.ends_with(" text is "));
    const double where = static_cast<double>(sample->prompt.find(second)) /
                         static_cast<double>(sample->prompt.size());
    EXPECT_NEAR(where, depth, 0.35) << "turn 2's needle follows the depth";
  }
}

// Turn 2's samples: prefill puts the answer and the new question after the prompt; reuse keeps
// the prompt and carries them as the continuation. Merging keeps turn 1's answer and score.
TEST(TwoTurnTest, SecondTurnSamplesAndMerge) {
  auto rng = testing::MakeRng();
  auto tokenizer = MakeEmbeddedByteTokenizer();
  TaskGenerator generator(TaskSpec::Embedded(), *tokenizer, {});
  auto two_turn = generator.Generate("niah-two-turn", 1200, 0.5, 0, rng());
  auto single = generator.Generate("niah", 1200, 0.5, 0, rng());
  ASSERT_TRUE(two_turn.ok() && single.ok());
  const std::vector<const EvalSample*> samples = {&*single, &*two_turn};
  std::vector<SampleRecord> records(2);
  records[0] = {samples[0], "full", " " + single->expected[0] + ".", 1.0};
  records[1] = {samples[1], "full", " " + std::to_string(rng() % 10000000) + ".", 0.0};
  const std::vector<int32_t> answer = *tokenizer->Encode(records[1].output, false);
  const std::vector<int32_t> question = *tokenizer->Encode(two_turn->follow_up, false);
  for (const SecondTurn mode : {SecondTurn::kPrefill, SecondTurn::kReuse}) {
    auto second = SecondTurnSamples(samples, records, mode, *tokenizer);
    ASSERT_TRUE(second.ok());
    ASSERT_EQ(second->size(), 2u);
    EXPECT_EQ((*second)[0], nullptr) << "a one-turn sample has no turn 2";
    const EvalSample& turn = *(*second)[1];
    std::vector<int32_t> after = answer;
    after.insert(after.end(), question.begin(), question.end());
    std::vector<int32_t> whole = two_turn->prompt_ids;
    whole.insert(whole.end(), after.begin(), after.end());
    if (mode == SecondTurn::kPrefill) {
      EXPECT_EQ(turn.prompt_ids, whole);
      EXPECT_TRUE(turn.continuation.empty());
    } else {
      EXPECT_EQ(turn.prompt_ids, two_turn->prompt_ids);
      EXPECT_EQ(turn.continuation, after);
    }
    EXPECT_EQ(turn.prompt, two_turn->prompt + records[1].output + two_turn->follow_up);
    EXPECT_EQ(turn.expected, two_turn->follow_up_expected);
    std::vector<SampleRecord> merged = records;
    const std::string reply = " " + two_turn->follow_up_expected[0] + ".";
    MergeSecondTurn(merged, *second, {{&turn, "full", reply, 1.0}});
    EXPECT_FALSE(merged[0].first_turn_output.has_value());
    EXPECT_EQ(merged[0].output, records[0].output);
    EXPECT_EQ(merged[1].first_turn_output, records[1].output);
    EXPECT_EQ(merged[1].first_turn_score, 0.0);
    EXPECT_EQ(merged[1].output, reply);
    EXPECT_EQ(merged[1].score, 1.0);
  }
  EXPECT_FALSE(ParseSecondTurn("both").ok());
}

TEST(TaskGeneratorTest, DeterministicPerSeedAndDifferentAcrossSeeds) {
  auto rng = testing::MakeRng();
  auto tokenizer = MakeEmbeddedByteTokenizer();
  TaskGenerator generator(TaskSpec::Embedded(), *tokenizer, {});
  for (const std::string& task : AllTaskNames()) {
    if (!IsSyntheticTask(task)) continue;
    const uint64_t seed = rng();
    auto first = generator.Generate(task, 1024, 0.5, 2, seed);
    auto again = generator.Generate(task, 1024, 0.5, 2, seed);
    auto other_seed = generator.Generate(task, 1024, 0.5, 2, seed + 1);
    auto other_index = generator.Generate(task, 1024, 0.5, 3, seed);
    ASSERT_TRUE(first.ok() && again.ok() && other_seed.ok() && other_index.ok()) << task;
    EXPECT_EQ(first->prompt, again->prompt) << task;
    EXPECT_EQ(first->expected, again->expected) << task;
    EXPECT_NE(first->prompt, other_seed->prompt) << task;
    EXPECT_NE(first->prompt, other_index->prompt) << task;
  }
}

TEST(TaskGeneratorTest, WordingAndAnswersOfEveryTask) {
  auto rng = testing::MakeRng();
  const TaskSpec& spec = TaskSpec::Embedded();
  auto tokenizer = MakeEmbeddedByteTokenizer();
  std::vector<std::string> haystack;
  for (int index = 0; index < 50; ++index) {
    haystack.push_back("Sentence number " + std::to_string(rng() % 1000) +
                       " of a test text here. ");
  }
  TaskGenerator generator(spec, *tokenizer, haystack);
  // niah-multivalue: every value once, asked with question_all.
  auto multi = generator.Generate("niah-multivalue", 2048, std::nullopt, 0, rng());
  ASSERT_TRUE(multi.ok());
  EXPECT_EQ(static_cast<int>(multi->expected.size()), spec.Int("niah", "needles_multi"));
  for (const std::string& value : multi->expected) EXPECT_EQ(Count(multi->prompt, value), 1);
  EXPECT_NE(multi->prompt.find("What are all the special magic numbers for"), std::string::npos);
  EXPECT_EQ(multi->max_tokens, spec.Int("niah", "max_tokens_all"));
  EXPECT_NE(multi->prompt.find("Sentence number"), std::string::npos) << "natural haystack";
  // variable-tracking: a chain of hops + 1 names, in order, the question counting them.
  auto chain = generator.Generate("variable-tracking", 2048, std::nullopt, 0, rng());
  ASSERT_TRUE(chain.ok());
  ASSERT_EQ(static_cast<int>(chain->expected.size()), spec.Int("variable_tracking", "hops") + 1);
  size_t last = 0;
  for (size_t name = 1; name < chain->expected.size(); ++name) {
    const std::string statement =
        "VAR " + chain->expected[name] + " = VAR " + chain->expected[name - 1] + ". ";
    const size_t at = chain->prompt.find(statement);
    ASSERT_NE(at, std::string::npos) << statement;
    EXPECT_GT(at, last);
    last = at;
  }
  EXPECT_NE(chain->prompt.find(std::to_string(chain->expected.size()) + " variables are assigned"),
            std::string::npos);
  // common-words: the common words outnumber every other word.
  auto words = generator.Generate("common-words", 3000, std::nullopt, 0, rng());
  ASSERT_TRUE(words.ok());
  std::map<std::string, int> counts;
  std::string text = words->prompt;
  for (size_t at = text.find("\n1. "); at != std::string::npos;) {
    const size_t dot = text.find(". ", at);
    const size_t end = text.find('\n', dot);
    ++counts[text.substr(dot + 2, end - dot - 2)];
    at = text.compare(end + 1, 9, "Question:") == 0 ? std::string::npos : end;
  }
  int least_common = 1 << 30, most_rare = 0;
  for (const auto& [word, count] : counts) {
    const bool common =
        std::find(words->expected.begin(), words->expected.end(), word) != words->expected.end();
    if (common) {
      least_common = std::min(least_common, count);
    } else {
      most_rare = std::max(most_rare, count);
    }
  }
  EXPECT_EQ(static_cast<int>(words->expected.size()), spec.Int("common_words", "common"));
  EXPECT_GT(least_common, most_rare);
  // kv-retrieval: the JSON object's wrapping and the asked key's question.
  auto pairs = generator.Generate("kv-retrieval", 1024, 1.0, 0, rng());
  ASSERT_TRUE(pairs.ok());
  EXPECT_EQ(pairs->prompt.rfind(spec.Text("kv_retrieval", "prefix"), 0), 0u);
  EXPECT_NE(pairs->prompt.find("\": \"" + pairs->expected[0] + "\"}"), std::string::npos)
      << "depth 1 asks the last pair";
}

TEST(InsertAtDepthsTest, FollowsTasksPy) {
  const std::vector<std::string_view> units = {"a", "b", "c", "d"};
  EXPECT_EQ(InsertAtDepths(units, {{"X", 0.0}}), "Xabcd");
  EXPECT_EQ(InsertAtDepths(units, {{"X", 1.0}}), "abcdX");
  EXPECT_EQ(InsertAtDepths(units, {{"X", 0.5}}), "abXcd");
  EXPECT_EQ(InsertAtDepths(units, {{"X", 0.375}}), "abXcd");  // round(1.5) = 2 (half to even)
  EXPECT_EQ(InsertAtDepths(units, {{"X", 0.625}}), "abXcd");  // round(2.5) = 2
  EXPECT_EQ(InsertAtDepths(units, {{"X", 0.1}, {"Y", 0.9}}), "XabcdY");
  EXPECT_EQ(InsertAtDepths(units, {{"X", 0.5}, {"Y", 0.5}}), "abYXcd");  // Python's order
}

TEST(ScoringTest, WholeNumbersAndWords) {
  EXPECT_TRUE(ContainsWhole(" 12345.", "12345"));
  EXPECT_TRUE(ContainsWhole("12345", "12345"));
  EXPECT_TRUE(ContainsWhole("key12345", "12345"));  // letters do not extend a number
  EXPECT_FALSE(ContainsWhole(" 123456.", "12345"));
  EXPECT_FALSE(ContainsWhole(" 012345", "12345"));
  EXPECT_TRUE(ContainsWhole("9123456 and 12345", "12345"));
  EXPECT_TRUE(ContainsWhole("\"0a1b2c3d\"", "0a1b2c3d"));
  EXPECT_FALSE(ContainsWhole("0a1b2c3de", "0a1b2c3d"));
  EXPECT_FALSE(ContainsWhole("ABCDEF", "ABCDE"));
  EXPECT_FALSE(ContainsWhole("", "1"));
  EXPECT_DOUBLE_EQ(FractionFound(" 1111, 2222.", {"1111", "2222", "3333", "4444"}), 0.5);
  EXPECT_DOUBLE_EQ(FractionFound("anything", {}), 0.0);
  EvalSample sample;
  sample.expected = {"ABCDE", "FGHIJ", "KLMNO"};
  EXPECT_NEAR(ScoreOutput(sample, " ABCDE KLMNO."), 2.0 / 3, 1e-12);
}

TEST(ScoringTest, SquadNormalisationAndF1) {
  EXPECT_EQ(NormalizeAnswer("The  Cat, a dog!\tAn apple."), "cat dog apple");
  EXPECT_EQ(NormalizeAnswer("Theory"), "theory");
  EXPECT_DOUBLE_EQ(TokenF1("the cat sat", "cat sat down"), 2 * (1.0 * 2 / 3) / (1 + 2.0 / 3));
  EXPECT_DOUBLE_EQ(TokenF1("Paris", "paris."), 1.0);
  EXPECT_DOUBLE_EQ(TokenF1("london", "paris"), 0.0);
  EvalSample sample;
  sample.expected = {"Paris", "the city of Paris"};
  sample.metric = Metric::kExact;
  EXPECT_DOUBLE_EQ(ScoreOutput(sample, " paris!"), 1.0);
  EXPECT_DOUBLE_EQ(ScoreOutput(sample, "It is Paris"), 0.0);
  sample.metric = Metric::kSubstring;
  EXPECT_DOUBLE_EQ(ScoreOutput(sample, "It is Paris."), 1.0);
  EXPECT_DOUBLE_EQ(ScoreOutput(sample, "Lyon"), 0.0);
  sample.metric = Metric::kF1;
  EXPECT_NEAR(ScoreOutput(sample, "city of Paris"), 1.0, 1e-12);  // best over answers
}

TEST(JsonlTest, ParsesRecordsAndNamesBadLines) {
  const std::string good =
      "{\"context\": \"c1\", \"input\": \"q1\", \"answers\": [\"a\"]}\n\n"
      "{\"context\": \"c2\", \"input\": \"q2\", \"answers\": [\"b\", \"c\"], \"length\": 900, "
      "\"metric\": \"f1\"}\n";
  auto records = ParseJsonl(good, "data.jsonl");
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[1].line, 3);
  EXPECT_EQ((*records)[1].length, 900);
  EXPECT_EQ((*records)[1].metric, Metric::kF1);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"context\": \"c\", \"input\": \"q\"}", "data.jsonl:2: missing \"answers\""},
      {"{\"context\": 3, \"input\": \"q\", \"answers\": [\"a\"]}", "data.jsonl:2: \"context\""},
      {"{not json", "data.jsonl:2: not valid JSON"},
      {"[1, 2]", "data.jsonl:2: not a JSON object"},
      {"{\"context\": \"c\", \"input\": \"q\", \"answers\": []}", "data.jsonl:2: \"answers\" is"},
      {"{\"context\": \"c\", \"input\": \"q\", \"answers\": [1]}", "data.jsonl:2: \"answers\""},
      {"{\"context\": \"c\", \"input\": \"q\", \"answers\": [\"a\"], \"metric\": \"bleu\"}",
       "data.jsonl:2: unknown metric 'bleu'"},
      {"{\"context\": \"c\", \"input\": \"q\", \"answers\": [\"a\"], \"length\": \"long\"}",
       "data.jsonl:2: \"length\""},
  };
  for (const auto& [line, message] : bad) {
    auto parsed = ParseJsonl("{\"context\": \"\", \"input\": \"\", \"answers\": [\"x\"]}\n" + line,
                             "data.jsonl");
    ASSERT_FALSE(parsed.ok()) << line;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(message), std::string::npos)
        << parsed.status().message();
  }
  EXPECT_FALSE(ParseJsonl("\n\n", "empty.jsonl").ok());
}

// `--task heldout` finds the committed set from a build tree and reads every record of it
// (scripts/eval_heldout_test.py checks the records themselves).
TEST(JsonlTest, HeldoutSetIsFoundAndReads) {
  auto path = FindHeldoutSet();
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_TRUE(path->ends_with("testdata/eval/heldout_needles.jsonl")) << *path;
  auto records = ReadJsonl(*path);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  std::map<int, int> per_length;
  for (const JsonlRecord& record : *records) {
    ASSERT_TRUE(record.length.has_value()) << "line " << record.line;
    ++per_length[*record.length];
    EXPECT_EQ(record.metric, Metric::kSubstring) << "line " << record.line;
    ASSERT_EQ(record.answers.size(), 1u) << "line " << record.line;
    // As the substring metric compares (a value opening a needle is capitalised there).
    EXPECT_NE(NormalizeAnswer(record.context).find(NormalizeAnswer(record.answers[0])),
              std::string::npos)
        << "line " << record.line;
  }
  EXPECT_EQ(per_length, (std::map<int, int>{{1000, 40}, {2000, 40}, {4000, 40}}));
}

TEST(JsonlTest, TemplateTruncationAndBuckets) {
  EXPECT_EQ(FillPromptTemplate("{context}\n\n{input}", "has {input} inside", "Q?"),
            "has {input} inside\n\nQ?");
  auto rng = testing::MakeRng();
  std::vector<int32_t> ids(100);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 1000);
  const std::vector<int32_t> cut = TruncateMiddle(ids, 31);
  ASSERT_EQ(cut.size(), 31u);
  EXPECT_TRUE(std::equal(cut.begin(), cut.begin() + 15, ids.begin()));
  EXPECT_TRUE(std::equal(cut.begin() + 15, cut.end(), ids.end() - 16));
  EXPECT_EQ(TruncateMiddle(ids, 100), ids);
  EXPECT_EQ(LengthBucket({1024, 2048, 4096}, 1), 1024);
  EXPECT_EQ(LengthBucket({1024, 2048, 4096}, 1024), 1024);
  EXPECT_EQ(LengthBucket({1024, 2048, 4096}, 1025), 2048);
  EXPECT_EQ(LengthBucket({1024, 2048, 4096}, 9999), 4096);

  auto tokenizer = MakeEmbeddedByteTokenizer();
  JsonlRecord record;
  record.context = std::string(500, 'x') + "MIDDLE" + std::string(500, 'y');
  record.input = "Question?";
  record.answers = {"a"};
  JsonlOptions options;
  options.max_prompt_tokens = 200;
  options.buckets = {256, 2048};
  auto sample = MakeJsonlSample(record, 0, options, *tokenizer);
  ASSERT_TRUE(sample.ok());
  EXPECT_TRUE(sample->truncated);
  EXPECT_EQ(sample->prompt_ids.size(), 200u);
  EXPECT_EQ(sample->length, 2048) << "bucketed by the prompt's length before the cut";
  EXPECT_EQ(sample->prompt.find("MIDDLE"), std::string::npos);
  EXPECT_TRUE(sample->prompt.ends_with("Question?"));
  EXPECT_EQ(sample->prompt_ids.front(), *tokenizer->bos_id());
}

TEST(TextSourceTest, SentencesAsTrainPyCutsThem) {
  const std::string text =
      "Short one. This sentence is long enough to keep!  And this one\nspans a line break? "
      "Tiny. " +
      std::string(401, 'z') + ". Last sentence without an end";
  const std::vector<std::string> sentences = SplitSentences(text);
  ASSERT_EQ(sentences.size(), 3u);
  EXPECT_EQ(sentences[0], "This sentence is long enough to keep! ");
  EXPECT_EQ(sentences[1], "And this one spans a line break? ");
  EXPECT_EQ(sentences[2], "Last sentence without an end ");
  EXPECT_FALSE(ReadTextSource("/nonexistent/path", "--haystack").ok());
}

// Tags balance (a small XML check: every <x ...> closed by </x> or self-closed).
bool BalancedTags(const std::string& svg, std::string& why) {
  std::vector<std::string> open;
  for (size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const size_t end = svg.find('>', at);
    if (end == std::string::npos) {
      why = "unterminated tag";
      return false;
    }
    const std::string tag = svg.substr(at + 1, end - at - 1);
    if (tag.starts_with("?") || tag.starts_with("!")) continue;
    if (tag.ends_with("/")) continue;
    if (tag.starts_with("/")) {
      if (open.empty() || open.back() != tag.substr(1)) {
        why = "unexpected </" + tag.substr(1) + ">";
        return false;
      }
      open.pop_back();
    } else {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  if (!open.empty()) why = "unclosed <" + open.back() + ">";
  return open.empty();
}

TEST(SvgChartTest, HeatmapAndBudgetChartAreWellFormed) {
  auto rng = testing::MakeRng();
  const std::vector<int> lengths = {1024, 2048, 4096};
  const std::vector<double> depths = {0, 0.5, 1};
  std::vector<std::vector<std::optional<double>>> scores(3, std::vector<std::optional<double>>(3));
  for (auto& row : scores) {
    for (auto& cell : row) cell = std::uniform_real_distribution<double>(0, 1)(rng);
  }
  scores[1][2].reset();
  const std::string heatmap =
      NeedleHeatmapSvg("passkey: snapkv@<256> & co", lengths, depths, scores);
  std::string why;
  EXPECT_TRUE(BalancedTags(heatmap, why)) << why;
  EXPECT_EQ(Count(heatmap, "class=\"cell\""), 9);
  EXPECT_EQ(Count(heatmap, "not measured"), 1);
  EXPECT_NE(heatmap.find("snapkv@&lt;256&gt; &amp; co"), std::string::npos);
  EXPECT_NE(heatmap.find(">4096<"), std::string::npos);
  EXPECT_NE(heatmap.find("needle depth"), std::string::npos);
  EXPECT_NE(ScoreColor(0.0), ScoreColor(1.0));

  std::vector<ChartSeries> series = {{"snapkv", {10.0, 50.0, std::nullopt}},
                                     {"h2o", {5.0, 20.0, 80.0}}};
  const std::string chart =
      BudgetChartSvg("niah: score vs KV budget", "score (%)", {64, 256, 1024}, series, 90.0, true);
  EXPECT_TRUE(BalancedTags(chart, why)) << why;
  EXPECT_EQ(Count(chart, "class=\"series\""), 2);
  EXPECT_EQ(Count(chart, "class=\"dense\""), 1);
  EXPECT_EQ(Count(chart, "<circle"), 5);
}

TEST(EvalResultsTest, CellsSummaryAndJson) {
  EvalSample a, b, c;
  a.task = b.task = "passkey";
  a.length = 1024;
  b.length = 2048;
  a.depth = b.depth = 0.5;
  a.prompt_ids = {1, 2, 3};
  c.task = "perplexity";
  c.length = 1024;
  c.metric = Metric::kPerplexity;
  EvalResults results({"passkey", "perplexity"}, {{"full", "full", std::nullopt}});
  results.Add({&a, "full", "12345", 1.0, 0, ""});
  results.Add({&a, "full", "x", 0.0, 0, ""});
  results.Add({&b, "full", "12345", 1.0, 0, ""});
  results.Add({&c, "full", "", 2.0, 4, ""});
  const auto cells = results.Cells();
  ASSERT_EQ(cells.size(), 3u);
  EXPECT_DOUBLE_EQ(cells[0].value(), 0.5);
  EXPECT_DOUBLE_EQ(cells[1].value(), 1.0);
  EXPECT_NEAR(cells[2].value(), std::exp(0.5), 1e-12);
  const auto summary = results.Summary();
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_DOUBLE_EQ(summary[0].value(), 0.75) << "the mean of the cells, not of the samples";
  const nlohmann::json json = results.ToJson();
  EXPECT_EQ(json["records"].size(), 4u);
  EXPECT_EQ(json["records"][0]["prompt_tokens"], 3);
  EXPECT_EQ(json["cells"][2]["tokens"], 4);
  EXPECT_NE(results.Table().find("50.0"), std::string::npos);
}

}  // namespace
}  // namespace sieve::eval
