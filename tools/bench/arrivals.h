// When each request of a benchmark is released: all at once, or by a Poisson process (or a gamma
// one, for burstier or smoother traffic), as vLLM's benchmark_serving does.
#pragma once

#include <cstdint>
#include <vector>

namespace sieve::bench {

// Release times in seconds from the start, one per request, ascending; the first is 0. With a
// `request_rate` (requests/s) that is infinite or not positive, every request is released at 0.
// Else the gaps are gamma-distributed with shape `burstiness` and mean 1/request_rate: burstiness
// 1 is a Poisson process (exponential gaps), below 1 burstier, above 1 more regular.
std::vector<double> MakeArrivalTimes(int num_requests, double request_rate, double burstiness,
                                     uint64_t seed);

}  // namespace sieve::bench
