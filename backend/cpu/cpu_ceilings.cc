// The CPU ceilings of cpu_ceilings.h. The FMA loop keeps 12 accumulators a thread (more than the
// fma latency times the units, so the units never wait) and mixes nothing else in.
#include "backend/cpu/cpu_ceilings.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define SIEVE_CPU_X86 1
#endif

namespace sieve::cpu {
namespace {

constexpr int kChains = 12;

// Each returns a value of its accumulators, so the loop is not optimised away.
float FmaChainsScalar(int64_t iterations) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + 1e-7f * static_cast<float>(c);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = std::fma(acc[c], 0.9999999f, 1e-7f);
  }
  float sum = 0;
  for (float value : acc) sum += value;
  return sum;
}

#ifdef SIEVE_CPU_X86
__attribute__((target("avx512f"))) float FmaChainsAvx512(int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 1e-7f * static_cast<float>(c));
  const __m512 factor = _mm512_set1_ps(0.9999999f), term = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], factor, term);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float lane : lanes) total += lane;
  return total;
}

__attribute__((target("avx2,fma"))) float FmaChainsAvx2(int64_t iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + 1e-7f * static_cast<float>(c));
  const __m256 factor = _mm256_set1_ps(0.9999999f), term = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], factor, term);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float lane : lanes) total += lane;
  return total;
}
#endif

int Lanes(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return 16;
    case Isa::kAvx2:
      return 8;
    case Isa::kScalar:
      break;
  }
  return 1;
}

float FmaChains(Isa isa, int64_t iterations) {
#ifdef SIEVE_CPU_X86
  if (isa == Isa::kAvx512) return FmaChainsAvx512(iterations);
  if (isa == Isa::kAvx2) return FmaChainsAvx2(iterations);
#endif
  return FmaChainsScalar(iterations);
}

template <class Body>
double BestSeconds(const Body& body) {
  double best = INFINITY;
  for (int trial = 0; trial < 3; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

double MeasureFmaPeak(ThreadPool& pool, Isa isa) {
  const int threads = pool.num_threads();
  // About 0.1 s a run at a few GHz for the vector forms (the scalar one is far slower).
  const int64_t iterations = isa == Isa::kScalar ? 2'000'000 : 20'000'000;
  std::atomic<float> sink{0};
  const double seconds = BestSeconds([&] {
    pool.ParallelFor(threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) sink = sink + FmaChains(isa, iterations);
    });
  });
  return 2.0 * kChains * Lanes(isa) * static_cast<double>(iterations) * threads / seconds;
}

double MeasureReadBandwidth(ThreadPool& pool) {
  std::vector<float> data(128 << 20, 1.0f);
  std::atomic<float> sink{0};
  const double seconds = BestSeconds([&] {
    pool.ParallelFor(static_cast<int64_t>(data.size()), 1 << 20, [&](int64_t begin, int64_t end) {
      float partial[16] = {};
      for (int64_t i = begin; i + 16 <= end; i += 16) {
        for (int lane = 0; lane < 16; ++lane) partial[lane] += data[i + lane];
      }
      float sum = 0;
      for (float value : partial) sum += value;
      sink = sink + sum;
    });
  });
  return static_cast<double>(data.size()) * sizeof(float) / seconds;
}

}  // namespace sieve::cpu
