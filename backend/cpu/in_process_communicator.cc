#include "backend/cpu/in_process_communicator.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace sieve {

namespace {

// What the ranks of one group share: a reusable rendezvous and each rank's published buffers.
class Group {
 public:
  explicit Group(int size) : size_(size), inputs_(size), outputs_(size), counts_(size) {}

  int size() const { return size_; }

  // Publishes rank `rank`'s buffers, then waits for every rank to have published its own.
  void Publish(int rank, const void* input, void* output, int64_t count) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inputs_[rank] = input;
      outputs_[rank] = output;
      counts_[rank] = count;
    }
    Rendezvous();
  }

  // Returns once every rank has called it (as often as this rank has).
  void Rendezvous() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
      return;
    }
    all_arrived_.wait(lock, [&] { return generation_ != generation; });
  }

  // Valid between a Publish and the next Rendezvous: the buffers every rank published.
  const void* input(int rank) const { return inputs_[rank]; }
  void* output(int rank) const { return outputs_[rank]; }
  int64_t count(int rank) const { return counts_[rank]; }

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<const void*> inputs_;
  std::vector<void*> outputs_;
  std::vector<int64_t> counts_;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank), buffers_(group_->size()) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void AllReduceSum(Tensor& data) override {
    SIEVE_CHECK(data.device() == Device::kCpu && data.dtype() == DType::kF32 &&
                data.is_contiguous())
        << "in-process all-reduce of " << data.ShapeString() << ": contiguous f32 host tensors";
    const int64_t count = data.numel();
    group_->Publish(rank_, data.data(), data.data(), count);
    CheckCounts(count, "AllReduceSum");
    // This rank reduces elements [begin, end) of every rank's buffer and writes the sum back into
    // all of them; no other rank reads or writes these elements until the rendezvous below.
    const int ranks = size();
    const int64_t begin = count * rank_ / ranks;
    const int64_t end = count * (rank_ + 1) / ranks;
    std::vector<float*>& buffers = buffers_;
    for (int rank = 0; rank < ranks; ++rank) {
      buffers[rank] = static_cast<float*>(group_->output(rank));
    }
    for (int64_t index = begin; index < end; ++index) {
      float sum = buffers[0][index];
      for (int rank = 1; rank < ranks; ++rank) sum += buffers[rank][index];
      for (int rank = 0; rank < ranks; ++rank) buffers[rank][index] = sum;
    }
    group_->Rendezvous();
  }

  void AllGather(const Tensor& in, Tensor& out) override {
    SIEVE_CHECK(in.device() == Device::kCpu && out.device() == Device::kCpu && in.is_contiguous() &&
                out.is_contiguous() && in.dtype() == out.dtype() &&
                out.numel() == in.numel() * size())
        << "in-process all-gather of " << in.ShapeString() << " into " << out.ShapeString();
    const int64_t count = in.numel();
    group_->Publish(rank_, in.data(), out.data(), count);
    CheckCounts(count, "AllGather");
    // This rank writes its own input into its slot of every rank's output.
    const size_t bytes = static_cast<size_t>(count) * in.element_size();
    for (int rank = 0; rank < size(); ++rank) {
      if (bytes == 0) break;
      std::memcpy(static_cast<char*>(group_->output(rank)) + rank_ * bytes, in.data(), bytes);
    }
    group_->Rendezvous();
  }

  void Barrier() override { group_->Rendezvous(); }

 private:
  void CheckCounts(int64_t count, const char* what) const {
    for (int rank = 0; rank < size(); ++rank) {
      SIEVE_CHECK(group_->count(rank) == count)
          << what << ": rank " << rank_ << " has " << count << " elements, rank " << rank << " "
          << group_->count(rank);
    }
  }

  std::shared_ptr<Group> group_;
  int rank_;
  std::vector<float*>
      buffers_;  // [size] every rank's all-reduce buffer, so a call allocates nothing
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeInProcessCommunicators(int size) {
  SIEVE_CHECK(size >= 1) << "a group of " << size << " ranks";
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int rank = 0; rank < size; ++rank) {
    communicators.push_back(std::make_unique<InProcessCommunicator>(group, rank));
  }
  return communicators;
}

}  // namespace sieve
