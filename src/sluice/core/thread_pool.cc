#include "sluice/core/thread_pool.h"

#include <system_error>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

namespace {

thread_local bool t_in_job = false;

// Marks the calling thread as running a kParts job for its lifetime (a kOwnWork job leaves the
// mark as it was).
struct InJobScope {
  bool saved = t_in_job;
  explicit InJobScope(ThreadPool::Jobs jobs) {
    if (jobs == ThreadPool::Jobs::kParts) t_in_job = true;
  }
  ~InJobScope() { t_in_job = saved; }
};

}  // namespace

bool ThreadPool::InJob() { return t_in_job; }

ThreadPool::ThreadPool(int threads, Jobs jobs) : jobs_(jobs) {
  if (threads < 1) {
    throw InvalidArgument(fmt::format("thread pool: need at least 1 thread, got {}", threads));
  }
  if (threads > kMaxThreads) {
    throw InvalidArgument(
        fmt::format("thread pool: at most {} threads, got {}", kMaxThreads, threads));
  }
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int member = 1; member < threads; ++member) {
    try {
      workers_.emplace_back([this, member] { WorkerLoop(member); });
    } catch (const std::system_error& e) {
      // The system refused a thread (pid or thread limit, no memory for its stack). The workers
      // already started must be stopped and joined here: a joinable std::thread destroyed by the
      // unwinding vector would call std::terminate.
      StopWorkers();
      throw ResourceError(fmt::format(
          "cannot start thread {} of {}: {}; ask for fewer {} or raise the process limits (ulimit "
          "-u, ulimit -v)",
          member + 1, threads, e.what(),
          jobs == Jobs::kParts ? "threads (--threads)" : "pipeline stages (--stages)"));
    }
  }
}

ThreadPool::~ThreadPool() { StopWorkers(); }

void ThreadPool::StopWorkers() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.NotifyAll();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
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
    InJobScope in_job(jobs_);
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
      InJobScope in_job(jobs_);
      fn(context, member);
    } catch (...) {
      RecordError(std::current_exception());
    }
    MutexLock lock(&mu_);
    if (--active_ == 0) done_cv_.NotifyOne();
  }
}

}  // namespace sluice
