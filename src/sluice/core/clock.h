// Clocks for timing work and stamping events: the one place sluice reads them.
//
//   NowNs()        steady-clock nanoseconds since an arbitrary origin (the same origin in every
//                  thread of the process): for timestamps shared across threads (traces, memory
//                  timelines) and for wall-clock durations. Never goes backwards.
//   ThreadCpuNs()  CPU time the calling thread has consumed, in nanoseconds
//                  (CLOCK_THREAD_CPUTIME_ID): subtract two readings taken on the same thread to
//                  learn how much of a wall-clock span the thread actually ran.
//
// For the hottest paths (timing a free list per instruction) exec/cycle_clock.h reads the CPU's
// time-stamp counter, which costs less than a steady-clock read under a hypervisor.
//
// Thread-safety: both functions may be called from any thread.
//
// Example:
//   const int64_t begin = NowNs(), cpu_begin = ThreadCpuNs();
//   Compute();
//   const int64_t wall_ns = NowNs() - begin, cpu_ns = ThreadCpuNs() - cpu_begin;
#pragma once

#include <cstdint>

namespace sluice {

int64_t NowNs();
int64_t ThreadCpuNs();

}  // namespace sluice
