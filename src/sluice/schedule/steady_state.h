// Consecutive training steps that interlock — the schedule side of optimizer post-validation
// (`--post-validate`, docs/pipeline.md "Post-validation").
//
// Synchronous steps end in an all-reduce across the ranks (the global gradient norm, the finite
// check): no rank starts step k + 1 before the last rank's last W of step k, so every step pays
// the pipeline's fill and drain — the bubble of schedule_analysis.h's Simulate. Under
// post-validation each rank updates as soon as its own step is done and the reduction completes
// in the background, so rank r may begin step k + 1 right after its own OPT of step k: the steps
// interlock, the fill is paid once at the start of a run and the drain once at its end, and the
// steady state in between has its own, smaller bubble — 0 for ZB-H2 and ZB-V at unit cost (Qi
// et al. 2024, table 3).
//
// InterlockSteps expresses N interlocked steps as one schedule (schedule.h) of N·M micro-batches:
// rank r's list is its list of step 0, then step 1's with micro-batch m renumbered M + m, and so
// on. The OPT of every step but the last is left out — a schedule has one OPT per rank, last —
// which the unit-cost analysis may do: OPT costs nothing there, and the list keeps step k + 1's
// actions after step k's on each rank, as the runtime would run them.
//
// AnalyseSteadyState simulates N and N + 1 interlocked steps (Simulate, the same cost model and
// communication mode) and reads off:
//   period   the makespan one more step adds in the steady state (T(N + 1) − T(N))
//   bubble   Σ_r (period − busy_r) / (P · period): each rank's idle share of a steady-state step
//   fill     mean over ranks of the idle before a rank's first compute (the run's first step)
//   drain    mean over ranks of the idle after a rank's last compute (the run's last step)
// beside the synchronous step's makespan and bubble. A run of K steps then takes
// K · period + (what fill and drain add) instead of K · (synchronous makespan).
//
// Failure: ScheduleError for an invalid schedule (validated first unless `validated`);
// InvalidArgument for steps < 1. Thread-safety: pure functions.
//
// Example:
//   Schedule s = MakeSchedule({.kind = ScheduleKind::kZeroBubbleH2, .stages = 8,
//                              .micro_batches = 32});
//   SteadyState ss = AnalyseSteadyState(s);
//   ss.synchronous_bubble;  // 7/103: every step fills and drains
//   ss.bubble;              // 0: the steps interlock into a parallelogram with no gaps
#pragma once

#include "sluice/schedule/schedule.h"
#include "sluice/schedule/schedule_analysis.h"

namespace sluice::pipeline {

// `steps` (≥ 1) interlocked steps of `one` as one schedule (see above). Its name is one's, its
// micro-batches steps·M.
Schedule InterlockSteps(const Schedule& one, int steps);

struct SteadyState {
  int steps = 0;                    // N: the steady state is measured between N and N + 1 steps
  double synchronous_makespan = 0;  // one step alone (Simulate)
  double synchronous_bubble = 0;
  double period = 0;  // a steady-state step
  double bubble = 0;  // its idle share, over all ranks
  double fill = 0;    // once per run: mean idle before a rank's first compute
  double drain = 0;   // once per run: mean idle after a rank's last compute
};

// The steady state of `schedule`'s steps interlocked (see above). N = kSteadyStateSteps.
inline constexpr int kSteadyStateSteps = 4;
SteadyState AnalyseSteadyState(const Schedule& schedule, const CostModel& costs = {},
                               CommMode mode = CommMode::kAsync, bool validated = false);

}  // namespace sluice::pipeline
