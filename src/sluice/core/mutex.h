// Mutex, MutexLock, MutexLockIf and CondVar: std::mutex and std::condition_variable with the
// annotations of core/thread_annotations.h, so that clang's -Wthread-safety checks every lock rule
// written as GUARDED_BY / REQUIRES. libstdc++'s own types carry no annotations, which makes them
// invisible to the analysis; every lock that guards sluice state is one of these instead.
//
// They cost what the std types cost: Mutex is a std::mutex, CondVar a std::condition_variable, and
// every method an inline call of the std one.
//
// Thread-safety: Mutex and CondVar are for use by many threads at once (that is their job);
// MutexLock and MutexLockIf belong to the thread that made them.
//
// Example:
//   class Queue {
//    public:
//     void Push(int v) EXCLUDES(mu_) {
//       {
//         MutexLock lock(&mu_);
//         items_.push_back(v);
//       }
//       nonempty_.NotifyOne();
//     }
//     int Pop() EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       while (items_.empty()) nonempty_.Wait(&mu_);  // re-check after every wake-up
//       const int v = items_.front();
//       items_.pop_front();
//       return v;
//     }
//    private:
//     Mutex mu_;
//     CondVar nonempty_;                       // notified when items_ gains an element
//     std::deque<int> items_ GUARDED_BY(mu_);
//   };
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "sluice/core/thread_annotations.h"

namespace sluice {

// A non-recursive exclusive lock: std::mutex as a capability. Prefer MutexLock to Lock/Unlock.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Blocks until this thread holds the mutex. Locking a mutex the thread already holds deadlocks.
  void Lock() ACQUIRE() { mu_.lock(); }
  // Takes the mutex if no thread holds it; returns whether it did (never blocks).
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Releases the mutex, which this thread must hold.
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;  // waits on mu_ itself
  std::mutex mu_;
};

// Holds *mu from its construction to the end of its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Holds *mu for its scope when `lock` is true, and nothing when it is false: for state that a
// mutex guards only when several threads may use it at once (AsyncGarbageCollector's producer
// side: with a single producer thread, that thread's exclusive use is the guard, and the lock would
// be pure cost). To the analysis it holds *mu either way, so a caller passing false must hold the
// guard by contract instead — say which contract in the comment on the guarded fields.
class SCOPED_CAPABILITY MutexLockIf {
 public:
  MutexLockIf(Mutex* mu, bool lock) ACQUIRE(mu) : mu_(lock ? mu : nullptr) {
    if (mu_ != nullptr) mu_->Lock();
  }
  ~MutexLockIf() RELEASE() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  MutexLockIf(const MutexLockIf&) = delete;
  MutexLockIf& operator=(const MutexLockIf&) = delete;

 private:
  Mutex* const mu_;  // nullptr when not locked
};

// A condition variable for Mutex: std::condition_variable waiting on the Mutex's std::mutex.
// Waits may wake without a notification, so always wait in a loop that re-checks the condition
// (while (!cond) cv.Wait(&mu);) — the condition reads guarded state, which the loop, unlike a
// predicate lambda, lets the analysis check. Notify with or without holding the mutex.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases *mu, blocks until notified (or woken spuriously) and reacquires *mu before returning.
  void Wait(Mutex* mu) noexcept REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // *mu stays held, by the caller
  }

  // As Wait, but gives up at `deadline`: returns false when it returns because the deadline
  // passed, true when notified (or woken spuriously) before it. *mu is held again either way.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) noexcept REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool notified = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }

  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace sluice
