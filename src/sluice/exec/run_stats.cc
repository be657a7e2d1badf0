#include "sluice/exec/run_stats.h"

#include <algorithm>
#include <vector>

#include "sluice/core/error.h"

namespace sluice {

namespace {

template <typename F>
int64_t Median(std::span<const RunStats> runs, F field) {
  std::vector<int64_t> v;
  v.reserve(runs.size());
  for (const RunStats& r : runs) v.push_back(field(r));
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

template <typename F>
int64_t Max(std::span<const RunStats> runs, F field) {
  int64_t m = field(runs[0]);
  for (const RunStats& r : runs) m = std::max(m, field(r));
  return m;
}

}  // namespace

RunSummary Summarize(std::span<const RunStats> runs) {
  if (runs.empty()) throw InvalidArgument("cannot summarize zero runs");
  RunSummary s;
  s.runs = static_cast<int64_t>(runs.size());
  s.instructions = runs[0].instructions;
  s.wall_ns_median = Median(runs, [](const RunStats& r) { return r.wall_ns; });
  s.wall_ns_min = -Max(runs, [](const RunStats& r) { return -r.wall_ns; });
  s.peak_allocated_bytes = Max(runs, [](const RunStats& r) { return r.peak_allocated_bytes; });
  s.peak_reserved_bytes = Max(runs, [](const RunStats& r) { return r.peak_reserved_bytes; });
  s.liveness_lower_bound_bytes = runs[0].liveness_lower_bound_bytes;
  s.gc_thread_ns_per_run = Median(runs, [](const RunStats& r) { return r.gc_thread_ns; });
  s.frees_per_run = Median(runs, [](const RunStats& r) { return r.frees; });
  s.sync_fallbacks_per_run = Median(runs, [](const RunStats& r) { return r.sync_fallbacks; });
  s.drain_wait_ns_per_run = Median(runs, [](const RunStats& r) { return r.drain_wait_ns; });
  s.async_pending_peak_bytes =
      Max(runs, [](const RunStats& r) { return r.async_pending_peak_bytes; });
  return s;
}

}  // namespace sluice
