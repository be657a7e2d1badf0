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
//           (comm/local.h): `copy_ms` more on that rank; the message arrives and the send
//           completes `transit` after that (under MPI: TransitMs, latency + bytes × ms per
//           byte; 0 in-process). Nobody waits at a post.
//   F(c, m) waits for its RECV_F's message, if it had one, then costs forward_ms of (r, c).
//   B(c, m) waits for its RECV_B's message, then for the completion of SEND_F(c, m) (output
//           release), then costs backward_ms (+ weight_ms when the schedule does not split).
//   W(c, m) costs weight_ms.
//           A compute that waited (its message came after r's clock) starts `wake_ms` after the
//           message (the blocked thread waking); after each compute r spends `overhead_ms` of
//           its own (bookkeeping between actions: idle, not busy).
//   OPT     waits data_allreduce_ms (the replicas' gradient all-reduce; 0 without replicas),
//           costs optimizer_ms (gradient mean and norm), then the all-reduce of the norm: a barrier
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
// Draws (SimulateOptions::draws): instead of one replay of the medians, N replays in which every
// compute costs a time recorded by the profile (StepCosts::recorded) — a whole recorded step's,
// or each compute's drawn at random — and the prediction is their mean. A replay is a maximum of
// sums, so computes that vary lengthen it beyond the replay of their medians (E[max] ≥ max E).
//
// Costs cover a schedule as step_costs.h says (CheckCostsCover).
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

#include "sluice/schedule/schedule.h"
#include "sluice/schedule/step_costs.h"

namespace sluice::pipeline {

struct RankPrediction {
  double busy_ms = 0, idle_ms = 0, bubble = 0;
  double end_ms = 0;  // when this rank's step ends
};

// One replay of drawn costs (SimulateOptions::draws).
struct DrawPrediction {
  double makespan_ms = 0, step_ms = 0;
  std::vector<double> stage_bubble;  // [P]
};

struct StepPrediction {
  double makespan_ms = 0;  // the last rank's end
  double step_ms = 0;      // makespan + step overhead
  double bubble = 0;       // Σ idle / (P · makespan)
  std::vector<RankPrediction> ranks;
  // With draws: every draw's own figures; the fields above are their means.
  std::vector<DrawPrediction> draws;
};

// How a replay of draws takes each compute's cost from the recorded steps.
enum class DrawMode {
  kSteps,     // draw d replays recorded step d mod S: each compute the one of its micro-batch
  kComputes,  // each compute drawn at random from every recorded one of its rank, chunk and kind
              // — of the steps that ran with a core per stage (DrawnSteps)
};

// The recorded steps kComputes draws from: those in which no stage thread waited for a core
// kCoreWaitShareNoted of the step's span or more, when they are at least half of the steps;
// otherwise every one. A step stalled by other work on the machine holds computes of another
// machine, and one such step of 19 put the mean of the draws well above the measured median
// (docs/benchmarks.md, "Simulator accuracy"). Steps that do not say how long their threads waited
// (files written before they did) count as having had a core.
std::vector<size_t> DrawnSteps(const StepCosts& costs);

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
  // (tests/schedule/step_simulator_test.cc holds the two to it), several times slower at scale.
  bool in_event_order = false;
  // 0: one replay of the medians. N > 0: N replays of costs drawn from the recorded steps
  // (StepCosts::recorded; draw_mode says how), each compute its own wall time — the waits that
  // computes' variation adds at every hand-off, which a replay of medians leaves out — and the
  // prediction is their mean (a costs file without recorded steps is refused). Deterministic:
  // the same seed gives the same draws. One core per rank only (cores = 0).
  int draws = 0;
  DrawMode draw_mode = DrawMode::kComputes;
  uint64_t seed = 1;
};

// The draws `sluice simulate` replays by default when its costs recorded steps: enough that the
// standard error of their mean is small beside the step (docs/simulator.md has the figures).
inline constexpr int kDefaultDraws = 64;
// ... and only when it recorded at least this many steps: a pool of fewer is not a distribution,
// and one step slowed by other work (a load burst) would lengthen most draws where the median
// step the run measures leaves it out; with fewer the medians are the robust figure.
inline constexpr int kDefaultDrawsLeastSteps = 8;

// Validates (unless options.validated), checks coverage, and replays one step.
StepPrediction SimulateStep(const Schedule& schedule, const StepCosts& costs,
                            const SimulateOptions& options = {});

}  // namespace sluice::pipeline
