#include "sluice/schedule/steady_state.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "sluice/schedule/validator.h"

namespace sluice::pipeline {

Schedule InterlockSteps(const Schedule& one, int steps) {
  if (steps < 1)
    throw InvalidArgument(
        fmt::format("{}: interlocking needs 1 step or more, got {}", one.Describe(), steps));
  const int64_t M = one.micro_batches;
  if (int64_t{steps} * M > std::numeric_limits<int32_t>::max()) {
    throw InvalidArgument(fmt::format("{}: {} interlocked steps hold more than 2^31 micro-batches",
                                      one.Describe(), steps));
  }
  Schedule out = one;
  out.micro_batches = static_cast<int>(steps * M);
  for (size_t r = 0; r < one.ranks.size(); ++r) {
    std::vector<Action>& list = out.ranks[r];
    list.clear();
    list.reserve(one.ranks[r].size() * static_cast<size_t>(steps));
    for (int k = 0; k < steps; ++k) {
      for (Action a : one.ranks[r]) {
        if (a.kind == ActionKind::kOptimizer && k + 1 < steps) continue;
        if (a.kind != ActionKind::kOptimizer) a.micro_batch = a.micro_batch + k * M;
        list.push_back(a);
      }
    }
  }
  return out;
}

SteadyState AnalyseSteadyState(const Schedule& schedule, const CostModel& costs, CommMode mode,
                               bool validated) {
  if (!validated) ValidateSchedule(schedule);
  const int P = schedule.stages;
  SteadyState out;
  out.steps = kSteadyStateSteps;
  const Simulation one = Simulate(schedule, costs, mode, /*keep_action_times=*/false, true);
  out.synchronous_makespan = one.makespan;
  out.synchronous_bubble = one.bubble;
  // Interlocking keeps every list's order and every message's pairing: valid when one step is.
  const Simulation n = Simulate(InterlockSteps(schedule, out.steps), costs, mode,
                                /*keep_action_times=*/false, true);
  const Schedule longer = InterlockSteps(schedule, out.steps + 1);
  const Simulation n1 = Simulate(longer, costs, mode, /*keep_action_times=*/true, true);
  out.period = n1.makespan - n.makespan;
  double idle = 0, fill = 0, drain = 0;
  for (int r = 0; r < P; ++r) {
    const double busy = one.ranks[r].busy;  // each step's is the same
    idle += out.period - busy;
    double first = n1.makespan, last = 0;
    const std::vector<Action>& list = longer.ranks[r];
    for (size_t i = 0; i < list.size(); ++i) {
      if (!IsCompute(list[i].kind)) continue;
      first = std::min(first, n1.ranks[r].actions[i].start);
      last = std::max(last, n1.ranks[r].actions[i].end);
    }
    fill += first / P;
    drain += (n1.makespan - last) / P;
  }
  // Sums of measured costs may leave a rounding error below 0 where the steady state has no idle.
  out.bubble = out.period > 0 ? std::max(0.0, idle / (P * out.period)) : 0;
  out.fill = fill;
  out.drain = drain;
  return out;
}

}  // namespace sluice::pipeline
