// The inner products of cpu_kernels.h: a scalar definition and its AVX2 + FMA and AVX-512 forms.
// The vector forms are the scalar one with the lanes side by side: a dot product's 16 lane sums
// live in one zmm register (two ymm), fma for fma; the tree that joins them is done for 16 (or 8)
// dot products at once by shuffles that pair the same lanes the scalar tree pairs. Each vector
// function carries its instruction set as a target attribute (the rest of the program stays
// baseline x86-64), and runs only where BestIsa found it.
#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#define SIEVE_CPU_X86 1
#define SIEVE_AVX512 __attribute__((target("avx512f")))
#define SIEVE_AVX2 __attribute__((target("avx2,fma")))
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reads the AVX-512 shuffles' _mm512_undefined_ps() (an intended self-initialisation) as
// an uninitialised use when they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

// Loops over template constants (tile rows, columns, vectors) unrolled completely, so that a
// tile's accumulators stay in registers.
#if defined(__clang__)
#define SIEVE_UNROLL _Pragma("unroll")
#else
#define SIEVE_UNROLL _Pragma("GCC unroll 16")
#endif

namespace sieve::cpu {
namespace {

constexpr int kLanes = 16;

// The definition's tree over 16 lane sums.
float TreeSum(const float* lanes) {
  float q[8], r[4], s[2];
  for (int l = 0; l < 8; ++l) q[l] = lanes[l] + lanes[l + 8];
  for (int l = 0; l < 4; ++l) r[l] = q[l] + q[l + 4];
  for (int l = 0; l < 2; ++l) s[l] = r[l] + r[l + 2];
  return s[0] + s[1];
}

// The products past the last whole group of 16, added in order.
float AddTail(float sum, const float* a, const float* b, int64_t begin, int64_t n) {
  for (int64_t i = begin; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

float DotScalar(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = std::fma(a[i + l], b[i + l], lanes[l]);
  }
  return AddTail(TreeSum(lanes), a, b, body, n);
}

void Store(float* dst, float value, bool accumulate) { *dst = accumulate ? *dst + value : value; }

// A tile's R x C results from their tree sums: the tail's products added, then stored.
template <int R, int C>
inline void StoreTile(const float* sums, const float* const* a, const float* const* b, int64_t body,
                      int64_t n, float* out, int64_t ldo, bool accumulate) {
  SIEVE_UNROLL for (int r = 0; r < R; ++r) {
    SIEVE_UNROLL for (int c = 0; c < C; ++c) {
      float sum = sums[r * C + c];
      if (body != n) sum = AddTail(sum, a[r], b[c], body, n);
      Store(out + r * ldo + c, sum, accumulate);
    }
  }
}

void TableScalar(Rows a, int64_t rows, Rows b, int64_t cols, int64_t n, float* out, int64_t ldo,
                 bool accumulate) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      Store(out + i * ldo + j, DotScalar(a[i], b[j], n), accumulate);
  }
}

void WeightedSumScalar(const float* weights, int64_t ldw, int64_t rows, Rows v, int64_t count,
                       int64_t dim, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * ldo;
    for (int64_t j = 0; j < count; ++j) {
      const float w = weights[r * ldw + j];
      for (int64_t d = 0; d < dim; ++d) dst[d] = std::fma(w, v[j][d], dst[d]);
    }
  }
}

// Exp's constants (Cephes expf).
constexpr float kExpMin = -87.33654f;  // e^x stays normal above this
constexpr float kExpMax = 88.37626f;   // and 2^n below 2^128
constexpr float kLog2E = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f;  // ln 2 = kLn2High + kLn2Low, kLn2High exact in 9 bits
constexpr float kLn2Low = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                               4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

float ExpScalar(float x) {
  x = std::min(std::max(x, kExpMin), kExpMax);
  const float n = std::nearbyint(x * kLog2E);
  float r = std::fma(-n, kLn2High, x);
  r = std::fma(-n, kLn2Low, r);
  const float z = r * r;
  float p = kExpPoly[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpPoly[i]);
  p = std::fma(p, z, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The softmax's sum: 16 lanes in order, the tree, then the tail in order.
float SoftmaxScalar(float* row, int64_t count, float scale) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    row[j] = scale * row[j];
    max_score = std::max(max_score, row[j]);
  }
  float lanes[kLanes] = {};
  const int64_t body = count - count % kLanes;
  for (int64_t j = 0; j < count; ++j) row[j] = ExpScalar(row[j] - max_score);
  for (int64_t j = 0; j < body; ++j) lanes[j % kLanes] += row[j];
  float sum = TreeSum(lanes);
  for (int64_t j = body; j < count; ++j) sum += row[j];
  const float inv_sum = 1.0f / sum;
  for (int64_t j = 0; j < count; ++j) row[j] *= inv_sum;
  return max_score + std::log(sum);
}

#ifdef SIEVE_CPU_X86

// ---- AVX-512: a dot product's 16 lanes are one zmm register.

SIEVE_AVX512 float DotAvx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  }
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, acc);
  return AddTail(TreeSum(lanes), a, b, body, n);
}

// The tree for N <= 16 dot products at once: out[t] = TreeSum(lanes of v[t]). Each level adds
// lane l to lane l + 8 (then + 4, + 2, + 1) of every product, packing two (then four, eight,
// sixteen) products into a register; the last register holds product 4j + g in lane 4g + j.
template <int N>
SIEVE_AVX512 void TreeSumsAvx512(const __m512* v, float* out) {
  __m512 x[16];
  SIEVE_UNROLL for (int t = 0; t < 16; ++t) x[t] = t < N ? v[t] : _mm512_setzero_ps();
  __m512 halves[8];  // product 2p in lanes 0-7, 2p + 1 in lanes 8-15
  SIEVE_UNROLL for (int p = 0; p < 8; ++p) {
    halves[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0x44),
                              _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0xEE));
  }
  __m512 quarters[4];  // products 4p .. 4p + 3, four lanes each
  SIEVE_UNROLL for (int p = 0; p < 4; ++p) {
    quarters[p] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * p], halves[2 * p + 1], 0x88),
                                _mm512_shuffle_f32x4(halves[2 * p], halves[2 * p + 1], 0xDD));
  }
  __m512 pairs[2];
  SIEVE_UNROLL for (int p = 0; p < 2; ++p) {
    pairs[p] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * p], quarters[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(quarters[2 * p], quarters[2 * p + 1], 0xEE));
  }
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88),
                                    _mm512_shuffle_ps(pairs[0], pairs[1], 0xDD));
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, sums);
  SIEVE_UNROLL for (int t = 0; t < N; ++t) out[t] = lanes[4 * (t % 4) + t / 4];
}

// A tile of R rows of a by C rows of b: out[r * ldo + c] = a[r] . b[c] (or += with accumulate).
template <int R, int C>
SIEVE_AVX512 void TileAvx512(const float* const* a, const float* const* b, int64_t n, float* out,
                             int64_t ldo, bool accumulate) {
  const int64_t body = n - n % kLanes;
  __m512 acc[R * C];
  SIEVE_UNROLL for (int t = 0; t < R * C; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < body; i += kLanes) {
    __m512 bv[C];
    SIEVE_UNROLL for (int c = 0; c < C; ++c) bv[c] = _mm512_loadu_ps(b[c] + i);
    SIEVE_UNROLL for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_loadu_ps(a[r] + i);
      SIEVE_UNROLL for (int c = 0; c < C; ++c) {
        acc[r * C + c] = _mm512_fmadd_ps(av, bv[c], acc[r * C + c]);
      }
    }
  }
  float sums[R * C];
  TreeSumsAvx512<R * C>(acc, sums);
  StoreTile<R, C>(sums, a, b, body, n, out, ldo, accumulate);
}

// R rows' weighted sums over V vectors of 16 of the value rows, from column d0.
template <int R, int V>
SIEVE_AVX512 void WeightedTileAvx512(const float* weights, int64_t ldw, Rows v, int64_t count,
                                     int64_t d0, float* out, int64_t ldo) {
  __m512 acc[R * V];
  SIEVE_UNROLL for (int r = 0; r < R; ++r) {
    SIEVE_UNROLL for (int k = 0; k < V; ++k) {
      acc[r * V + k] = _mm512_loadu_ps(out + r * ldo + d0 + k * kLanes);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 values[V];
    SIEVE_UNROLL for (int k = 0; k < V; ++k) values[k] = _mm512_loadu_ps(v[j] + d0 + k * kLanes);
    SIEVE_UNROLL for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(weights[r * ldw + j]);
      SIEVE_UNROLL for (int k = 0; k < V; ++k) {
        acc[r * V + k] = _mm512_fmadd_ps(w, values[k], acc[r * V + k]);
      }
    }
  }
  SIEVE_UNROLL for (int r = 0; r < R; ++r) {
    SIEVE_UNROLL for (int k = 0; k < V; ++k) {
      _mm512_storeu_ps(out + r * ldo + d0 + k * kLanes, acc[r * V + k]);
    }
  }
}

SIEVE_AVX512 __m512 ExpAvx512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  SIEVE_UNROLL for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

SIEVE_AVX512 float SoftmaxAvx512(float* row, int64_t count, float scale) {
  const int64_t body = count - count % kLanes;
  const __m512 scales = _mm512_set1_ps(scale);
  __m512 maxima = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < body; j += kLanes) {
    const __m512 s = _mm512_mul_ps(scales, _mm512_loadu_ps(row + j));
    _mm512_storeu_ps(row + j, s);
    maxima = _mm512_max_ps(maxima, s);
  }
  float max_score = _mm512_reduce_max_ps(maxima);
  for (int64_t j = body; j < count; ++j) {
    row[j] = scale * row[j];
    max_score = std::max(max_score, row[j]);
  }
  const __m512 shift = _mm512_set1_ps(max_score);
  __m512 sums = _mm512_setzero_ps();
  for (int64_t j = 0; j < body; j += kLanes) {
    const __m512 e = ExpAvx512(_mm512_sub_ps(_mm512_loadu_ps(row + j), shift));
    _mm512_storeu_ps(row + j, e);
    sums = _mm512_add_ps(sums, e);
  }
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, sums);
  float sum = TreeSum(lanes);
  for (int64_t j = body; j < count; ++j) {
    row[j] = ExpScalar(row[j] - max_score);
    sum += row[j];
  }
  const float inv_sum = 1.0f / sum;
  const __m512 factor = _mm512_set1_ps(inv_sum);
  for (int64_t j = 0; j < body; j += kLanes) {
    _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), factor));
  }
  for (int64_t j = body; j < count; ++j) row[j] *= inv_sum;
  return max_score + std::log(sum);
}

// ---- AVX2 + FMA: a dot product's 16 lanes are two ymm registers (lanes 0-7, 8-15).

SIEVE_AVX2 float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    low = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), low);
    high = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), high);
  }
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, low);
  _mm256_store_ps(lanes + 8, high);
  return AddTail(TreeSum(lanes), a, b, body, n);
}

// The tree for N <= 8 dot products, each as (lanes 0-7, lanes 8-15): the first level is their
// sum; the last register holds product 2j + g in lane 4g + j.
template <int N>
SIEVE_AVX2 void TreeSumsAvx2(const __m256* low, const __m256* high, float* out) {
  __m256 x[8];
  SIEVE_UNROLL for (int t = 0; t < 8; ++t) {
    x[t] = t < N ? _mm256_add_ps(low[t], high[t]) : _mm256_setzero_ps();
  }
  __m256 quarters[4];  // products 2p, 2p + 1, four lanes each
  SIEVE_UNROLL for (int p = 0; p < 4; ++p) {
    quarters[p] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * p], x[2 * p + 1], 0x20),
                                _mm256_permute2f128_ps(x[2 * p], x[2 * p + 1], 0x31));
  }
  __m256 pairs[2];
  SIEVE_UNROLL for (int p = 0; p < 2; ++p) {
    pairs[p] = _mm256_add_ps(_mm256_shuffle_ps(quarters[2 * p], quarters[2 * p + 1], 0x44),
                             _mm256_shuffle_ps(quarters[2 * p], quarters[2 * p + 1], 0xEE));
  }
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], 0x88),
                                    _mm256_shuffle_ps(pairs[0], pairs[1], 0xDD));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sums);
  SIEVE_UNROLL for (int t = 0; t < N; ++t) out[t] = lanes[4 * (t % 2) + t / 2];
}

template <int R, int C>
SIEVE_AVX2 void TileAvx2(const float* const* a, const float* const* b, int64_t n, float* out,
                         int64_t ldo, bool accumulate) {
  const int64_t body = n - n % kLanes;
  __m256 low[R * C], high[R * C];
  SIEVE_UNROLL for (int t = 0; t < R * C; ++t) low[t] = high[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < body; i += kLanes) {
    __m256 bv[C];
    SIEVE_UNROLL for (int c = 0; c < C; ++c) bv[c] = _mm256_loadu_ps(b[c] + i);
    SIEVE_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_loadu_ps(a[r] + i);
      SIEVE_UNROLL for (int c = 0; c < C; ++c) {
        low[r * C + c] = _mm256_fmadd_ps(av, bv[c], low[r * C + c]);
      }
    }
    SIEVE_UNROLL for (int c = 0; c < C; ++c) bv[c] = _mm256_loadu_ps(b[c] + i + 8);
    SIEVE_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_loadu_ps(a[r] + i + 8);
      SIEVE_UNROLL for (int c = 0; c < C; ++c) {
        high[r * C + c] = _mm256_fmadd_ps(av, bv[c], high[r * C + c]);
      }
    }
  }
  float sums[R * C];
  TreeSumsAvx2<R * C>(low, high, sums);
  StoreTile<R, C>(sums, a, b, body, n, out, ldo, accumulate);
}

template <int R, int V>
SIEVE_AVX2 void WeightedTileAvx2(const float* weights, int64_t ldw, Rows v, int64_t count,
                                 int64_t d0, float* out, int64_t ldo) {
  constexpr int kWidth = 8;
  __m256 acc[R * V];
  SIEVE_UNROLL for (int r = 0; r < R; ++r) {
    SIEVE_UNROLL for (int k = 0; k < V; ++k) {
      acc[r * V + k] = _mm256_loadu_ps(out + r * ldo + d0 + k * kWidth);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m256 values[V];
    SIEVE_UNROLL for (int k = 0; k < V; ++k) values[k] = _mm256_loadu_ps(v[j] + d0 + k * kWidth);
    SIEVE_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_set1_ps(weights[r * ldw + j]);
      SIEVE_UNROLL for (int k = 0; k < V; ++k) {
        acc[r * V + k] = _mm256_fmadd_ps(w, values[k], acc[r * V + k]);
      }
    }
  }
  SIEVE_UNROLL for (int r = 0; r < R; ++r) {
    SIEVE_UNROLL for (int k = 0; k < V; ++k) {
      _mm256_storeu_ps(out + r * ldo + d0 + k * kWidth, acc[r * V + k]);
    }
  }
}

SIEVE_AVX2 __m256 ExpAvx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  SIEVE_UNROLL for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

SIEVE_AVX2 float SoftmaxAvx2(float* row, int64_t count, float scale) {
  const int64_t body = count - count % kLanes;
  const __m256 scales = _mm256_set1_ps(scale);
  __m256 maxima = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < body; j += 8) {
    const __m256 s = _mm256_mul_ps(scales, _mm256_loadu_ps(row + j));
    _mm256_storeu_ps(row + j, s);
    maxima = _mm256_max_ps(maxima, s);
  }
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, maxima);
  float max_score = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < 8; ++l) max_score = std::max(max_score, lanes[l]);
  for (int64_t j = body; j < count; ++j) {
    row[j] = scale * row[j];
    max_score = std::max(max_score, row[j]);
  }
  const __m256 shift = _mm256_set1_ps(max_score);
  __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
  for (int64_t j = 0; j < body; j += kLanes) {
    const __m256 e_low = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift));
    const __m256 e_high = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), shift));
    _mm256_storeu_ps(row + j, e_low);
    _mm256_storeu_ps(row + j + 8, e_high);
    low = _mm256_add_ps(low, e_low);
    high = _mm256_add_ps(high, e_high);
  }
  _mm256_store_ps(lanes, low);
  _mm256_store_ps(lanes + 8, high);
  float sum = TreeSum(lanes);
  for (int64_t j = body; j < count; ++j) {
    row[j] = ExpScalar(row[j] - max_score);
    sum += row[j];
  }
  const float inv_sum = 1.0f / sum;
  const __m256 factor = _mm256_set1_ps(inv_sum);
  for (int64_t j = 0; j < body; j += 8) {
    _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), factor));
  }
  for (int64_t j = body; j < count; ++j) row[j] *= inv_sum;
  return max_score + std::log(sum);
}

// ---- Tiling, shared by both: a table in tiles of kRows x kCols with smaller edge tiles.

using TileFn = void (*)(const float* const*, const float* const*, int64_t, float*, int64_t, bool);

template <int R, int C>
struct Avx512Tile {
  static void Run(const float* const* a, const float* const* b, int64_t n, float* out, int64_t ldo,
                  bool accumulate) {
    TileAvx512<R, C>(a, b, n, out, ldo, accumulate);
  }
};
template <int R, int C>
struct Avx2Tile {
  static void Run(const float* const* a, const float* const* b, int64_t n, float* out, int64_t ldo,
                  bool accumulate) {
    TileAvx2<R, C>(a, b, n, out, ldo, accumulate);
  }
};

template <template <int, int> class Tile, int R, int... Cs>
constexpr auto TileRow(std::integer_sequence<int, Cs...>) {
  return std::array<TileFn, sizeof...(Cs)>{&Tile<R, Cs + 1>::Run...};
}
template <template <int, int> class Tile, int kCols, int... Rs>
constexpr auto TileGrid(std::integer_sequence<int, Rs...>) {
  return std::array<std::array<TileFn, kCols>, sizeof...(Rs)>{
      TileRow<Tile, Rs + 1>(std::make_integer_sequence<int, kCols>())...};
}

template <int kRows, int kCols>
void TableTiled(const std::array<std::array<TileFn, kCols>, kRows>& tiles, Rows a, int64_t rows,
                Rows b, int64_t cols, int64_t n, float* out, int64_t ldo, bool accumulate) {
  const float* a_rows[kRows];
  const float* b_rows[kCols];
  for (int64_t j0 = 0; j0 < cols; j0 += kCols) {
    const int tile_cols = static_cast<int>(std::min<int64_t>(kCols, cols - j0));
    for (int c = 0; c < tile_cols; ++c) b_rows[c] = b[j0 + c];
    for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
      const int tile_rows = static_cast<int>(std::min<int64_t>(kRows, rows - i0));
      for (int r = 0; r < tile_rows; ++r) a_rows[r] = a[i0 + r];
      tiles[tile_rows - 1][tile_cols - 1](a_rows, b_rows, n, out + i0 * ldo + j0, ldo, accumulate);
    }
  }
}

// Weighted sums in tiles of up to kRows rows and 4 vectors (of `width` lanes) of columns; the
// columns past the last whole vector go through the scalar form (the same fma sequence).
template <int kRows, int kWidth, class Run>
void WeightedTiled(Run run, const float* weights, int64_t ldw, int64_t rows, Rows v, int64_t count,
                   int64_t dim, float* out, int64_t ldo) {
  const int64_t vectors = dim / kWidth;
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int tile_rows = static_cast<int>(std::min<int64_t>(kRows, rows - r0));
    for (int64_t k0 = 0; k0 < vectors; k0 += 4) {
      const int tile_vectors = static_cast<int>(std::min<int64_t>(4, vectors - k0));
      run(tile_rows, tile_vectors, weights + r0 * ldw, k0 * kWidth, out + r0 * ldo);
    }
    const int64_t done = vectors * kWidth;
    if (done == dim) continue;
    for (int r = 0; r < tile_rows; ++r) {
      float* dst = out + (r0 + r) * ldo;
      for (int64_t j = 0; j < count; ++j) {
        const float w = weights[(r0 + r) * ldw + j];
        for (int64_t d = done; d < dim; ++d) dst[d] = std::fma(w, v[j][d], dst[d]);
      }
    }
  }
}

#endif  // SIEVE_CPU_X86

Isa DetectIsa() {
  Isa best = Isa::kScalar;
#ifdef SIEVE_CPU_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (__builtin_cpu_supports("avx512f")) best = Isa::kAvx512;
#endif
  // SIEVE_CPU_ISA caps it (a diagnostic: the results are the same bits either way).
  if (const char* cap = std::getenv("SIEVE_CPU_ISA")) {
    const std::string_view name(cap);
    if (name == "scalar") best = Isa::kScalar;
    if (name == "avx2" && best == Isa::kAvx512) best = Isa::kAvx2;
  }
  return best;
}

}  // namespace

Isa BestIsa() {
  static const Isa isa = DetectIsa();
  return isa;
}

bool IsaSupported(Isa isa) {
#ifdef SIEVE_CPU_X86
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

float Exp(float x) { return ExpScalar(x); }

float SoftmaxRow(Isa isa, float* row, int64_t count, float scale) {
#ifdef SIEVE_CPU_X86
  if (isa == Isa::kAvx512) return SoftmaxAvx512(row, count, scale);
  if (isa == Isa::kAvx2) return SoftmaxAvx2(row, count, scale);
#endif
  (void)isa;
  return SoftmaxScalar(row, count, scale);
}

float Dot(Isa isa, const float* a, const float* b, int64_t n) {
#ifdef SIEVE_CPU_X86
  if (isa == Isa::kAvx512) return DotAvx512(a, b, n);
  if (isa == Isa::kAvx2) return DotAvx2(a, b, n);
#endif
  (void)isa;
  return DotScalar(a, b, n);
}

void DotTable(Isa isa, Rows a, int64_t rows, Rows b, int64_t cols, int64_t n, float* out,
              int64_t ldo, bool accumulate) {
#ifdef SIEVE_CPU_X86
  if (isa == Isa::kAvx512) {
    static constexpr auto kTiles = TileGrid<Avx512Tile, 4>(std::make_integer_sequence<int, 4>());
    TableTiled<4, 4>(kTiles, a, rows, b, cols, n, out, ldo, accumulate);
    return;
  }
  if (isa == Isa::kAvx2) {
    static constexpr auto kTiles = TileGrid<Avx2Tile, 2>(std::make_integer_sequence<int, 2>());
    TableTiled<2, 2>(kTiles, a, rows, b, cols, n, out, ldo, accumulate);
    return;
  }
#endif
  (void)isa;
  TableScalar(a, rows, b, cols, n, out, ldo, accumulate);
}

void WeightedSumRows(Isa isa, const float* weights, int64_t ldw, int64_t rows, Rows v,
                     int64_t count, int64_t dim, float* out, int64_t ldo) {
#ifdef SIEVE_CPU_X86
  if (isa == Isa::kAvx512) {
    using Fn = void (*)(const float*, int64_t, Rows, int64_t, int64_t, float*, int64_t);
    static constexpr Fn kTiles[4][4] = {{WeightedTileAvx512<1, 1>, WeightedTileAvx512<1, 2>,
                                         WeightedTileAvx512<1, 3>, WeightedTileAvx512<1, 4>},
                                        {WeightedTileAvx512<2, 1>, WeightedTileAvx512<2, 2>,
                                         WeightedTileAvx512<2, 3>, WeightedTileAvx512<2, 4>},
                                        {WeightedTileAvx512<3, 1>, WeightedTileAvx512<3, 2>,
                                         WeightedTileAvx512<3, 3>, WeightedTileAvx512<3, 4>},
                                        {WeightedTileAvx512<4, 1>, WeightedTileAvx512<4, 2>,
                                         WeightedTileAvx512<4, 3>, WeightedTileAvx512<4, 4>}};
    WeightedTiled<4, kLanes>(
        [&](int tile_rows, int tile_vectors, const float* w, int64_t d0, float* dst) {
          kTiles[tile_rows - 1][tile_vectors - 1](w, ldw, v, count, d0, dst, ldo);
        },
        weights, ldw, rows, v, count, dim, out, ldo);
    return;
  }
  if (isa == Isa::kAvx2) {
    using Fn = void (*)(const float*, int64_t, Rows, int64_t, int64_t, float*, int64_t);
    static constexpr Fn kTiles[2][4] = {{WeightedTileAvx2<1, 1>, WeightedTileAvx2<1, 2>,
                                         WeightedTileAvx2<1, 3>, WeightedTileAvx2<1, 4>},
                                        {WeightedTileAvx2<2, 1>, WeightedTileAvx2<2, 2>,
                                         WeightedTileAvx2<2, 3>, WeightedTileAvx2<2, 4>}};
    WeightedTiled<2, 8>(
        [&](int tile_rows, int tile_vectors, const float* w, int64_t d0, float* dst) {
          kTiles[tile_rows - 1][tile_vectors - 1](w, ldw, v, count, d0, dst, ldo);
        },
        weights, ldw, rows, v, count, dim, out, ldo);
    return;
  }
#endif
  (void)isa;
  WeightedSumScalar(weights, ldw, rows, v, count, dim, out, ldo);
}

}  // namespace sieve::cpu
