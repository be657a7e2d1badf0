#include "sluice/exec/thread_pool.h"

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) {
    throw InvalidArgument(fmt::format("thread pool: need at least 1 thread, got {}", threads));
  }
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int member = 1; member < threads; ++member) {
    workers_.emplace_back([this, member] { WorkerLoop(member); });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.NotifyAll();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RecordError(std::exception_ptr error) {
  MutexLock lock(&mu_);
  if (!error_) error_ = std::move(error);
}

void ThreadPool::RunJob(JobFn fn, void* context) {
  {
    MutexLock lock(&mu_);
    job_ = fn;
    context_ = context;
    error_ = nullptr;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.NotifyAll();
  try {
    fn(context, 0);
  } catch (...) {
    RecordError(std::current_exception());
  }
  std::exception_ptr error;
  {
    MutexLock lock(&mu_);
    while (active_ != 0) done_cv_.Wait(&mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::WorkerLoop(int member) {
  uint64_t seen = 0;
  for (;;) {
    JobFn fn;
    void* context;
    {
      MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) start_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      fn = job_;
      context = context_;
    }
    try {
      fn(context, member);
    } catch (...) {
      RecordError(std::current_exception());
    }
    MutexLock lock(&mu_);
    if (--active_ == 0) done_cv_.NotifyOne();
  }
}

}  // namespace sluice
