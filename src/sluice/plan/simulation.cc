#include "sluice/plan/simulation.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/pipeline/cost_profiler.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/step/stage_program.h"

namespace sluice {

namespace {

// The costs' run's step time and stage bubbles when it ran `schedule`; null when it ran another
// (or the costs do not say: unit costs, files written before they named the schedule).
nlohmann::ordered_json MeasuredStep(const pipeline::StepCosts& costs,
                                    const pipeline::Schedule& schedule) {
  const nlohmann::json& m = costs.measured;
  if (!m.is_object() || !m.contains("schedule") || m["schedule"] != schedule.Describe() ||
      !m.contains("step_ms") || !m.contains("stage_bubble")) {
    return nullptr;
  }
  nlohmann::ordered_json out;
  if (m.contains("steps") && m["steps"].is_number_unsigned()) out["steps"] = m["steps"];  // a count
  out["step_ms"] = m["step_ms"];
  out["stage_bubble"] = m["stage_bubble"];
  return out;
}

// The first of `costs` that covers the job under `kind` (P, V, split backward, the same model,
// micro-batch, layout, recompute and threads); unit costs when none is given. Throws
// InvalidArgument naming why each file does not cover it.
pipeline::StepCosts CostsFor(const std::vector<pipeline::StepCosts>& costs,
                             const pipeline::PipelineLayout& layout) {
  const pipeline::Schedule& schedule = layout.setup.schedule;
  if (costs.empty()) return pipeline::UnitCosts(schedule);
  std::string why;
  for (const pipeline::StepCosts& c : costs) {
    try {
      pipeline::CheckCostsCover(c, schedule);
      pipeline::CheckCostsJob(c, pipeline::ProfileJob(layout.setup, layout.layout));
      return c;
    } catch (const InvalidArgument& e) {
      why += costs.size() > 1 ? fmt::format("\n  {}", e.what()) : e.what();
    }
  }
  throw InvalidArgument(why);
}

// Each compute kind's mean cost over the ranks and chunks of `costs`: the cost model of the
// steady-state analysis (schedule_analysis.h Simulate takes one cost per kind).
pipeline::CostModel MeanComputeCosts(const pipeline::StepCosts& costs) {
  pipeline::CostModel mean{.forward = 0, .backward = 0, .weight = 0};
  int n = 0;
  for (const pipeline::RankCosts& rank : costs.ranks) {
    for (const pipeline::ChunkCosts& ch : rank.chunks) {
      mean.forward += ch.forward_ms;
      mean.backward += ch.backward_ms;
      mean.weight += ch.weight_ms;
      ++n;
    }
  }
  if (n > 0) {
    mean.forward /= n;
    mean.backward /= n;
    mean.weight /= n;
  }
  return mean;
}

// The steady state of interlocked steps at a profile's per-action costs (module comment of
// simulation.h): SimulateStep of N and N + 1 interlocked steps at the medians; the period is
// what one more step adds plus the OPT the interlocked schedule leaves out, on the rank where it
// costs most. `one` is the synchronous step's prediction.
pipeline::SteadyState ProfiledSteadyState(const pipeline::Schedule& schedule,
                                          const pipeline::StepCosts& costs, int cores,
                                          const pipeline::StepPrediction& one,
                                          const std::vector<double>& step_opt_ms) {
  const int N = pipeline::kSteadyStateSteps;
  const int P = schedule.stages;
  auto simulate = [&](int steps) {
    return pipeline::SimulateStep(pipeline::InterlockSteps(schedule, steps), costs,
                                  {.cores = cores, .validated = true, .draws = 0});
  };
  const pipeline::StepPrediction n = simulate(N), n1 = simulate(N + 1);
  pipeline::SteadyState out{
      .steps = N, .synchronous_makespan = one.makespan_ms, .synchronous_bubble = one.bubble};
  const double opt = *std::max_element(step_opt_ms.begin(), step_opt_ms.end());
  out.period = n1.makespan_ms - n.makespan_ms + opt;
  double idle = 0;
  for (int r = 0; r < P; ++r) {
    const double busy = n1.ranks[r].busy_ms - n.ranks[r].busy_ms;
    const double steady_idle = std::max(0.0, n1.makespan_ms - n.makespan_ms - busy);
    idle += out.period - busy - step_opt_ms[r];
    // What N steps idle beyond N steady-state steps: after the rank's end (the drain), the rest
    // before its first compute (the fill).
    const double drain = n.makespan_ms - n.ranks[r].end_ms;
    out.drain += drain / P;
    out.fill += std::max(0.0, n.ranks[r].idle_ms - drain - N * steady_idle) / P;
  }
  out.bubble = out.period > 0 ? idle / (P * out.period) : 0;
  return out;
}

}  // namespace

int64_t SimulatedSchedule::LargestPeak() const {
  int64_t peak = memory.empty() ? -1 : 0;
  for (const StageMemoryForecast& m : memory) peak = std::max(peak, m.peak_allocated_bytes);
  return peak;
}

double SimulatedSchedule::RankedTime() const {
  return steady && steady_per_action ? steady->period : prediction.step_ms;
}

int64_t SimulatedSchedule::LargestReservedPeak() const {
  int64_t peak = memory.empty() ? -1 : 0;
  for (const StageMemoryForecast& m : memory) peak = std::max(peak, m.peak_reserved_bytes);
  return peak;
}

SimulatedSchedule SimulateSchedule(const SimulationRequest& r, const Job& job,
                                   pipeline::ScheduleKind kind) {
  const EngineContext ctx{.config = r.config, .task = *job.task, .model = job.model, .threads = 1};
  pipeline::PipelineOptions options = r.pipe;
  options.schedule = kind;
  const pipeline::PipelineLayout layout = pipeline::LayOutPipeline(ctx, options, 1);
  const pipeline::StepCosts chosen = CostsFor(r.costs, layout);
  // By default, draws where the costs recorded enough steps and every stage has a core (the
  // model draws are for); the medians elsewhere.
  const bool enough = chosen.recorded.size() >= size_t{pipeline::kDefaultDrawsLeastSteps};
  const int draws = r.draws >= 0 ? r.draws : enough && r.cores == 0 ? pipeline::kDefaultDraws : 0;
  SimulatedSchedule out{
      .kind = kind,
      .describe = layout.setup.schedule.Describe(),
      .costs = chosen.source,
      .prediction = pipeline::SimulateStep(
          layout.setup.schedule, chosen,
          {.cores = r.cores, .validated = true, .draws = draws, .draw_mode = r.draw_mode}),
      .draws = draws,
      .core_wait_share = pipeline::CoreWaitShare(chosen),
      .measured = MeasuredStep(chosen, layout.setup.schedule)};
  if (std::optional<std::string> why = pipeline::ForecastRefusal(layout.setup.schedule)) {
    out.memory_note = *why;
    if (!r.budget.empty()) throw InvalidArgument("--memory-budget: " + out.memory_note);
  } else {
    ShareForecastThreads(r.config.threads, r.pipe.stages);  // as ForecastJob (planner.h)
    out.memory = pipeline::ForecastStages(layout.setup);
  }
  if (options.post_validate && r.costs.empty()) {
    out.steady = pipeline::AnalyseSteadyState(layout.setup.schedule, MeanComputeCosts(chosen),
                                              pipeline::CommMode::kAsync, /*validated=*/true);
  } else if (options.post_validate) {
    // Every step's OPT: each rank's optimizer and update, and the copy of its rollback state at
    // the profile's copy bandwidth — unless the profiled run updated eagerly, copy included.
    const bool copied = chosen.measured.is_object() && chosen.measured.contains("post_validate");
    const double ms_per_byte =
        chosen.message_bytes > 0 ? chosen.copy_ms / static_cast<double>(chosen.message_bytes) : 0;
    std::vector<double> opt;
    for (size_t rank = 0; rank < chosen.ranks.size(); ++rank) {
      const pipeline::RankCosts& rc = chosen.ranks[rank];
      const double bytes =
          rank < out.memory.size() ? static_cast<double>(out.memory[rank].rollback_bytes) : 0;
      const double copy = copied ? 0 : bytes * ms_per_byte;
      out.rollback_copy_ms = std::max(out.rollback_copy_ms, copy);
      opt.push_back(rc.optimizer_ms + rc.update_ms + copy);
    }
    out.steady_per_action = true;
    out.steady = ProfiledSteadyState(layout.setup.schedule, chosen, r.cores, out.prediction, opt);
  }
  for (size_t s = 0; s < r.budget.size() && s < out.memory.size(); ++s) {
    if (out.memory[s].peak_reserved_bytes > r.budget[s]) out.fits = false;
  }
  return out;
}

ScheduleRanking RankSchedules(const SimulationRequest& request, const Job& job,
                              const std::vector<pipeline::ScheduleKind>& kinds) {
  ScheduleRanking out;
  for (pipeline::ScheduleKind kind : kinds) {
    try {
      out.ranked.push_back(SimulateSchedule(request, job, kind));
    } catch (const Error& e) {
      out.refused.emplace_back(kind, e.what());
    }
  }
  if (out.ranked.empty()) {
    std::string why;
    for (const auto& [kind, reason] : out.refused) {
      why += fmt::format("\n  {}: {}", pipeline::ScheduleKindName(kind), reason);
    }
    throw InvalidArgument("--compare: no schedule named can be simulated for this job:" + why);
  }
  // Within the budget first, then the fastest; of equal times, the one needing less memory (in the
  // reserved bytes the budget bounds).
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const auto& x, const auto& y) {
    if (x.fits != y.fits) return x.fits;
    if (x.RankedTime() != y.RankedTime()) return x.RankedTime() < y.RankedTime();
    return x.LargestReservedPeak() < y.LargestReservedPeak();
  });
  return out;
}

}  // namespace sluice
