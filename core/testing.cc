#include "core/testing.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace sieve::testing {

namespace {
std::mutex g_seed_mutex;
const ::testing::TestInfo* g_seeds_test = nullptr;  // the test g_test_seeds were drawn in
std::vector<uint64_t> g_test_seeds;                 // its seeds so far, in order
}  // namespace

std::mt19937_64 MakeRng() {
  std::lock_guard<std::mutex> lock(g_seed_mutex);
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (test != g_seeds_test) {
    g_seeds_test = test;
    g_test_seeds.clear();
  }
  uint64_t seed;
  if (const char* env = std::getenv("SIEVE_TEST_SEED"); env && *env) {
    // A comma-separated list: a test's k-th generator takes the k-th seed, the last one past it.
    std::vector<uint64_t> listed;
    for (const char* at = env; at != nullptr && *at != '\0';) {
      listed.push_back(std::strtoull(at, nullptr, 10));
      at = std::strchr(at, ',');
      if (at != nullptr) ++at;
    }
    seed = listed[std::min(g_test_seeds.size(), listed.size() - 1)];  // env is not empty
  } else {
    std::random_device device;
    seed = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  g_test_seeds.push_back(seed);
  std::string replay;
  for (const uint64_t drawn : g_test_seeds) {
    replay += (replay.empty() ? "" : ",") + std::to_string(drawn);
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("random seed %llu (replay with SIEVE_TEST_SEED=%s)\n",
              static_cast<unsigned long long>(seed), replay.c_str());
  return std::mt19937_64(seed);
}

uint64_t LastSeed() {
  std::lock_guard<std::mutex> lock(g_seed_mutex);
  return g_test_seeds.empty() ? 0 : g_test_seeds.back();
}

void FillRandom(float* data, size_t count, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  for (size_t index = 0; index < count; ++index) data[index] = normal(rng);
}

Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937_64& rng, float stddev) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
  FillRandom(tensor.data_as<float>(), static_cast<size_t>(tensor.numel()), rng, stddev);
  return tensor;
}

double RelativeL2Error(const float* actual, const float* expected, size_t count) {
  double diff = 0, ref = 0;
  for (size_t index = 0; index < count; ++index) {
    const double d = static_cast<double>(actual[index]) - expected[index];
    if (std::isnan(actual[index])) return INFINITY;
    diff += d * d;
    ref += static_cast<double>(expected[index]) * expected[index];
  }
  if (ref == 0) return diff == 0 ? 0 : INFINITY;
  return std::sqrt(diff / ref);
}

double MaxAbsError(const float* actual, const float* expected, size_t count) {
  double worst = 0;
  for (size_t index = 0; index < count; ++index) {
    if (std::isnan(actual[index])) return INFINITY;
    worst = std::max(worst, std::abs(static_cast<double>(actual[index]) - expected[index]));
  }
  return worst;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test =
      info != nullptr ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
  std::string name =
      "sieve_" + test + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  for (char& c : name) {
    if (c == '/') c = '_';  // parameterised tests are named Suite/Name/N
  }
  path_ = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code error;
  std::filesystem::remove_all(path_, error);
}

std::string TempDir::Write(const std::string& name, std::string_view contents) const {
  const std::filesystem::path file = path_ / name;
  std::ofstream(file, std::ios::binary) << contents;
  return file.string();
}

std::string TempDir::Link(const std::string& name, const std::string& target) const {
  const std::filesystem::path link = path_ / name;
  std::filesystem::create_symlink(target, link);
  return link.string();
}

}  // namespace sieve::testing
