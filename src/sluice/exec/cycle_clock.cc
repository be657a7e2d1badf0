#include "sluice/exec/cycle_clock.h"

#include <chrono>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace sluice {

namespace {

bool InvariantTsc() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 8)) != 0;
#else
  return false;
#endif
}

// Ticks per steady-clock nanosecond over a ~2 ms busy wait.
double CalibrateNsPerTick() {
  if (!CycleClock::UsesTsc()) return 1.0;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int64_t c0 = CycleClock::Now();
  Clock::time_point t1;
  do {
    t1 = Clock::now();
  } while (t1 - t0 < std::chrono::milliseconds(2));
  const int64_t c1 = CycleClock::Now();
  const double ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  return c1 > c0 ? ns / static_cast<double>(c1 - c0) : 1.0;
}

}  // namespace

bool CycleClock::UsesTsc() {
  static const bool tsc = InvariantTsc();
  return tsc;
}

double CycleClock::NsPerTick() {
  static const double ns_per_tick = CalibrateNsPerTick();
  return ns_per_tick;
}

int64_t CycleClock::SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace sluice
