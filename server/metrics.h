// Metrics: a small Prometheus registry (counters, gauges, histograms with labels) and its text
// exposition format (version 0.0.4), so /metrics needs no client library.
//
// Metrics are created once (registration takes a lock) and then updated from any thread without
// one: counters and gauges are atomics, a histogram takes its own short lock. Render() reads a
// consistent-enough snapshot for scraping.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sieve {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Increment(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  // For counters that mirror a monotonic total kept elsewhere (the engine's token counts).
  void Set(double total) { value_.store(total, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative_counts;  // [bounds.size() + 1], the last is +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // [bounds_.size() + 1], per bucket (not cumulative)
  double sum_ = 0.0;
};

class MetricsRegistry {
 public:
  // The metric `name` with `labels`, created on first use. A name keeps the type and help it was
  // first registered with.
  Counter& GetCounter(std::string_view name, std::string_view help,
                      const MetricLabels& labels = {});
  Gauge& GetGauge(std::string_view name, std::string_view help, const MetricLabels& labels = {});
  Histogram& GetHistogram(std::string_view name, std::string_view help,
                          std::span<const double> bounds, const MetricLabels& labels = {});

  // Prometheus text format: HELP and TYPE lines, then one line per sample.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    std::string name;
    std::string help;
    Type type = Type::kCounter;
    std::map<MetricLabels, std::unique_ptr<Counter>> counters;
    std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
    std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  };
  Family& GetFamily(std::string_view name, std::string_view help, Type type);

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_;  // in registration order
};

}  // namespace sieve
