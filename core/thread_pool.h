// ThreadPool: a fixed set of worker threads for data-parallel loops on the CPU backend.
//
// ParallelFor splits [0, count) into chunks that the workers and the calling thread take from a
// shared counter, and returns when all are done. Calls from several threads are serialised; a
// ParallelFor inside a ParallelFor body runs inline (no nested parallelism, no deadlock).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sieve {

class ThreadPool {
 public:
  // num_threads <= 0 means one per hardware thread.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) over disjoint ranges covering [0, count); each range holds at least
  // `grain` items except possibly the last.
  void ParallelFor(int64_t count, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& body);

  // The process-wide pool (size from SIEVE_NUM_THREADS or the hardware).
  static ThreadPool& Default();

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one ParallelFor at a time
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  uint64_t generation_ = 0;
  int active_workers_ = 0;
  bool stopping_ = false;

  // The loop in flight.
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace sieve
