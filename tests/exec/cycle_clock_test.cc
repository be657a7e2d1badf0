// CycleClock: monotone ticks and a positive conversion rate; durations never come out shorter
// than a sleep that certainly lasted that long.
#include "sluice/exec/cycle_clock.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(CycleClock, TicksAdvanceAndConvert) {
  EXPECT_GT(CycleClock::NsPerTick(), 0.0);
  int64_t last = CycleClock::Now();
  for (int i = 0; i < 1000; ++i) {
    const int64_t now = CycleClock::Now();
    EXPECT_GE(now, last);
    last = now;
  }
  const int64_t start = CycleClock::Now();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // A lower bound only: the sleep lasted at least 5 ms; allow 20% for the calibration's error.
  EXPECT_GE(CycleClock::ToNs(CycleClock::Now() - start), 4'000'000);
  EXPECT_EQ(CycleClock::ToNs(0), 0);
}

}  // namespace
}  // namespace sluice
