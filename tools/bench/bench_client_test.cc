// Tests of the load generator: metrics math against hand-computed values, SSE parsing at random
// byte boundaries, arrival statistics, datasets, the SVG chart, and
// whole runs against a fake OpenAI-compatible server with known delays.
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include <fmt/format.h>

#include "core/testing.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/bench_commands.h"
#include "tools/bench/dataset.h"
#include "tools/bench/fake_openai_server.h"
#include "tools/bench/http_client.h"
#include "tools/bench/metrics.h"
#include "tools/bench/openai_protocol.h"
#include "tools/bench/plot.h"
#include "tools/bench/report.h"
#include "tools/bench/server_info.h"
#include "tools/bench/serving_benchmark.h"
#include "tools/bench/sse_parser.h"
#include "tools/bench/svg_writer.h"

namespace sieve::bench {
namespace {

using testing::FakeOpenAiServer;
using testing::FakeServerOptions;

// ---------------------------------------------------------------------------------------------
// Metrics

TEST(PercentileTest, MatchesNumpyLinearInterpolation) {
  const std::vector<double> values = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(values, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(values, 90), 3.7);
  EXPECT_DOUBLE_EQ(Percentile(values, 99), 3.97);
  EXPECT_DOUBLE_EQ(Percentile(values, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(values, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
}

TEST(SummarizeTest, MeanStdMedianAndEmpty) {
  const Distribution d = Summarize({300, 100, 200});
  EXPECT_DOUBLE_EQ(d.mean, 200);
  EXPECT_NEAR(d.std, std::sqrt(20000.0 / 3), 1e-9);  // population std, as numpy
  EXPECT_DOUBLE_EQ(d.median, 200);
  EXPECT_DOUBLE_EQ(d.p90, 280);
  EXPECT_DOUBLE_EQ(d.p99, 298);
  EXPECT_DOUBLE_EQ(d.min, 100);
  EXPECT_DOUBLE_EQ(d.max, 300);
  const Distribution empty = Summarize({});
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.p99, 0);
}

RequestRecord Record(int prompt_len, double start, double ttft, double e2e, int64_t tokens,
                     std::vector<double> itl) {
  RequestRecord record;
  record.success = true;
  record.prompt_len = prompt_len;
  record.start_s = start;
  record.ttft_s = ttft;
  record.e2e_s = e2e;
  record.output_tokens = tokens;
  record.itl_s = std::move(itl);
  return record;
}

TEST(ComputeMetricsTest, HandComputedRun) {
  std::vector<RequestRecord> records;
  records.push_back(Record(10, 0.0, 0.1, 1.0, 10, std::vector<double>(9, 0.1)));
  records.push_back(Record(20, 0.5, 0.3, 2.0, 5, {0.2, 0.5, 0.5, 0.5}));
  records.push_back(Record(30, 0.9, 0.2, 0.2, 1, {}));  // one token: no TPOT
  RequestRecord failed;
  failed.error = "boom";
  failed.prompt_len = 1000;
  failed.start_s = 3.0;
  failed.e2e_s = 0.1;
  records.push_back(failed);

  const BenchMetrics m = ComputeMetrics(records, 4.0);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 60);  // failed requests do not count
  EXPECT_EQ(m.total_output_tokens, 16);
  EXPECT_DOUBLE_EQ(m.request_throughput, 0.75);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 19.0);
  EXPECT_NEAR(m.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p99, 298, 1e-9);
  // TPOT: (1.0 - 0.1) / 9 = 100 ms and (2.0 - 0.3) / 4 = 425 ms.
  EXPECT_NEAR(m.tpot_ms.mean, 262.5, 1e-9);
  EXPECT_NEAR(m.tpot_ms.median, 262.5, 1e-9);
  EXPECT_NEAR(m.tpot_ms.p99, 100 + 0.99 * 325, 1e-9);
  // ITL: nine gaps of 100 ms and 200, 500, 500, 500.
  EXPECT_NEAR(m.itl_ms.mean, 200, 1e-9);
  EXPECT_NEAR(m.itl_ms.median, 100, 1e-9);
  EXPECT_NEAR(m.itl_ms.p90, 500, 1e-9);
  EXPECT_NEAR(m.e2el_ms.median, 1000, 1e-9);
  EXPECT_NEAR(m.e2el_ms.max, 2000, 1e-9);
  // In flight together during [0.9, 1.0]: all three successful requests.
  EXPECT_EQ(m.peak_concurrent_requests, 3);
}

TEST(ComputeMetricsTest, PeakChunksPerSecondBucketsArrivals) {
  // Chunks at 0.75, 0.875, 1.0, 1.125 s: two in [0, 1) and two in [1, 2).
  const std::vector<RequestRecord> records = {
      Record(1, 0.5, 0.25, 0.625, 4, {0.125, 0.125, 0.125})};
  EXPECT_DOUBLE_EQ(ComputeMetrics(records, 1.0).peak_output_throughput, 2);
}

TEST(ComputeMetricsTest, JsonRoundTripKeepsVllmKeys) {
  const std::vector<RequestRecord> records = {Record(5, 0, 0.1, 0.5, 3, {0.2, 0.2})};
  const BenchMetrics m = ComputeMetrics(records, 1.0);
  const nlohmann::json json = MetricsToJson(m);
  for (const char* key :
       {"completed", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
        "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "median_e2el_ms"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  const BenchMetrics back = MetricsFromJson(json);
  EXPECT_EQ(back.completed, 1);
  EXPECT_DOUBLE_EQ(back.tpot_ms.median, m.tpot_ms.median);
  EXPECT_DOUBLE_EQ(back.itl_ms.p99, m.itl_ms.p99);
}

TEST(ReportTest, TableHasVllmLayout) {
  const std::vector<RequestRecord> records = {Record(5, 0, 0.1, 0.5, 3, {0.2, 0.2})};
  const std::string table =
      FormatServingTable(ComputeMetrics(records, 1.0), 4, std::numeric_limits<double>::infinity());
  EXPECT_NE(table.find("============ Serving Benchmark Result ============"), std::string::npos);
  EXPECT_NE(table.find("---------------Time to First Token----------------"), std::string::npos);
  EXPECT_NE(table.find("Maximum request concurrency:             4"), std::string::npos);
  EXPECT_NE(table.find("Request rate configured (RPS):           inf"), std::string::npos);
  EXPECT_NE(table.find("Median TPOT (ms):                        200.00"), std::string::npos);
  EXPECT_NE(table.find("P90 ITL (ms):"), std::string::npos);
  EXPECT_NE(table.find(std::string(50, '=') + "\n"), std::string::npos);
}

TEST(ReportTest, ErrorsAreCountedMostFrequentFirst) {
  std::vector<RequestRecord> records(5);
  records[0].error = "a";
  records[1].error = "b";
  records[2].error = "b";
  records[3].success = true;
  records[4].error = "c";
  const nlohmann::json errors = SummarizeErrors(records, 2);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0]["message"], "b");
  EXPECT_EQ(errors[0]["count"], 2);
  EXPECT_EQ(errors[1]["message"], "a");
}

// ---------------------------------------------------------------------------------------------
// SSE and the OpenAI stream format

std::vector<std::string> ParseAll(const std::vector<std::string>& pieces) {
  SseParser parser;
  std::vector<std::string> events;
  const auto on_event = [&](std::string_view data) { events.emplace_back(data); };
  for (const std::string& piece : pieces) parser.Feed(piece, on_event);
  parser.Finish(on_event);
  return events;
}

TEST(SseParserTest, SpecCases) {
  const std::string stream =
      "\xEF\xBB\xBF"  // byte-order mark
      "data: {\"a\": 1}\n\n"
      ": keep-alive comment\n\n"
      "data:no-space\r\n\r\n"
      "data: line1\ndata: line2\n\n"
      "event: message\nid: 7\ndata: y\rdata: z\r\r"
      "data:\n\n"      // an empty data line is still an event
      "retry: 10\n\n"  // no data: no event
      "data: [DONE]\n\n"
      "data: unterminated";  // dispatched by Finish
  const std::vector<std::string> expected = {"{\"a\": 1}", "no-space", "line1\nline2", "y\nz",
                                             "",           "[DONE]",   "unterminated"};
  EXPECT_EQ(ParseAll({stream}), expected);
}

TEST(SseParserTest, AnySplitGivesTheSameEvents) {
  std::string stream;
  for (int index = 0; index < 40; ++index) {
    const char* newline = index % 3 == 0 ? "\r\n" : (index % 3 == 1 ? "\n" : "\r");
    stream += std::string("data: {\"choices\": [{\"text\": \"t\u00e9") + std::to_string(index) +
              "\"}]}" + newline + newline;
    if (index % 7 == 0) stream += std::string(": ping") + newline + newline;
  }
  stream += "data: [DONE]\n\n";
  const std::vector<std::string> expected = ParseAll({stream});
  ASSERT_EQ(expected.size(), 41u);
  std::mt19937_64 rng = sieve::testing::MakeRng();
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::string> pieces;
    size_t offset = 0;
    std::uniform_int_distribution<size_t> length(0, trial % 2 == 0 ? 4 : 64);
    while (offset < stream.size()) {
      const size_t take = std::min(length(rng), stream.size() - offset);
      pieces.push_back(stream.substr(offset, take));
      offset += take;
    }
    ASSERT_EQ(ParseAll(pieces), expected) << "trial " << trial;
  }
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(ParseAll(bytes), expected);
}

TEST(OpenAiProtocolTest, ParsesCompletionChatUsageErrorAndDone) {
  auto text = ParseStreamEvent(R"({"choices": [{"index": 0, "text": "Hello"}]})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->text, "Hello");
  auto role =
      ParseStreamEvent(R"({"choices": [{"delta": {"role": "assistant", "content": null}}]})");
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(role->text, "");
  auto chat = ParseStreamEvent(R"({"choices": [{"delta": {"content": " world"}}]})");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->text, " world");
  auto usage =
      ParseStreamEvent(R"({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}})");
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->completion_tokens, 9);
  EXPECT_EQ(usage->prompt_tokens, 4);
  EXPECT_EQ(usage->text, "");
  auto error = ParseStreamEvent(R"({"error": {"message": "out of KV pages", "code": 507}})");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->error, "out of KV pages");
  auto done = ParseStreamEvent(" [DONE] ");
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
  EXPECT_FALSE(ParseStreamEvent("{truncated").ok());
}

TEST(OpenAiProtocolTest, RequestBodies) {
  RequestBodyOptions options;
  options.model = "m";
  nlohmann::json body = MakeRequestBody(options, "hi", 5);
  EXPECT_EQ(body["prompt"], "hi");
  EXPECT_EQ(body["max_tokens"], 5);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_FALSE(body.contains("ignore_eos"));
  EXPECT_FALSE(body.contains("messages"));
  options.api = ApiKindForEndpoint("/v1/chat/completions/");
  options.ignore_eos = true;
  options.extra = {{"top_p", 0.5}, {"temperature", 0.7}};
  body = MakeRequestBody(options, "hi", 5);
  EXPECT_EQ(body["messages"][0]["role"], "user");
  EXPECT_EQ(body["messages"][0]["content"], "hi");
  EXPECT_EQ(body["max_completion_tokens"], 5);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["top_p"], 0.5);
  EXPECT_EQ(body["temperature"], 0.7);  // --extra-body wins
  EXPECT_EQ(ApiKindForEndpoint("/v1/completions"), ApiKind::kCompletions);
}

// ---------------------------------------------------------------------------------------------
// URLs

TEST(HttpUrlTest, ParsesAndRejects) {
  auto url = ParseHttpUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, "8000");
  EXPECT_EQ(url->path, "");
  url = ParseHttpUrl("http://localhost/prefix/");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->port, "80");
  EXPECT_EQ(url->path, "/prefix");
  EXPECT_EQ(url->ToString(), "http://localhost:80/prefix");
  url = ParseHttpUrl("http://[::1]:9000");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->Authority(), "[::1]:9000");
  const auto https = ParseHttpUrl("https://api.openai.com");
  ASSERT_FALSE(https.ok());
  EXPECT_NE(https.status().message().find("only http://"), std::string::npos);
  EXPECT_FALSE(ParseHttpUrl("localhost:8000").ok());
  EXPECT_FALSE(ParseHttpUrl("http://host:99999").ok());
  EXPECT_FALSE(ParseHttpUrl("http://host:80x").ok());
  EXPECT_FALSE(ParseHttpUrl("http://:80").ok());
}

// ---------------------------------------------------------------------------------------------
// Arrivals

struct GapStats {
  double mean;
  double cv;  // std / mean
};

GapStats Gaps(const std::vector<double>& times) {
  std::vector<double> gaps;
  for (size_t index = 1; index < times.size(); ++index) {
    gaps.push_back(times[index] - times[index - 1]);
  }
  const Distribution d = Summarize(gaps);
  return {d.mean, d.std / d.mean};
}

TEST(ArrivalsTest, InfiniteRateReleasesEverythingAtOnce) {
  const auto times = MakeArrivalTimes(50, std::numeric_limits<double>::infinity(), 1.0, 3);
  ASSERT_EQ(times.size(), 50u);
  for (double time : times) EXPECT_EQ(time, 0.0);
}

TEST(ArrivalsTest, PoissonGapsAreExponential) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  constexpr int kRequests = 40001;
  constexpr double kRate = 100;
  const auto times = MakeArrivalTimes(kRequests, kRate, 1.0, rng());
  EXPECT_EQ(times.front(), 0.0);
  EXPECT_TRUE(std::is_sorted(times.begin(), times.end()));
  const GapStats stats = Gaps(times);
  // The standard error of the mean gap is 0.5% here; 3% is a six-sigma bound.
  EXPECT_NEAR(stats.mean, 1 / kRate, 0.03 / kRate);
  EXPECT_NEAR(stats.cv, 1.0, 0.05);  // exponential: std == mean
  // Exponential: P(gap < mean x ln 2) = 1/2.
  int below = 0;
  for (size_t index = 1; index < times.size(); ++index) {
    if (times[index] - times[index - 1] < std::log(2.0) / kRate) ++below;
  }
  EXPECT_NEAR(static_cast<double>(below) / (kRequests - 1), 0.5, 0.02);
}

TEST(ArrivalsTest, BurstinessShapesTheGaps) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const GapStats regular = Gaps(MakeArrivalTimes(40001, 10, 4.0, rng()));
  EXPECT_NEAR(regular.mean, 0.1, 0.003);
  EXPECT_NEAR(regular.cv, 0.5, 0.03);  // gamma: cv = 1 / sqrt(shape)
  const GapStats bursty = Gaps(MakeArrivalTimes(40001, 10, 0.25, rng()));
  EXPECT_NEAR(bursty.mean, 0.1, 0.006);
  EXPECT_NEAR(bursty.cv, 2.0, 0.15);
}

// ---------------------------------------------------------------------------------------------
// Datasets

TEST(RandomDatasetTest, LengthsInRangeAndExactWithByteTokenizer) {
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  RandomDatasetOptions options;
  options.num_prompts = 60;
  options.input_len = 100;
  options.output_len = 20;
  options.range_ratio = 0.5;
  options.seed = 11;
  auto prompts = MakeRandomDataset(*tokenizer, options);
  ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
  ASSERT_EQ(prompts->size(), 60u);
  std::set<int> input_lens;
  for (const BenchPrompt& prompt : *prompts) {
    EXPECT_GE(prompt.prompt_len, 50);
    EXPECT_LE(prompt.prompt_len, 150);
    EXPECT_GE(prompt.output_len, 10);
    EXPECT_LE(prompt.output_len, 30);
    // The reported length is the re-tokenised one.
    EXPECT_EQ(static_cast<int>(tokenizer->Encode(prompt.prompt, false)->size()), prompt.prompt_len);
    input_lens.insert(prompt.prompt_len);
  }
  EXPECT_GT(input_lens.size(), 20u);  // really spread
  auto again = MakeRandomDataset(*tokenizer, options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[7].prompt, (*prompts)[7].prompt);  // seeded
  options.seed = 12;
  EXPECT_NE((*MakeRandomDataset(*tokenizer, options))[7].prompt, (*prompts)[7].prompt);
  options.range_ratio = 0;
  auto exact = MakeRandomDataset(*tokenizer, options);
  ASSERT_TRUE(exact.ok());
  for (const BenchPrompt& prompt : *exact) {
    EXPECT_EQ(prompt.prompt_len, 100);
    EXPECT_EQ(prompt.output_len, 20);
  }
  options.range_ratio = 1.5;
  EXPECT_FALSE(MakeRandomDataset(*tokenizer, options).ok());
}

TEST(RandomDatasetTest, BpeTokenizerLengthsAreReTokenised) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const std::string path = fixtures + "/tokenizers/llama3/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no Llama 3 tokenizer fixture at " << path;
  auto tokenizer = LoadTokenizer(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  RandomDatasetOptions options;
  options.num_prompts = 10;
  options.input_len = 300;
  auto prompts = MakeRandomDataset(**tokenizer, options);
  ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
  for (const BenchPrompt& prompt : *prompts) {
    EXPECT_EQ(static_cast<int>((*tokenizer)->Encode(prompt.prompt, false)->size()),
              prompt.prompt_len);
    EXPECT_NEAR(prompt.prompt_len, 300, 15);
  }
}

// The bytes two strings share at their start.
size_t CommonPrefix(const std::string& a, const std::string& b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first -
                             a.begin());
}

// Checks what MakePrefixRepetitionDataset promises with any tokenizer: exactly num_prompts,
// split among the prefixes as documented, every prompt of a group starting with the same prefix
// text and its tokens with the prefix's tokens, the groups' prefixes different, the suffixes of
// a group different, the lengths re-tokenised. Returns the prompts by group.
std::vector<std::vector<BenchPrompt>> CheckPrefixRepetition(const Tokenizer& tokenizer,
                                                            const PrefixRepetitionOptions& options,
                                                            const std::vector<BenchPrompt>& prompts,
                                                            int length_tolerance) {
  std::vector<std::vector<BenchPrompt>> groups(static_cast<size_t>(options.num_prefixes));
  EXPECT_EQ(prompts.size(), static_cast<size_t>(options.num_prompts));
  for (const BenchPrompt& prompt : prompts) {
    EXPECT_GE(prompt.prefix_group, 0);
    EXPECT_LT(prompt.prefix_group, options.num_prefixes);
    if (prompt.prefix_group < 0 || prompt.prefix_group >= options.num_prefixes) continue;
    groups[static_cast<size_t>(prompt.prefix_group)].push_back(prompt);
    EXPECT_EQ(prompt.output_len, options.output_len);
    const auto ids = tokenizer.Encode(prompt.prompt, false);
    EXPECT_TRUE(ids.ok());
    if (!ids.ok()) continue;
    EXPECT_EQ(static_cast<int>(ids->size()), prompt.prompt_len);  // re-tokenised
    EXPECT_NEAR(prompt.prompt_len, options.prefix_len + options.suffix_len, length_tolerance);
    // The seam: the whole prompt's tokens begin with the prefix's own.
    EXPECT_GT(prompt.prefix_bytes, 0);
    const auto prefix_ids = tokenizer.Encode(prompt.prompt.substr(0, prompt.prefix_bytes), false);
    EXPECT_TRUE(prefix_ids.ok());
    if (!prefix_ids.ok()) continue;
    EXPECT_NEAR(static_cast<int>(prefix_ids->size()), options.prefix_len, length_tolerance);
    EXPECT_TRUE(ids->size() > prefix_ids->size() &&
                std::equal(prefix_ids->begin(), prefix_ids->end(), ids->begin()))
        << "the prefix's tokens merged with its suffix's in prompt of group "
        << prompt.prefix_group;
  }
  const int per_prefix = options.num_prompts / options.num_prefixes;
  const int remainder = options.num_prompts % options.num_prefixes;
  for (size_t group = 0; group < groups.size(); ++group) {
    const std::vector<BenchPrompt>& members = groups[group];
    EXPECT_EQ(static_cast<int>(members.size()),
              per_prefix + (static_cast<int>(group) < remainder ? 1 : 0))
        << "group " << group;
    if (members.empty()) continue;
    const std::string prefix = members[0].prompt.substr(0, members[0].prefix_bytes);
    for (size_t a = 0; a < members.size(); ++a) {
      EXPECT_EQ(members[a].prefix_bytes, members[0].prefix_bytes);
      EXPECT_EQ(members[a].prompt.substr(0, members[a].prefix_bytes), prefix) << "group " << group;
      for (size_t b = a + 1; b < members.size(); ++b) {
        // Each suffix is fresh: the two differ soon after the prefix.
        EXPECT_NE(members[a].prompt, members[b].prompt);
        EXPECT_LT(CommonPrefix(members[a].prompt, members[b].prompt), prefix.size() + 16);
      }
    }
    for (size_t other = 0; other < group; ++other) {
      if (groups[other].empty()) continue;
      // Different random prefixes part within a few bytes.
      EXPECT_LT(CommonPrefix(groups[other][0].prompt, members[0].prompt), 16u)
          << "groups " << other << " and " << group;
    }
  }
  return groups;
}

TEST(PrefixRepetitionDatasetTest, GroupsShareExactlyTheirPrefixWithTheByteTokenizer) {
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto rng = ::sieve::testing::MakeRng();
  for (int trial = 0; trial < 8; ++trial) {
    PrefixRepetitionOptions options;
    options.num_prefixes = 1 + static_cast<int>(rng() % 6);
    options.num_prompts = options.num_prefixes + static_cast<int>(rng() % 40);
    options.prefix_len = 16 + static_cast<int>(rng() % 100);
    options.suffix_len = 16 + static_cast<int>(rng() % 100);
    options.output_len = 1 + static_cast<int>(rng() % 200);
    options.seed = rng();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << options.num_prompts
                                      << " prompts, " << options.num_prefixes << " prefixes of "
                                      << options.prefix_len << " + " << options.suffix_len);
    auto prompts = MakePrefixRepetitionDataset(*tokenizer, options);
    ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
    // One token a byte: every length is exact.
    const auto groups = CheckPrefixRepetition(*tokenizer, options, *prompts, 0);
    for (const BenchPrompt& prompt : *prompts) {
      EXPECT_EQ(prompt.prefix_bytes, options.prefix_len);
      EXPECT_EQ(prompt.prompt_len, options.prefix_len + options.suffix_len);
    }
    // Shuffled: the prompts do not come group by group (2 groups of 20 or more keep their order
    // with odds of 1 in C(40, 20)).
    if (options.num_prefixes >= 2 && options.num_prompts >= 20) {
      EXPECT_FALSE(std::is_sorted(prompts->begin(), prompts->end(),
                                  [](const BenchPrompt& a, const BenchPrompt& b) {
                                    return a.prefix_group < b.prefix_group;
                                  }));
    }
    // Seeded: the same seed, the same prompts; another seed, other prefixes.
    auto again = MakePrefixRepetitionDataset(*tokenizer, options);
    ASSERT_TRUE(again.ok());
    for (size_t index = 0; index < prompts->size(); ++index) {
      EXPECT_EQ((*again)[index].prompt, (*prompts)[index].prompt);
    }
    options.seed += 1;
    auto other = MakePrefixRepetitionDataset(*tokenizer, options);
    ASSERT_TRUE(other.ok());
    for (const BenchPrompt& a : *other) {
      for (const auto& group : groups) {
        EXPECT_LT(CommonPrefix(a.prompt, group[0].prompt), 16u);
      }
    }
  }
}

TEST(PrefixRepetitionDatasetTest, BpeTokenizersKeepThePrefixTokensAcrossTheSeam) {
  const std::string fixtures = TestDataDir();
  auto rng = ::sieve::testing::MakeRng();
  int tested = 0;
  for (const char* name : {"llama3/tokenizer.json", "llama2/tokenizer.model"}) {
    const std::string path = fixtures + "/tokenizers/" + std::string(name);
    if (!std::filesystem::exists(path)) continue;
    auto tokenizer = LoadTokenizer(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    PrefixRepetitionOptions options;
    options.num_prefixes = 3;
    options.num_prompts = 14;
    options.prefix_len = 48 + static_cast<int>(rng() % 32);
    options.suffix_len = 48 + static_cast<int>(rng() % 32);
    options.seed = rng();
    SCOPED_TRACE(name);
    auto prompts = MakePrefixRepetitionDataset(**tokenizer, options);
    ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
    CheckPrefixRepetition(**tokenizer, options, *prompts, /*length_tolerance=*/4);
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << "no BPE tokenizer fixture under " << fixtures;
}

TEST(PrefixRepetitionDatasetTest, BadOptionsAreNamed) {
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  const auto expect_error = [&](const PrefixRepetitionOptions& options, const std::string& flag) {
    auto prompts = MakePrefixRepetitionDataset(*tokenizer, options);
    ASSERT_FALSE(prompts.ok()) << flag;
    EXPECT_EQ(prompts.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(prompts.status().message().find(flag), std::string::npos)
        << prompts.status().message();
  };
  PrefixRepetitionOptions options;
  options.num_prompts = 20;
  options.prefix_len = 8;
  options.suffix_len = 8;
  ASSERT_TRUE(MakePrefixRepetitionDataset(*tokenizer, options).ok());
  for (int bad : {0, -3}) {
    PrefixRepetitionOptions broken = options;
    broken.prefix_len = bad;
    expect_error(broken, "--prefix-repetition-prefix-len");
    broken = options;
    broken.suffix_len = bad;
    expect_error(broken, "--prefix-repetition-suffix-len");
    broken = options;
    broken.output_len = bad;
    expect_error(broken, "--prefix-repetition-output-len");
    broken = options;
    broken.num_prefixes = bad;
    expect_error(broken, "--prefix-repetition-num-prefixes");
    broken = options;
    broken.num_prompts = bad;
    expect_error(broken, "--num-prompts");
  }
  options.num_prefixes = 21;  // more prefixes than prompts
  expect_error(options, "--prefix-repetition-num-prefixes (21)");
  options.num_prefixes = 20;  // one prompt each
  auto one_each = MakePrefixRepetitionDataset(*tokenizer, options);
  ASSERT_TRUE(one_each.ok());
  std::set<int> groups;
  for (const BenchPrompt& prompt : *one_each) groups.insert(prompt.prefix_group);
  EXPECT_EQ(groups.size(), 20u);
}

// The random dataset's prompts share no prefix: no prefix cache hit between two of them.
TEST(RandomDatasetTest, PromptsShareNoPrefix) {
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto rng = ::sieve::testing::MakeRng();
  RandomDatasetOptions options;
  options.num_prompts = 50;
  options.input_len = 64;
  options.seed = rng();
  auto prompts = MakeRandomDataset(*tokenizer, options);
  ASSERT_TRUE(prompts.ok());
  for (size_t a = 0; a < prompts->size(); ++a) {
    EXPECT_EQ((*prompts)[a].prefix_group, -1);
    for (size_t b = a + 1; b < prompts->size(); ++b) {
      EXPECT_LT(CommonPrefix((*prompts)[a].prompt, (*prompts)[b].prompt), 8u);
    }
  }
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("sieve_bench_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

TEST(JsonlDatasetTest, ReadsDefaultsRepeatsAndNamesBadLines) {
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  const std::string path = TempPath("prompts.jsonl");
  {
    std::ofstream file(path);
    file << R"({"prompt": "hello", "output_len": 3})"
         << "\n\n"
         << R"({"prompt": "ab"})"
         << "\n";
  }
  auto all = LoadJsonlDataset(path, *tokenizer, 9, 0);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].prompt_len, 5);
  EXPECT_EQ((*all)[0].output_len, 3);
  EXPECT_EQ((*all)[1].output_len, 9);
  auto repeated = LoadJsonlDataset(path, *tokenizer, 9, 5);
  ASSERT_TRUE(repeated.ok());
  ASSERT_EQ(repeated->size(), 5u);
  EXPECT_EQ((*repeated)[4].prompt, "hello");
  {
    std::ofstream file(path);
    file << R"({"prompt": "ok"})"
         << "\n"
         << R"({"text": "no prompt"})"
         << "\n";
  }
  auto bad = LoadJsonlDataset(path, *tokenizer, 9, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path + ":2"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(LoadJsonlDataset(path + ".missing", *tokenizer, 9, 0).ok());
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------------
// The SVG chart

int CountOf(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(SvgWriterTest, EscapesTextAndClosesTheDocument) {
  EXPECT_EQ(XmlEscape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
  const std::string text = SvgText(10, 20, "x < y", 11, "start");
  EXPECT_NE(text.find("x &lt; y"), std::string::npos);
  EXPECT_NE(text.find("text-anchor=\"start\""), std::string::npos);
  EXPECT_NE(SvgHeader(300, 200).find("viewBox=\"0 0 300 200\""), std::string::npos);
  EXPECT_STRNE(SeriesColor(0), SeriesColor(1));
  EXPECT_STREQ(SeriesColor(0), SeriesColor(8));  // the palette cycles
}

TEST(SvgWriterTest, PanelDrawsOnePolylinePerCurveAndSkipsMissingPoints) {
  const std::vector<double> x = {1, 10, 100};
  const std::string svg = LinePanelSvg({50, 50, 400, 300}, "t", "concurrency", x, true,
                                       {{"a", "#111111", false, {1, 2, 3}},
                                        {"b", "#222222", true, {4, NAN, 6}},
                                        {"", "#333333", false, {7, 8, 9}}});
  EXPECT_EQ(CountOf(svg, "class=\"series\""), 3);
  EXPECT_EQ(CountOf(svg, "<circle"), 3 + 2 + 3);
  EXPECT_EQ(CountOf(svg, "stroke-dasharray"), 2);  // b's curve and its legend sample
  EXPECT_NE(svg.find("concurrency (log scale)"), std::string::npos);
  EXPECT_EQ(svg.find(">nan<"), std::string::npos);
}

std::vector<SweepLevel> FakeLevels(double scale) {
  std::vector<SweepLevel> levels;
  for (int concurrency : kPerfConcurrencyLevels) {
    SweepLevel level;
    level.concurrency = concurrency;
    level.metrics.completed = 10;
    level.metrics.output_throughput = scale * 100 * std::sqrt(concurrency);
    level.metrics.ttft_ms.median = 50.0 * concurrency;
    level.metrics.ttft_ms.p99 = 80.0 * concurrency;
    levels.push_back(level);
  }
  return levels;
}

TEST(PlotTest, ChartIsSvgWithEveryCurve) {
  const std::string chart =
      SweepChartSvg({{"dense", FakeLevels(1.0)}, {"snapkv", FakeLevels(1.6)}}, "4000 in / 500 out");
  EXPECT_EQ(chart.rfind("<?xml", 0), 0u);
  EXPECT_NE(chart.find("width=\"1200\" height=\"560\""), std::string::npos);
  EXPECT_EQ(chart.substr(chart.size() - 7), "</svg>\n");
  // Throughput per series, TTFT P50 and P99 per series.
  EXPECT_EQ(CountOf(chart, "class=\"series\""), 2 + 4);
  EXPECT_GE(CountOf(chart, "#1f77b4"), 3);  // first series
  EXPECT_GE(CountOf(chart, "#ff7f0e"), 3);  // second series
  for (const char* text : {"4000 in / 500 out", "output tokens/s", "TTFT (ms)", "dense P99",
                           "snapkv", "concurrency (log scale)", ">128<"}) {
    EXPECT_NE(chart.find(text), std::string::npos) << text;
  }
}

TEST(PlotTest, SeriesFromSweepJson) {
  nlohmann::json json;
  json["label"] = "run";
  json["levels"] = nlohmann::json::array();
  for (int concurrency : {10, 1}) {
    BenchMetrics metrics;
    metrics.output_throughput = concurrency * 3.0;
    json["levels"].push_back({{"concurrency", concurrency}, {"metrics", MetricsToJson(metrics)}});
  }
  auto series = SweepSeriesFromJson(json, "fallback");
  ASSERT_TRUE(series.ok());
  EXPECT_EQ(series->label, "run");
  ASSERT_EQ(series->levels.size(), 2u);
  EXPECT_EQ(series->levels[0].concurrency, 1);  // sorted
  EXPECT_DOUBLE_EQ(series->levels[1].metrics.output_throughput, 30);
  EXPECT_FALSE(SweepSeriesFromJson(nlohmann::json::object(), "x").ok());
}

// ---------------------------------------------------------------------------------------------
// Whole runs against the fake server

ServingLoadOptions LoadOptions(const FakeOpenAiServer& server, const std::string& endpoint) {
  ServingLoadOptions options;
  options.base_url = *ParseHttpUrl(server.base_url());
  options.endpoint = endpoint;
  options.body.api = ApiKindForEndpoint(endpoint);
  options.body.model = "fake-model";
  return options;
}

std::vector<BenchPrompt> Prompts(int count, int output_len) {
  std::vector<BenchPrompt> prompts;
  for (int index = 0; index < count; ++index) {
    prompts.push_back({"prompt " + std::to_string(index), 8, output_len});
  }
  return prompts;
}

// Timing bounds: at least what the server waited, at most that plus scheduling slack for a loaded
// CI machine. Under the sanitizers (CI's asan and tsan presets) every thread runs several times
// slower and shares two cores with another sanitized test, where TTFTs of several times the
// server's delay were seen: there the slack is wide, and the test checks the bookkeeping.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
constexpr double kSlackMs = kSanitized ? 2000 : 150;

void ExpectTimingsMatchServer(const std::vector<RequestRecord>& records, int tokens,
                              const FakeServerOptions& server) {
  const double first_ms = static_cast<double>(server.first_token_delay.count());
  const double gap_ms = static_cast<double>(server.token_delay.count());
  for (const RequestRecord& record : records) {
    ASSERT_TRUE(record.success) << record.error;
    EXPECT_GE(record.ttft_s * 1000, first_ms - 1);
    EXPECT_LE(record.ttft_s * 1000, first_ms + kSlackMs);
    ASSERT_EQ(record.itl_s.size(), static_cast<size_t>(tokens - 1));
    // One gap can be shorter than the server's delay when the chunk before it reached the client
    // late (a loaded machine), so only their sum is bounded below.
    double itl_sum = 0;
    for (double gap : record.itl_s) {
      EXPECT_GE(gap, 0.0);
      itl_sum += gap;
    }
    EXPECT_GE(itl_sum * 1000, (tokens - 1) * gap_ms - kSlackMs);
    EXPECT_LE(itl_sum * 1000 / (tokens - 1), gap_ms + kSlackMs / 3);
    // TPOT is what is left of the request after its first token, so a first token that reached
    // the client late shortens it as it does the gap after it: bounded below like their sum.
    const double tpot_ms = (record.e2e_s - record.ttft_s) / (tokens - 1) * 1000;
    EXPECT_GE(tpot_ms * (tokens - 1), (tokens - 1) * gap_ms - kSlackMs);
    EXPECT_LE(tpot_ms, gap_ms + kSlackMs / 3);
    EXPECT_GE(record.e2e_s * 1000, first_ms + (tokens - 1) * gap_ms - 1);
  }
}

TEST(FakeServerTest, CompletionsTimingsAndUsage) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 6;
  server_options.first_token_delay = std::chrono::milliseconds(60);
  server_options.token_delay = std::chrono::milliseconds(25);
  FakeOpenAiServer server(server_options);
  ServingLoadOptions options = LoadOptions(server, "/v1/completions");
  options.max_concurrency = 2;
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto result = RunServingLoad(options, Prompts(6, 50), *tokenizer, nullptr);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ExpectTimingsMatchServer(result->records, 6, server_options);
  std::string expected_text;
  for (int index = 0; index < 6; ++index) expected_text += FakeOpenAiServer::TokenText(index);
  for (const RequestRecord& record : result->records) {
    EXPECT_EQ(record.output_tokens, 6);
    EXPECT_TRUE(record.output_tokens_from_usage);
    EXPECT_EQ(record.generated_text, expected_text);
    EXPECT_EQ(record.output_len_requested, 50);
  }
  const BenchMetrics metrics = ComputeMetrics(result->records, result->duration_s);
  EXPECT_EQ(metrics.completed, 6);
  EXPECT_LE(metrics.peak_concurrent_requests, 2);  // the cap held
  // Three waves of two, each at least 60 + 5 x 25 ms.
  EXPECT_GE(result->duration_s, 3 * 0.185);
  EXPECT_NEAR(metrics.tpot_ms.median, 25, kSlackMs / 3);
  EXPECT_EQ(server.last_request_body()["stream_options"]["include_usage"], true);
  EXPECT_EQ(server.last_request_body()["max_tokens"], 50);
}

TEST(FakeServerTest, ChatWithoutUsageCountsTokensByReTokenising) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 5;
  server_options.send_usage = false;
  server_options.first_token_delay = std::chrono::milliseconds(80);
  server_options.token_delay = std::chrono::milliseconds(10);
  FakeOpenAiServer server(server_options);
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto result = RunServingLoad(LoadOptions(server, "/v1/chat/completions"), Prompts(3, 5),
                               *tokenizer, nullptr);
  ASSERT_TRUE(result.ok());
  // The role-only chunk came at once; TTFT waits for the first text.
  ExpectTimingsMatchServer(result->records, 5, server_options);
  for (const RequestRecord& record : result->records) {
    EXPECT_FALSE(record.output_tokens_from_usage);
    EXPECT_EQ(record.output_tokens, static_cast<int64_t>(record.generated_text.size()));  // bytes
  }
  const std::string content = server.last_request_body()["messages"][0]["content"];
  EXPECT_EQ(content.rfind("prompt ", 0), 0u) << content;
}

TEST(FakeServerTest, EventsSplitAcrossHttpChunks) {
  FakeServerOptions server_options;
  server_options.split_events = true;
  server_options.max_tokens_cap = 4;
  server_options.first_token_delay = std::chrono::milliseconds(30);
  server_options.token_delay = std::chrono::milliseconds(15);
  FakeOpenAiServer server(server_options);
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto result =
      RunServingLoad(LoadOptions(server, "/v1/completions"), Prompts(4, 9), *tokenizer, nullptr);
  ASSERT_TRUE(result.ok());
  ExpectTimingsMatchServer(result->records, 4, server_options);
  for (const RequestRecord& record : result->records) EXPECT_EQ(record.output_tokens, 4);
}

TEST(FakeServerTest, PoissonArrivalsAreFollowed) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 2;
  server_options.first_token_delay = std::chrono::milliseconds(5);
  server_options.token_delay = std::chrono::milliseconds(5);
  FakeOpenAiServer server(server_options);
  ServingLoadOptions options = LoadOptions(server, "/v1/completions");
  options.request_rate = 40;
  options.seed = 5;
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto result = RunServingLoad(options, Prompts(20, 2), *tokenizer, nullptr);
  ASSERT_TRUE(result.ok());
  const std::vector<double> arrivals = MakeArrivalTimes(20, 40, 1.0, 5);
  for (size_t index = 0; index < arrivals.size(); ++index) {
    const RequestRecord& record = result->records[index];
    EXPECT_TRUE(record.success) << record.error;
    EXPECT_DOUBLE_EQ(record.arrival_s, arrivals[index]);
    EXPECT_GE(record.start_s, arrivals[index]);
    EXPECT_LE(record.start_s, arrivals[index] + 0.1);  // no cap: sent when released
  }
  EXPECT_GE(result->duration_s, arrivals.back());
}

TEST(FakeServerTest, FailuresAreCountedWithTheirMessages) {
  FakeServerOptions server_options;
  server_options.fail_every = 2;
  server_options.max_tokens_cap = 2;
  server_options.first_token_delay = std::chrono::milliseconds(1);
  FakeOpenAiServer server(server_options);
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto result =
      RunServingLoad(LoadOptions(server, "/v1/completions"), Prompts(6, 2), *tokenizer, nullptr);
  ASSERT_TRUE(result.ok());
  const BenchMetrics metrics = ComputeMetrics(result->records, result->duration_s);
  EXPECT_EQ(metrics.failed, 3);
  EXPECT_EQ(metrics.completed, 3);
  const nlohmann::json errors = SummarizeErrors(result->records, 5);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["count"], 3);
  const std::string message = errors[0]["message"];
  EXPECT_NE(message.find("HTTP 500"), std::string::npos) << message;
  EXPECT_NE(message.find("injected failure"), std::string::npos) << message;
}

int FreePort() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(
      io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  return acceptor.local_endpoint().port();  // closed on return: nothing listens there now
}

TEST(BenchServeTest, ConnectionRefusedIsAClearError) {
  ServeConfig config;
  config.client.base_url = "http://127.0.0.1:" + std::to_string(FreePort());
  config.client.progress = false;
  config.dataset.num_prompts = 2;
  const Status status = RunBenchServe(config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cannot reach the server"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("refused"), std::string::npos) << status.message();
}

TEST(BenchServeTest, WrongEndpointFailsOnTheTestRequest) {
  FakeOpenAiServer server(FakeServerOptions{});
  ServeConfig config;
  config.client.base_url = server.base_url();
  config.client.endpoint = "/v1/nothing";
  config.client.progress = false;
  config.dataset.num_prompts = 3;
  config.dataset.input_len = 8;
  const Status status = RunBenchServe(config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("test request failed: HTTP 404"), std::string::npos)
      << status.message();
  EXPECT_EQ(server.generation_requests(), 0);
}

TEST(BenchServeTest, WritesTheResultJson) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 5;
  server_options.first_token_delay = std::chrono::milliseconds(20);
  server_options.token_delay = std::chrono::milliseconds(10);
  FakeOpenAiServer server(server_options);
  ServeConfig config;
  config.client.base_url = server.base_url();
  config.client.progress = false;
  config.client.warmup = 2;
  config.client.ignore_eos = true;
  config.client.label = "fake";
  config.client.metadata = {"gpu=none", "policy=snapkv"};
  config.client.result_json = TempPath("serve.json");
  config.client.save_texts = true;
  config.dataset.num_prompts = 8;
  config.dataset.input_len = 40;
  config.dataset.output_len = 5;
  config.max_concurrency = 4;
  ASSERT_TRUE(RunBenchServe(config).ok());
  // One test request, two warmups, eight measured.
  EXPECT_EQ(server.generation_requests(), 11);
  EXPECT_EQ(server.last_request_body()["ignore_eos"], true);
  EXPECT_EQ(server.last_request_body()["model"], "fake-model");  // from /v1/models
  auto json = ReadJsonFile(config.client.result_json);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ((*json)["kind"], "sieve_bench_serve");
  EXPECT_EQ((*json)["label"], "fake");
  EXPECT_EQ((*json)["metadata"]["policy"], "snapkv");
  EXPECT_FALSE((*json)["date"].get<std::string>().empty());
  EXPECT_EQ((*json)["server"]["models"]["data"][0]["id"], "fake-model");
  EXPECT_EQ((*json)["server"]["version"]["version"], "fake-1.0");
  EXPECT_EQ((*json)["server"]["metrics_info"][0],
            "fake_server_info{kv_policy=\"snapkv\",max_num_seqs=\"64\"} 1");
  EXPECT_EQ((*json)["config"]["max_concurrency"], 4);
  EXPECT_EQ((*json)["config"]["dataset"]["input_len"], 40);
  EXPECT_EQ((*json)["config"]["client"]["model"], "fake-model");
  const nlohmann::json& metrics = (*json)["metrics"];
  EXPECT_EQ(metrics["completed"], 8);
  EXPECT_EQ(metrics["failed"], 0);
  EXPECT_EQ(metrics["total_input_tokens"], 8 * 40);
  EXPECT_EQ(metrics["total_output_tokens"], 8 * 5);
  EXPECT_GE(metrics["median_ttft_ms"].get<double>(), 19);
  EXPECT_NEAR(metrics["median_tpot_ms"].get<double>(), 10, kSlackMs / 3);
  ASSERT_EQ((*json)["requests"].size(), 8u);
  EXPECT_EQ((*json)["requests"][0]["itl_ms"].size(), 4u);
  EXPECT_EQ((*json)["requests"][0]["generated_text"], "tok0 tok1 tok2 tok3 tok4 ");
  EXPECT_TRUE((*json)["errors"].empty());
  // The fake server exposes no prefix-cache counters here.
  ASSERT_TRUE(json->contains("prefix_cache"));
  EXPECT_TRUE((*json)["prefix_cache"].is_null());
  std::filesystem::remove(config.client.result_json);
}

// ---------------------------------------------------------------------------------------------
// The prefix cache's hit rate

TEST(PrefixCacheTest, CountersAreSummedOverSeriesVllmsFirst) {
  auto rng = ::sieve::testing::MakeRng();
  const int64_t q0 = static_cast<int64_t>(rng() % 100000);
  const int64_t q1 = static_cast<int64_t>(rng() % 100000);
  const int64_t h0 = static_cast<int64_t>(rng() % 1000);
  const std::string text =
      "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n"
      "# TYPE vllm:prefix_cache_queries_total counter\n"
      "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} " +
      std::to_string(q0) + ".0\n" +
      "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} " + std::to_string(q1) +
      "\n" +
      "vllm:prefix_cache_queries_created{engine=\"0\",model_name=\"m\"} 1.7e+09\n"
      "vllm:prefix_cache_queries_total_other 5\n"  // another name that starts with the same
      "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} " +
      std::to_string(h0) + "\r\n" +
      "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 2.5e+01 1700000000\n" +
      "sieve:prefix_cache_queries_total 1\nsieve:prefix_cache_hits_total 1\n";
  const auto counters = ParsePrefixCacheCounters(text);
  ASSERT_TRUE(counters.has_value());
  EXPECT_EQ(counters->family, "vllm");
  EXPECT_DOUBLE_EQ(counters->queries, static_cast<double>(q0 + q1));
  EXPECT_DOUBLE_EQ(counters->hits, static_cast<double>(h0) + 25);
  // Only Sieve's own names: those.
  const auto sieve_only = ParsePrefixCacheCounters(
      "sieve:prefix_cache_queries_total{model_name=\"m\"} 40\n"
      "sieve:prefix_cache_hits_total{model_name=\"m\"} 10\n");
  ASSERT_TRUE(sieve_only.has_value());
  EXPECT_EQ(sieve_only->family, "sieve");
  EXPECT_DOUBLE_EQ(sieve_only->queries, 40);
  EXPECT_DOUBLE_EQ(sieve_only->hits, 10);
  // Half a pair, none, or a value that is no number: not reported.
  EXPECT_FALSE(ParsePrefixCacheCounters("vllm:prefix_cache_queries_total 40\n").has_value());
  EXPECT_FALSE(ParsePrefixCacheCounters("fake_requests_total 3\n").has_value());
  EXPECT_FALSE(ParsePrefixCacheCounters("vllm:prefix_cache_queries_total NaN\n"
                                        "vllm:prefix_cache_hits_total 1\n")
                   .has_value());
}

TEST(PrefixCacheTest, HitRateIsTheRunsDeltas) {
  auto rng = ::sieve::testing::MakeRng();
  const double queries_before = static_cast<double>(rng() % 1000000);
  const double hits_before = static_cast<double>(rng() % 1000);
  const double queries = 1 + static_cast<double>(rng() % 100000);
  const double hits = std::floor(queries * static_cast<double>(rng() % 1001) / 1000);
  const PrefixCacheCounters before{queries_before, hits_before, "vllm"};
  const PrefixCacheCounters after{queries_before + queries, hits_before + hits, "vllm"};
  const PrefixCacheRun run = PrefixCacheOfRun(before, after);
  ASSERT_TRUE(run.reported);
  EXPECT_DOUBLE_EQ(run.queries, queries);
  EXPECT_DOUBLE_EQ(run.hits, hits);
  ASSERT_TRUE(run.hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*run.hit_rate, hits / queries);
  const std::string line = FormatPrefixCacheLine(run);
  EXPECT_NE(line.find(fmt::format("Prefix cache hit rate: {:.2f}%", 100 * hits / queries)),
            std::string::npos)
      << line;
  EXPECT_NE(line.find(fmt::format("{:.0f} of {:.0f} prompt tokens", hits, queries)),
            std::string::npos)
      << line;
  const nlohmann::json json = PrefixCacheJson(run);
  EXPECT_DOUBLE_EQ(json["hit_rate"].get<double>(), hits / queries);
  EXPECT_DOUBLE_EQ(json["queries"].get<double>(), queries);
  EXPECT_EQ(json["metrics"][0], "vllm:prefix_cache_hits_total");
  // Not exposed before or after: said so, and null in the JSON.
  for (const PrefixCacheRun& missing :
       {PrefixCacheOfRun(std::nullopt, after), PrefixCacheOfRun(before, std::nullopt)}) {
    EXPECT_FALSE(missing.reported);
    EXPECT_EQ(FormatPrefixCacheLine(missing), "prefix cache: not reported by the server\n");
    EXPECT_TRUE(PrefixCacheJson(missing).is_null());
  }
  // No lookups, or counters that fell (a restart): reported, but no rate.
  const PrefixCacheRun idle = PrefixCacheOfRun(before, before);
  EXPECT_TRUE(idle.reported);
  EXPECT_FALSE(idle.hit_rate.has_value());
  EXPECT_NE(FormatPrefixCacheLine(idle).find("no lookups"), std::string::npos);
  EXPECT_TRUE(PrefixCacheJson(idle)["hit_rate"].is_null());
  const PrefixCacheRun restarted = PrefixCacheOfRun(after, PrefixCacheCounters{5, 1, "vllm"});
  EXPECT_TRUE(restarted.reported);
  EXPECT_FALSE(restarted.hit_rate.has_value());
}

// The hits a prefix cache of whole prompts scores on `prompts` in order (the fake server's rule,
// computed apart from it): each prompt's longest common prefix with any before it.
int64_t LongestPrefixHits(const std::vector<std::string>& prompts, size_t from) {
  int64_t hits = 0;
  for (size_t index = from; index < prompts.size(); ++index) {
    size_t longest = 0;
    for (size_t earlier = 0; earlier < index; ++earlier) {
      longest = std::max(longest, CommonPrefix(prompts[index], prompts[earlier]));
    }
    hits += static_cast<int64_t>(longest);
  }
  return hits;
}

TEST(BenchServeTest, PrefixRepetitionRunReportsTheServersHitRate) {
  auto rng = ::sieve::testing::MakeRng();
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 2;
  server_options.first_token_delay = std::chrono::milliseconds(1);
  server_options.token_delay = std::chrono::milliseconds(1);
  server_options.prefix_cache_metrics = true;
  // A server that served before the benchmark: the run's share is the counters' difference.
  server_options.prefix_cache_initial_queries = 100000 + static_cast<int64_t>(rng() % 100000);
  server_options.prefix_cache_initial_hits = static_cast<int64_t>(rng() % 50000);
  FakeOpenAiServer server(server_options);
  ServeConfig config;
  config.client.base_url = server.base_url();
  config.client.progress = false;
  config.client.warmup = 3;
  config.client.result_json = TempPath("prefix.json");
  config.dataset.name = "prefix_repetition";  // vLLM's spelling
  config.dataset.num_prompts = 24;
  config.dataset.num_prefixes = 4;
  config.dataset.prefix_len = 48 + static_cast<int>(rng() % 64);
  config.dataset.suffix_len = 16 + static_cast<int>(rng() % 64);
  config.dataset.prefix_output_len = 2;
  config.dataset.seed = rng();
  config.max_concurrency = 4;
  ASSERT_TRUE(RunBenchServe(config).ok());
  const std::vector<std::string> prompts = server.prompts();
  ASSERT_EQ(prompts.size(), 1u + 3u + 24u);  // the test request, the warm-up, the run
  const size_t first_measured = 4;
  auto json = ReadJsonFile(config.client.result_json);
  ASSERT_TRUE(json.ok());
  const nlohmann::json& metrics = (*json)["metrics"];
  EXPECT_EQ(metrics["completed"], 24);
  EXPECT_EQ(metrics["total_input_tokens"],
            24 * (config.dataset.prefix_len + config.dataset.suffix_len));
  EXPECT_EQ((*json)["config"]["dataset"]["name"], "prefix-repetition");
  EXPECT_EQ((*json)["config"]["dataset"]["num_prefixes"], 4);
  EXPECT_EQ((*json)["config"]["dataset"]["prefix_len"], config.dataset.prefix_len);
  const nlohmann::json& cache = (*json)["prefix_cache"];
  ASSERT_TRUE(cache.is_object()) << json->dump();
  // One byte a token on both sides: the run looked up its own prompts' tokens, no more.
  EXPECT_EQ(cache["queries"].get<double>(), metrics["total_input_tokens"].get<double>());
  const int64_t hits = LongestPrefixHits(prompts, first_measured);
  EXPECT_EQ(cache["hits"].get<double>(), static_cast<double>(hits));
  EXPECT_DOUBLE_EQ(cache["hit_rate"].get<double>(),
                   static_cast<double>(hits) / cache["queries"].get<double>());
  // All but the first prompt of each of the 4 prefixes finds its prefix cached (the warm-up had
  // prefixes of its own); the random suffixes add a few bytes at most.
  const double prompt_len = config.dataset.prefix_len + config.dataset.suffix_len;
  const double expected = 20.0 * config.dataset.prefix_len / (24 * prompt_len);
  EXPECT_GE(cache["hit_rate"].get<double>(), expected);
  EXPECT_LE(cache["hit_rate"].get<double>(), expected + 0.05);
  // The measured prompts share nothing long with the test request's and the warm-up's.
  for (size_t index = first_measured; index < prompts.size(); ++index) {
    for (size_t earlier = 0; earlier < first_measured; ++earlier) {
      EXPECT_LT(CommonPrefix(prompts[index], prompts[earlier]), 16u);
    }
  }
  std::filesystem::remove(config.client.result_json);
}

// The existing rule for every dataset: the test request and the warm-up hold no measured prompt
// in a prefix cache, and each sweep level draws prompts of its own.
TEST(BenchSweepTest, LevelsAndWarmupDrawApartForEveryDataset) {
  auto rng = ::sieve::testing::MakeRng();
  for (const char* name : {"random", "prefix-repetition"}) {
    SCOPED_TRACE(name);
    FakeServerOptions server_options;
    server_options.max_tokens_cap = 1;
    server_options.first_token_delay = std::chrono::milliseconds(1);
    server_options.prefix_cache_metrics = true;
    FakeOpenAiServer server(server_options);
    SweepConfig config;
    config.client.base_url = server.base_url();
    config.client.progress = false;
    config.client.warmup = 2;
    config.client.result_json = TempPath("apart.json");
    config.concurrency = {1, 2};
    config.num_prompts_per_level = {6};
    config.dataset.name = name;
    config.dataset.input_len = 40;
    config.dataset.output_len = 1;
    config.dataset.num_prefixes = 2;
    config.dataset.prefix_len = 32;
    config.dataset.suffix_len = 8;
    config.dataset.prefix_output_len = 1;
    config.dataset.seed = rng();
    ASSERT_TRUE(RunBenchSweep(config).ok());
    // Test request, warm-up (2), level 1 (6), warm-up again (2), level 2 (6).
    const std::vector<std::string> prompts = server.prompts();
    ASSERT_EQ(prompts.size(), 17u);
    const std::vector<std::pair<size_t, size_t>> levels = {{3, 9}, {11, 17}};
    for (const auto& [begin, end] : levels) {
      for (size_t index = begin; index < end; ++index) {
        for (size_t earlier = 0; earlier < begin; ++earlier) {
          EXPECT_LT(CommonPrefix(prompts[index], prompts[earlier]), 16u)
              << "prompt " << index << " and " << earlier;
        }
      }
    }
    auto json = ReadJsonFile(config.client.result_json);
    ASSERT_TRUE(json.ok());
    for (const nlohmann::json& level : (*json)["levels"]) {
      const nlohmann::json& cache = level["prefix_cache"];
      ASSERT_TRUE(cache.is_object());
      // random: nothing shared; prefix-repetition: 2 prefixes of 32 bytes, 3 prompts each.
      if (std::string(name) == "random") {
        EXPECT_LT(cache["hit_rate"].get<double>(), 0.1);
      } else {
        EXPECT_GE(cache["hit_rate"].get<double>(), 4.0 * 32 / (6 * 40));
      }
    }
    std::filesystem::remove(config.client.result_json);
  }
}

// The sweep table's bound columns: the fraction of the bound on every level with one, and a
// column of the fraction of the roofline only when some level's roofline is below its bound.
TEST(BenchSweepTest, TableShowsTheRooflineWhereItIsBelowTheBound) {
  auto rng = ::sieve::testing::MakeRng();
  std::vector<SweepLevel> levels(2);
  levels[0].concurrency = 64;
  levels[1].concurrency = 256;
  for (SweepLevel& level : levels) {
    level.metrics.output_throughput = 1000 + static_cast<double>(rng() % 1000);
    level.bound_output_throughput = 2.5 * level.metrics.output_throughput;
    level.roofline_output_throughput = level.bound_output_throughput;
  }
  const auto rows = [](const std::string& table) {
    std::vector<std::string> lines;
    for (size_t at = 0, end; (end = table.find('\n', at)) != std::string::npos; at = end + 1)
      lines.push_back(table.substr(at, end - at));
    return lines;
  };
  std::string table = FormatSweepTable(levels);
  EXPECT_EQ(table.find("of roofline"), std::string::npos) << table;
  EXPECT_NE(table.find("| 40% |"), std::string::npos) << table;
  // Past the ridge the roofline is lower: its level shows the fraction of it, the other a blank.
  levels[1].roofline_output_throughput = 0.5 * levels[1].bound_output_throughput;
  table = FormatSweepTable(levels);
  const std::vector<std::string> lines = rows(table);
  ASSERT_EQ(lines.size(), 4u) << table;
  EXPECT_NE(lines[0].find("| of bound | of roofline |"), std::string::npos) << table;
  EXPECT_EQ(CountOf(lines[1], "|"), CountOf(lines[0], "|")) << table;
  EXPECT_EQ(CountOf(lines[2], "|"), CountOf(lines[0], "|")) << table;
  EXPECT_TRUE(lines[2].ends_with("| 40% | |")) << table;
  EXPECT_TRUE(lines[3].ends_with("| 40% | 80% |")) << table;
}

TEST(BenchSweepTest, TableJsonAndPlot) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 3;
  server_options.first_token_delay = std::chrono::milliseconds(5);
  server_options.token_delay = std::chrono::milliseconds(5);
  FakeOpenAiServer server(server_options);
  SweepConfig config;
  config.client.base_url = server.base_url();
  config.client.progress = false;
  config.client.result_json = TempPath("sweep.json");
  config.plot = TempPath("sweep.png");
  EXPECT_FALSE(RunBenchSweep(config).ok());  // the chart is SVG: a .png name is refused first
  EXPECT_EQ(server.generation_requests(), 0);
  config.plot = TempPath("sweep.svg");
  config.concurrency = {1, 4};
  config.dataset.input_len = 16;
  config.dataset.output_len = 3;
  EXPECT_EQ(PromptsForLevel(config, 0), 10);  // C = 1
  config.concurrency = {1, 64};
  EXPECT_EQ(PromptsForLevel(config, 1), 128);
  config.num_prompts_per_level = {3, 0};  // one a level; 0: the default
  EXPECT_EQ(PromptsForLevel(config, 0), 3);
  EXPECT_EQ(PromptsForLevel(config, 1), 128);
  config.concurrency = {1, 4};
  config.num_prompts_per_level = {2, 5, 7};  // three counts for two levels
  EXPECT_FALSE(RunBenchSweep(config).ok());
  EXPECT_EQ(server.generation_requests(), 0);
  config.num_prompts_per_level = {4, 5};
  ASSERT_TRUE(RunBenchSweep(config).ok());
  EXPECT_EQ(server.generation_requests(), 1 + 4 + 5);
  auto json = ReadJsonFile(config.client.result_json);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ((*json)["kind"], "sieve_bench_sweep");
  ASSERT_EQ((*json)["levels"].size(), 2u);
  EXPECT_EQ((*json)["levels"][1]["concurrency"], 4);
  EXPECT_EQ((*json)["levels"][1]["metrics"]["completed"], 5);
  EXPECT_LE((*json)["levels"][1]["metrics"]["max_concurrent_requests"].get<int>(), 4);
  std::ifstream svg_file(config.plot, std::ios::binary);
  const std::string svg((std::istreambuf_iterator<char>(svg_file)), {});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(CountOf(svg, "class=\"series\""), 3);
  // `sieve bench plot` redraws it, here with a second copy overlaid.
  PlotConfig plot;
  plot.result_jsons = {config.client.result_json, config.client.result_json};
  plot.plot = TempPath("replot.svg");
  ASSERT_TRUE(RunBenchPlot(plot).ok());
  EXPECT_TRUE(std::filesystem::exists(plot.plot));
  plot.result_jsons = {TempPath("missing.json")};
  EXPECT_FALSE(RunBenchPlot(plot).ok());
  for (const std::string& path : {config.client.result_json, config.plot, plot.plot}) {
    std::filesystem::remove(path);
  }
}

// ---------------------------------------------------------------------------------------------
// The multi-turn dataset and conversations

TEST(MultiTurnDatasetTest, ExactLengthsSeededDistinctAndNamedErrors) {
  auto rng = ::sieve::testing::MakeRng();
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  MultiTurnOptions options;
  options.num_conversations = 5;
  options.num_turns = 4;
  options.first_len = 30 + static_cast<int>(rng() % 40);
  options.message_len = 5 + static_cast<int>(rng() % 20);
  options.output_len = 7;
  options.seed = rng();
  auto conversations = MakeMultiTurnDataset(*tokenizer, options);
  ASSERT_TRUE(conversations.ok()) << conversations.status().ToString();
  ASSERT_EQ(conversations->size(), 5u);
  std::set<std::string> messages;
  for (const BenchConversation& conversation : *conversations) {
    ASSERT_EQ(conversation.messages.size(), 4u);
    ASSERT_EQ(conversation.message_lens.size(), 4u);
    EXPECT_EQ(conversation.output_len, 7);
    for (size_t turn = 0; turn < 4; ++turn) {
      const int expected = turn == 0 ? options.first_len : options.message_len;
      // One token a byte: exact.
      EXPECT_EQ(conversation.message_lens[turn], expected);
      EXPECT_EQ(conversation.messages[turn].size(), static_cast<size_t>(expected));
      messages.insert(conversation.messages[turn]);
    }
  }
  EXPECT_EQ(messages.size(), 20u);  // every message its own
  auto again = MakeMultiTurnDataset(*tokenizer, options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->front().messages, conversations->front().messages);
  options.seed += 1;
  auto other = MakeMultiTurnDataset(*tokenizer, options);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->front().messages, conversations->front().messages);

  const auto expect_error = [&](const MultiTurnOptions& broken, const std::string& flag) {
    auto result = MakeMultiTurnDataset(*tokenizer, broken);
    ASSERT_FALSE(result.ok()) << flag;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(result.status().message().find(flag), std::string::npos) << result.status().message();
  };
  for (int bad : {0, -2}) {
    MultiTurnOptions broken = options;
    broken.num_turns = bad;
    expect_error(broken, "--multi-turn-num-turns");
    broken = options;
    broken.first_len = bad;
    expect_error(broken, "--multi-turn-first-len");
    broken = options;
    broken.message_len = bad;
    expect_error(broken, "--multi-turn-message-len");
    broken = options;
    broken.output_len = bad;
    expect_error(broken, "--multi-turn-output-len");
    broken = options;
    broken.num_conversations = bad;
    expect_error(broken, "--num-prompts");
  }
}

// Conversations of made-up messages: turn t's text is "c<conversation> t<turn> ".
std::vector<BenchConversation> Conversations(int count, int turns, int output_len) {
  std::vector<BenchConversation> conversations(static_cast<size_t>(count));
  for (int index = 0; index < count; ++index) {
    BenchConversation& conversation = conversations[static_cast<size_t>(index)];
    conversation.output_len = output_len;
    for (int turn = 0; turn < turns; ++turn) {
      conversation.messages.push_back(fmt::format("c{} t{} ", index, turn));
      conversation.message_lens.push_back(static_cast<int>(conversation.messages.back().size()));
    }
  }
  return conversations;
}

TEST(ConversationLoadTest, EachTurnIsTheLastPromptAndAnswerPlusAMessageSentInTurn) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 3;
  server_options.first_token_delay = std::chrono::milliseconds(15);
  server_options.token_delay = std::chrono::milliseconds(5);
  FakeOpenAiServer server(server_options);
  ServingLoadOptions options = LoadOptions(server, "/v1/completions");
  options.max_concurrency = 2;
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  const int kConversations = 3;
  const int kTurns = 4;
  const std::vector<BenchConversation> conversations = Conversations(kConversations, kTurns, 9);
  auto result = RunConversationLoad(options, conversations, *tokenizer, nullptr);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_EQ(result->records.size(), static_cast<size_t>(kConversations * kTurns));
  ASSERT_EQ(result->prompts.size(), result->records.size());
  EXPECT_EQ(server.generation_requests(), kConversations * kTurns);
  const std::string answer = FakeOpenAiServer::TokenText(0) + FakeOpenAiServer::TokenText(1) +
                             FakeOpenAiServer::TokenText(2);
  const std::vector<std::string> received = server.prompts();
  for (int c = 0; c < kConversations; ++c) {
    for (int t = 0; t < kTurns; ++t) {
      const size_t index = static_cast<size_t>(c * kTurns + t);
      const RequestRecord& record = result->records[index];
      ASSERT_TRUE(record.success) << record.error;
      EXPECT_EQ(record.conversation, c);
      EXPECT_EQ(record.turn, t);
      EXPECT_EQ(record.generated_text, answer);
      EXPECT_EQ(record.output_len_requested, 9);
      const std::string& prompt = result->prompts[index];
      EXPECT_EQ(record.prompt_len, static_cast<int>(prompt.size()));  // one token a byte
      // The server got exactly this prompt, once.
      EXPECT_EQ(std::count(received.begin(), received.end(), prompt), 1) << prompt;
      if (t == 0) {
        EXPECT_EQ(prompt, conversations[static_cast<size_t>(c)].messages[0]);
        continue;
      }
      const RequestRecord& before = result->records[index - 1];
      EXPECT_EQ(prompt, result->prompts[index - 1] + answer +
                            conversations[static_cast<size_t>(c)].messages[static_cast<size_t>(t)]);
      // Sent after the turn before had its whole answer, and in that order at the server.
      EXPECT_GE(record.start_s, before.start_s + before.e2e_s);
      EXPECT_GE(record.arrival_s, before.start_s + before.e2e_s);
      const auto at = std::find(received.begin(), received.end(), prompt);
      const auto before_at =
          std::find(received.begin(), received.end(), result->prompts[index - 1]);
      EXPECT_LT(before_at, at);
    }
  }
  const BenchMetrics metrics = ComputeMetrics(result->records, result->duration_s);
  EXPECT_EQ(metrics.completed, kConversations * kTurns);
  EXPECT_LE(metrics.peak_concurrent_requests, 2);
  // A conversation keeps its slot: the third starts only when one of the first two has ended.
  const auto end_of = [&](size_t index) {
    return result->records[index].start_s + result->records[index].e2e_s;
  };
  const double first_free = std::min(end_of(kTurns - 1), end_of(2 * kTurns - 1));
  EXPECT_GE(result->records[static_cast<size_t>(2 * kTurns)].start_s, first_free);
  const TurnSplit split = SplitTurns(result->records);
  EXPECT_EQ(split.first_turns, kConversations);
  EXPECT_EQ(split.later_turns, kConversations * (kTurns - 1));
  EXPECT_GT(split.first_ttft_ms.median, 0);
  EXPECT_NE(FormatTurnSplitLine(split).find("(n = 9)"), std::string::npos)
      << FormatTurnSplitLine(split);
  EXPECT_EQ(TurnSplitJson(split)["later_turns"], 9);
}

TEST(ConversationLoadTest, AFailedTurnEndsItsConversation) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 2;
  server_options.first_token_delay = std::chrono::milliseconds(1);
  server_options.token_delay = std::chrono::milliseconds(1);
  server_options.fail_every = 2;  // the second request: turn 1
  FakeOpenAiServer server(server_options);
  ServingLoadOptions options = LoadOptions(server, "/v1/completions");
  options.max_concurrency = 1;
  const auto tokenizer = MakeEmbeddedByteTokenizer();
  auto result = RunConversationLoad(options, Conversations(1, 4, 2), *tokenizer, nullptr);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_EQ(result->records.size(), 4u);
  EXPECT_EQ(server.generation_requests(), 2);
  EXPECT_TRUE(result->records[0].success);
  EXPECT_FALSE(result->records[1].success);
  EXPECT_NE(result->records[1].error.find("HTTP 500"), std::string::npos);
  for (size_t turn = 2; turn < 4; ++turn) {
    EXPECT_FALSE(result->records[turn].success);
    EXPECT_EQ(result->records[turn].error, "not sent: turn 1 of its conversation failed");
    EXPECT_TRUE(result->prompts[turn].empty());
  }
  const BenchMetrics metrics = ComputeMetrics(result->records, result->duration_s);
  EXPECT_EQ(metrics.completed, 1);
  EXPECT_EQ(metrics.failed, 3);
}

TEST(BenchServeTest, MultiTurnRunCountsEveryTurnAndHitsTheAnswers) {
  auto rng = ::sieve::testing::MakeRng();
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 2;
  server_options.first_token_delay = std::chrono::milliseconds(1);
  server_options.token_delay = std::chrono::milliseconds(1);
  server_options.prefix_cache_metrics = true;
  FakeOpenAiServer server(server_options);
  ServeConfig config;
  config.client.base_url = server.base_url();
  config.client.progress = false;
  config.client.warmup = 2;
  config.client.result_json = TempPath("multi_turn.json");
  config.dataset.name = "multi_turn";  // either spelling
  config.dataset.num_prompts = 3;
  config.dataset.num_turns = 3;
  config.dataset.first_len = 40 + static_cast<int>(rng() % 40);
  config.dataset.message_len = 8 + static_cast<int>(rng() % 8);
  config.dataset.multi_turn_output_len = 2;
  config.dataset.seed = rng();
  config.max_concurrency = 2;
  ASSERT_TRUE(RunBenchServe(config).ok());
  const std::vector<std::string> prompts = server.prompts();
  ASSERT_EQ(prompts.size(), 1u + 2u + 9u);  // the test request, the warm-up, 3 x 3 turns
  const size_t first_measured = 3;
  auto json = ReadJsonFile(config.client.result_json);
  ASSERT_TRUE(json.ok());
  const nlohmann::json& metrics = (*json)["metrics"];
  EXPECT_EQ(metrics["completed"], 9);
  EXPECT_EQ(metrics["failed"], 0);
  const nlohmann::json& dataset = (*json)["config"]["dataset"];
  EXPECT_EQ(dataset["name"], "multi-turn");
  EXPECT_EQ(dataset["num_prompts"], 3);
  EXPECT_EQ(dataset["num_turns"], 3);
  EXPECT_EQ(dataset["first_len"], config.dataset.first_len);
  EXPECT_EQ(dataset["message_len"], config.dataset.message_len);
  EXPECT_EQ((*json)["multi_turn"]["first_turns"], 3);
  EXPECT_EQ((*json)["multi_turn"]["later_turns"], 6);
  ASSERT_EQ((*json)["requests"].size(), 9u);
  // Input tokens (bytes): turn t's prompt is the first message, t answers and t messages.
  const int answer =
      static_cast<int>((FakeOpenAiServer::TokenText(0) + FakeOpenAiServer::TokenText(1)).size());
  int64_t input = 0;
  for (int turn = 0; turn < 3; ++turn) {
    input += config.dataset.first_len + turn * (answer + config.dataset.message_len);
  }
  EXPECT_EQ(metrics["total_input_tokens"], 3 * input);
  for (const nlohmann::json& request : (*json)["requests"]) {
    EXPECT_TRUE(request.contains("conversation"));
    EXPECT_EQ(request["prompt_len"],
              config.dataset.first_len +
                  request["turn"].get<int>() * (answer + config.dataset.message_len));
  }
  // A later turn finds the turn before's prompt and answer cached: all but its new message.
  const nlohmann::json& cache = (*json)["prefix_cache"];
  ASSERT_TRUE(cache.is_object()) << json->dump();
  EXPECT_EQ(cache["queries"].get<double>(), static_cast<double>(3 * input));
  EXPECT_EQ(cache["hits"].get<double>(),
            static_cast<double>(LongestPrefixHits(prompts, first_measured)));
  // Each conversation's turns 1 and 2 find turns 0's and 1's whole prompts: all but the last
  // turn's prompt, first_len + 2 x (answer + message_len); random bytes match a few more by chance.
  const double owed =
      3.0 * static_cast<double>(
                input - (config.dataset.first_len + 2 * (answer + config.dataset.message_len)));
  EXPECT_GE(cache["hits"].get<double>(), owed);
  EXPECT_LE(cache["hits"].get<double>(), owed + 9 * 16);
  // The measured conversations share nothing long with the test request's and the warm-up's.
  for (size_t index = first_measured; index < prompts.size(); ++index) {
    for (size_t earlier = 0; earlier < first_measured; ++earlier) {
      EXPECT_LT(CommonPrefix(prompts[index], prompts[earlier]), 16u);
    }
  }
  std::filesystem::remove(config.client.result_json);
}

TEST(BenchServeTest, MultiTurnBadFlagsAreNamedAndSweepRefusesIt) {
  FakeServerOptions server_options;
  server_options.max_tokens_cap = 2;
  server_options.first_token_delay = std::chrono::milliseconds(1);
  server_options.token_delay = std::chrono::milliseconds(1);
  FakeOpenAiServer server(server_options);
  ServeConfig config;
  config.client.base_url = server.base_url();
  config.client.progress = false;
  config.dataset.name = "multi-turn";
  config.dataset.num_prompts = 2;
  config.dataset.first_len = 8;
  config.dataset.message_len = 4;
  config.dataset.multi_turn_output_len = 2;
  config.dataset.num_turns = 0;
  Status status = RunBenchServe(config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--multi-turn-num-turns"), std::string::npos) << status.message();
  config.dataset.num_turns = 2;
  config.dataset.message_len = -1;
  status = RunBenchServe(config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--multi-turn-message-len"), std::string::npos)
      << status.message();
  EXPECT_EQ(server.generation_requests(), 0);  // refused before anything was sent
  SweepConfig sweep;
  sweep.client.base_url = server.base_url();
  sweep.client.progress = false;
  sweep.dataset.name = "multi_turn";
  status = RunBenchSweep(sweep);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("multi-turn is for `sieve bench serve`"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace sieve::bench
