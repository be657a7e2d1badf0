// A job's pipeline step simulated before it runs — what `sluice simulate` prints: under one
// schedule, the step simulator's prediction (schedule/step_simulator.h) with measured costs (the
// first costs file that covers the job) or unit costs, beside every stage's memory forecast
// (pipeline/memory_forecast.h) and whether it fits a budget; and several schedules ranked by
// predicted step time, those within the budget first. The CLI parses the options into a
// SimulationRequest and prints; the choices are made here.
//
// Thread-safety: pure functions of their arguments. Failure: InvalidArgument naming why no costs
// file covers the job (each file's reason), what LayOutPipeline and MakeSchedule throw, and, with
// a budget, a schedule too large to forecast; RankSchedules throws only when no schedule named can
// be simulated (each one's reason).
//
// Example:
//   SimulationRequest r{.config = config, .pipe = {.stages = 4}, .costs = {ReadCostsFile(path)}};
//   SimulatedSchedule s = SimulateSchedule(r, MakeJob(config), ScheduleKind::kOneFOneB);
//   s.prediction.step_ms;    // the predicted step time
//   s.memory[0].peak_allocated_bytes;
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/pipeline/layout.h"
#include "sluice/plan/planner.h"
#include "sluice/schedule/steady_state.h"
#include "sluice/schedule/step_costs.h"
#include "sluice/schedule/step_simulator.h"

namespace sluice {

// What to simulate: the job, its pipeline, the costs and how to replay them.
struct SimulationRequest {
  TrainConfig config;
  pipeline::PipelineOptions pipe;  // stages, chunks, partition, layout (the kind is given apart)
  std::vector<pipeline::StepCosts>
      costs;                    // each kind takes the first covering it; none: unit costs
  std::vector<int64_t> budget;  // bytes per stage; empty: none
  int cores = 0;                // cores the stage threads share (0: one each)
  int draws = -1;  // replays of recorded computes; -1: kDefaultDraws where the costs recorded
                   // enough steps and every stage has a core, else 0 (the medians)
  pipeline::DrawMode draw_mode = pipeline::DrawMode::kComputes;
};

// One schedule's simulated step: the prediction and the memory forecast of every stage.
struct SimulatedSchedule {
  pipeline::ScheduleKind kind = pipeline::ScheduleKind::kOneFOneB;
  std::string describe;  // the schedule (kind, P, M, V)
  std::string costs;     // where its costs come from
  pipeline::StepPrediction prediction;
  int draws = 0;                            // replays of drawn costs (0: of the medians)
  std::vector<StageMemoryForecast> memory;  // empty when not forecast (memory_note says why)
  std::string memory_note;
  bool fits = true;             // every stage's forecast within the budget (true without a budget)
  double core_wait_share = -1;  // of the costs' run (pipeline::CoreWaitShare); -1 unknown
  // The profiled run's own step, when it ran this very schedule (its costs' "measured"): what the
  // prediction can be checked against. Null otherwise.
  nlohmann::ordered_json measured;
  // With pipe.post_validate: the steady state of its steps interlocked (schedule/steady_state.h),
  // in the prediction's unit — the step every step after the first costs, the fill and drain
  // paid once per run. Empty without post-validation. At unit costs, the unit-cost analysis
  // (AnalyseSteadyState). With a costs file (`steady_per_action`), the step simulator's replay of
  // N and N + 1 interlocked steps at the profile's per-action costs (each rank's and chunk's F,
  // B, W, messages and their transit; the medians), the period being what one more step adds
  // plus the OPT every step pays and the interlocked schedule leaves out — on the rank where it
  // costs most, its optimizer and update and the copy of its rollback state (the forecast's
  // rollback_bytes at the profile's copy bandwidth, message_bytes per copy_ms; `rollback_copy_ms`,
  // the largest rank's) — unless the profiled run had --post-validate itself, whose update held
  // what keeping the rollback state costs (its "measured" says "post_validate"). The eager update
  // swaps spare buffers instead of copying (StageProgram::UpdateEagerly), so for a profile taken
  // without --post-validate the copy charged is an upper bound (measured: 0.3–0.4 ms more than the
  // synchronous update per stage where the copy took 1.3–1.6 ms). A rollback (a step validation
  // refuses) costs a step more; the steady state assumes none.
  std::optional<pipeline::SteadyState> steady;
  bool steady_per_action = false;
  double rollback_copy_ms = 0;
  // What ranking weighs: the steady-state period with per-action costs, else the step time.
  double RankedTime() const;

  // The largest stage's forecast peak of allocated bytes; -1 when memory was not forecast.
  int64_t LargestPeak() const;
  // The largest stage's forecast peak of reserved bytes, what `fits` weighs against the budget;
  // -1 when memory was not forecast.
  int64_t LargestReservedPeak() const;
};

SimulatedSchedule SimulateSchedule(const SimulationRequest& request, const Job& job,
                                   pipeline::ScheduleKind kind);

// Every kind of `kinds` simulated and ranked: within the budget first, then by predicted step
// time, then by the largest stage's peak; `refused` holds each kind that could not be simulated
// and why, in the order given.
struct ScheduleRanking {
  std::vector<SimulatedSchedule> ranked;
  std::vector<std::pair<pipeline::ScheduleKind, std::string>> refused;
};
ScheduleRanking RankSchedules(const SimulationRequest& request, const Job& job,
                              const std::vector<pipeline::ScheduleKind>& kinds);

}  // namespace sluice
