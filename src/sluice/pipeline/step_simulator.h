// The step simulator: predicts a pipeline training step's time — per stage busy, idle and bubble —
// by replaying every rank's action list (schedule.h) as a discrete-event model of the stage
// runtime (stage_runtime.h), with costs measured by a real run (`sluice train --profile-out`) or
// unit costs (the theory figures of schedule_analysis.h). Memory is not modelled here: the CLI
// reports the exact forecast of memory_forecast.h beside the time (one memory model, not two).
//
// Any ScheduleKind: the replay reads only the action lists, so a new generator needs nothing here.
//
// The model, action by action on rank r at its clock t (times in milliseconds):
//   RECV_F, RECV_B, SEND_F, SEND_B  posting costs `post_ms` on r. Matching is per pair of ranks in
//           list order (validated schedules). The later of the two posts of a message copies it
//           (comm/local.h): `copy_ms` more on that rank; the message has then arrived and the send
//           has completed. Nobody waits at a post.
//   F(c, m) waits for its RECV_F's message, if it had one, then costs forward_ms of (r, c).
//   B(c, m) waits for its RECV_B's message, then for the completion of SEND_F(c, m) (output
//           release), then costs backward_ms (+ weight_ms when the schedule does not split).
//   W(c, m) costs weight_ms.
//           A compute that waited (its message came after r's clock) starts `wake_ms` after the
//           message (the blocked thread waking); after each compute r spends `overhead_ms` of
//           its own (bookkeeping between actions: idle, not busy).
//   OPT     costs optimizer_ms (gradient mean and norm), then the all-reduce of the norm: a barrier
//           of all ranks, ending `allreduce_ms` after the last rank reaches it; then update_ms
//           (the optimizer proper).
//   end     a rank's step ends once every send it made has completed.
// The step time is the last rank's end plus `step_overhead_ms` (starting and joining the rank
// threads, the loss): step_ms. A rank's busy time is the sum of its compute costs; idle is the
// makespan (without overhead) minus busy; bubble = idle / makespan — as the engine measures it,
// with the step's span from the first rank's start to the last one's end (StepSpanNs).
// The replay runs rank by rank — each rank down its list until a compute needs a message not yet
// matched — which gives, bit for bit, the times of replaying one action at a time in the global
// order of start times (the reference, SimulateOptions::in_event_order; the replay of --cores).
//
// Costs cover a schedule when they have its stage count P and chunk count V and, for a schedule
// that splits the backward into B and W, were measured split (an unsplit B costs B + W).
// CheckCostsCover throws InvalidArgument naming the mismatch and what to measure instead.
//
// Thread-safety: pure functions. Failure: ScheduleError for a schedule the validator refuses.
//
// Example:
//   Schedule s = MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 8});
//   StepPrediction p = SimulateStep(s, UnitCosts(s));
//   p.ranks[0].bubble;  // 3/11, as Simulate(s) and TheoreticalBubble say
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/pipeline/schedule.h"
#include "sluice/pipeline/stage_runtime.h"

namespace sluice::pipeline {

struct ChunkCosts {
  double forward_ms = 0, backward_ms = 0, weight_ms = 0;  // per micro-batch; medians when measured
  double forward_cpu_ms = 0, backward_cpu_ms = 0, weight_cpu_ms = 0;  // thread CPU beside wall
};

struct RankCosts {
  std::vector<ChunkCosts> chunks;  // [V]
  double optimizer_ms = 0, update_ms = 0;
  // Per F, B or W: the rank's time outside computes and the communicator (binding a batch,
  // handing values between scopes, freeing a micro-batch's): idle, spent after each compute.
  double overhead_ms = 0;
};

struct StepCosts {
  std::string source = "unit costs";  // where they come from: errors name it
  int stages = 1, chunks = 1;         // P and V of the run measured
  bool split_backward = false;        // measured with B and W apart
  std::vector<RankCosts> ranks;       // [P]
  int64_t message_bytes = 0;          // one message
  double post_ms = 0;                 // an Isend or Irecv call that copies nothing
  double copy_ms = 0;                 // the extra of the call that copies the message
  double wake_ms = 0;           // from a message's arrival to its blocked receiver running again
  double allreduce_ms = 0;      // OPT's all-reduce, once the last rank has reached it
  double step_overhead_ms = 0;  // per step, beyond the slowest rank
  // What the costs were measured on ("model", "layers", "dim", ... → value): a simulation of
  // another job is refused (CheckCostsJob).
  nlohmann::json job = nlohmann::json::object();
  // The run's own figures, for comparing predictions with it (empty for unit costs).
  nlohmann::json measured = nlohmann::json::object();
};

// A stage's F, B and W of a micro-batch cost 1 each (an unsplit B 2), everything else 0: the
// unit-cost analysis, in units of a whole stage's forward — with V chunks per stage each chunk's
// action costs 1/V, so schedules of different V compare (schedule_analysis.h's Simulate counts
// one per action: its makespan and busy times are V times these, its bubbles the same).
StepCosts UnitCosts(const Schedule& schedule);

// Throws InvalidArgument when `costs` do not cover `schedule` (see above).
void CheckCostsCover(const StepCosts& costs, const Schedule& schedule);
// Throws InvalidArgument naming the first field of costs.job that `job` has with another value.
void CheckCostsJob(const StepCosts& costs, const nlohmann::json& job);

struct RankPrediction {
  double busy_ms = 0, idle_ms = 0, bubble = 0;
  double end_ms = 0;  // when this rank's step ends
};

struct StepPrediction {
  double makespan_ms = 0;  // the last rank's end
  double step_ms = 0;      // makespan + step overhead
  double bubble = 0;       // Σ idle / (P · makespan)
  std::vector<RankPrediction> ranks;
};

struct SimulateOptions {
  // Cores the rank threads share; 0: a core per rank, the model above. With fewer cores than
  // ranks a compute (F, B, W, either half of OPT) starts when its rank is ready AND a core is free
  // — the earliest-ready compute first — and holds the core for its CPU time (`*_cpu_ms`: its
  // wall time was measured with the threads competing and already holds such waits); the waits
  // count as idle.
  int cores = 0;
  // The schedule came from MakeSchedule, which validated it: SimulateStep skips validating it
  // again (longer than the replay itself at P = 1024, M = 8192). Anything else is validated.
  bool validated = false;
  // Replay every action in the global order of start times, as ReplayInEventOrder does (the
  // reference; always so with shared cores), instead of rank by rank: the same times bit for bit
  // (tests/pipeline/step_simulator_test.cc holds the two to it), several times slower at scale.
  bool in_event_order = false;
};

// Validates (unless options.validated), checks coverage, and replays one step.
StepPrediction SimulateStep(const Schedule& schedule, const StepCosts& costs,
                            const SimulateOptions& options = {});

// What a costs file says it was measured on, for CheckCostsJob: the model's shape, the
// micro-batch, the layout of the layers, the recompute policies and the threads.
nlohmann::json ProfileJob(const StageSetup& setup, const std::string& layout);

// Costs files (docs/simulator.md): JSON, written by `sluice train --profile-out`.
nlohmann::ordered_json CostsToJson(const StepCosts& costs);
// Throws InvalidArgument naming `source` and the entry for a missing, mistyped or negative entry.
StepCosts CostsFromJson(const nlohmann::json& json, const std::string& source);
StepCosts ReadCostsFile(const std::string& path);

// Collects the profile of a run's steps (StageStep::computes, posts) per rank and makes costs of
// them: medians over every sample of the computes and posts; means of the waits between computes
// (overhead_ms, wake_ms, allreduce_ms: their sum is what they cost a step, long tail included).
// wake_ms and allreduce_ms need every rank's step on one clock (Add): AddRank leaves them 0.
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

 private:
  const Schedule& schedule_;
  nlohmann::json job_;
  // [P][kind][V] wall and CPU samples; kind 0 F, 1 B, 2 W, 3 optimizer, 4 update.
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> wall_, cpu_;
  std::vector<int64_t> post_, copy_, overhead_, step_wall_;
  std::vector<int64_t> wake_, allreduce_;                  // in-process runs only
  std::vector<std::vector<double>> bubble_;                // [P] per step
  std::vector<std::vector<double>> overhead_per_compute_;  // [P] per step, ns
  int64_t message_bytes_ = 0;
};

}  // namespace sluice::pipeline
