// Helpers for Sieve's tests: fixture lookup that skips cleanly, fresh random inputs, the error
// metrics every comparison test states its tolerance in, and scratch directories.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/fixtures.h"
#include "core/tensor.h"

namespace sieve::testing {

// A generator seeded from a fresh random device value, logged so that a failure can be replayed
// with SIEVE_TEST_SEED: the log line lists every seed the test has drawn so far, comma-separated,
// and with such a list the test's k-th generator takes the k-th seed (a single seed: every one).
std::mt19937_64 MakeRng();
uint64_t LastSeed();

// A host f32 tensor of N(0, stddev) values.
Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937_64& rng, float stddev = 1.0f);
void FillRandom(float* data, size_t count, std::mt19937_64& rng, float stddev = 1.0f);

// ||a - b|| / ||b|| over `count` floats (b is the reference); 0 when both are zero.
double RelativeL2Error(const float* actual, const float* expected, size_t count);
double MaxAbsError(const float* actual, const float* expected, size_t count);

// A fresh directory under gtest's temp dir, named after the test, the process and a counter (so
// tests running side by side, or two in one test, never share one), removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  // Writes `contents` to the file `name` in the directory; returns its path.
  std::string Write(const std::string& name, std::string_view contents) const;
  // A symbolic link `name` in the directory pointing at `target`; returns its path.
  std::string Link(const std::string& name, const std::string& target) const;

 private:
  std::filesystem::path path_;
};

}  // namespace sieve::testing
