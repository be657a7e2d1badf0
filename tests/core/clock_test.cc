#include "sluice/core/clock.h"

#include <thread>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(Clock, NowNsNeverGoesBackwards) {
  int64_t previous = NowNs();
  for (int i = 0; i < 10000; ++i) {
    const int64_t now = NowNs();
    ASSERT_GE(now, previous);
    previous = now;
  }
}

TEST(Clock, NowNsIsSharedByThreads) {
  // One origin for the process: a reading on another thread falls between two on this one.
  const int64_t before = NowNs();
  int64_t there = 0;
  std::thread([&] { there = NowNs(); }).join();
  const int64_t after = NowNs();
  EXPECT_LE(before, there);
  EXPECT_LE(there, after);
}

TEST(Clock, ThreadCpuNsCountsOnlyThisThreadsWork) {
  const int64_t begin = ThreadCpuNs();
  volatile double sink = 0;
  for (int i = 0; i < 5'000'000; ++i) sink = sink + 1.0;  // burns CPU on this thread
  const int64_t busy = ThreadCpuNs() - begin;
  EXPECT_GT(busy, 0);

  // Another thread's work is not this thread's CPU time.
  const int64_t before_other = ThreadCpuNs();
  int64_t other_busy = 0;
  std::thread([&] {
    const int64_t start = ThreadCpuNs();
    volatile double other_sink = 0;
    for (int i = 0; i < 5'000'000; ++i) other_sink = other_sink + 1.0;
    other_busy = ThreadCpuNs() - start;
  }).join();
  EXPECT_GT(other_busy, 0);
  EXPECT_LT(ThreadCpuNs() - before_other, other_busy);
}

}  // namespace
}  // namespace sluice
