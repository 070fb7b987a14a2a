// The CPU backend's inner products: dot products (GEMMs, attention scores) and weighted sums of
// rows (attention's values), each with ONE numeric definition that every vector unit computes bit
// for bit: AVX-512, AVX2 + FMA, or plain scalar code, chosen at run time (BestIsa). So a result
// depends only on its operands: not on the machine's vector unit, the batch a row came in, its
// place in a tile, or the threads. That is what keeps the CPU backend the reference it is
// (EngineTest.PreemptedRequestsAnswerAsAlone: a request under load answers bitwise as alone).
// A BLAS library's sgemm makes no such promise (its kernels and their summation orders change
// with the matrix sizes), so these are written here.
//
// The dot product of a and b over n elements, the definition:
//   - lane l (0..15) sums a[i] * b[i] over the i = l (mod 16) below n - n % 16, by fma, in order
//     of i, from 0;
//   - the 16 lane sums meet in a fixed tree: s[l] + s[l + 8], then l + 4, l + 2, l + 1;
//   - the last n % 16 products are added to that by fma, in order.
// A weighted sum of rows: out[d] = fma(w[j], v[j][d], out[d]) for j = 0, 1, ... in order.
// A softmax row: Exp below, summed in 16 lanes and the tree as a dot product's products are.
#pragma once

#include <cstdint>

namespace sieve::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

Isa BestIsa();                 // this machine's widest (SIEVE_CPU_ISA=scalar|avx2 caps it)
bool IsaSupported(Isa isa);    // whether this machine runs it
const char* IsaName(Isa isa);  // "avx512", "avx2", "scalar"

// The dot product above.
float Dot(Isa isa, const float* a, const float* b, int64_t n);
inline float Dot(const float* a, const float* b, int64_t n) { return Dot(BestIsa(), a, b, n); }

// A list of rows: pointers (paged KV entries, say), or a strided matrix (row i at base + i *
// stride).
struct Rows {
  const float* const* pointers = nullptr;
  const float* base = nullptr;
  int64_t stride = 0;
  static Rows Pointers(const float* const* pointers) { return {pointers, nullptr, 0}; }
  static Rows Strided(const float* base, int64_t stride) { return {nullptr, base, stride}; }
  const float* operator[](int64_t i) const { return pointers ? pointers[i] : base + i * stride; }
};

// out[i * ldo + j] = Dot(a[i], b[j], n) (plus out's value when accumulate), for i < rows,
// j < cols: a table of dot products between two lists of rows (x w^T for a GEMM), in tiles of
// several rows of each side that share their loads.
void DotTable(Isa isa, Rows a, int64_t rows, Rows b, int64_t cols, int64_t n, float* out,
              int64_t ldo, bool accumulate);

// out[r * ldo + d] = fma(weights[r * ldw + j], v[j][d], out[r * ldo + d]) for j = 0 .. count - 1
// in order, for r < rows, d < dim: several rows' weighted sums over the same value rows.
void WeightedSumRows(Isa isa, const float* weights, int64_t ldw, int64_t rows, Rows v,
                     int64_t count, int64_t dim, float* out, int64_t ldo);

// e^x in single precision (Cephes' expf polynomial, within about 1 ulp): x clamped to
// [-87.33, 88.37], n = x log2(e) rounded to nearest even, r = x - n ln2 (in two parts, by fma),
// p(r) by fma, times 2^n. Every vector unit computes these same operations.
float Exp(float x);

// Softmax of one row of attention, in place: s_j = scale * row[j]; m = max s_j; e_j = Exp(s_j - m);
// sum = the e_j summed as a dot product's products are (16 lanes in order, the tree, the tail);
// row[j] = e_j * (1 / sum). Returns the row's log-sum-exp, m + log(sum).
float SoftmaxRow(Isa isa, float* row, int64_t count, float scale);

}  // namespace sieve::cpu
