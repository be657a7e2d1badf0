// CycleClock: a cheap timestamp for hot paths, converted to nanoseconds.
//
// The executor times the GC work of every freeing instruction (RunStats::gc_thread_ns). Under a
// hypervisor's clock source (kvm-clock) a steady_clock read costs several times a read of the
// CPU's time-stamp counter, enough to double the cost of a small instruction (docs/benchmarks.md,
// "Executor", has the figures). CycleClock reads the counter (rdtsc) when the CPU says it ticks at
// a constant rate in every power state (invariant TSC, CPUID 0x80000007 EDX bit 8), converting
// ticks with a rate calibrated once against steady_clock, on first use; elsewhere it reads NowNs
// (core/clock.h) and a tick is 1 ns.
//
// Use it for durations on one thread; for timestamps shared across threads (traces) use NowNs.
// Thread-safety: all functions may be called from any thread (calibration is a thread-safe static).
//
// Example:
//   const int64_t start = CycleClock::Now();
//   Work();
//   const int64_t ns = CycleClock::ToNs(CycleClock::Now() - start);
#pragma once

#include <cstdint>

#include "sluice/core/clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace sluice {

class CycleClock {
 public:
  // Ticks since an arbitrary origin.
  static int64_t Now() {
#if defined(__x86_64__)
    if (UsesTsc()) return static_cast<int64_t>(__rdtsc());
#endif
    return NowNs();
  }
  // Nanoseconds in `ticks`.
  static int64_t ToNs(int64_t ticks) {
    return static_cast<int64_t>(static_cast<double>(ticks) * NsPerTick());
  }
  static double NsPerTick();
  // Whether Now() reads the time-stamp counter.
  static bool UsesTsc();
};

}  // namespace sluice
