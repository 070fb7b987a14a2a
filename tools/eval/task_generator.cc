#include "tools/eval/task_generator.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace sieve::eval {

namespace {

std::string RandomDigits(std::mt19937_64& rng, int digits) {
  uint64_t low = 1;
  for (int index = 1; index < digits; ++index) low *= 10;
  return std::to_string(std::uniform_int_distribution<uint64_t>(low, low * 10 - 1)(rng));
}

std::string RandomFrom(std::mt19937_64& rng, std::string_view alphabet, int count) {
  std::string out;
  for (int index = 0; index < count; ++index) {
    out += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
  }
  return out;
}

double Uniform(std::mt19937_64& rng) { return std::uniform_real_distribution<double>(0, 1)(rng); }

template <typename T>
const T& Pick(std::mt19937_64& rng, const std::vector<T>& items) {
  return items[std::uniform_int_distribution<size_t>(0, items.size() - 1)(rng)];
}

// Python's round(): to nearest, ties to even.
int RoundHalfEven(double value) { return static_cast<int>(std::nearbyint(value)); }

}  // namespace

const std::vector<std::string>& AllTaskNames() {
  static const std::vector<std::string> names = {
      "passkey",         "niah",          "niah-multikey",
      "niah-multivalue", "kv-retrieval",  "variable-tracking",
      "common-words",    "niah-two-turn", "perplexity",
      "jsonl",           "heldout"};
  return names;
}

bool IsSyntheticTask(std::string_view task) {
  return task != "perplexity" && task != "jsonl" && task != "heldout" &&
         std::find(AllTaskNames().begin(), AllTaskNames().end(), task) != AllTaskNames().end();
}

bool HasDepthAxis(std::string_view task) {
  return task == "passkey" || task == "niah" || task == "niah-multikey" || task == "kv-retrieval" ||
         task == "niah-two-turn";
}

std::mt19937_64 SampleRng(uint64_t seed, std::string_view task, int length,
                          std::optional<double> depth, int index) {
  const uint64_t task_hash = std::hash<std::string_view>{}(task);
  const int64_t depth_key = depth ? std::llround(*depth * 1e6) : -1;
  std::seed_seq sequence{static_cast<uint32_t>(seed),
                         static_cast<uint32_t>(seed >> 32),
                         static_cast<uint32_t>(task_hash),
                         static_cast<uint32_t>(task_hash >> 32),
                         static_cast<uint32_t>(length),
                         static_cast<uint32_t>(depth_key),
                         static_cast<uint32_t>(static_cast<uint64_t>(depth_key) >> 32),
                         static_cast<uint32_t>(index)};
  return std::mt19937_64(sequence);
}

std::string InsertAtDepths(const std::vector<std::string_view>& units,
                           const std::vector<std::pair<std::string, double>>& needles) {
  std::vector<std::string_view> out(units.begin(), units.end());
  std::vector<size_t> order(needles.size());
  for (size_t index = 0; index < order.size(); ++index) order[index] = index;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return needles[a].second > needles[b].second; });
  for (const size_t index : order) {
    const int at = RoundHalfEven(needles[index].second * static_cast<double>(units.size()));
    out.insert(out.begin() + std::clamp<int>(at, 0, static_cast<int>(out.size())),
               needles[index].first);
  }
  std::string text;
  for (const std::string_view piece : out) text += piece;
  return text;
}

TaskGenerator::TaskGenerator(const TaskSpec& spec, const Tokenizer& tokenizer,
                             std::vector<std::string> haystack)
    : spec_(spec), tokenizer_(tokenizer), haystack_(std::move(haystack)) {}

std::vector<std::string_view> TaskGenerator::Units(int n, bool natural, size_t start) const {
  std::vector<std::string_view> units;
  units.reserve(static_cast<size_t>(n));
  for (int index = 0; index < n; ++index) {
    units.push_back(natural ? std::string_view(haystack_[(start + index) % haystack_.size()])
                            : std::string_view(spec_.noise_sentence()));
  }
  return units;
}

Result<TaskGenerator::Fitted> TaskGenerator::Fit(const std::function<std::string(int)>& build,
                                                 int length, std::string_view task) const {
  const int cap = length + 1;  // every unit is at least a character: more never fits
  Fitted best;
  int lo = 1;   // fits
  int hi = -1;  // does not fit (-1: none seen yet)
  // Tokenizing is the cost here: a few probes near an estimate, then bisection.
  const auto probe = [&](int n) -> Status {
    std::string prompt = build(n) + prompt_suffix_;
    SIEVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_.Encode(prompt, /*add_bos=*/true));
    if (static_cast<int>(ids.size()) <= length) {
      if (n >= lo) {
        lo = n;
        best = {n, std::move(prompt), std::move(ids)};
      }
    } else if (hi < 0 || n < hi) {
      hi = n;
    }
    return Status::Ok();
  };
  SIEVE_RETURN_IF_ERROR(probe(1));
  if (best.ids.empty()) {
    return OutOfRangeError(std::string(task) + ": even the smallest prompt (one unit of context) " +
                           "has more than " + std::to_string(length) + " tokens; raise --lengths");
  }
  const int one = static_cast<int>(best.ids.size());
  if (cap >= 2) SIEVE_RETURN_IF_ERROR(probe(2));
  if (hi < 0 && lo == 2) {
    const int per_unit = std::max(1, static_cast<int>(best.ids.size()) - one);
    const int guess = std::clamp(1 + (length - one) / per_unit, 2, cap);
    SIEVE_RETURN_IF_ERROR(probe(guess));
    int step = std::max(1, guess / 32);
    if (hi < 0) {  // the guess fits: gallop up
      while (hi < 0 && lo < cap) {
        SIEVE_RETURN_IF_ERROR(probe(std::min(cap, lo + step)));
        step *= 2;
      }
    } else {  // too long: gallop down until one fits
      for (int below = hi - step; below > lo; below = hi - step) {
        SIEVE_RETURN_IF_ERROR(probe(below));
        if (lo == below) break;
        step *= 2;
      }
    }
  }
  while (hi > 0 && hi - lo > 1) SIEVE_RETURN_IF_ERROR(probe(lo + (hi - lo) / 2));
  return best;
}

Result<EvalSample> TaskGenerator::Generate(std::string_view task, int length,
                                           std::optional<double> depth, int index,
                                           uint64_t seed) const {
  if (!IsSyntheticTask(task)) {
    return InvalidArgumentError("unknown synthetic task '" + std::string(task) + "'");
  }
  if (!HasDepthAxis(task)) depth.reset();
  std::mt19937_64 rng = SampleRng(seed, task, length, depth, index);
  EvalSample sample;
  sample.task = std::string(task);
  sample.length = length;
  sample.depth = depth;
  sample.index = index;
  sample.metric = Metric::kContains;
  const double needle_depth = depth.value_or(0.0);
  std::function<std::string(int)> build;

  if (task == "passkey") {
    const std::string value = RandomDigits(rng, spec_.Int("passkey", "value_digits"));
    const std::string needle = Fill(spec_.Text("passkey", "needle"), {{"value", value}});
    sample.expected = {value};
    sample.max_tokens = spec_.Int("passkey", "max_tokens");
    build = [this, needle, needle_depth](int n) {
      return spec_.Text("passkey", "prefix") +
             InsertAtDepths(Units(n, false, 0), {{needle, needle_depth}}) +
             spec_.Text("passkey", "question");
    };
  } else if (task == "niah" || task == "niah-multikey" || task == "niah-multivalue" ||
             task == "niah-two-turn") {
    const bool multivalue = task == "niah-multivalue";
    // Two turns: two needles, the first asked in turn 1, the second (at the sample's depth, the
    // one scored) in turn 2.
    const bool two_turn = task == "niah-two-turn";
    const int needles = task == "niah" ? 1 : (two_turn ? 2 : spec_.Int("niah", "needles_multi"));
    std::vector<std::string> keys;
    while (static_cast<int>(keys.size()) < (multivalue ? 1 : needles)) {
      std::string key = Pick(rng, spec_.key_adjectives()) + "-" + Pick(rng, spec_.key_nouns());
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(std::move(key));
    }
    std::vector<std::string> values;
    while (static_cast<int>(values.size()) < needles) {
      std::string value = RandomDigits(rng, spec_.Int("niah", "value_digits"));
      if (std::find(values.begin(), values.end(), value) == values.end()) {
        values.push_back(std::move(value));
      }
    }
    std::vector<std::pair<std::string, double>> placed;
    for (int needle = 0; needle < needles; ++needle) {
      const std::string& key = keys[multivalue ? 0 : static_cast<size_t>(needle)];
      const int at_depth = two_turn ? 1 : 0;
      const double at = needle == at_depth && !multivalue ? needle_depth : Uniform(rng);
      placed.emplace_back(
          Fill(spec_.Text("niah", "needle"), {{"key", key}, {"value", values[needle]}}), at);
    }
    const bool natural = !haystack_.empty();
    const size_t start =
        natural ? std::uniform_int_distribution<size_t>(0, haystack_.size() - 1)(rng) : 0;
    const std::string question = multivalue
                                     ? Fill(spec_.Text("niah", "question_all"), {{"key", keys[0]}})
                                     : Fill(spec_.Text("niah", "question"), {{"key", keys[0]}});
    sample.expected = multivalue ? values : std::vector<std::string>{values[0]};
    sample.max_tokens = spec_.Int("niah", multivalue ? "max_tokens_all" : "max_tokens");
    if (two_turn) {
      sample.follow_up = Fill(spec_.Text("niah", "question"), {{"key", keys[1]}}) + prompt_suffix_;
      sample.follow_up_expected = {values[1]};
    }
    build = [this, placed, natural, start, question](int n) {
      return spec_.Text("niah", "prefix") + InsertAtDepths(Units(n, natural, start), placed) +
             question;
    };
  } else if (task == "kv-retrieval") {
    const int digits = spec_.Int("kv_retrieval", "key_hex_digits");
    // Pairs are drawn in one stream: the pairs of n are the first n of n + 1's.
    const uint64_t pair_seed = rng();
    sample.max_tokens = spec_.Int("kv_retrieval", "max_tokens");
    const auto pairs_for = [digits, pair_seed](int n) {
      std::mt19937_64 draw(pair_seed);
      std::set<std::string> seen;
      std::vector<std::pair<std::string, std::string>> pairs;
      while (static_cast<int>(pairs.size()) < n) {
        std::string key = RandomFrom(draw, "0123456789abcdef", digits);
        std::string value = RandomFrom(draw, "0123456789abcdef", digits);
        if (key == value || seen.count(key) || seen.count(value)) continue;
        seen.insert(key);
        seen.insert(value);
        pairs.emplace_back(std::move(key), std::move(value));
      }
      return pairs;
    };
    const auto asked_for = [needle_depth](int n) {
      return static_cast<size_t>(RoundHalfEven(needle_depth * (n - 1)));
    };
    build = [this, pairs_for, asked_for](int n) {
      const auto pairs = pairs_for(n);
      std::string context;
      for (size_t pair = 0; pair < pairs.size(); ++pair) {
        if (pair > 0) context += spec_.Text("kv_retrieval", "separator");
        context += Fill(spec_.Text("kv_retrieval", "pair"),
                        {{"key", pairs[pair].first}, {"value", pairs[pair].second}});
      }
      return spec_.Text("kv_retrieval", "prefix") + context + spec_.Text("kv_retrieval", "suffix") +
             Fill(spec_.Text("kv_retrieval", "question"), {{"key", pairs[asked_for(n)].first}});
    };
    SIEVE_ASSIGN_OR_RETURN(Fitted fitted, Fit(build, length, task));
    sample.expected = {pairs_for(fitted.units)[asked_for(fitted.units)].second};
    sample.prompt = std::move(fitted.prompt);
    sample.prompt_ids = std::move(fitted.ids);
    return sample;
  } else if (task == "variable-tracking") {
    const int letters = spec_.Int("variable_tracking", "name_letters");
    const std::string value = RandomDigits(rng, spec_.Int("variable_tracking", "value_digits"));
    std::vector<std::string> names;
    while (static_cast<int>(names.size()) < spec_.Int("variable_tracking", "hops") + 1) {
      std::string name = RandomFrom(rng, "ABCDEFGHIJKLMNOPQRSTUVWXYZ", letters);
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    std::vector<double> depths;
    for (size_t name = 0; name < names.size(); ++name) depths.push_back(Uniform(rng));
    std::sort(depths.begin(), depths.end());
    std::vector<std::pair<std::string, double>> statements;
    statements.emplace_back(
        Fill(spec_.Text("variable_tracking", "first"), {{"name", names[0]}, {"value", value}}),
        depths[0]);
    for (size_t name = 1; name < names.size(); ++name) {
      statements.emplace_back(Fill(spec_.Text("variable_tracking", "next"),
                                   {{"name", names[name]}, {"previous", names[name - 1]}}),
                              depths[name]);
    }
    const std::string question = Fill(spec_.Text("variable_tracking", "question"),
                                      {{"value", value}, {"count", std::to_string(names.size())}});
    sample.expected = names;
    sample.max_tokens = spec_.Int("variable_tracking", "max_tokens");
    build = [this, statements, question](int n) {
      return spec_.Text("variable_tracking", "prefix") +
             InsertAtDepths(Units(n, false, 0), statements) + question;
    };
  } else {  // common-words
    const int common = spec_.Int("common_words", "common");
    const int rare_max = spec_.Int("common_words", "rare_repeats_max");
    const double share = spec_.Number("common_words", "common_share");
    std::vector<std::string> words = spec_.list_words();
    std::shuffle(words.begin(), words.end(), rng);
    const uint64_t lines_seed = rng();
    sample.expected.assign(words.begin(), words.begin() + common);
    sample.max_tokens = spec_.Int("common_words", "max_tokens");
    build = [this, words, common, rare_max, share, lines_seed](int lines) {
      std::mt19937_64 draw(lines_seed);
      const int repeats = std::max(rare_max + 2, RoundHalfEven(share * lines / common));
      std::vector<std::string_view> items;
      for (int word = 0; word < common; ++word) items.insert(items.end(), repeats, words[word]);
      for (size_t rare = static_cast<size_t>(common);
           static_cast<int>(items.size()) < lines && rare < words.size(); ++rare) {
        items.insert(items.end(), std::uniform_int_distribution<int>(1, rare_max)(draw),
                     words[rare]);
      }
      std::shuffle(items.begin(), items.end(), draw);
      std::string context;
      for (size_t item = 0; item < items.size(); ++item) {
        context += Fill(spec_.Text("common_words", "item"),
                        {{"index", std::to_string(item + 1)}, {"word", items[item]}});
      }
      return spec_.Text("common_words", "prefix") + context +
             Fill(spec_.Text("common_words", "question"), {{"count", std::to_string(common)}});
    };
  }
  SIEVE_ASSIGN_OR_RETURN(Fitted fitted, Fit(build, length, task));
  sample.prompt = std::move(fitted.prompt);
  sample.prompt_ids = std::move(fitted.ids);
  if (!sample.follow_up.empty()) {
    SIEVE_ASSIGN_OR_RETURN(sample.follow_up_ids, tokenizer_.Encode(sample.follow_up, false));
  }
  return sample;
}

}  // namespace sieve::eval
