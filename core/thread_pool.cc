#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace sieve {

namespace {
thread_local bool tls_inside_parallel_for = false;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int index = 1; index < num_threads; ++index) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int threads = 0;
    if (const char* env = std::getenv("SIEVE_NUM_THREADS")) threads = std::atoi(env);
    return new ThreadPool(threads);  // never destroyed: workers may outlive static destructors
  }();
  return *pool;
}

void ThreadPool::RunChunks() {
  tls_inside_parallel_for = true;
  while (true) {
    const int64_t begin = next_.fetch_add(chunk_);
    if (begin >= count_) break;
    (*body_)(begin, std::min(count_, begin + chunk_));
  }
  tls_inside_parallel_for = false;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen_generation = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
    }
    RunChunks();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_workers_ == 0) work_done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t count, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || tls_inside_parallel_for || count <= grain) {
    body(0, count);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  const int64_t parts = static_cast<int64_t>(num_threads()) * 4;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    chunk_ = std::max(grain, (count + parts - 1) / parts);
    next_.store(0);
    active_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_ready_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return active_workers_ == 0; });
  body_ = nullptr;
}

}  // namespace sieve
