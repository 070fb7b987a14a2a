// Prefill and decode attention kernels (decode in both CTA shapes, and with RoPE fused in)
// against the CPU backend (the reference).
//
// Every case draws fresh random inputs (replay with SIEVE_TEST_SEED), rounds them to bf16 so both
// sides compute from identical values, poisons the outputs with NaN, and checks that every output
// element was written, that nothing outside the outputs was (padding columns, other rows), and
// that a second run is bitwise identical (a moving result is a race).
//
// Tolerances: outputs are bf16 and P is rounded to bf16 before the P.V product, so the relative
// L2 error over a case lands near 3e-3; we allow 1e-2 over the whole output and 5e-2 for any
// single (row, head), which catches a wrong key set in one row. The log-sum-exp is f32 on both
// sides from identical bf16 scores: 5e-3 absolute. H2O scores are f32 sums of probabilities:
// 1e-4 absolute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_bench.h"
#include "backend/cuda/cuda_test_util.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/e4m3_bits.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill_attention.h"
#include "core/float8.h"
#include "core/testing.h"

namespace sieve::cuda {
namespace {

using ::sieve::cuda::testing::DeviceBuffer;
using ::sieve::cuda::testing::ToBf16;
using ::sieve::cuda::testing::ToFloat;

constexpr double kOutTolerance = 1e-2;
constexpr double kOutRowTolerance = 5e-2;
constexpr double kLseTolerance = 5e-3;
constexpr double kScoresTolerance = 1e-4;

// N(0, stddev) values already rounded to bf16.
std::vector<float> RandomBf16Values(size_t count, std::mt19937_64& rng, float stddev = 1.0f) {
  std::vector<float> values(count);
  sieve::testing::FillRandom(values.data(), count, rng, stddev);
  ::sieve::cuda::testing::RoundToBf16(values);
  return values;
}

Tensor HostF32(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
  SIEVE_CHECK_EQ(static_cast<size_t>(tensor.numel()), values.size());
  std::copy(values.begin(), values.end(), tensor.data_as<float>());
  return tensor;
}

Tensor HostI32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kI32);
  SIEVE_CHECK_EQ(static_cast<size_t>(tensor.numel()), values.size());
  std::copy(values.begin(), values.end(), tensor.data_as<int32_t>());
  return tensor;
}

// An FP8 pool's pages and scales: values quantized by their (layer, KV head)'s scale, which is
// amax / 448 of the head's values times a random factor in [1, 4) (headroom, as real scales have).
struct Fp8PoolValues {
  std::vector<uint8_t> k, v;              // [num_pages][page_size][G][d]
  std::vector<float> k_scales, v_scales;  // [layers][G]
};
Fp8PoolValues QuantizePool(const std::vector<float>& k, const std::vector<float>& v, int layers,
                           int kv_heads, int head_dim, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> headroom(1.0f, 4.0f);
  Fp8PoolValues out;
  for (auto [values, bytes, scales] :
       {std::tuple{&k, &out.k, &out.k_scales}, std::tuple{&v, &out.v, &out.v_scales}}) {
    std::vector<float> amax(kv_heads, 0.0f);
    for (size_t index = 0; index < values->size(); ++index) {
      float& head_max = amax[index / head_dim % kv_heads];
      head_max = std::max(head_max, std::abs((*values)[index]));
    }
    scales->resize(static_cast<size_t>(layers) * kv_heads);
    for (size_t index = 0; index < scales->size(); ++index) {
      (*scales)[index] = amax[index % kv_heads] / 448.0f * headroom(rng);
    }
    bytes->resize(values->size());
    for (size_t index = 0; index < values->size(); ++index) {
      // Every layer reads the same pages here; quantize with layer 1's scales (the tests' layer).
      const float scale = (*scales)[kv_heads + index / head_dim % kv_heads];
      (*bytes)[index] = FloatToE4m3((*values)[index] * (1.0f / scale));
    }
  }
  return out;
}

Tensor HostBytes(std::vector<int64_t> shape, const std::vector<uint8_t>& values) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF8E4M3);
  SIEVE_CHECK_EQ(static_cast<size_t>(tensor.numel()), values.size());
  std::copy(values.begin(), values.end(), tensor.data_as<uint8_t>());
  return tensor;
}

std::vector<bf16> NanBf16(size_t count) {
  __nv_bfloat16_raw bits;
  bits.x = 0x7fc0;
  return std::vector<bf16>(count, bf16(bits));
}

// Compares `rows` rows of a GPU output [.][stride] (columns [0, width) are the output, the rest
// padding that must stay NaN) with the reference [rows][width].
struct OutputCheck {
  int64_t unwritten = 0;        // NaN inside the output
  int64_t padding_written = 0;  // non-NaN in the padding columns
  double rel_l2 = 0.0;          // over the whole output
  double worst_segment = 0.0;   // worst relative L2 of one (row, segment) (segment = a head)
};

OutputCheck CompareOutput(const float* gpu, int64_t stride, const float* ref, int64_t rows,
                          int64_t width, int64_t segment) {
  OutputCheck check;
  double diff_sum = 0.0;
  double ref_sum = 0.0;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t begin = 0; begin < width; begin += segment) {
      double segment_diff = 0.0;
      double segment_ref = 0.0;
      for (int64_t column = begin; column < begin + segment; ++column) {
        const float actual = gpu[row * stride + column];
        const float expected = ref[row * width + column];
        if (std::isnan(actual)) {
          ++check.unwritten;
          continue;
        }
        const double d = static_cast<double>(actual) - expected;
        segment_diff += d * d;
        segment_ref += static_cast<double>(expected) * expected;
      }
      diff_sum += segment_diff;
      ref_sum += segment_ref;
      if (segment_ref > 0.0) {
        check.worst_segment = std::max(check.worst_segment, std::sqrt(segment_diff / segment_ref));
      }
    }
    for (int64_t column = width; column < stride; ++column) {
      if (!std::isnan(gpu[row * stride + column])) ++check.padding_written;
    }
  }
  check.rel_l2 = ref_sum > 0.0 ? std::sqrt(diff_sum / ref_sum) : (diff_sum > 0.0 ? INFINITY : 0.0);
  return check;
}

void ExpectOutputMatches(const OutputCheck& check, const std::string& what) {
  EXPECT_EQ(check.unwritten, 0) << what << ": output elements never written";
  EXPECT_EQ(check.padding_written, 0) << what << ": wrote past the output columns";
  EXPECT_LE(check.rel_l2, kOutTolerance) << what;
  EXPECT_LE(check.worst_segment, kOutRowTolerance) << what << ": worst (row, head)";
  std::printf("%s: rel L2 %.3g, worst (row, head) %.3g\n", what.c_str(), check.rel_l2,
              check.worst_segment);
}

bool BitwiseEqual(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

// ------------------------------------------------------------------------------------------
// Prefill

struct PrefillCase {
  std::string name;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  std::vector<int> chunk_lens;    // query rows of each prefill sequence this step
  std::vector<int> context_lens;  // keys cached before this step (chunked prefill)
  float q_stddev = 1.0f;          // larger: peakier softmax
};

void PrintTo(const PrefillCase& test_case, std::ostream* os) { *os << test_case.name; }

// More query tiles than one launch of the sm_90a kernel orders (768): 700 sequences of 1-250 rows
// after 0-300 cached keys, so the launch is split and the sorted order mixes many chunks.
PrefillCase ManyChunksCase() {
  PrefillCase test_case{"many_chunks_d128", 8, 2, 128, {}, {}};
  for (int seq = 0; seq < 700; ++seq) {
    test_case.chunk_lens.push_back(1 + (seq * 37) % 250);
    test_case.context_lens.push_back((seq * 53) % 301);
  }
  return test_case;
}

// Each case runs both kernels: the sm_80 one everywhere, the sm_90a (wgmma) one where the device
// and the build have it (PrefillAttention's choice there).
class PrefillAttentionTest
    : public ::testing::TestWithParam<std::tuple<PrefillCase, PrefillKernel>> {};

TEST_P(PrefillAttentionTest, MatchesCpu) {
  SIEVE_REQUIRE_GPU();
  const PrefillCase& test_case = std::get<0>(GetParam());
  const PrefillKernel kernel = std::get<1>(GetParam());
  if (kernel == PrefillKernel::kSm90 && !PrefillAttentionSm90Supported()) {
    GTEST_SKIP() << "the sm_90a kernel needs an H100/H200 and a build for sm_90a";
  }
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const int num_heads = test_case.num_heads;
  const int kv_heads = test_case.num_kv_heads;
  const int head_dim = test_case.head_dim;
  const int num_seqs = static_cast<int>(test_case.chunk_lens.size());
  ASSERT_EQ(test_case.context_lens.size(), test_case.chunk_lens.size());

  std::vector<int32_t> query_start(num_seqs + 1, 0);
  std::vector<int32_t> key_start(num_seqs + 1, 0);
  std::vector<int32_t> context(test_case.context_lens.begin(), test_case.context_lens.end());
  int max_query_len = 0;
  int max_kv_len = 0;
  for (int seq = 0; seq < num_seqs; ++seq) {
    const int chunk = test_case.chunk_lens[seq];
    query_start[seq + 1] = query_start[seq] + chunk;
    key_start[seq + 1] = key_start[seq] + context[seq] + chunk;
    max_query_len = std::max(max_query_len, chunk);
    max_kv_len = std::max(max_kv_len, context[seq] + chunk);
  }
  const int tokens = query_start[num_seqs];
  const int keys = key_start[num_seqs];
  // q is the first H d columns of a fused qkv row, as in the model.
  const int64_t qkv_width = static_cast<int64_t>(num_heads + 2 * kv_heads) * head_dim;
  const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
  const std::vector<float> qkv =
      RandomBf16Values(static_cast<size_t>(tokens) * qkv_width, rng, test_case.q_stddev);
  const size_t kv_count = static_cast<size_t>(keys) * kv_heads * head_dim;
  const std::vector<float> k = RandomBf16Values(kv_count, rng);
  const std::vector<float> v = RandomBf16Values(kv_count, rng);

  // CPU reference.
  StepMeta step;
  step.num_tokens = step.num_prefill_tokens = tokens;
  step.num_seqs = step.num_prefill_seqs = num_seqs;
  step.num_layers = 1;
  step.max_query_len = max_query_len;
  step.max_kv_len = max_kv_len;
  step.num_prefill_keys = keys;
  step.query_start = HostI32({num_seqs + 1}, query_start);
  step.key_start = HostI32({num_seqs + 1}, key_start);
  step.context_lens = HostI32({num_seqs}, context);
  std::vector<int32_t> slots(num_seqs);
  std::iota(slots.begin(), slots.end(), 0);
  step.seq_slots = HostI32({num_seqs}, slots);
  const Tensor qkv_host = HostF32({tokens, qkv_width}, qkv);
  const Tensor k_host = HostF32({keys, kv_heads, head_dim}, k);
  const Tensor v_host = HostF32({keys, kv_heads, head_dim}, v);
  Tensor out_ref = Tensor::Empty({tokens, q_width}, DType::kF32);
  Tensor lse_ref = Tensor::Empty({tokens, num_heads}, DType::kF32);
  auto cpu = MakeCpuBackend();
  cpu->PrefillAttention(qkv_host.Columns(0, q_width), k_host, v_host, num_heads, step, out_ref,
                        lse_ref);

  // GPU, twice on the same inputs.
  const DeviceBuffer<bf16> qkv_dev(ToBf16(qkv));
  const DeviceBuffer<bf16> k_dev(ToBf16(k));
  const DeviceBuffer<bf16> v_dev(ToBf16(v));
  const DeviceBuffer<int32_t> query_start_dev(query_start);
  const DeviceBuffer<int32_t> key_start_dev(key_start);
  const DeviceBuffer<int32_t> context_dev(context);
  StepView view{};
  view.query_start = query_start_dev.get();
  view.key_start = key_start_dev.get();
  view.context_lens = context_dev.get();
  view.num_tokens = view.num_prefill_tokens = tokens;
  view.num_seqs = view.num_prefill_seqs = num_seqs;
  view.max_query_len = max_query_len;
  view.max_kv_len = max_kv_len;
  view.num_prefill_keys = keys;
  std::vector<PrefillChunk> chunks(num_seqs);
  for (int seq = 0; seq < num_seqs; ++seq) chunks[seq] = {test_case.chunk_lens[seq], context[seq]};
  const int64_t out_stride = q_width + 16;  // the 16 padding columns must stay NaN
  const int64_t lse_stride = num_heads + 3;
  std::vector<bf16> first_run;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<bf16> out_dev(NanBf16(static_cast<size_t>(tokens) * out_stride));
    DeviceBuffer<float> lse_dev(std::vector<float>(static_cast<size_t>(tokens) * lse_stride, NAN));
    PrefillAttentionWithKernel(kernel, qkv_dev.get(), qkv_width, k_dev.get(), v_dev.get(),
                               num_heads, kv_heads, head_dim, view, chunks, out_dev.get(),
                               out_stride, lse_dev.get(), lse_stride, nullptr);
    SIEVE_CUDA_CHECK(cudaGetLastError());
    SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> out_bits = out_dev.ToHost();
    if (run == 1) {
      EXPECT_TRUE(BitwiseEqual(out_bits, first_run)) << "two runs on the same inputs differ";
      break;
    }
    first_run = out_bits;
    const std::vector<float> out = ToFloat(out_bits);
    ExpectOutputMatches(
        CompareOutput(out.data(), out_stride, out_ref.data_as<float>(), tokens, q_width, head_dim),
        test_case.name + " out");
    const std::vector<float> lse = lse_dev.ToHost();
    OutputCheck lse_check;
    double worst = 0.0;
    for (int token = 0; token < tokens; ++token) {
      for (int64_t column = 0; column < lse_stride; ++column) {
        const float actual = lse[token * lse_stride + column];
        if (column >= num_heads) {
          if (!std::isnan(actual)) ++lse_check.padding_written;
          continue;
        }
        if (std::isnan(actual)) {
          ++lse_check.unwritten;
          continue;
        }
        worst = std::max(worst, std::abs(static_cast<double>(actual) -
                                         lse_ref.data_as<float>()[token * num_heads + column]));
      }
    }
    EXPECT_EQ(lse_check.unwritten, 0) << "lse elements never written";
    EXPECT_EQ(lse_check.padding_written, 0) << "wrote past the lse columns";
    EXPECT_LE(worst, kLseTolerance) << "lse";
    std::printf("%s lse: max abs error %.3g\n", test_case.name.c_str(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PrefillAttentionTest,
    ::testing::Combine(
        ::testing::Values(
            // MHA, d = 64, lengths around the 128-row and 64-key tiles, a length-1 sequence.
            PrefillCase{"mha_d64", 4, 4, 64, {1, 37, 128, 200}, {0, 0, 0, 0}},
            // Llama-3-8B heads, d = 128.
            PrefillCase{"gqa32x8_d128", 32, 8, 128, {1, 65, 130, 257}, {0, 0, 0, 0}},
            // Chunked prefill: cached context before each chunk (bottom-right causal alignment).
            PrefillCase{
                "gqa8x2_d128_chunked", 8, 2, 128, {100, 1, 64, 129, 7}, {50, 300, 0, 127, 1000}},
            PrefillCase{"gqa8x2_d64_chunked", 8, 2, 64, {33, 129, 1}, {5, 64, 77}},
            // Long sequences: many key tiles, the online-softmax rescaling over ~50 tiles.
            PrefillCase{"long3000_d128", 8, 2, 128, {3000}, {0}},
            PrefillCase{"long_chunked_d64", 8, 2, 64, {1000, 257}, {2000, 0}},
            // Peaky softmax (score std 4): the running max moves a lot between tiles.
            PrefillCase{"peaky_d128", 8, 2, 128, {300}, {200}, 4.0f},
            // A group size that is not a power of two.
            PrefillCase{"group3_d64", 12, 4, 64, {70}, {10}}, ManyChunksCase()),
        ::testing::Values(PrefillKernel::kSm80, PrefillKernel::kSm90)),
    [](const ::testing::TestParamInfo<std::tuple<PrefillCase, PrefillKernel>>& info) {
      return std::get<0>(info.param).name +
             (std::get<1>(info.param) == PrefillKernel::kSm90 ? "_sm90" : "_sm80");
    });

// Key tiles of 128 keys that the last row of a work order's entry sees.
int KeyTilesOf(const std::vector<PrefillChunk>& chunks, uint32_t entry, int rows_per_tile) {
  const PrefillChunk& chunk = chunks[entry >> 16];
  const int last_row =
      std::min<int>(chunk.query_len, (static_cast<int>(entry & 0xffff) + 1) * rows_per_tile);
  return (chunk.context_len + last_row + 127) / 128;
}

// The sm_90a kernel's work order (host code: runs without a GPU). Fresh random chunks: every
// query tile once, most key tiles first, ties in chunk order.
TEST(PrefillWorkOrderTest, EveryTileOnceMostKeyTilesFirst) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<PrefillChunk> chunks(1 + rng() % 12);
    for (PrefillChunk& chunk : chunks) {
      chunk.query_len = static_cast<int32_t>(1 + rng() % 5000);
      chunk.context_len = static_cast<int32_t>(rng() % 2 == 0 ? 0 : rng() % 8000);
    }
    const int rows = trial % 2 == 0 ? 128 : 192;
    const std::vector<uint32_t> order = SortedPrefillTiles(chunks, rows, 128);
    size_t expected = 0;
    for (const PrefillChunk& chunk : chunks) expected += (chunk.query_len + rows - 1) / rows;
    ASSERT_EQ(order.size(), expected);
    std::vector<uint32_t> seen = order;
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "a tile twice";
    for (const uint32_t entry : order) {
      ASSERT_LT(entry >> 16, chunks.size());
      EXPECT_LT(static_cast<int>(entry & 0xffff) * rows, chunks[entry >> 16].query_len);
    }
    for (size_t i = 1; i < order.size(); ++i) {
      const int before = KeyTilesOf(chunks, order[i - 1], rows);
      const int after = KeyTilesOf(chunks, order[i], rows);
      ASSERT_GE(before, after) << "entry " << i;
      if (before == after) {
        EXPECT_LT(order[i - 1], order[i]) << "ties keep chunk order";
      }
    }
  }
}

// What the order is for: a step of `sieve serve` (the rest of a 4000-token prompt, a whole one and
// the start of the next) dealt out as the kernel's rounds do (132 CTAs, 32 heads; CTA c takes item
// c of even rounds, G - 1 - c of odd ones; an item costs its key tiles and 3.5 more) keeps the
// busiest CTA within 2% of the mean.
TEST(PrefillWorkOrderTest, ServingStepRoundsEvenOut) {
  const std::vector<PrefillChunk> chunks = {{3936, 64}, {4000, 0}, {128, 0}};
  const std::vector<uint32_t> order = SortedPrefillTiles(chunks, 128, 128);
  constexpr int kCtas = 132;
  constexpr int kHeads = 32;
  std::vector<double> load(kCtas, 0.0);
  double total = 0.0;
  const int items = static_cast<int>(order.size()) * kHeads;
  for (int work = 0; work < items; ++work) {
    const int round = work / kCtas;
    const int slot = work % kCtas;
    const int cta = round % 2 == 0 ? slot : kCtas - 1 - slot;
    const double cost = KeyTilesOf(chunks, order[work / kHeads], 128) + 3.5;
    load[cta] += cost;
    total += cost;
  }
  const double busiest = *std::max_element(load.begin(), load.end());
  EXPECT_LE(busiest, 1.02 * total / kCtas);
}

// ------------------------------------------------------------------------------------------
// Decode

struct DecodeCase {
  std::string name;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int batch;                        // decode sequences
  int max_context;                  // kv lengths in [1, max_context]; 1 and max_context occur
  std::vector<int> prefill_chunks;  // prefill sequences ahead of the decode ones in the step
  bool h2o;                         // exercise the scores side pool
  std::vector<int> splits;          // split counts to run; 0 = DecodeAttention's own choice
  int page_size = 16;
  bool fp8 = false;  // an FP8 pool: e4m3 entries with per-(layer, KV head) scales
};

void PrintTo(const DecodeCase& test_case, std::ostream* os) { *os << test_case.name; }

class DecodeAttentionTest : public ::testing::TestWithParam<DecodeCase> {};

// "wide", "narrow x2" (2 KV heads a CTA), or "auto (narrow x4)": what DecodeAttention picks at
// these sizes.
std::string CtaName(DecodeCta cta, int kv_heads_per_cta, int batch, int num_heads,
                    int num_kv_heads) {
  const auto name = [](DecodeCta shape, int fold) {
    return std::string(shape == DecodeCta::kNarrow ? "narrow" : "wide") +
           (fold > 1 ? " x" + std::to_string(fold) : "");
  };
  if (cta != DecodeCta::kAuto) return name(cta, kv_heads_per_cta);
  const DecodeCta chosen = ChooseDecodeCta(batch, num_heads, num_kv_heads);
  return "auto (" +
         name(chosen, ChooseDecodeKvHeadsPerCta(batch, num_heads, num_kv_heads, chosen)) + ")";
}

// The KV heads a CTA that each forced CTA shape runs with: 1, and where the group allows folding
// 2 and all of them (each a divisor of num_kv_heads).
std::vector<int> FoldsToRun(int num_heads, int num_kv_heads) {
  std::vector<int> folds = {1};
  if (num_heads / num_kv_heads > kDecodeMaxFoldedGroup) return folds;
  for (const int fold : {2, num_kv_heads}) {
    if (fold > 1 && num_kv_heads % fold == 0 &&
        std::find(folds.begin(), folds.end(), fold) == folds.end()) {
      folds.push_back(fold);
    }
  }
  return folds;
}

// A decode attention configuration a test runs: kAuto (DecodeAttention's own choice of split
// count, shape and KV heads a CTA), or a forced shape with a forced number of KV heads a CTA.
struct DecodeShape {
  DecodeCta cta;
  int fold;  // KV heads a CTA; 0 with kAuto
};

std::vector<DecodeShape> ShapesToRun(int num_heads, int num_kv_heads) {
  std::vector<DecodeShape> shapes = {{DecodeCta::kAuto, 0}};
  for (const DecodeCta cta : {DecodeCta::kWide, DecodeCta::kNarrow}) {
    for (const int fold : FoldsToRun(num_heads, num_kv_heads)) shapes.push_back({cta, fold});
  }
  return shapes;
}

// The decode rows [prefill_tokens, tokens) of a GPU output [tokens][out_stride] against the
// reference [tokens][q_width]; the prefill rows belong to another op and must stay NaN.
void ExpectDecodeRowsMatch(const std::vector<float>& out, int64_t out_stride, const float* ref,
                           int tokens, int prefill_tokens, int64_t q_width, int head_dim,
                           const std::string& what) {
  int64_t prefill_written = 0;
  for (int64_t index = 0; index < prefill_tokens * out_stride; ++index) {
    if (!std::isnan(out[index])) ++prefill_written;
  }
  EXPECT_EQ(prefill_written, 0) << what << ": wrote into prefill rows";
  ExpectOutputMatches(
      CompareOutput(out.data() + prefill_tokens * out_stride, out_stride,
                    ref + prefill_tokens * q_width, tokens - prefill_tokens, q_width, head_dim),
      what);
}

// The sequences, lengths and page tables of a decode-attention case, over two layers: prefill
// chunks, then one token for each of `batch` decode sequences, in shuffled rows of a page table of
// `max_seqs` rows. The decode sequences of `layer` hold [1, max_context] entries (both ends
// present); every other (layer, row) a short random length, so that a wrong layer offset shows.
// Each row gets the pages of its length (room_past_end: of one entry more), shuffled over a pool
// with `spare_pages` more; unused table entries are -1 (reading one fetches from before the pool).
struct PagedDecodeCase {
  static constexpr int kLayers = 2;
  int num_prefill = 0;
  int num_seqs = 0;
  int max_seqs = 0;
  int page_size = 0;
  int max_pages_per_seq = 0;
  int num_pages = 0;
  int max_kv_len = 0;  // of the decode sequences of the tested layer
  int tokens = 0;
  int prefill_tokens = 0;
  std::vector<int32_t> slots;        // [num_seqs]
  std::vector<int32_t> kv_lens;      // [kLayers][max_seqs]
  std::vector<int32_t> page_table;   // [kLayers][max_seqs][max_pages_per_seq]
  std::vector<int32_t> query_start;  // [num_seqs + 1]

  PagedDecodeCase(std::mt19937_64& rng, const std::vector<int>& prefill_chunks, int batch,
                  int layer, int max_seqs_, int max_context, int page_size_, int max_pages_per_seq_,
                  int spare_pages, bool room_past_end)
      : num_prefill(static_cast<int>(prefill_chunks.size())),
        num_seqs(num_prefill + batch),
        max_seqs(max_seqs_),
        page_size(page_size_),
        max_pages_per_seq(max_pages_per_seq_) {
    std::vector<int32_t> slot_order(max_seqs);
    std::iota(slot_order.begin(), slot_order.end(), 0);
    std::shuffle(slot_order.begin(), slot_order.end(), rng);
    slots.assign(slot_order.begin(), slot_order.begin() + num_seqs);

    std::uniform_int_distribution<int> context_dist(1, max_context);
    std::uniform_int_distribution<int> short_dist(1, 40);
    kv_lens.resize(static_cast<size_t>(kLayers) * max_seqs);
    for (auto& length : kv_lens) length = short_dist(rng);
    for (int index = 0; index < batch; ++index) {
      int length = context_dist(rng);
      if (index == 0) length = max_context;
      if (index == 1) length = 1;
      Length(layer, num_prefill + index) = length;
      max_kv_len = std::max(max_kv_len, length);
    }

    const auto pages_for = [&](int length) {
      return room_past_end ? length / page_size + 1 : (length + page_size - 1) / page_size;
    };
    int total_pages = 0;
    for (const int length : kv_lens) total_pages += pages_for(length);
    num_pages = total_pages + spare_pages;
    std::vector<int32_t> page_ids(num_pages);
    std::iota(page_ids.begin(), page_ids.end(), 0);
    std::shuffle(page_ids.begin(), page_ids.end(), rng);
    page_table.assign(static_cast<size_t>(kLayers) * max_seqs * max_pages_per_seq, -1);
    int next_page = 0;
    for (int row = 0; row < kLayers * max_seqs; ++row) {
      for (int page = 0; page < pages_for(kv_lens[row]); ++page) {
        page_table[static_cast<size_t>(row) * max_pages_per_seq + page] = page_ids[next_page++];
      }
    }

    query_start.assign(num_seqs + 1, 0);
    for (int seq = 0; seq < num_seqs; ++seq) {
      query_start[seq + 1] = query_start[seq] + (seq < num_prefill ? prefill_chunks[seq] : 1);
    }
    tokens = query_start[num_seqs];
    prefill_tokens = query_start[num_prefill];
  }

  // Entries sequence `seq` holds in `layer`.
  int32_t& Length(int layer, int seq) {
    return kv_lens[static_cast<size_t>(layer) * max_seqs + slots[seq]];
  }
  int32_t Length(int layer, int seq) const {
    return kv_lens[static_cast<size_t>(layer) * max_seqs + slots[seq]];
  }

  // The step on the host (no positions or write_start: the RoPE test adds them).
  StepMeta HostStep() const {
    StepMeta step;
    step.num_tokens = tokens;
    step.num_prefill_tokens = prefill_tokens;
    step.num_seqs = num_seqs;
    step.num_prefill_seqs = num_prefill;
    step.num_layers = kLayers;
    step.max_kv_len = max_kv_len;
    step.query_start = HostI32({num_seqs + 1}, query_start);
    step.seq_slots = HostI32({num_seqs}, slots);
    step.context_lens = HostI32({num_seqs}, std::vector<int32_t>(num_seqs, 0));
    return step;
  }

  // The pool on the host over K and V values [num_pages][page_size][kv_heads][head_dim].
  KvPool HostPool(int kv_heads, int head_dim, const std::vector<float>& k,
                  const std::vector<float>& v) const {
    KvPool pool;
    pool.page_size = page_size;
    pool.num_pages = num_pages;
    pool.max_seqs = max_seqs;
    pool.max_pages_per_seq = max_pages_per_seq;
    pool.num_kv_heads = kv_heads;
    pool.head_dim = head_dim;
    pool.k = HostF32({num_pages, page_size, kv_heads, head_dim}, k);
    pool.v = HostF32({num_pages, page_size, kv_heads, head_dim}, v);
    pool.page_table = HostI32({kLayers, max_seqs, max_pages_per_seq}, page_table);
    pool.kv_lens = HostI32({kLayers, max_seqs}, kv_lens);
    return pool;
  }
};

// A PagedDecodeCase's tables on the device, the StepView over them and PoolViews over its pages.
struct DevicePagedDecodeCase {
  explicit DevicePagedDecodeCase(const PagedDecodeCase& paged)
      : page_table(paged.page_table),
        kv_lens(paged.kv_lens),
        query_start(paged.query_start),
        slots(paged.slots) {
    view.query_start = query_start.get();
    view.seq_slots = slots.get();
    view.num_tokens = paged.tokens;
    view.num_prefill_tokens = paged.prefill_tokens;
    view.num_seqs = paged.num_seqs;
    view.num_prefill_seqs = paged.num_prefill;
    view.max_kv_len = paged.max_kv_len;
    pool.page_table = page_table.get();
    pool.kv_lens = kv_lens.get();
    pool.page_size = paged.page_size;
    pool.max_seqs = paged.max_seqs;
    pool.max_pages_per_seq = paged.max_pages_per_seq;
  }

  // The pool view over device K and V pages (and optional side pools).
  PoolView Pool(void* k, void* v, int kv_heads, int head_dim) const {
    PoolView result = pool;
    result.k = k;
    result.v = v;
    result.num_kv_heads = kv_heads;
    result.head_dim = head_dim;
    return result;
  }

  DeviceBuffer<int32_t> page_table, kv_lens, query_start, slots;
  StepView view{};
  PoolView pool{};  // tables and shape only
};

TEST_P(DecodeAttentionTest, MatchesCpu) {
  SIEVE_REQUIRE_GPU();
  const DecodeCase& test_case = GetParam();
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const int num_heads = test_case.num_heads;
  const int kv_heads = test_case.num_kv_heads;
  const int head_dim = test_case.head_dim;
  const int page_size = test_case.page_size;
  const int batch = test_case.batch;
  const int layer = 1;  // layer 0 holds other lengths and pages: a wrong layer offset shows
  const PagedDecodeCase paged(rng, test_case.prefill_chunks, batch, layer,
                              static_cast<int>(test_case.prefill_chunks.size()) + batch + 3,
                              test_case.max_context, page_size,
                              (test_case.max_context + page_size - 1) / page_size + 1, 7, false);
  const int num_pages = paged.num_pages;
  const int max_kv_len = paged.max_kv_len;

  const size_t pool_count = static_cast<size_t>(num_pages) * page_size * kv_heads * head_dim;
  const std::vector<float> k_pool = RandomBf16Values(pool_count, rng);
  const std::vector<float> v_pool = RandomBf16Values(pool_count, rng);
  std::vector<float> scores_initial;
  if (test_case.h2o) {
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    scores_initial.resize(static_cast<size_t>(num_pages) * page_size * kv_heads);
    for (float& score : scores_initial) score = uniform(rng);
  }

  const int tokens = paged.tokens;
  const int prefill_tokens = paged.prefill_tokens;
  const int64_t qkv_width = static_cast<int64_t>(num_heads + 2 * kv_heads) * head_dim;
  const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
  const std::vector<float> qkv = RandomBf16Values(static_cast<size_t>(tokens) * qkv_width, rng);

  const StepMeta step = paged.HostStep();
  KvPool pool = paged.HostPool(kv_heads, head_dim, k_pool, v_pool);
  Fp8PoolValues fp8;
  if (test_case.fp8) {
    fp8 = QuantizePool(k_pool, v_pool, PagedDecodeCase::kLayers, kv_heads, head_dim, rng);
    pool.k = HostBytes(pool.k.shape(), fp8.k);
    pool.v = HostBytes(pool.v.shape(), fp8.v);
    pool.k_scales = HostF32({PagedDecodeCase::kLayers, kv_heads}, fp8.k_scales);
    pool.v_scales = HostF32({PagedDecodeCase::kLayers, kv_heads}, fp8.v_scales);
  }
  if (test_case.h2o) {
    pool.scores = HostF32({static_cast<int64_t>(num_pages) * page_size, kv_heads}, scores_initial);
  }
  const Tensor qkv_host = HostF32({tokens, qkv_width}, qkv);
  Tensor out_ref = Tensor::Empty({tokens, q_width}, DType::kF32);
  auto cpu = MakeCpuBackend();
  cpu->DecodeAttention(qkv_host.Columns(0, q_width), num_heads, step, layer, pool, out_ref);

  const DeviceBuffer<bf16> qkv_dev(ToBf16(qkv));
  const DeviceBuffer<bf16> k_dev(ToBf16(k_pool));
  const DeviceBuffer<bf16> v_dev(ToBf16(v_pool));
  const DeviceBuffer<uint8_t> k_fp8_dev(test_case.fp8 ? fp8.k : std::vector<uint8_t>(1));
  const DeviceBuffer<uint8_t> v_fp8_dev(test_case.fp8 ? fp8.v : std::vector<uint8_t>(1));
  const DeviceBuffer<float> k_scales_dev(test_case.fp8 ? fp8.k_scales : std::vector<float>(1));
  const DeviceBuffer<float> v_scales_dev(test_case.fp8 ? fp8.v_scales : std::vector<float>(1));
  const DevicePagedDecodeCase device(paged);
  const StepView& view = device.view;
  const int64_t out_stride = q_width + 8;  // padding columns must stay NaN

  for (const int forced_splits : test_case.splits) {
    const int splits = forced_splits > 0
                           ? forced_splits
                           : DecodeAttentionSplits(batch, num_heads, kv_heads, head_dim, max_kv_len,
                                                   DecodeAttentionWorkspaceBytes(
                                                       batch, num_heads, head_dim, max_kv_len));
    const size_t workspace_bytes =
        forced_splits > 0
            ? DecodeAttentionWorkspaceBytesForSplits(batch, num_heads, head_dim, forced_splits)
            : DecodeAttentionWorkspaceBytes(batch, num_heads, head_dim, max_kv_len);
    DeviceBuffer<uint8_t> workspace(workspace_bytes);
    // Each split count in both CTA shapes, unfolded and folded; with the chosen count also
    // DecodeAttention itself (kAuto: its own split count, shape and folding).
    for (const auto& [cta, fold] : ShapesToRun(num_heads, kv_heads)) {
      if (cta == DecodeCta::kAuto && forced_splits > 0) continue;
      const std::string what = test_case.name + (forced_splits > 0 ? " forced" : " chosen") +
                               " splits=" + std::to_string(splits) + " " +
                               CtaName(cta, fold, batch, num_heads, kv_heads);
      std::vector<bf16> first_run;
      for (int run = 0; run < 2; ++run) {
        DeviceBuffer<bf16> out_dev(NanBf16(static_cast<size_t>(tokens) * out_stride));
        std::unique_ptr<DeviceBuffer<float>> scores_dev;
        if (test_case.h2o) scores_dev = std::make_unique<DeviceBuffer<float>>(scores_initial);
        PoolView pool_view = device.Pool(k_dev.get(), v_dev.get(), kv_heads, head_dim);
        if (test_case.fp8) {
          pool_view = device.Pool(k_fp8_dev.get(), v_fp8_dev.get(), kv_heads, head_dim);
          pool_view.fp8 = true;
          pool_view.k_scales = k_scales_dev.get();
          pool_view.v_scales = v_scales_dev.get();
        }
        pool_view.scores = scores_dev ? scores_dev->get() : nullptr;
        if (cta != DecodeCta::kAuto) {
          DecodeAttentionWithSplits(splits, cta, fold, qkv_dev.get(), qkv_width, nullptr, num_heads,
                                    view, layer, pool_view, out_dev.get(), out_stride,
                                    workspace.get(), workspace_bytes, RowRmsView{}, nullptr);
        } else {
          DecodeAttention(qkv_dev.get(), qkv_width, num_heads, view, layer, pool_view,
                          out_dev.get(), out_stride, workspace.get(), workspace_bytes, nullptr);
        }
        SIEVE_CUDA_CHECK(cudaGetLastError());
        SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<bf16> out_bits = out_dev.ToHost();
        if (run == 1) {
          EXPECT_TRUE(BitwiseEqual(out_bits, first_run)) << what << ": two runs differ";
          break;
        }
        first_run = out_bits;
        const std::vector<float> out = ToFloat(out_bits);
        ExpectDecodeRowsMatch(out, out_stride, out_ref.data_as<float>(), tokens, prefill_tokens,
                              q_width, head_dim, what);
        if (test_case.h2o) {
          // Compare what each side added to the accumulated scores.
          const std::vector<float> scores = scores_dev->ToHost();
          const float* scores_ref = pool.scores.data_as<float>();
          double worst = 0.0;
          int64_t nan_count = 0;
          for (size_t index = 0; index < scores.size(); ++index) {
            if (std::isnan(scores[index])) {
              ++nan_count;
              continue;
            }
            worst =
                std::max(worst, std::abs(static_cast<double>(scores[index]) - scores_ref[index]));
          }
          EXPECT_EQ(nan_count, 0) << what << ": NaN scores";
          EXPECT_LE(worst, kScoresTolerance) << what << ": H2O scores";
          std::printf("%s: H2O scores max abs error %.3g\n", what.c_str(), worst);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DecodeAttentionTest,
    ::testing::Values(
        // Batch 1, long context: split-K by the heuristic, and forced off and odd.
        DecodeCase{"b1_gqa32x8_d128", 32, 8, 128, 1, 5000, {}, false, {0, 1, 7}},
        DecodeCase{"b7_gqa32x8_d128", 32, 8, 128, 7, 5000, {}, false, {0, 1, 3}},
        DecodeCase{"b33_gqa8x2_d128", 8, 2, 128, 33, 5000, {}, false, {0, 1, 4}},
        DecodeCase{"b7_gqa8x2_d64", 8, 2, 64, 7, 3000, {}, false, {0, 1, 5}},
        DecodeCase{"b5_mha_d128", 4, 4, 128, 5, 700, {}, false, {0, 1, 2}},
        // 32 query heads on one KV head: two 16-head chunks per KV head.
        DecodeCase{"b3_mqa32_d64", 32, 1, 64, 3, 1000, {}, false, {0, 1, 3}},
        DecodeCase{"b4_group3_d128", 12, 4, 128, 4, 600, {}, false, {0, 1}},
        // A mixed step: prefill rows ahead of the decode rows stay untouched.
        DecodeCase{"mixed_b9_gqa32x8_d128", 32, 8, 128, 9, 2000, {5, 3}, false, {0, 1, 2}},
        // H2O accumulated scores, with and without splits.
        DecodeCase{"h2o_b7_gqa32x8_d128", 32, 8, 128, 7, 3000, {}, true, {0, 1, 4}},
        DecodeCase{"h2o_mixed_b5_gqa8x2_d64", 8, 2, 64, 5, 1500, {4}, true, {0, 1, 3}},
        // A page size that is not a power of two (the division path).
        DecodeCase{"page24_b3_gqa8x2_d128", 8, 2, 128, 3, 1000, {}, true, {0, 2}, 24},
        // The sparse decode step's shape: 512 CTAs, more than one wide wave, so auto is narrow
        // (on a GPU of fewer than 256 SMs).
        DecodeCase{"b64_gqa32x8_d128_short", 32, 8, 128, 64, 500, {}, false, {0, 1, 3}},
        // Batch 160: 1,280 (sequence, KV head) CTAs, several narrow waves on a GPU of up to 320
        // SMs, so auto folds KV heads into CTAs.
        DecodeCase{"b160_gqa32x8_d128_short", 32, 8, 128, 160, 300, {}, false, {0, 1, 2}},
        // FP8 pools: e4m3 tiles through the pipeline, scales folded into scores and outputs;
        // long and split, both CTA shapes, H2O's score pass, folded KV heads, d = 64.
        DecodeCase{"fp8_b7_gqa32x8_d128", 32, 8, 128, 7, 5000, {}, false, {0, 1, 3}, 16, true},
        DecodeCase{
            "fp8_h2o_mixed_b5_gqa8x2_d64", 8, 2, 64, 5, 1500, {4}, true, {0, 1, 3}, 16, true},
        DecodeCase{
            "fp8_b160_gqa32x8_d128_short", 32, 8, 128, 160, 300, {}, false, {0, 1}, 16, true},
        DecodeCase{"fp8_page24_b3_gqa8x2_d128", 8, 2, 128, 3, 1000, {}, true, {0, 2}, 24, true},
        // Groups of 3 (rows past the group masked) and of 32 (two head chunks a KV head).
        DecodeCase{"fp8_b4_group3_d128", 12, 4, 128, 4, 600, {}, false, {0, 1}, 16, true},
        DecodeCase{"fp8_b3_mqa32_d128", 32, 1, 128, 3, 1000, {}, false, {0, 1, 3}, 16, true}),
    [](const ::testing::TestParamInfo<DecodeCase>& info) { return info.param.name; });

// Batch invariance (DecodeAttention's batch_invariant, README_attention.md "Batch invariance"):
// a decode sequence's output row is the same bits alone (a step of one sequence, its grid sized
// for its own length or for a longer context, as a CUDA graph is) as inside a step of 200 decode
// sequences behind a prefill chunk, for sequences of one entry, of a few splits and of the
// longest context. The batch's outputs also match the CPU (the tolerances above).
TEST(DecodeAttentionBatchInvariantTest, SequenceAloneEqualsItInABatch) {
  SIEVE_REQUIRE_GPU();
  std::mt19937_64 rng = sieve::testing::MakeRng();
  struct Shape {
    int num_heads, kv_heads, head_dim;
  };
  for (const Shape shape : {Shape{32, 8, 128}, Shape{8, 2, 64}}) {
    const int num_heads = shape.num_heads, kv_heads = shape.kv_heads, head_dim = shape.head_dim;
    SCOPED_TRACE(std::to_string(num_heads) + "x" + std::to_string(kv_heads) + " d" +
                 std::to_string(head_dim));
    constexpr int kBatch = 200;
    constexpr int kMaxContext = 3000;
    constexpr int kPageSize = 16;
    const int layer = 1;
    const PagedDecodeCase paged(rng, {37}, kBatch, layer, kBatch + 5, kMaxContext, kPageSize,
                                kMaxContext / kPageSize + 1, 7, false);
    const size_t pool_count =
        static_cast<size_t>(paged.num_pages) * kPageSize * kv_heads * head_dim;
    const std::vector<float> k_pool = RandomBf16Values(pool_count, rng);
    const std::vector<float> v_pool = RandomBf16Values(pool_count, rng);
    const int64_t qkv_width = static_cast<int64_t>(num_heads + 2 * kv_heads) * head_dim;
    const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
    const std::vector<float> qkv =
        RandomBf16Values(static_cast<size_t>(paged.tokens) * qkv_width, rng);
    const DeviceBuffer<bf16> qkv_dev(ToBf16(qkv));
    const DeviceBuffer<bf16> k_dev(ToBf16(k_pool));
    const DeviceBuffer<bf16> v_dev(ToBf16(v_pool));
    const DevicePagedDecodeCase device(paged);
    const PoolView pool_view = device.Pool(k_dev.get(), v_dev.get(), kv_heads, head_dim);
    const int64_t out_stride = q_width + 8;

    // The batch: every decode sequence at once, behind the prefill chunk's rows.
    const size_t batch_bytes =
        DecodeAttentionWorkspaceBytes(kBatch, num_heads, head_dim, paged.max_kv_len, true);
    DeviceBuffer<uint8_t> batch_workspace(batch_bytes);
    DeviceBuffer<bf16> batch_out(NanBf16(static_cast<size_t>(paged.tokens) * out_stride));
    DecodeAttention(qkv_dev.get(), qkv_width, num_heads, device.view, layer, pool_view,
                    batch_out.get(), out_stride, batch_workspace.get(), batch_bytes, nullptr,
                    /*batch_invariant=*/true);
    SIEVE_CUDA_CHECK(cudaGetLastError());
    const std::vector<bf16> batch_bits = batch_out.ToHost();
    {
      const StepMeta step = paged.HostStep();
      KvPool pool = paged.HostPool(kv_heads, head_dim, k_pool, v_pool);
      const Tensor qkv_host = HostF32({paged.tokens, qkv_width}, qkv);
      Tensor out_ref = Tensor::Empty({paged.tokens, q_width}, DType::kF32);
      MakeCpuBackend()->DecodeAttention(qkv_host.Columns(0, q_width), num_heads, step, layer, pool,
                                        out_ref);
      ExpectDecodeRowsMatch(ToFloat(batch_bits), out_stride, out_ref.data_as<float>(), paged.tokens,
                            paged.prefill_tokens, q_width, head_dim, "batch-invariant batch");
    }

    // Each probe alone: the longest, the one-entry one and a few others.
    std::vector<int> probes = {0, 1};
    for (int extra = 0; extra < 4; ++extra) probes.push_back(2 + static_cast<int>(rng() % 198));
    for (const int probe : probes) {
      const int seq = paged.num_prefill + probe;
      const int length = paged.Length(layer, seq);
      const int token = paged.query_start[seq];
      DeviceBuffer<int32_t> query_start(std::vector<int32_t>{0, 1});
      DeviceBuffer<int32_t> slots(std::vector<int32_t>{paged.slots[seq]});
      for (const int bound : {length, kMaxContext + 700}) {
        SCOPED_TRACE("sequence " + std::to_string(probe) + " of " + std::to_string(length) +
                     " entries, grid for " + std::to_string(bound));
        StepView alone = device.view;
        alone.query_start = query_start.get();
        alone.seq_slots = slots.get();
        alone.num_tokens = 1;
        alone.num_prefill_tokens = 0;
        alone.num_seqs = 1;
        alone.num_prefill_seqs = 0;
        alone.max_kv_len = bound;
        const size_t bytes = DecodeAttentionWorkspaceBytes(1, num_heads, head_dim, bound, true);
        DeviceBuffer<uint8_t> workspace(bytes);
        DeviceBuffer<bf16> out(NanBf16(static_cast<size_t>(out_stride)));
        DecodeAttention(qkv_dev.get() + static_cast<int64_t>(token) * qkv_width, qkv_width,
                        num_heads, alone, layer, pool_view, out.get(), out_stride, workspace.get(),
                        bytes, nullptr, /*batch_invariant=*/true);
        SIEVE_CUDA_CHECK(cudaGetLastError());
        const std::vector<bf16> alone_bits = out.ToHost();
        const std::vector<bf16> row(alone_bits.begin(), alone_bits.begin() + q_width);
        const std::vector<bf16> in_batch(
            batch_bits.begin() + static_cast<int64_t>(token) * out_stride,
            batch_bits.begin() + static_cast<int64_t>(token) * out_stride + q_width);
        EXPECT_TRUE(BitwiseEqual(row, in_batch)) << "alone differs from the batch";
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Decode attention with RoPE fused in (RopeDecodeAttention)
//
// Fresh random q, k, v rows (not rotated) and pools. Against the CPU's RopeAndCacheWrite(kDecode)
// then DecodeAttention: the output (tolerances as above), V entries and positions exact, K
// entries within one bf16 rounding of the CPU's f32 rotation (2^-7 relative), every other entry
// untouched. Against the GPU's own two kernels (RopeAndCacheWrite over the decode tokens, then
// DecodeAttention) with the same split count and CTA shape: output and pool bitwise equal.
// Decode sequences 2, 3 and 4 write no entry, an entry in the middle of their range, and one
// past their length (written, never read).

struct RopeDecodeCase {
  std::string name;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int batch;
  int max_context;
  std::vector<int> prefill_chunks;  // prefill sequences ahead of the decode ones in the step
  std::vector<int> splits;          // split counts to run; 0 = RopeDecodeAttention's own choice
  int page_size = 16;
  bool folded = false;  // q, k, v scaled by a folded RMSNorm's s of random residual rows
};

void PrintTo(const RopeDecodeCase& test_case, std::ostream* os) { *os << test_case.name; }

class RopeDecodeAttentionTest : public ::testing::TestWithParam<RopeDecodeCase> {};

TEST_P(RopeDecodeAttentionTest, MatchesCpuAndTwoKernelPath) {
  SIEVE_REQUIRE_GPU();
  const RopeDecodeCase& test_case = GetParam();
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const int num_heads = test_case.num_heads;
  const int kv_heads = test_case.num_kv_heads;
  const int head_dim = test_case.head_dim;
  const int page_size = test_case.page_size;
  const int batch = test_case.batch;
  const int layer = 1;  // layer 0 has other lengths, pages and write positions
  // Pages for one entry more than each row holds (the past-the-end write).
  const PagedDecodeCase paged(rng, test_case.prefill_chunks, batch, layer,
                              static_cast<int>(test_case.prefill_chunks.size()) + batch + 2,
                              test_case.max_context, page_size,
                              (test_case.max_context + 1 + page_size - 1) / page_size, 5, true);
  const int num_prefill = paged.num_prefill;
  const int num_seqs = paged.num_seqs;
  const int num_pages = paged.num_pages;
  const int max_kv_len = paged.max_kv_len;
  const std::vector<int32_t>& query_start = paged.query_start;
  const int tokens = paged.tokens;
  const int prefill_tokens = paged.prefill_tokens;

  // write_start [L][S]: the decode token's own entry (lengths include it); decode sequences 2, 3
  // and 4 write no entry, one in the middle, and one past their length.
  std::vector<int32_t> write_start(static_cast<size_t>(PagedDecodeCase::kLayers) * num_seqs, 0);
  for (int index = 0; index < batch; ++index) {
    const int seq = num_prefill + index;
    const int length = paged.Length(layer, seq);
    int written = length - 1;
    if (index == 2) written = -1;
    if (index == 3) written = length / 2;
    if (index == 4) written = length;
    write_start[static_cast<size_t>(layer) * num_seqs + seq] = written;
  }
  // True positions run past the entries held (a sparse layer keeps fewer).
  std::uniform_int_distribution<int> extra_dist(0, 2000);
  std::vector<int32_t> positions(tokens);
  for (int token = 0; token < tokens; ++token) {
    const int seq = static_cast<int>(
        std::upper_bound(query_start.begin(), query_start.end(), token) - query_start.begin() - 1);
    positions[token] = seq < num_prefill ? token - query_start[seq]
                                         : paged.Length(layer, seq) - 1 + extra_dist(rng);
  }
  const int max_positions = test_case.max_context + 2001;
  std::vector<float> rope(static_cast<size_t>(max_positions) * head_dim);
  for (int position = 0; position < max_positions; ++position) {
    for (int pair = 0; pair < head_dim / 2; ++pair) {
      const double angle = position * std::pow(500000.0, -2.0 * pair / head_dim);
      rope[(static_cast<size_t>(position) * head_dim / 2 + pair) * 2] =
          static_cast<float>(std::cos(angle));
      rope[(static_cast<size_t>(position) * head_dim / 2 + pair) * 2 + 1] =
          static_cast<float>(std::sin(angle));
    }
  }

  const int64_t qkv_width = static_cast<int64_t>(num_heads + 2 * kv_heads) * head_dim;
  const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
  const std::vector<float> qkv = RandomBf16Values(static_cast<size_t>(tokens) * qkv_width, rng);
  const size_t pool_count = static_cast<size_t>(num_pages) * page_size * kv_heads * head_dim;
  const std::vector<float> k_pool = RandomBf16Values(pool_count, rng);
  const std::vector<float> v_pool = RandomBf16Values(pool_count, rng);
  const std::vector<int32_t> pool_positions(static_cast<size_t>(num_pages) * page_size * kv_heads,
                                            -7);

  // CPU reference.
  StepMeta step = paged.HostStep();
  step.positions = HostI32({tokens}, positions);
  step.write_start = HostI32({PagedDecodeCase::kLayers, num_seqs}, write_start);
  KvPool pool = paged.HostPool(kv_heads, head_dim, k_pool, v_pool);
  pool.positions = HostI32({static_cast<int64_t>(num_pages) * page_size, kv_heads}, pool_positions);
  Tensor qkv_host = HostF32({tokens, qkv_width}, qkv);
  Tensor out_ref = Tensor::Empty({tokens, q_width}, DType::kF32);
  // A folded RMSNorm: residual rows [T][512] whose s scales each token's q, k and v.
  constexpr int kHidden = 512;
  constexpr float kEps = 1e-5f;
  const std::vector<float> residual =
      test_case.folded ? RandomBf16Values(static_cast<size_t>(tokens) * kHidden, rng)
                       : std::vector<float>{};
  Tensor residual_host = test_case.folded ? HostF32({tokens, kHidden}, residual) : Tensor();
  auto cpu = MakeCpuBackend();
  cpu->RopeAndCacheWrite(qkv_host, HostF32({max_positions, head_dim / 2, 2}, rope), num_heads, step,
                         layer, pool, RopeTokens::kDecode,
                         test_case.folded ? RowRms{&residual_host, kEps} : RowRms{});
  cpu->DecodeAttention(qkv_host.Columns(0, q_width), num_heads, step, layer, pool, out_ref);

  const std::vector<bf16> qkv_bits = ToBf16(qkv);
  const std::vector<bf16> k_bits = ToBf16(k_pool);
  const std::vector<bf16> v_bits = ToBf16(v_pool);
  const DeviceBuffer<float> rope_dev(rope);
  const DevicePagedDecodeCase device(paged);
  const DeviceBuffer<int32_t> positions_dev(positions);
  const DeviceBuffer<int32_t> write_start_dev(write_start);
  StepView view = device.view;
  view.positions = positions_dev.get();
  view.write_start = write_start_dev.get();
  const int64_t out_stride = q_width + 8;  // padding columns must stay NaN
  const DeviceBuffer<bf16> residual_dev(
      ToBf16(test_case.folded ? residual : std::vector<float>(8, 0.0f)));
  RowRmsView norm{};
  if (test_case.folded) {
    norm.rows = residual_dev.get();
    norm.stride = kHidden;
    norm.width = kHidden;
    norm.eps = kEps;
  }

  struct RunResult {
    std::vector<bf16> out, k, v;
    std::vector<int32_t> positions;
  };
  // One run on fresh copies of everything it writes. splits 0 with kAuto: the public entry points.
  const auto run = [&](bool fused, int splits, DecodeCta cta, int fold, size_t workspace_bytes) {
    DeviceBuffer<bf16> qkv_dev(qkv_bits);
    DeviceBuffer<bf16> k_dev(k_bits);
    DeviceBuffer<bf16> v_dev(v_bits);
    DeviceBuffer<int32_t> pool_positions_dev(pool_positions);
    DeviceBuffer<bf16> out_dev(NanBf16(static_cast<size_t>(tokens) * out_stride));
    DeviceBuffer<uint8_t> workspace(workspace_bytes);
    PoolView pool_view = device.Pool(k_dev.get(), v_dev.get(), kv_heads, head_dim);
    pool_view.positions = pool_positions_dev.get();
    if (!fused) {
      RopeAndCacheWrite(qkv_dev.get(), qkv_width, rope_dev.get(), num_heads, view, layer, pool_view,
                        prefill_tokens, tokens, norm, nullptr);
    }
    const float* table = fused ? rope_dev.get() : nullptr;
    if (splits > 0) {
      DecodeAttentionWithSplits(splits, cta, fold, qkv_dev.get(), qkv_width, table, num_heads, view,
                                layer, pool_view, out_dev.get(), out_stride, workspace.get(),
                                workspace_bytes, fused ? norm : RowRmsView{}, nullptr);
    } else if (fused) {
      RopeDecodeAttention(qkv_dev.get(), qkv_width, table, num_heads, view, layer, pool_view,
                          out_dev.get(), out_stride, workspace.get(), workspace_bytes, norm,
                          nullptr);
    } else {
      DecodeAttention(qkv_dev.get(), qkv_width, num_heads, view, layer, pool_view, out_dev.get(),
                      out_stride, workspace.get(), workspace_bytes, nullptr);
    }
    SIEVE_CUDA_CHECK(cudaGetLastError());
    SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
    return RunResult{out_dev.ToHost(), k_dev.ToHost(), v_dev.ToHost(), pool_positions_dev.ToHost()};
  };

  const float* k_ref = pool.k.data_as<float>();
  const float* v_ref = pool.v.data_as<float>();
  const int32_t* positions_ref = pool.positions.data_as<int32_t>();
  for (const int forced_splits : test_case.splits) {
    const size_t workspace_bytes =
        forced_splits > 0
            ? DecodeAttentionWorkspaceBytesForSplits(batch, num_heads, head_dim, forced_splits)
            : DecodeAttentionWorkspaceBytes(batch, num_heads, head_dim, max_kv_len);
    const int splits = forced_splits > 0
                           ? forced_splits
                           : DecodeAttentionSplits(batch, num_heads, kv_heads, head_dim, max_kv_len,
                                                   workspace_bytes);
    for (const auto& [cta, fold] : ShapesToRun(num_heads, kv_heads)) {
      if (cta == DecodeCta::kAuto && forced_splits > 0) continue;
      const std::string what = test_case.name + (forced_splits > 0 ? " forced" : " chosen") +
                               " splits=" + std::to_string(splits) + " " +
                               CtaName(cta, fold, batch, num_heads, kv_heads);
      const int run_splits = cta == DecodeCta::kAuto ? 0 : splits;
      const RunResult fused = run(true, run_splits, cta, fold, workspace_bytes);
      const RunResult two_kernels = run(false, run_splits, cta, fold, workspace_bytes);

      ExpectDecodeRowsMatch(ToFloat(fused.out), out_stride, out_ref.data_as<float>(), tokens,
                            prefill_tokens, q_width, head_dim, what + " fused");
      EXPECT_TRUE(BitwiseEqual(fused.out, two_kernels.out))
          << what << ": fused and two-kernel outputs differ";
      EXPECT_TRUE(BitwiseEqual(fused.k, two_kernels.k)) << what << ": K pools differ";
      EXPECT_TRUE(BitwiseEqual(fused.v, two_kernels.v)) << what << ": V pools differ";
      EXPECT_EQ(fused.positions, two_kernels.positions) << what << ": positions differ";

      const std::vector<float> k = ToFloat(fused.k);
      const std::vector<float> v = ToFloat(fused.v);
      int64_t k_off = 0;
      int64_t k_rotated = 0;  // entries the step wrote (differ from the initial pool)
      int64_t v_off = 0;
      for (size_t index = 0; index < pool_count; ++index) {
        const double error = std::abs(static_cast<double>(k[index]) - k_ref[index]);
        if (!(error <= std::abs(k_ref[index]) * 0x1p-7 + 1e-6)) ++k_off;
        if (k_ref[index] != k_pool[index]) ++k_rotated;
        // Folded: v is scaled and rounded once, like k; otherwise copied exactly.
        const double v_error = std::abs(static_cast<double>(v[index]) - v_ref[index]);
        if (test_case.folded ? !(v_error <= std::abs(v_ref[index]) * 0x1p-7 + 1e-6)
                             : v[index] != v_ref[index]) {
          ++v_off;
        }
      }
      int64_t positions_off = 0;
      for (size_t index = 0; index < pool_positions.size(); ++index) {
        if (fused.positions[index] != positions_ref[index]) ++positions_off;
      }
      EXPECT_EQ(k_off, 0) << what << ": K entries off by more than a bf16 rounding";
      EXPECT_GT(k_rotated, 0) << what << ": the reference wrote no K entry";
      EXPECT_EQ(v_off, 0) << what << ": V entries differ";
      EXPECT_EQ(positions_off, 0) << what << ": positions differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RopeDecodeAttentionTest,
    ::testing::Values(
        RopeDecodeCase{"b7_gqa32x8_d128", 32, 8, 128, 7, 3000, {}, {0, 1, 4}},
        RopeDecodeCase{"b6_gqa8x2_d64", 8, 2, 64, 6, 1500, {}, {0, 1, 3}},
        // Prefill rows ahead of the decode rows: neither their output rows nor their entries move.
        RopeDecodeCase{"mixed_b9_gqa32x8_d128", 32, 8, 128, 9, 2000, {5, 3}, {0, 1, 2}},
        RopeDecodeCase{"mixed_b5_gqa8x2_d64", 8, 2, 64, 5, 700, {4}, {0, 3}},
        // Groups above 16 heads: several head-chunk CTAs each write the same entry.
        RopeDecodeCase{"b5_mqa32_d64", 32, 1, 64, 5, 1000, {}, {0, 1, 3}},
        RopeDecodeCase{"b5_gqa48x2_d128", 48, 2, 128, 5, 1000, {}, {0, 1, 2}},
        RopeDecodeCase{"b5_group3_d128", 12, 4, 128, 5, 600, {}, {0, 1}},
        RopeDecodeCase{"page24_b5_gqa8x2_d128", 8, 2, 128, 5, 1000, {}, {0, 2}, 24},
        // The sparse decode step's shape (auto: narrow on an H100/H200).
        RopeDecodeCase{"b64_gqa32x8_d128_short", 32, 8, 128, 64, 500, {}, {0, 1, 3}},
        // A folded RMSNorm (model/README.md): q, k and v scaled by the residual row's s.
        RopeDecodeCase{"folded_b7_gqa32x8_d128", 32, 8, 128, 7, 3000, {}, {0, 1, 4}, 16, true},
        RopeDecodeCase{"folded_mixed_b5_gqa8x2_d64", 8, 2, 64, 5, 700, {4}, {0, 3}, 16, true},
        RopeDecodeCase{"folded_b5_gqa48x2_d128", 48, 2, 128, 5, 1000, {}, {0, 1, 2}, 16, true},
        RopeDecodeCase{"folded_b64_gqa32x8_d128_short", 32, 8, 128, 64, 500, {}, {0, 3}, 16, true},
        // Auto folds KV heads into CTAs (as DecodeAttentionTest's b160).
        RopeDecodeCase{
            "folded_b160_gqa32x8_d128_short", 32, 8, 128, 160, 300, {}, {0, 2}, 16, true},
        RopeDecodeCase{"mixed_b300_gqa8x2_d64", 8, 2, 64, 300, 300, {3}, {0, 1}}),
    [](const ::testing::TestParamInfo<RopeDecodeCase>& info) { return info.param.name; });

// ---- The e4m3 fragment arithmetic of decode attention over FP8 pools (e4m3_bits.h) ----
// Host checks (no GPU needed): the same constexpr functions the kernel runs.

// An f16 bit pattern's value (IEEE binary16).
double HalfBitsValue(uint32_t bits) {
  const int exponent = static_cast<int>((bits >> 10) & 0x1f);
  const double mantissa = static_cast<double>(bits & 0x3ff);
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
                                         : std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  return (bits & 0x8000) != 0 ? -magnitude : magnitude;
}

// Every finite e4m3 byte, in each of a word's four places, comes out as its value / 256 exactly
// (subnormals and both zeros included), and never disturbs the other half.
TEST(E4m3FragmentBitsTest, EveryByteInEveryPlaceIsItsValueOver256) {
  for (uint32_t byte = 0; byte < 256; ++byte) {
    if ((byte & 0x7f) == 0x7f) continue;  // NaN: the pool's quantizer saturates, never writes it
    const double want = static_cast<double>(E4m3ToFloat(static_cast<uint8_t>(byte))) /
                        static_cast<double>(cuda::kE4m3HalfBitsScale);
    // Other bytes set to a pattern that must not leak in.
    const uint32_t noise = 0xa5a5a5a5u;
    for (int place = 0; place < 4; ++place) {
      const uint32_t word = (noise & ~(0xffu << (8 * place))) | (byte << (8 * place));
      const uint32_t pair =
          place % 2 == 0 ? cuda::E4m3EvenBytesToHalf2(word) : cuda::E4m3OddBytesToHalf2(word);
      const uint32_t half = place < 2 ? pair & 0xffffu : pair >> 16;
      EXPECT_EQ(HalfBitsValue(half), want) << "byte " << byte << " in place " << place;
      // The other half is the neighbouring byte of the same parity.
      const uint32_t other_byte = (noise >> (8 * ((place + 2) % 4))) & 0xffu;
      const uint32_t other = place < 2 ? pair >> 16 : pair & 0xffffu;
      EXPECT_EQ(HalfBitsValue(other),
                static_cast<double>(E4m3ToFloat(static_cast<uint8_t>(other_byte))) / 256.0)
          << "byte " << byte << " in place " << place << ": the other half";
    }
  }
}

// The output columns of the 16 accumulator tiles of d = 128 are each dimension exactly once.
TEST(E4m3FragmentBitsTest, OutputColumnsAreAPermutation) {
  std::vector<int> seen(128, 0);
  for (int n = 0; n < 16; ++n) {
    for (int t = 0; t < 4; ++t) {
      for (int e = 0; e < 2; ++e) {
        const int column = cuda::E4m3OutputColumn(n, t, e);
        ASSERT_GE(column, 0);
        ASSERT_LT(column, 128);
        ++seen[column];
      }
    }
  }
  for (int column = 0; column < 128; ++column) EXPECT_EQ(seen[column], 1) << column;
  // The merge stores tiles n, n + 1 (even n) as one float4 at E4m3OutputColumn(n, t, 0): the
  // four columns must be that one and the next three, in the order it writes them.
  for (int n = 0; n < 16; n += 2) {
    for (int t = 0; t < 4; ++t) {
      const int base = cuda::E4m3OutputColumn(n, t, 0);
      EXPECT_EQ(base % 4, 0);
      EXPECT_EQ(cuda::E4m3OutputColumn(n + 1, t, 0), base + 1);
      EXPECT_EQ(cuda::E4m3OutputColumn(n, t, 1), base + 2);
      EXPECT_EQ(cuda::E4m3OutputColumn(n + 1, t, 1), base + 3);
    }
  }
}

// Not a check: the benchmark (attention_bench.h) run from this binary, so that one GPU session can
// test and time without the `sieve` tool. Run with
//   --gtest_also_run_disabled_tests --gtest_filter='AttentionBenchmark.*'
TEST(AttentionBenchmark, DISABLED_Run) {
  SIEVE_REQUIRE_GPU();
  std::vector<AttentionBenchResult> results;
  AttentionBenchOptions options;
  options.results = &results;
  EXPECT_EQ(RunAttentionBenchmarks(options), 0);
  std::printf("%s", AttentionBenchResultsToJson(results).c_str());
}

}  // namespace
}  // namespace sieve::cuda
