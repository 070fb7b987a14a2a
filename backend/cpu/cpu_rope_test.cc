// RopeAndCacheWrite's token ranges on the CPU reference, and RopeDecodeAttention's default: on a
// mixed step (prefill chunks, then decode tokens; one sequence that writes nothing), the prefill
// range followed by the decode range is bitwise the whole step, each range touches only its own
// tokens' rows and pool entries, and RopeDecodeAttention is the decode range then DecodeAttention;
// each without and with a folded RMSNorm (RowRms). With one, each token's q, k and v are RoPE of
// the row scaled by 1 / rms of the token's norm row, against a double-precision reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/testing.h"

namespace sieve {
namespace {

constexpr int kHeads = 4;
constexpr int kKvHeads = 2;
constexpr int kHeadDim = 16;
constexpr int kLayers = 2;
constexpr int kLayer = 1;
constexpr int kPageSize = 4;
constexpr int kMaxSeqs = 6;
constexpr int kMaxPages = 8;
constexpr int kNumPages = kLayers * kMaxSeqs * kMaxPages + 5;
constexpr int kWidth = (kHeads + 2 * kKvHeads) * kHeadDim;
constexpr int kMaxPositions = 64;
constexpr int kNormWidth = 48;  // D of the residual rows RowRms reads
constexpr float kEps = 1e-5f;

Tensor Floats(const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
  std::copy(values.begin(), values.end(), tensor.data_as<float>());
  return tensor;
}
Tensor Ints(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kI32);
  std::copy(values.begin(), values.end(), tensor.data_as<int32_t>());
  return tensor;
}
template <typename T>
std::vector<T> Values(const Tensor& tensor) {
  return std::vector<T>(tensor.data_as<T>(), tensor.data_as<T>() + tensor.numel());
}

// Two prefill sequences (one continuing from cached entries), three decode tokens; decode
// sequence 3 writes nothing in kLayer.
struct MixedStep {
  std::vector<int> chunk = {5, 3, 1, 1, 1};
  std::vector<int> context = {0, 6, 9, 3, 12};
  std::vector<int32_t> slots = {4, 0, 2, 5, 1};
  std::vector<int32_t> write_start = {0, 6, 9, 3,  12,   // layer 0
                                      0, 6, 9, -1, 12};  // layer 1
  std::vector<float> qkv, k_pool, v_pool, scores, rope;
  std::vector<float> norm_rows;  // [tokens][kNormWidth], rows of very different RMS
  std::vector<int32_t> positions, query_start = {0}, table, kv_lens;
  int tokens = 0;
  int prefill_tokens = 0;

  explicit MixedStep(std::mt19937_64& rng) {
    for (int seq = 0; seq < 5; ++seq) {
      for (int index = 0; index < chunk[seq]; ++index) positions.push_back(context[seq] + index);
      query_start.push_back(query_start.back() + chunk[seq]);
    }
    tokens = query_start.back();
    prefill_tokens = query_start[2];
    table.resize(static_cast<size_t>(kLayers) * kMaxSeqs * kMaxPages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    kv_lens.assign(static_cast<size_t>(kLayers) * kMaxSeqs, 2);
    for (int seq = 2; seq < 5; ++seq) kv_lens[kLayer * kMaxSeqs + slots[seq]] = context[seq] + 1;
    qkv.resize(static_cast<size_t>(tokens) * kWidth);
    sieve::testing::FillRandom(qkv.data(), qkv.size(), rng);
    norm_rows.resize(static_cast<size_t>(tokens) * kNormWidth);
    sieve::testing::FillRandom(norm_rows.data(), norm_rows.size(), rng);
    std::uniform_real_distribution<double> log_scale(-3.0, 3.0);
    for (int token = 0; token < tokens; ++token) {
      const float factor = static_cast<float>(std::exp(log_scale(rng)));
      for (int index = 0; index < kNormWidth; ++index)
        norm_rows[token * kNormWidth + index] *= factor;
    }
    k_pool.resize(static_cast<size_t>(kNumPages) * kPageSize * kKvHeads * kHeadDim);
    sieve::testing::FillRandom(k_pool.data(), k_pool.size(), rng);
    v_pool.resize(k_pool.size());
    sieve::testing::FillRandom(v_pool.data(), v_pool.size(), rng);
    scores.resize(static_cast<size_t>(kNumPages) * kPageSize * kKvHeads);
    std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
    for (float& score : scores) score = uniform(rng);
    rope.resize(static_cast<size_t>(kMaxPositions) * kHeadDim);
    for (int position = 0; position < kMaxPositions; ++position) {
      for (int pair = 0; pair < kHeadDim / 2; ++pair) {
        const double angle = position * std::pow(10000.0, -2.0 * pair / kHeadDim);
        rope[(position * kHeadDim / 2 + pair) * 2] = static_cast<float>(std::cos(angle));
        rope[(position * kHeadDim / 2 + pair) * 2 + 1] = static_cast<float>(std::sin(angle));
      }
    }
  }

  // Fresh copies of every input.
  void Build(StepMeta& step, KvPool& pool, Tensor& qkv_tensor) const {
    step.num_tokens = tokens;
    step.num_prefill_tokens = prefill_tokens;
    step.num_seqs = 5;
    step.num_prefill_seqs = 2;
    step.num_layers = kLayers;
    step.max_kv_len = 13;
    step.positions = Ints(positions, {tokens});
    step.query_start = Ints(query_start, {6});
    step.context_lens = Ints(std::vector<int32_t>(context.begin(), context.end()), {5});
    step.seq_slots = Ints(slots, {5});
    step.write_start = Ints(write_start, {kLayers, 5});
    pool.page_size = kPageSize;
    pool.num_pages = kNumPages;
    pool.max_seqs = kMaxSeqs;
    pool.max_pages_per_seq = kMaxPages;
    pool.num_kv_heads = kKvHeads;
    pool.head_dim = kHeadDim;
    pool.k = Floats(k_pool, {kNumPages, kPageSize, kKvHeads, kHeadDim});
    pool.v = Floats(v_pool, {kNumPages, kPageSize, kKvHeads, kHeadDim});
    pool.page_table = Ints(table, {kLayers, kMaxSeqs, kMaxPages});
    pool.kv_lens = Ints(kv_lens, {kLayers, kMaxSeqs});
    pool.scores = Floats(scores, {kNumPages * kPageSize, kKvHeads});
    pool.positions =
        Ints(std::vector<int32_t>(scores.size(), -7), {kNumPages * kPageSize, kKvHeads});
    qkv_tensor = Floats(qkv, {tokens, kWidth});
  }

  // Pool entries (index into [num_pages * page_size]) that sequences [first, end) write in kLayer.
  std::set<int64_t> WrittenEntries(int first, int end) const {
    std::set<int64_t> entries;
    for (int seq = first; seq < end; ++seq) {
      const int start = write_start[kLayer * 5 + seq];
      if (start < 0) continue;
      for (int index = 0; index < chunk[seq]; ++index) {
        const int entry = start + index;
        const int page = table[(kLayer * kMaxSeqs + slots[seq]) * kMaxPages + entry / kPageSize];
        entries.insert(static_cast<int64_t>(page) * kPageSize + entry % kPageSize);
      }
    }
    return entries;
  }
};

void ExpectPoolsEqual(const KvPool& actual, const KvPool& expected) {
  EXPECT_EQ(Values<float>(actual.k), Values<float>(expected.k));
  EXPECT_EQ(Values<float>(actual.v), Values<float>(expected.v));
  EXPECT_EQ(Values<float>(actual.scores), Values<float>(expected.scores));
  EXPECT_EQ(Values<int32_t>(actual.positions), Values<int32_t>(expected.positions));
}

// Runs each test without (false) and with (true) a folded RMSNorm.
class CpuRopeTest : public ::testing::TestWithParam<bool> {
 protected:
  // RowRms over `rows` when the parameter asks for one.
  RowRms Norm(const Tensor& rows) const { return GetParam() ? RowRms{&rows, kEps} : RowRms{}; }
};

TEST_P(CpuRopeTest, PrefillThenDecodeRangeIsTheWholeStep) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const MixedStep mixed(rng);
  auto cpu = MakeCpuBackend();
  StepMeta step;
  KvPool all_pool, split_pool, prefill_pool;
  Tensor all_qkv, split_qkv, prefill_qkv;
  mixed.Build(step, all_pool, all_qkv);
  mixed.Build(step, split_pool, split_qkv);
  mixed.Build(step, prefill_pool, prefill_qkv);
  const Tensor rope = Floats(mixed.rope, {kMaxPositions, kHeadDim / 2, 2});
  const Tensor rows = Floats(mixed.norm_rows, {mixed.tokens, kNormWidth});
  const RowRms norm = Norm(rows);

  cpu->RopeAndCacheWrite(all_qkv, rope, kHeads, step, kLayer, all_pool, RopeTokens::kAll, norm);
  cpu->RopeAndCacheWrite(split_qkv, rope, kHeads, step, kLayer, split_pool, RopeTokens::kPrefill,
                         norm);
  cpu->RopeAndCacheWrite(split_qkv, rope, kHeads, step, kLayer, split_pool, RopeTokens::kDecode,
                         norm);
  EXPECT_EQ(Values<float>(split_qkv), Values<float>(all_qkv));
  ExpectPoolsEqual(split_pool, all_pool);

  // The prefill range alone: prefill rows as in the whole step, decode rows untouched (not
  // scaled either); pool entries of the decode sequences untouched, the prefill sequences'
  // written.
  cpu->RopeAndCacheWrite(prefill_qkv, rope, kHeads, step, kLayer, prefill_pool,
                         RopeTokens::kPrefill, norm);
  const std::vector<float> rotated = Values<float>(prefill_qkv);
  const std::vector<float> whole = Values<float>(all_qkv);
  const size_t split_at = static_cast<size_t>(mixed.prefill_tokens) * kWidth;
  EXPECT_TRUE(std::equal(rotated.begin(), rotated.begin() + split_at, whole.begin()));
  EXPECT_TRUE(std::equal(rotated.begin() + split_at, rotated.end(), mixed.qkv.begin() + split_at));
  const std::set<int64_t> decode_entries = mixed.WrittenEntries(2, 5);
  const std::set<int64_t> prefill_entries = mixed.WrittenEntries(0, 2);
  ASSERT_EQ(decode_entries.size(), 2u);  // sequence 3 writes nothing
  ASSERT_EQ(prefill_entries.size(), 8u);
  const int64_t entry_floats = kKvHeads * kHeadDim;
  const std::vector<float> k_after = Values<float>(prefill_pool.k);
  const std::vector<float> k_whole = Values<float>(all_pool.k);
  const std::vector<int32_t> positions_after = Values<int32_t>(prefill_pool.positions);
  for (int64_t entry = 0; entry < kNumPages * kPageSize; ++entry) {
    const bool by_decode = decode_entries.count(entry) > 0;
    const std::vector<float>& expected = by_decode ? mixed.k_pool : k_whole;
    EXPECT_TRUE(std::equal(k_after.begin() + entry * entry_floats,
                           k_after.begin() + (entry + 1) * entry_floats,
                           expected.begin() + entry * entry_floats))
        << "entry " << entry;
    if (by_decode) {
      EXPECT_EQ(positions_after[entry * kKvHeads], -7) << "entry " << entry;
    }
    if (prefill_entries.count(entry) > 0) {
      EXPECT_GE(positions_after[entry * kKvHeads], 0) << "entry " << entry;
    }
  }
}

TEST_P(CpuRopeTest, RopeDecodeAttentionIsDecodeRopeThenDecodeAttention) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const MixedStep mixed(rng);
  auto cpu = MakeCpuBackend();
  StepMeta step;
  KvPool fused_pool, pool;
  Tensor fused_qkv, qkv;
  mixed.Build(step, fused_pool, fused_qkv);
  mixed.Build(step, pool, qkv);
  const Tensor rope = Floats(mixed.rope, {kMaxPositions, kHeadDim / 2, 2});
  const Tensor rows = Floats(mixed.norm_rows, {mixed.tokens, kNormWidth});
  const RowRms norm = Norm(rows);
  Tensor fused_out = Floats(std::vector<float>(mixed.tokens * kHeads * kHeadDim, NAN),
                            {mixed.tokens, kHeads * kHeadDim});
  Tensor out = Floats(Values<float>(fused_out), {mixed.tokens, kHeads * kHeadDim});

  cpu->RopeDecodeAttention(fused_qkv, rope, kHeads, step, kLayer, fused_pool, fused_out, norm);
  cpu->RopeAndCacheWrite(qkv, rope, kHeads, step, kLayer, pool, RopeTokens::kDecode, norm);
  cpu->DecodeAttention(qkv.Columns(0, kHeads * kHeadDim), kHeads, step, kLayer, pool, out);
  const std::vector<float> fused_values = Values<float>(fused_out);
  EXPECT_EQ(std::memcmp(fused_values.data(), out.data(), fused_values.size() * sizeof(float)), 0);
  // Decode rows written, prefill rows not.
  const size_t split_at = static_cast<size_t>(mixed.prefill_tokens) * kHeads * kHeadDim;
  EXPECT_TRUE(std::all_of(fused_values.begin(), fused_values.begin() + split_at,
                          [](float value) { return std::isnan(value); }));
  EXPECT_TRUE(std::none_of(fused_values.begin() + split_at, fused_values.end(),
                           [](float value) { return std::isnan(value); }));
  ExpectPoolsEqual(fused_pool, pool);
}

// Each token of the range: q, k and v are its qkv row times s = 1 / sqrt(mean(norm row^2) + eps),
// q and k then rotated; computed here in double from the same f32 cos/sin table. The rows are
// written back into qkv and k, v into the pool; tokens outside the range keep their rows.
TEST_P(CpuRopeTest, MatchesDoubleReference) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  const MixedStep mixed(rng);
  auto cpu = MakeCpuBackend();
  const Tensor rope = Floats(mixed.rope, {kMaxPositions, kHeadDim / 2, 2});
  const Tensor rows = Floats(mixed.norm_rows, {mixed.tokens, kNormWidth});
  const RowRms norm = Norm(rows);
  for (const RopeTokens tokens : {RopeTokens::kPrefill, RopeTokens::kDecode, RopeTokens::kAll}) {
    StepMeta step;
    KvPool pool;
    Tensor qkv;
    mixed.Build(step, pool, qkv);
    cpu->RopeAndCacheWrite(qkv, rope, kHeads, step, kLayer, pool, tokens, norm);
    const int first = tokens == RopeTokens::kDecode ? mixed.prefill_tokens : 0;
    const int end = tokens == RopeTokens::kPrefill ? mixed.prefill_tokens : mixed.tokens;
    const std::vector<float> actual = Values<float>(qkv);
    double worst = 0;
    for (int token = 0; token < mixed.tokens; ++token) {
      const float* in = mixed.qkv.data() + static_cast<size_t>(token) * kWidth;
      const float* got = actual.data() + static_cast<size_t>(token) * kWidth;
      if (token < first || token >= end) {
        EXPECT_TRUE(std::equal(got, got + kWidth, in)) << "token " << token << " was touched";
        continue;
      }
      double s = 1.0;
      if (GetParam()) {
        double sum_squares = 0;
        for (int index = 0; index < kNormWidth; ++index) {
          const double value = mixed.norm_rows[token * kNormWidth + index];
          sum_squares += value * value;
        }
        s = 1.0 / std::sqrt(sum_squares / kNormWidth + kEps);
      }
      const float* cos_sin = mixed.rope.data() + mixed.positions[token] * kHeadDim;
      for (int head = 0; head < kHeads + 2 * kKvHeads; ++head) {
        const bool rotated = head < kHeads + kKvHeads;  // v is scaled only
        for (int index = 0; index < kHeadDim; ++index) {
          const int pair = index % (kHeadDim / 2);
          const double c = rotated ? cos_sin[2 * pair] : 1.0;
          const double sn = rotated ? cos_sin[2 * pair + 1] : 0.0;
          const double a = s * in[head * kHeadDim + pair];
          const double b = s * in[head * kHeadDim + pair + kHeadDim / 2];
          const double expected = index < kHeadDim / 2 ? a * c - b * sn : b * c + a * sn;
          const double error = std::abs(got[head * kHeadDim + index] - expected);
          worst = std::max(worst, error / std::max(1.0, std::abs(expected)));
        }
      }
    }
    EXPECT_LE(worst, 1e-5) << "tokens " << static_cast<int>(tokens);
    // The pool holds exactly the rows' k and v (written from the scaled, rotated rows).
    const std::vector<float> k_pool = Values<float>(pool.k);
    const std::vector<float> v_pool = Values<float>(pool.v);
    for (int seq = 0; seq < 5; ++seq) {
      const bool prefill = seq < 2;
      if ((tokens == RopeTokens::kPrefill && !prefill) ||
          (tokens == RopeTokens::kDecode && prefill)) {
        continue;
      }
      const int start = mixed.write_start[kLayer * 5 + seq];
      if (start < 0) continue;
      for (int index = 0; index < mixed.chunk[seq]; ++index) {
        const int token = mixed.query_start[seq] + index;
        const int entry_index = start + index;
        const int page = mixed.table[(kLayer * kMaxSeqs + mixed.slots[seq]) * kMaxPages +
                                     entry_index / kPageSize];
        const int64_t entry = static_cast<int64_t>(page) * kPageSize + entry_index % kPageSize;
        const float* row = actual.data() + static_cast<size_t>(token) * kWidth;
        EXPECT_TRUE(std::equal(row + kHeads * kHeadDim, row + (kHeads + kKvHeads) * kHeadDim,
                               k_pool.begin() + entry * kKvHeads * kHeadDim))
            << "k of token " << token;
        EXPECT_TRUE(std::equal(row + (kHeads + kKvHeads) * kHeadDim, row + kWidth,
                               v_pool.begin() + entry * kKvHeads * kHeadDim))
            << "v of token " << token;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Norm, CpuRopeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("FoldedRmsNorm") : std::string("NoNorm");
                         });

}  // namespace
}  // namespace sieve
