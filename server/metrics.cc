#include "server/metrics.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/check.h"

namespace sieve {

namespace {

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string escaped;
  for (const char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string EscapeHelp(std::string_view help) {
  std::string escaped;
  for (const char c : help) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

// `{a="1",b="2"}`, with `extra` (e.g. le) last; "" without labels.
std::string FormatLabels(const MetricLabels& labels, const MetricLabels& extra = {}) {
  if (labels.empty() && extra.empty()) return "";
  std::string text = "{";
  bool first = true;
  for (const auto* list : {&labels, &extra}) {
    for (const auto& [key, value] : *list) {
      if (!first) text += ",";
      first = false;
      text += key + "=\"" + EscapeLabelValue(value) + "\"";
    }
  }
  return text + "}";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  SIEVE_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void Histogram::Observe(double value) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (const uint64_t count : counts_) {
    running += count;
    snapshot.cumulative_counts.push_back(running);
  }
  snapshot.sum = sum_;
  snapshot.count = running;
  return snapshot;
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(std::string_view name, std::string_view help,
                                                    Type type) {
  for (const std::unique_ptr<Family>& family : families_) {
    if (family->name == name) {
      SIEVE_CHECK(family->type == type) << "metric " << name << " registered with two types";
      return *family;
    }
  }
  auto family = std::make_unique<Family>();
  family->name = std::string(name);
  family->help = std::string(help);
  family->type = type;
  families_.push_back(std::move(family));
  return *families_.back();
}

Counter& MetricsRegistry::GetCounter(std::string_view name, std::string_view help,
                                     const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = GetFamily(name, help, Type::kCounter).counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::GetGauge(std::string_view name, std::string_view help,
                                 const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = GetFamily(name, help, Type::kGauge).gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::GetHistogram(std::string_view name, std::string_view help,
                                         std::span<const double> bounds,
                                         const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = GetFamily(name, help, Type::kHistogram).histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(std::vector<double>(bounds.begin(), bounds.end()));
  return *slot;
}

std::string MetricsRegistry::Render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const std::unique_ptr<Family>& family : families_) {
    const char* type = family->type == Type::kCounter ? "counter"
                       : family->type == Type::kGauge ? "gauge"
                                                      : "histogram";
    out += "# HELP " + family->name + " " + EscapeHelp(family->help) + "\n";
    out += "# TYPE " + family->name + " " + type + "\n";
    for (const auto& [labels, counter] : family->counters) {
      out += family->name + FormatLabels(labels) + " " + FormatValue(counter->value()) + "\n";
    }
    for (const auto& [labels, gauge] : family->gauges) {
      out += family->name + FormatLabels(labels) + " " + FormatValue(gauge->value()) + "\n";
    }
    for (const auto& [labels, histogram] : family->histograms) {
      const Histogram::Snapshot snapshot = histogram->snapshot();
      for (size_t bucket = 0; bucket <= snapshot.bounds.size(); ++bucket) {
        const std::string le =
            bucket < snapshot.bounds.size() ? FormatValue(snapshot.bounds[bucket]) : "+Inf";
        out += family->name + "_bucket" + FormatLabels(labels, {{"le", le}}) + " " +
               std::to_string(snapshot.cumulative_counts[bucket]) + "\n";
      }
      out += family->name + "_sum" + FormatLabels(labels) + " " + FormatValue(snapshot.sum) + "\n";
      out += family->name + "_count" + FormatLabels(labels) + " " + std::to_string(snapshot.count) +
             "\n";
    }
  }
  return out;
}

}  // namespace sieve
