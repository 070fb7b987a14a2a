#include "tools/bench/arrivals.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace sieve::bench {

std::vector<double> MakeArrivalTimes(int num_requests, double request_rate, double burstiness,
                                     uint64_t seed) {
  std::vector<double> times(static_cast<size_t>(std::max(num_requests, 0)), 0.0);
  if (!std::isfinite(request_rate) || request_rate <= 0 || times.empty()) return times;
  std::mt19937_64 rng(seed);
  // Mean gap = shape * scale = 1 / request_rate.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (size_t index = 1; index < times.size(); ++index) {
    times[index] = times[index - 1] + gap(rng);
  }
  return times;
}

}  // namespace sieve::bench
