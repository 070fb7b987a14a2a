// The NCCL communicator on one rank and, where the machine has the GPUs, on two and on every GPU
// (when there are more than two; skipped otherwise): fresh random inputs of odd sizes, f32 and bf16
// all-reduces, all-gathers, a barrier, and an all-reduce captured into a CUDA graph and replayed
// with new inputs. Every rank must receive the same values bit for bit; the sums must match the
// host's: f32 to 1e-6 relative per element (NCCL's order of adding 3+ ranks is its own), bf16 to
// one bf16 rounding of the f32 sum (2^-8 relative) plus the inputs' own.
#include "backend/cuda/nccl_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/testing.h"

namespace sieve {
namespace {

int DeviceCount() { return CudaDeviceCount(); }

// `size` ranks on devices 0 .. size-1; skips the test when they or NCCL are not there.
std::optional<CudaRanks> MakeRanks(int size, std::string& skip_reason) {
  if (DeviceCount() < size) {
    skip_reason = std::to_string(size) + " ranks need " + std::to_string(size) + " GPUs; " +
                  std::to_string(DeviceCount()) + " found";
    return std::nullopt;
  }
  if (!NcclAvailable()) {
    skip_reason = "built without NCCL";
    return std::nullopt;
  }
  auto ranks = MakeCudaRanks(0, size);
  SIEVE_CHECK(ranks.ok()) << ranks.status().ToString();
  return std::move(ranks).value();
}

// Runs body(rank) on one thread per rank, each with its backend's device current.
void RunRanks(CudaRanks& ranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < static_cast<int>(ranks.backends.size()); ++rank) {
    threads.emplace_back([&, rank] {
      ranks.backends[rank]->MakeCurrent();
      body(rank);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// A test's ranks: 1, 2, or 0 for every GPU of the machine when it has more than two.
int RanksOf(int param) { return param > 0 ? param : std::max(3, DeviceCount()); }

class NcclCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCommunicatorTest, AllReduceSumMatchesTheHostSumOnEveryRank) {
  const int size = RanksOf(GetParam());
  std::string skip_reason;
  std::optional<CudaRanks> ranks = MakeRanks(size, skip_reason);
  if (!ranks) GTEST_SKIP() << skip_reason;
  std::mt19937_64 rng = testing::MakeRng();
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t count : {int64_t{1}, int64_t{1031}, int64_t{65537}}) {
      // inputs[rank]: f32 values, representable in `dtype`.
      std::vector<std::vector<float>> inputs(size);
      std::vector<double> sum(count, 0.0);
      for (int rank = 0; rank < size; ++rank) {
        inputs[rank].resize(count);
        testing::FillRandom(inputs[rank].data(), count, rng);
        if (dtype == DType::kBF16) {
          std::vector<uint16_t> bits(count);
          ConvertFromFloat(inputs[rank].data(), count, DType::kBF16, bits.data());
          ConvertToFloat(bits.data(), DType::kBF16, count, inputs[rank].data());
        }
        for (int64_t index = 0; index < count; ++index) sum[index] += inputs[rank][index];
      }
      std::vector<std::vector<float>> outputs(size, std::vector<float>(count));
      RunRanks(*ranks, [&](int rank) {
        Backend& backend = *ranks->backends[rank];
        Tensor data = backend.Allocate({count}, dtype);
        if (dtype == DType::kF32) {
          backend.CopyFromHost(inputs[rank].data(), count * sizeof(float), data);
        } else {
          std::vector<uint16_t> bits(count);
          ConvertFromFloat(inputs[rank].data(), count, DType::kBF16, bits.data());
          backend.CopyFromHost(bits.data(), count * sizeof(uint16_t), data);
        }
        ranks->communicators[rank]->AllReduceSum(data);
        if (dtype == DType::kF32) {
          backend.CopyToHost(data, outputs[rank].data());
        } else {
          std::vector<uint16_t> bits(count);
          backend.CopyToHost(data, bits.data());
          ConvertToFloat(bits.data(), DType::kBF16, count, outputs[rank].data());
        }
      });
      const double relative = dtype == DType::kF32 ? 1e-6 : 1.0 / 256;
      for (int rank = 0; rank < size; ++rank) {
        EXPECT_EQ(std::memcmp(outputs[rank].data(), outputs[0].data(), count * sizeof(float)), 0)
            << "rank " << rank << " differs from rank 0";
      }
      int bad = 0;
      for (int64_t index = 0; index < count; ++index) {
        // The bound scales with the terms' magnitudes: cancellation leaves a small sum.
        double magnitude = 0;
        for (int rank = 0; rank < size; ++rank) magnitude += std::fabs(inputs[rank][index]);
        if (std::fabs(outputs[0][index] - sum[index]) > relative * magnitude + 1e-30) ++bad;
      }
      EXPECT_EQ(bad, 0) << size << " ranks, " << DTypeName(dtype) << ", " << count << " elements";
    }
  }
}

TEST_P(NcclCommunicatorTest, AllGatherAndBarrier) {
  const int size = RanksOf(GetParam());
  std::string skip_reason;
  std::optional<CudaRanks> ranks = MakeRanks(size, skip_reason);
  if (!ranks) GTEST_SKIP() << skip_reason;
  std::mt19937_64 rng = testing::MakeRng();
  constexpr int64_t kCount = 333;
  std::vector<std::vector<int32_t>> inputs(size, std::vector<int32_t>(kCount));
  for (auto& values : inputs) {
    for (int32_t& value : values) value = static_cast<int32_t>(rng());
  }
  std::vector<std::vector<int32_t>> outputs(size);
  RunRanks(*ranks, [&](int rank) {
    Backend& backend = *ranks->backends[rank];
    Tensor in = backend.Allocate({kCount}, DType::kI32);
    backend.CopyFromHost(inputs[rank].data(), kCount * sizeof(int32_t), in);
    Tensor out = backend.Allocate({size * kCount}, DType::kI32);
    ranks->communicators[rank]->AllGather(in, out);
    ranks->communicators[rank]->Barrier();
    outputs[rank].resize(size * kCount);
    backend.CopyToHost(out, outputs[rank].data());
  });
  std::vector<int32_t> expected;
  for (const auto& values : inputs) expected.insert(expected.end(), values.begin(), values.end());
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(outputs[rank], expected) << "rank " << rank;
}

// The decode graphs capture the all-reduces: a captured AllReduceSum replays on new inputs.
TEST_P(NcclCommunicatorTest, CapturedAllReduceReplaysOnNewInputs) {
  const int size = RanksOf(GetParam());
  std::string skip_reason;
  std::optional<CudaRanks> ranks = MakeRanks(size, skip_reason);
  if (!ranks) GTEST_SKIP() << skip_reason;
  std::mt19937_64 rng = testing::MakeRng();
  constexpr int64_t kCount = 4099;
  constexpr int kReplays = 3;
  // inputs[replay][rank]
  std::vector<std::vector<std::vector<float>>> inputs(kReplays);
  for (auto& per_rank : inputs) {
    for (int rank = 0; rank < size; ++rank) {
      per_rank.emplace_back(kCount);
      testing::FillRandom(per_rank.back().data(), kCount, rng);
    }
  }
  std::vector<std::vector<std::vector<float>>> outputs(
      kReplays, std::vector<std::vector<float>>(size, std::vector<float>(kCount)));
  RunRanks(*ranks, [&](int rank) {
    Backend& backend = *ranks->backends[rank];
    Tensor data = backend.Allocate({kCount}, DType::kF32);
    backend.Synchronize();
    backend.BeginCapture();
    ranks->communicators[rank]->AllReduceSum(data);
    const int graph = backend.EndCapture();
    for (int replay = 0; replay < kReplays; ++replay) {
      backend.CopyFromHost(inputs[replay][rank].data(), kCount * sizeof(float), data);
      backend.ReplayGraph(graph);
      backend.CopyToHost(data, outputs[replay][rank].data());
    }
  });
  for (int replay = 0; replay < kReplays; ++replay) {
    int bad = 0;
    for (int64_t index = 0; index < kCount; ++index) {
      double sum = 0;
      double magnitude = 0;
      for (int rank = 0; rank < size; ++rank) {
        sum += inputs[replay][rank][index];
        magnitude += std::fabs(inputs[replay][rank][index]);
      }
      for (int rank = 0; rank < size; ++rank) {
        if (std::fabs(outputs[replay][rank][index] - sum) > 1e-6 * magnitude + 1e-30) ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "replay " << replay;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclCommunicatorTest, ::testing::Values(1, 2, 0),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param > 0 ? std::to_string(info.param) + "Ranks"
                                                 : std::string("EveryGpu");
                         });

}  // namespace
}  // namespace sieve
