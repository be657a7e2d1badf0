// ReadyQueue: the instructions of a parallel run whose inputs are all computed, waiting for a
// thread. A FIFO of instruction indices in a ring allocated once (every instruction enters at most
// once per run, so capacity = number of instructions and Push never allocates).
//
// Pop blocks (condition variable, no spinning) until an index is available or the queue is
// stopped; after Stop() it returns -1 to every caller. Reset() rearms it for the next run.
//
// Thread-safety: every method may be called from any thread (one mutex guards the state).
//
// Example:
//   ReadyQueue q(n);
//   q.Push(0);
//   int32_t i = q.Pop();  // 0
//   q.Stop();             // every Pop now returns -1
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "sluice/core/error.h"

namespace sluice {

class ReadyQueue {
 public:
  explicit ReadyQueue(size_t capacity = 0) : ring_(capacity) {}

  // Empties the queue and clears the stop flag. Not concurrently with other calls.
  void Reset() {
    std::lock_guard lock(mu_);
    head_ = tail_ = 0;
    stopped_.store(false, std::memory_order_relaxed);
  }

  void Push(int32_t index) {
    bool wake;
    {
      std::lock_guard lock(mu_);
      SLUICE_CHECK(tail_ - head_ < ring_.size(), "ready queue over capacity {}", ring_.size());
      ring_[tail_++ % ring_.size()] = index;
      wake = waiting_ > 0;
    }
    if (wake) cv_.notify_one();
  }

  // The oldest ready index, waiting for one; -1 once stopped.
  int32_t Pop() {
    std::unique_lock lock(mu_);
    ++waiting_;
    cv_.wait(lock, [&] { return stopped_.load(std::memory_order_relaxed) || head_ != tail_; });
    --waiting_;
    if (stopped_.load(std::memory_order_relaxed)) return -1;
    return ring_[head_++ % ring_.size()];
  }

  // Wakes every waiter; Pop returns -1 from now on (run complete, or failed).
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopped_.store(true, std::memory_order_relaxed);
    }
    cv_.notify_all();
  }

  // A lock-free peek at the stop flag (for a thread about to continue without Pop).
  bool stopped() const { return stopped_.load(std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> ring_;         // fixed size; slots guarded by mu_
  size_t head_ = 0;                   // guarded by mu_
  size_t tail_ = 0;                   // guarded by mu_
  int waiting_ = 0;                   // guarded by mu_: threads inside Pop
  std::atomic<bool> stopped_{false};  // written under mu_; read under mu_ or by stopped()
};

}  // namespace sluice
