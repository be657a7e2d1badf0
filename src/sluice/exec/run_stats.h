// RunStats: what one run of an Executable measured, and RunSummary: many runs condensed.
//
// Memory figures come from the allocator the executable was given, whose peak restarts once the
// inputs are bound (ExecutableOptions::reset_peak, on by default; off, the peak runs on across
// runs). They include whatever else that allocator holds — baseline_allocated_bytes says how much
// it held when the run began — so give the executable an allocator of its own to compare
// peak_allocated_bytes with liveness_lower_bound_bytes (exec/analysis.h): in trace mode with sync
// GC the two are equal.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <span>

namespace sluice {

struct RunStats {
  int64_t instructions = 0;
  int64_t wall_ns = 0;                     // Run(), from binding inputs to the final GC drain
  int64_t baseline_allocated_bytes = 0;    // allocator's allocated bytes once the inputs were bound
  int64_t peak_allocated_bytes = 0;        // allocator's peak (requested bytes), baseline included
  int64_t peak_reserved_bytes = 0;         // allocator's peak of bytes held from the OS
  int64_t liveness_lower_bound_bytes = 0;  // the plan's bound for its trace order
  int64_t arena_bytes = 0;   // static memory plan: the run's one allocation for its intermediates
  int64_t gc_thread_ns = 0;  // executing threads' time on GC work: releasing free lists (sync),
                             // detaching and handing over (async), the end-of-run release (none)
  int64_t frees = 0;  // storages released by the run (the same in every GC mode and memory plan:
                      // a planned value counts when its handles are dropped)
  int64_t sync_fallbacks = 0;  // async: batches freed on an executing thread (queue or budget full)
  int64_t drain_wait_ns = 0;   // async: time the caller waited at the end-of-run drain barrier
  int64_t async_pending_peak_bytes = 0;  // async: most bytes handed over and not yet destroyed
};

// Many runs of one executable: medians of the per-run times and counts (the middle run; the lower
// middle for an even count), the fastest wall time, maxima of the memory figures; instructions and
// the liveness bound are the plan's, the same in every run.
struct RunSummary {
  int64_t runs = 0;
  int64_t instructions = 0;
  int64_t wall_ns_median = 0;
  int64_t wall_ns_min = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t liveness_lower_bound_bytes = 0;
  int64_t gc_thread_ns_per_run = 0;    // median
  int64_t frees_per_run = 0;           // median
  int64_t sync_fallbacks_per_run = 0;  // median
  int64_t drain_wait_ns_per_run = 0;   // median
  int64_t async_pending_peak_bytes = 0;
};

// Throws InvalidArgument for an empty span.
RunSummary Summarize(std::span<const RunStats> runs);

}  // namespace sluice
