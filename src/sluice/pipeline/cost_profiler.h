// Cost profiling: what a real run's steps cost, collected from the stage runtime's records
// (StageStep) into the step costs of schedule/step_costs.h — `sluice train --profile-out` writes
// them as a costs file that `sluice simulate --costs` replays. The costs and the simulator are
// schedule mathematics (schedule/); measuring them needs the runtime, so it lives here.
//
// Thread-safety: ProfileJob is a pure function; one CostProfiler per run, used by one thread.
//
// Example:
//   CostProfiler profiler(schedule, ProfileJob(setup, layout));
//   profiler.Add(steps, step_wall_ns);  // every step after the warm-up
//   nlohmann::ordered_json file = CostsToJson(profiler.Costs());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/pipeline/stage_runtime.h"
#include "sluice/schedule/schedule.h"
#include "sluice/schedule/step_costs.h"

namespace sluice::pipeline {

// What a costs file says it was measured on, for CheckCostsJob: the model's shape, the
// micro-batch, the layout of the layers, the recompute policies and the threads.
nlohmann::json ProfileJob(const StageSetup& setup, const std::string& layout);

// Collects the profile of a run's steps (StageStep::computes, posts) per rank and makes costs of
// them: medians over every sample of the computes and posts; means of the waits between computes
// (overhead_ms, wake_ms, allreduce_ms: their sum is what they cost a step, long tail included);
// and the first kMaxRecordedSteps steps compute by compute (Add only).
// The means are robust to a few stalled steps (Add only): when at least half of the steps ran
// with a core per stage — no stage thread waited for a core kCoreWaitShareNoted of the step's
// span or more (StageStep::core_wait_ns) — the waits' means are of those steps alone. A step in
// which other work took the cores holds waits of another machine (a woken thread waiting for a
// core), and two such steps of 19 made wake_ms 25 times its value (docs/simulator.md); the
// medians and the run's measured figures leave such steps out by themselves. measured
// "steps_without_core_wait" says how many steps those were.
// wake_ms and allreduce_ms need every rank's step on one clock (Add): AddRank leaves them 0 (a
// distributed run joins its ranks' all-reduces itself: RankAllReduceMs).
class CostProfiler {
 public:
  CostProfiler(const Schedule& schedule, nlohmann::json job);
  // One step of every rank ([P]) and its wall time in the engine.
  void Add(const std::vector<StageStep>& steps, int64_t step_wall_ns);
  // The same in two parts, for a distributed run whose process knows only its own rank's step:
  // rank r's step and the step's span (StepSpanNs: there, the slowest rank's wall), then the
  // step's wall time in the engine beside its span (the difference is the step overhead).
  void AddRank(int r, const StageStep& step, int64_t span_ns);
  void AddStep(int64_t step_wall_ns, int64_t span_ns);
  StepCosts Costs() const;
  // The duration of OPT's all-reduce on each rank AddRank was given, in order (ms): one per step
  // in a distributed process, whose ranks' figures GatherCosts joins — the last rank to reach
  // the all-reduce waits least, so the shortest of a step's is its all-reduce.
  const std::vector<double>& RankAllReduceMs() const { return rank_allreduce_ms_; }

 private:
  void Record(const std::vector<StageStep>& steps, int64_t step_wall_ns, int64_t span_ns);

  const Schedule& schedule_;
  nlohmann::json job_;
  // [P][kind][V] wall and CPU samples; kind 0 F, 1 B, 2 W, 3 optimizer, 4 update.
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> wall_, cpu_;
  std::vector<int64_t> post_, copy_, overhead_, step_wall_;
  std::vector<int64_t> wake_, allreduce_;  // in-process runs only
  // The same waits of the steps that ran with a core per stage (Add only), and their count.
  std::vector<int64_t> own_core_wake_, own_core_allreduce_;
  std::vector<std::vector<double>> own_core_overhead_;  // [P] per step, ns
  int64_t own_core_steps_ = 0, added_steps_ = 0;
  std::vector<std::vector<double>> bubble_;                // [P] per step
  std::vector<std::vector<double>> core_wait_;             // [P] per step, ms (where known)
  std::vector<std::vector<double>> overhead_per_compute_;  // [P] per step, ns
  std::vector<RecordedStep> recorded_;                     // in-process runs only
  std::vector<double> rank_allreduce_ms_;                  // AddRank's, in order
  int64_t message_bytes_ = 0;
};

}  // namespace sluice::pipeline
