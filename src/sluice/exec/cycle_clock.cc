#include "sluice/exec/cycle_clock.h"

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

// Steady-clock nanoseconds per tick, measured over a ~2 ms busy wait.
double CalibrateNsPerTick() {
  if (!CycleClock::UsesTsc()) return 1.0;
  const int64_t t0 = NowNs();
  const int64_t c0 = CycleClock::Now();
  int64_t t1;
  do {
    t1 = NowNs();
  } while (t1 - t0 < 2'000'000);
  const int64_t c1 = CycleClock::Now();
  return c1 > c0 ? static_cast<double>(t1 - t0) / static_cast<double>(c1 - c0) : 1.0;
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

}  // namespace sluice
