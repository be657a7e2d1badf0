// The bubble of a step: how much of the makespan the ranks sit idle. The one computation of it,
// from each rank's end and busy time, that every replay uses — the unit-cost simulation
// (schedule_analysis.h Simulate), the step simulator's replays of measured costs
// (step_simulator.h) and the closed forms of TheoreticalBubble (schedules.h).
//
// A rank's idle time is the makespan (the last rank's end) minus its busy time, so the idle time
// before its first and after its last compute counts as bubble; its bubble is its idle share of
// the makespan, and the pipeline's is Σ idle / (P · makespan). A zero makespan has no bubble.
//
// Thread-safety: a pure function.
//
// Example:
//   Bubble b = BubbleOf({/*end=*/11, 11}, {/*busy=*/8, 8});
//   b.makespan;   // 11
//   b.total;      // 3/11 = (P − 1)/(M + P − 1) of 1F1B at P = 4, M = 8
#pragma once

#include <span>
#include <vector>

namespace sluice::pipeline {

struct Bubble {
  double makespan = 0;        // the largest end
  std::vector<double> idle;   // [P]: makespan − busy
  std::vector<double> share;  // [P]: idle / makespan
  double total = 0;           // Σ idle / (P · makespan)
};

// `end` and `busy` hold one entry per rank (the same number, at least one).
Bubble BubbleOf(std::span<const double> end, std::span<const double> busy);

}  // namespace sluice::pipeline
