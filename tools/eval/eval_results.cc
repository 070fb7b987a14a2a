#include "tools/eval/eval_results.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace sieve::eval {

namespace {

nlohmann::json DepthJson(const std::optional<double>& depth) {
  return depth ? nlohmann::json(*depth) : nlohmann::json(nullptr);
}

nlohmann::json CellJson(const EvalCell& cell) {
  nlohmann::json json;
  json["task"] = cell.task;
  if (cell.length > 0) json["length"] = cell.length;
  json["depth"] = DepthJson(cell.depth);
  json["config"] = cell.config;
  json["samples"] = cell.samples;
  if (cell.perplexity()) {
    json["perplexity"] = cell.value();
    json["mean_nll"] = cell.tokens > 0 ? cell.nll_sum / static_cast<double>(cell.tokens) : 0.0;
    json["tokens"] = cell.tokens;
  } else {
    json["score"] = cell.value();
  }
  if (cell.truncated > 0) json["truncated"] = cell.truncated;
  if (cell.errors > 0) json["errors"] = cell.errors;
  return json;
}

std::string FormatValue(const EvalCell& cell) {
  if (cell.samples == 0) return "-";
  return cell.perplexity() ? fmt::format("{:.3f}", cell.value())
                           : fmt::format("{:.1f}", 100.0 * cell.value());
}

}  // namespace

double EvalCell::value() const {
  if (perplexity()) return tokens > 0 ? std::exp(nll_sum / static_cast<double>(tokens)) : 0.0;
  return samples > 0 ? score_sum / samples : 0.0;
}

EvalResults::EvalResults(std::vector<std::string> tasks, std::vector<EvalConfig> configs)
    : tasks_(std::move(tasks)), configs_(std::move(configs)) {}

void EvalResults::Add(SampleRecord record) { records_.push_back(std::move(record)); }

int EvalResults::TaskOrder(const std::string& task) const {
  return static_cast<int>(std::find(tasks_.begin(), tasks_.end(), task) - tasks_.begin());
}

int EvalResults::ConfigOrder(const std::string& config) const {
  for (size_t index = 0; index < configs_.size(); ++index) {
    if (configs_[index].label == config) return static_cast<int>(index);
  }
  return static_cast<int>(configs_.size());
}

std::vector<EvalCell> EvalResults::Cells() const {
  // Key: (task order, length, has depth, depth, config order).
  using Key = std::tuple<int, int, bool, double, int>;
  std::map<Key, EvalCell> cells;
  for (const SampleRecord& record : records_) {
    const EvalSample& sample = *record.sample;
    const Key key{TaskOrder(sample.task), sample.length, sample.depth.has_value(),
                  sample.depth.value_or(0.0), ConfigOrder(record.config)};
    EvalCell& cell = cells[key];
    cell.task = sample.task;
    cell.length = sample.length;
    cell.depth = sample.depth;
    cell.config = record.config;
    ++cell.samples;
    if (sample.metric == Metric::kPerplexity) {
      cell.nll_sum += record.score;
      cell.tokens += record.scored_tokens;
    } else {
      cell.score_sum += record.score;
    }
    cell.truncated += sample.truncated ? 1 : 0;
    cell.errors += record.error.empty() ? 0 : 1;
  }
  std::vector<EvalCell> out;
  for (auto& [key, cell] : cells) out.push_back(std::move(cell));
  return out;
}

std::vector<EvalCell> EvalResults::Summary() const {
  std::map<std::pair<int, int>, EvalCell> summary;
  std::map<std::pair<int, int>, int> cell_counts;
  for (const EvalCell& cell : Cells()) {
    const std::pair<int, int> key{TaskOrder(cell.task), ConfigOrder(cell.config)};
    EvalCell& total = summary[key];
    total.task = cell.task;
    total.config = cell.config;
    total.samples += cell.samples;
    total.nll_sum += cell.nll_sum;
    total.tokens += cell.tokens;
    total.truncated += cell.truncated;
    total.errors += cell.errors;
    total.score_sum += cell.value();  // cells weigh the same
    ++cell_counts[key];
  }
  std::vector<EvalCell> out;
  for (auto& [key, total] : summary) {
    // value() divides score_sum by samples: make it the mean of the cells' scores.
    if (!total.perplexity())
      total.score_sum *= static_cast<double>(total.samples) / cell_counts[key];
    out.push_back(std::move(total));
  }
  return out;
}

std::string EvalResults::Table() const {
  const std::vector<EvalCell> cells = Cells();
  std::string out;
  size_t width = 8;
  for (const EvalConfig& config : configs_) width = std::max(width, config.label.size());
  const auto column = [&](const std::string& text) { return fmt::format(" {:>{}}", text, width); };
  const auto header = [&](const std::string& first) {
    std::string line = first;
    for (const EvalConfig& config : configs_) line += column(config.label);
    return line + "\n";
  };
  for (const std::string& task : tasks_) {
    std::vector<const EvalCell*> rows;
    for (const EvalCell& cell : cells) {
      if (cell.task == task) rows.push_back(&cell);
    }
    if (rows.empty()) continue;
    const bool perplexity = task == "perplexity";
    out += fmt::format("\n{} ({})\n", task, perplexity ? "perplexity, lower is better" : "score %");
    out += header(fmt::format("{:>8} {:>6}", "length", "depth"));
    for (size_t row = 0; row < rows.size();) {
      const EvalCell& first = *rows[row];
      std::string line =
          fmt::format("{:>8} {:>6}", first.length,
                      first.depth ? fmt::format("{:.2f}", *first.depth) : std::string("-"));
      std::map<std::string, std::string> by_config;
      size_t next = row;
      while (next < rows.size() && rows[next]->length == first.length &&
             rows[next]->depth == first.depth) {
        by_config[rows[next]->config] = FormatValue(*rows[next]);
        ++next;
      }
      for (const EvalConfig& config : configs_) {
        const auto it = by_config.find(config.label);
        line += column(it == by_config.end() ? "-" : it->second);
      }
      out += line + "\n";
      row = next;
    }
  }
  const std::vector<EvalCell> summary = Summary();
  if (!summary.empty()) {
    out += "\nsummary (score % averaged over lengths and depths; perplexity over all tokens)\n";
    out += header(fmt::format("{:>17}", "task"));
    for (const std::string& task : tasks_) {
      std::map<std::string, std::string> by_config;
      for (const EvalCell& cell : summary) {
        if (cell.task == task) by_config[cell.config] = FormatValue(cell);
      }
      if (by_config.empty()) continue;
      std::string line = fmt::format("{:>17}", task);
      for (const EvalConfig& config : configs_) {
        const auto it = by_config.find(config.label);
        line += column(it == by_config.end() ? "-" : it->second);
      }
      out += line + "\n";
    }
  }
  return out;
}

nlohmann::json EvalResults::ToJson() const {
  nlohmann::json json;
  json["cells"] = nlohmann::json::array();
  for (const EvalCell& cell : Cells()) json["cells"].push_back(CellJson(cell));
  json["summary"] = nlohmann::json::array();
  for (const EvalCell& cell : Summary()) json["summary"].push_back(CellJson(cell));
  json["records"] = nlohmann::json::array();
  for (const SampleRecord& record : records_) {
    const EvalSample& sample = *record.sample;
    nlohmann::json item;
    item["task"] = sample.task;
    item["length"] = sample.length;
    item["depth"] = DepthJson(sample.depth);
    item["index"] = sample.index;
    item["config"] = record.config;
    item["prompt_tokens"] = sample.prompt_ids.size();
    item["metric"] = MetricName(sample.metric);
    if (sample.metric == Metric::kPerplexity) {
      item["scored_tokens"] = record.scored_tokens;
      item["nll"] = record.score;
    } else {
      item["expected"] = sample.expected;
      item["output"] = record.output;
      item["score"] = record.score;
    }
    if (record.first_turn_output) {  // output, expected and score are turn 2's
      item["expected"] = sample.follow_up_expected;
      item["follow_up"] = sample.follow_up;
      item["first_turn_expected"] = sample.expected;
      item["first_turn_output"] = *record.first_turn_output;
      item["first_turn_score"] = record.first_turn_score;
    }
    if (sample.truncated) item["truncated"] = true;
    if (!record.error.empty()) item["error"] = record.error;
    json["records"].push_back(std::move(item));
  }
  return json;
}

}  // namespace sieve::eval
