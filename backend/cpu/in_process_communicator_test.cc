// The in-process communicator: ranks as threads, fresh random inputs of sizes that divide evenly
// by nothing, many calls in a row. AllReduceSum must equal the rank-order sum ((x0 + x1) + x2)
// ... bit for bit on every rank; AllGather must place each rank's input at its slot; Barrier must
// hold every rank until all have arrived.
#include "backend/cpu/in_process_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "core/testing.h"

namespace sieve {
namespace {

// Runs body(rank, communicator) on one thread per rank and joins them.
void RunRanks(int size, const std::function<void(int, Communicator&)>& body) {
  std::vector<std::unique_ptr<Communicator>> communicators = MakeInProcessCommunicators(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] { body(rank, *communicators[rank]); });
  }
  for (std::thread& thread : threads) thread.join();
}

TEST(InProcessCommunicatorTest, RanksAndSize) {
  for (const int size : {1, 2, 5}) {
    std::vector<std::unique_ptr<Communicator>> communicators = MakeInProcessCommunicators(size);
    ASSERT_EQ(static_cast<int>(communicators.size()), size);
    for (int rank = 0; rank < size; ++rank) {
      EXPECT_EQ(communicators[rank]->rank(), rank);
      EXPECT_EQ(communicators[rank]->size(), size);
    }
  }
}

// Several calls of different sizes, each rank's input fresh; every rank checks its result
// against the rank-order sum computed here.
TEST(InProcessCommunicatorTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  std::mt19937_64 rng = testing::MakeRng();
  const std::vector<int64_t> counts = {1, 3, 17, 1031, 4099, 2, 777};
  for (const int size : {1, 2, 3, 4, 7}) {
    // inputs[call][rank]: drawn before the threads start (the generator is not shared).
    std::vector<std::vector<std::vector<float>>> inputs(counts.size());
    std::vector<std::vector<float>> expected(counts.size());
    for (size_t call = 0; call < counts.size(); ++call) {
      for (int rank = 0; rank < size; ++rank) {
        std::vector<float> values(counts[call]);
        // Magnitudes spread over orders so that the summation order shows in the rounding.
        std::uniform_real_distribution<float> exponent(-8.0f, 8.0f);
        for (float& value : values) {
          value = std::normal_distribution<float>(0.0f, 1.0f)(rng) * std::exp2(exponent(rng));
        }
        inputs[call].push_back(std::move(values));
      }
      expected[call] = inputs[call][0];
      for (int rank = 1; rank < size; ++rank) {
        for (int64_t index = 0; index < counts[call]; ++index) {
          expected[call][index] += inputs[call][rank][index];
        }
      }
    }
    std::atomic<int> mismatches{0};
    RunRanks(size, [&](int rank, Communicator& communicator) {
      for (size_t call = 0; call < counts.size(); ++call) {
        Tensor data = Tensor::Empty({counts[call]}, DType::kF32);
        std::memcpy(data.data(), inputs[call][rank].data(), counts[call] * sizeof(float));
        communicator.AllReduceSum(data);
        if (std::memcmp(data.data(), expected[call].data(), counts[call] * sizeof(float)) != 0) {
          ++mismatches;
        }
      }
    });
    EXPECT_EQ(mismatches.load(), 0) << size << " ranks";
  }
}

// A 2-D tensor reduces as its elements; rows of a larger buffer (a contiguous view) too.
TEST(InProcessCommunicatorTest, AllReduceSumOfAContiguousRowView) {
  std::mt19937_64 rng = testing::MakeRng();
  constexpr int kSize = 3;
  std::vector<Tensor> buffers;
  std::vector<float> expected(5 * 13, 0.0f);
  for (int rank = 0; rank < kSize; ++rank) {
    buffers.push_back(testing::RandomTensor({9, 13}, rng));
    for (int64_t index = 0; index < 5 * 13; ++index) {
      expected[index] = rank == 0 ? buffers[rank].data_as<float>()[13 + index]
                                  : expected[index] + buffers[rank].data_as<float>()[13 + index];
    }
  }
  std::vector<std::vector<float>> untouched(kSize);
  for (int rank = 0; rank < kSize; ++rank) {
    const float* data = buffers[rank].data_as<float>();
    untouched[rank].assign(data, data + 13);
    untouched[rank].insert(untouched[rank].end(), data + 6 * 13, data + 9 * 13);
  }
  RunRanks(kSize, [&](int rank, Communicator& communicator) {
    Tensor rows = buffers[rank].Rows(1, 6);
    communicator.AllReduceSum(rows);
  });
  for (int rank = 0; rank < kSize; ++rank) {
    const float* data = buffers[rank].data_as<float>();
    EXPECT_EQ(std::memcmp(data + 13, expected.data(), expected.size() * sizeof(float)), 0);
    // Rows outside the view are not touched.
    std::vector<float> outside(data, data + 13);
    outside.insert(outside.end(), data + 6 * 13, data + 9 * 13);
    EXPECT_EQ(outside, untouched[rank]) << "rank " << rank;
  }
}

TEST(InProcessCommunicatorTest, AllGatherPlacesEachRankAtItsSlot) {
  std::mt19937_64 rng = testing::MakeRng();
  for (const int size : {1, 2, 3, 5}) {
    const std::vector<int64_t> counts = {1, 11, 1023, 5};
    std::vector<std::vector<std::vector<int32_t>>> inputs(counts.size());
    for (size_t call = 0; call < counts.size(); ++call) {
      for (int rank = 0; rank < size; ++rank) {
        std::vector<int32_t> values(counts[call]);
        for (int32_t& value : values) value = static_cast<int32_t>(rng());
        inputs[call].push_back(std::move(values));
      }
    }
    std::atomic<int> mismatches{0};
    RunRanks(size, [&](int rank, Communicator& communicator) {
      for (size_t call = 0; call < counts.size(); ++call) {
        Tensor in = Tensor::Empty({counts[call]}, DType::kI32);
        std::memcpy(in.data(), inputs[call][rank].data(), counts[call] * sizeof(int32_t));
        Tensor out = Tensor::Empty({size, counts[call]}, DType::kI32);
        communicator.AllGather(in, out);
        for (int source = 0; source < size; ++source) {
          if (std::memcmp(out.data_as<int32_t>() + source * counts[call],
                          inputs[call][source].data(), counts[call] * sizeof(int32_t)) != 0) {
            ++mismatches;
          }
        }
        // The caller may reuse `in` at once: the gather is complete on every rank.
        std::memset(in.data(), 0, counts[call] * sizeof(int32_t));
      }
    });
    EXPECT_EQ(mismatches.load(), 0) << size << " ranks";
  }
}

// No rank leaves Barrier i before every rank has arrived at it: each counts its arrival before
// the barrier and checks the count after.
TEST(InProcessCommunicatorTest, BarrierHoldsEveryRank) {
  constexpr int kSize = 4;
  constexpr int kRounds = 200;
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  RunRanks(kSize, [&](int rank, Communicator& communicator) {
    std::mt19937_64 jitter(static_cast<uint64_t>(rank) * 7919u + testing::LastSeed());
    for (int round = 0; round < kRounds; ++round) {
      if (jitter() % 8 == 0) std::this_thread::yield();
      ++arrived;
      communicator.Barrier();
      if (arrived.load() < kSize * (round + 1)) ++early;
      communicator.Barrier();  // nobody counts round + 1 before all have checked round
    }
  });
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(arrived.load(), kSize * kRounds);
}

}  // namespace
}  // namespace sieve
