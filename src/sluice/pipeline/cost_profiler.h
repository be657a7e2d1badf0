// Cost profiling: what a real run's steps cost, collected from the stage runtime's records
// (StageStep) into the step costs of schedule/step_costs.h — `sluice train --profile-out` writes
// them as a costs file that `sluice simulate --costs` replays. The costs and the simulator are
// schedule mathematics (schedule/); measuring them needs the runtime, so it lives here.
//
// Under MPI every process profiles its own rank and the engine joins them (PipelineEngine's
// GatherCosts), with the transit of a message between processes measured by MeasureTransit.
//
// Thread-safety: ProfileJob is a pure function; one CostProfiler per run, used by one thread.
//
// Example:
//   CostProfiler profiler(schedule, ProfileJob(setup, layout));
//   profiler.Add(steps, step_wall_ns);  // every step after the warm-up
//   nlohmann::ordered_json file = CostsToJson(profiler.Costs());
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/comm/communicator.h"
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
  // The same of the replicas' gradient all-reduce at the start of OPT (data parallelism), one per
  // step AddRank was given with one; the shortest of a step's over the replicas is its cost.
  const std::vector<double>& RankDataAllReduceMs() const { return rank_data_allreduce_ms_; }
  // Rank r's mean time per step waiting for a core (StageStep::core_wait_ns); -1 unknown.
  double MeanCoreWaitMs(int r) const;
  // The halves of the pipeline's message round trips that AddRank's ranks measured, each on its
  // own clock, one entry per AddRank (a distributed process: per step; the first
  // kMaxRecordedSteps · P): for virtual stages u and u + 1 on two ranks
  // and micro-batch m, at index (u·M + m)·2 the time on u's rank from posting F(m) to u + 1 until
  // its receive of B(m) returned, and at + 1 the time on u + 1's rank from its receive of F(m)
  // returning until it posted B(m); NaN where AddRank had no such rank or the receive did not
  // block (it returned later than the message arrived). Where both halves were measured, the
  // first minus the second is two messages' transit in the step (their wake-ups included):
  // TransitInStepMs joins them. [AddRank calls][(S − 1)·M·2]
  const std::vector<std::vector<double>>& RoundTrips() const { return round_trips_; }

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
  std::vector<double> rank_data_allreduce_ms_;             // AddRank's, in order
  std::vector<std::vector<double>> round_trips_;           // RoundTrips(), ns
  int64_t message_bytes_ = 0;
};

// A message's transit between two ranks' processes: latency + bytes × ms_per_byte.
struct TransitFit {
  double latency_ms = 0, ms_per_byte = 0;
};

// Fits the transit of messages between pipeline neighbours by ping-pong through `pipe`'s own
// Isend and Irecv (what the stages' messages cost, the communicator's headers and polling
// included): each rank s with a rank s + 1 sends it a message of 4 bytes and one of
// `message_bytes` (f32) in turn, kTransitRounds times each after two of warm-up, and times their
// return. The one-way latency is half the median round trip of the small message, the cost per
// byte half the difference of the two medians over the difference of their sizes (at least 0).
// Even s ping first, then odd s (a barrier apart), so each rank serves one pair at a time.
// Collective over `pipe`. Returns this rank's fit when it pinged (s + 1 < P), else nothing.
// Run when no other message of `pipe` is in flight (after a step): it uses tag 0.
inline constexpr int kTransitRounds = 16;
std::optional<TransitFit> MeasureTransit(Communicator& pipe, int64_t message_bytes);

// A message's mean transit in the profiled steps, in ms: over every round trip whose two halves
// `halves` holds (RoundTrips' layout, the halves of every rank joined, any number of steps
// back to back), half the first half minus the second (at least 0). nullopt when none has both.
std::optional<double> TransitInStepMs(const std::vector<double>& halves);

}  // namespace sluice::pipeline
