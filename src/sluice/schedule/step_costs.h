// Step costs: what one training step of a pipeline costs, per rank and chunk — the input of the
// step simulator (step_simulator.h). Unit costs (the theory figures), or costs measured by a real
// run: `sluice train --profile-out` collects them (pipeline/cost_profiler.h) and writes a costs
// file (CostsToJson; format in docs/simulator.md), `sluice simulate --costs` reads it back
// (ReadCostsFile: every missing, mistyped or negative entry is an error naming the entry).
//
// A profile holds two things: per rank and chunk the medians of F, B and W (with the means of the
// waits between computes: bookkeeping, wake-ups, the all-reduce), which the deterministic replay
// uses; and the recorded steps — every compute's own wall time, by micro-batch, in each of the
// first kMaxRecordedSteps profiled steps — which a replay of draws uses (SimulateOptions::draws):
// the medians leave out how much computes vary, and a pipeline's waits grow with it.
//
// Costs cover a schedule when they have its stage count P and chunk count V and, for a schedule
// that splits the backward into B and W, were measured split (an unsplit B costs B + W).
// CheckCostsCover throws InvalidArgument naming the mismatch and what to measure instead.
//
// Thread-safety: plain values and pure functions.
//
// Example:
//   StepCosts c = ReadCostsFile("costs.json");
//   CheckCostsCover(c, schedule);  // throws when it was measured on another P, V or split
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/schedule/schedule.h"

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
  // Data parallelism under MPI: the all-reduce of the stage's gradients over the replicas, at the
  // start of OPT (idle: a wait in the communicator), as the replica that reached it last saw it.
  // 0 without replicas.
  double data_allreduce_ms = 0;
};

// One profiled step as it ran: every compute's wall time, and what the run measured of the step.
struct RecordedStep {
  struct Chunk {
    std::vector<double> forward_ms, backward_ms, weight_ms;  // [M] by micro-batch; W 0 unsplit
  };
  struct Rank {
    std::vector<Chunk> chunks;  // [V]
    double optimizer_ms = 0, update_ms = 0;
    // The time its thread waited for a core in the step (StageStep::core_wait_ns); -1 unknown.
    // Not replayed: it says whether the step ran as the model assumes, a core per stage.
    double core_wait_ms = -1;
  };
  std::vector<Rank> ranks;           // [P]
  double step_ms = 0;                // the engine's wall time of the step
  double span_ms = 0;                // the first rank's start to the last rank's end
  std::vector<double> stage_bubble;  // [P] idle / span
};

// Steps a profile records compute by compute: the first this many after the warm-up.
inline constexpr int kMaxRecordedSteps = 64;

// The most one cost of a costs file may be, in ms (11.6 days): a replay sums millions of them.
inline constexpr double kMaxCostMs = 1e9;

struct StepCosts {
  std::string source = "unit costs";  // where they come from: errors name it
  int stages = 1, chunks = 1;         // P and V of the run measured
  bool split_backward = false;        // measured with B and W apart
  std::vector<RankCosts> ranks;       // [P]
  int64_t message_bytes = 0;          // one message
  double post_ms = 0;                 // an Isend or Irecv call that copies nothing
  double copy_ms = 0;                 // the extra of the call that copies the message
  double wake_ms = 0;       // from a message's arrival to its blocked receiver running again
  double allreduce_ms = 0;  // OPT's all-reduce, once the last rank has reached it
  // Under MPI: a message's transit from one process to another, latency + bytes × ms per byte,
  // fitted by a ping-pong of every pipeline neighbour pair at the end of the profiled run (a
  // message of 4 bytes and one of message_bytes, through the communicator's own Isend and Irecv).
  // A message arrives — and its send completes — this long after the later of its two posts.
  // 0 in-process (a copy between threads is copy_ms).
  double transit_latency_ms = 0;
  double transit_ms_per_byte = 0;
  double step_overhead_ms = 0;  // per step, beyond the slowest rank
  // Every compute of the profiled steps (empty for unit costs, costs files written before they
  // were recorded, and runs under MPI); each has `micro_batches` entries per compute kind.
  std::vector<RecordedStep> recorded;
  int micro_batches = 0;  // M of the recorded steps
  // What the costs were measured on ("model", "layers", "dim", ... → value): a simulation of
  // another job is refused (CheckCostsJob).
  nlohmann::json job = nlohmann::json::object();
  // The run's own figures, for comparing predictions with it (empty for unit costs): "schedule"
  // (Schedule::Describe of the run: `sluice simulate` of that schedule shows them beside its
  // prediction), "steps", "step_ms" (median), "stage_bubble" [P] (medians) and, where the system
  // says, "stage_core_wait_ms" [P]: each stage thread's mean time per step ready to run but
  // waiting for a core (CoreWaitShare).
  nlohmann::json measured = nlohmann::json::object();
};

// A stage's F, B and W of a micro-batch cost 1 each (an unsplit B 2), everything else 0: the
// unit-cost analysis, in units of a whole stage's forward — with V chunks per stage each chunk's
// action costs 1/V, so schedules of different V compare (schedule_analysis.h's Simulate counts
// one per action: its makespan and busy times are V times these, its bubbles the same).
StepCosts UnitCosts(const Schedule& schedule);

// The transit of one message of `costs.message_bytes` (StepCosts::transit_latency_ms).
double TransitMs(const StepCosts& costs);

// The largest share of the measured step a stage thread of the profiled run spent waiting for a
// core (measured "stage_core_wait_ms" over "step_ms", at most 1); -1 when the costs do not say. The
// replay gives every stage a core of its own: above a few percent the run measured another machine
// — its stage threads shared cores with other work, and a woken stage then takes the core of the
// stage that woke it, which no replay of a core per stage holds (docs/simulator.md, "Accuracy").
double CoreWaitShare(const StepCosts& costs);
// The share above which `sluice simulate` says so beside its prediction.
inline constexpr double kCoreWaitShareNoted = 0.05;

// Throws InvalidArgument when `costs` do not cover `schedule` (see above).
void CheckCostsCover(const StepCosts& costs, const Schedule& schedule);
// Throws InvalidArgument naming the first field of `job` that costs.job lacks (a file without its
// job, or without "dim", fits no job), then the first it has with another value.
void CheckCostsJob(const StepCosts& costs, const nlohmann::json& job);

// Costs files (docs/simulator.md): JSON, written by `sluice train --profile-out`.
nlohmann::ordered_json CostsToJson(const StepCosts& costs);
// Throws InvalidArgument naming `source` and the entry for a missing, mistyped or negative entry.
StepCosts CostsFromJson(const nlohmann::json& json, const std::string& source);
StepCosts ReadCostsFile(const std::string& path);

}  // namespace sluice::pipeline
