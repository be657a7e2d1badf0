#include "sluice/kernels/parallel.h"

#include <atomic>
#include <exception>
#include <memory>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_pool.h"

namespace sluice::kernels {

namespace {

// The process's intra-op pool. pool_mu is held by the one thread using the pool for a job (taken
// with TryLock: a second caller runs serially instead of waiting) and by SetIntraOpThreads while it
// replaces the pool.
struct IntraOpPool {
  Mutex mu;
  std::unique_ptr<ThreadPool> pool GUARDED_BY(mu);
  std::atomic<int> threads{1};  // pool's size, readable without the lock (1: no pool)
};

IntraOpPool& Pool() {
  static IntraOpPool* pool = new IntraOpPool;  // never destroyed: kernels may run at exit
  return *pool;
}

void RunSerially(int64_t chunks, void (*chunk)(void*, int64_t), void* context) {
  for (int64_t c = 0; c < chunks; ++c) chunk(context, c);
}

}  // namespace

void SetIntraOpThreads(int threads) {
  if (threads < 1 || threads > ThreadPool::kMaxThreads) {
    throw InvalidArgument(fmt::format("intra-op threads must be in [1, {}], got {}",
                                      ThreadPool::kMaxThreads, threads));
  }
  IntraOpPool& p = Pool();
  MutexLock lock(&p.mu);
  if (threads == p.threads.load(std::memory_order_relaxed)) return;
  p.pool.reset();
  if (threads > 1) p.pool = std::make_unique<ThreadPool>(threads);
  p.threads.store(threads, std::memory_order_relaxed);
}

int IntraOpThreads() { return Pool().threads.load(std::memory_order_relaxed); }

namespace internal {

void RunChunks(int64_t chunks, void (*chunk)(void*, int64_t), void* context) {
  IntraOpPool& p = Pool();
  if (chunks < 2 || p.threads.load(std::memory_order_relaxed) < 2 || ThreadPool::InJob()) {
    RunSerially(chunks, chunk, context);
    return;
  }
  if (!p.mu.TryLock()) {  // another thread's kernel holds the pool
    RunSerially(chunks, chunk, context);
    return;
  }
  // Members take chunks in turn from one counter. After a failure the others skip the rest; the
  // pool rethrows the first error, which is passed on once the pool is released.
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  try {
    p.pool->RunOnAll([&](int) {
      try {
        for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
             c = next.fetch_add(1, std::memory_order_relaxed)) {
          if (failed.load(std::memory_order_relaxed)) return;
          chunk(context, c);
        }
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        throw;
      }
    });
  } catch (...) {
    error = std::current_exception();
  }
  p.mu.Unlock();
  if (error) std::rethrow_exception(error);
}

}  // namespace internal

}  // namespace sluice::kernels
