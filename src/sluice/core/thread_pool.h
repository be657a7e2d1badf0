// ThreadPool: a fixed team of threads that runs one function on every member at once — the shape
// a parallel run needs (each member pulls ready instructions until the run is complete, or chunks
// of a kernel's rows: kernels/parallel.h).
//
// The calling thread is member 0; the pool owns size() − 1 worker threads, which sleep on a
// condition variable between jobs (no spinning). RunOnAll(fn) calls fn(i) on member i for every i
// in [0, size()) and returns when all calls have returned. A pool's Jobs say what its members
// run: parts of one kernel (kParts, the default: kernels called inside run serially) or work of
// their own that may use pools of its own (kOwnWork: the pipeline's stage threads).
//
// Errors: the constructor throws InvalidArgument for threads outside [1, kMaxThreads] and
// ResourceError when the system refuses a thread (the workers already started are joined first).
// An exception thrown by fn on any member is captured; RunOnAll rethrows the first one on
// the caller after every member has returned. Exceptions never cross threads by unwinding.
//
// Thread-safety: RunOnAll and the destructor are called by the owning thread only, one job at a
// time. fn is called concurrently from size() threads and must synchronize what it shares. Inside,
// one mutex guards the job hand-over (the fields say GUARDED_BY(mu_), checked by clang).
//
// Example:
//   ThreadPool pool(4);
//   std::atomic<int> sum{0};
//   pool.RunOnAll([&](int member) { sum += member; });  // sum == 0 + 1 + 2 + 3
#pragma once

#include <cstdint>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

class ThreadPool {
 public:
  // The most members a pool may have: far more than any machine's cores, few enough that the
  // stacks of a mistyped count (--threads 100000) are refused before any is mapped.
  static constexpr int kMaxThreads = 1024;

  // What the members of a job run.
  enum class Jobs {
    kParts,    // parts of one piece of work (a kernel's rows): kernels called inside run serially
    kOwnWork,  // work of their own (a pipeline stage each), which may use pools of its own
  };

  // 1 ≤ threads ≤ kMaxThreads (InvalidArgument otherwise); spawns threads − 1 workers, or throws
  // ResourceError, having joined those it started, when the system refuses one.
  explicit ThreadPool(int threads, Jobs jobs = Jobs::kParts);
  // Wakes and joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // True on a thread while it runs a job of any kParts pool (as member 0 or as a worker): kernels
  // use it to run serially inside a parallel run instead of nesting pools (kernels/parallel.h).
  static bool InJob();

  template <typename F>
  void RunOnAll(F&& fn) {
    using Fn = std::remove_reference_t<F>;
    RunJob([](void* f, int member) { (*static_cast<Fn*>(f))(member); }, &fn);
  }

 private:
  using JobFn = void (*)(void* context, int member);
  void RunJob(JobFn fn, void* context) EXCLUDES(mu_);
  void WorkerLoop(int member) EXCLUDES(mu_);
  void RecordError(std::exception_ptr error) EXCLUDES(mu_);
  void StopWorkers() EXCLUDES(mu_);  // wakes, joins and forgets every worker

  Mutex mu_;
  CondVar start_cv_;                         // workers wait here for a new generation or stop
  CondVar done_cv_;                          // the caller waits here for active_ == 0
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped once per job
  int active_ GUARDED_BY(mu_) = 0;           // workers still running the current job
  bool stop_ GUARDED_BY(mu_) = false;
  JobFn job_ GUARDED_BY(mu_) = nullptr;
  void* context_ GUARDED_BY(mu_) = nullptr;
  std::exception_ptr error_ GUARDED_BY(mu_);  // first error of the current job
  const Jobs jobs_;
  std::vector<std::thread> workers_;  // written by the constructor only
};

}  // namespace sluice
