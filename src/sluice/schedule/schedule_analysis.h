// Figures read off a schedule's action lists (schedule.h): how many micro-batches each rank
// holds between forward and backward, and a unit-cost simulation of busy and idle time.
//
// In flight (units): a chunk-micro-batch (c, m) is *in flight* on a rank from the end of its
// F(c, m) to the end of its B(c, m); it holds that chunk's saved activations. Without chunks
// (V = 1) a chunk-micro-batch is simply a micro-batch. With V chunks each holds about 1/V of
// what a whole stage would, so an interleaved rank with peak k holds ≈ k/V stage-micro-batches.
// Under a split backward, (c, m) *awaits W* from the end of B(c, m) to the end of W(c, m): it
// then holds only what the weight gradients read (layer inputs and output gradients).
//
// Simulation: every action of a rank runs in its list order on one clock per rank. F costs
// `forward`, B `backward` (plus `weight` when the backward is not split), W `weight`; OPT, sends
// and receives take no time (messages travel instantly). How a rank waits for its peers is the
// CommMode — from the strictest to the loosest:
//   kRendezvous  a send blocks until its receiver takes the message, a receive until it arrives
//   kBuffered    a send never blocks; a receive blocks until its message has arrived
//   kRendezvousPosted  a receive is posted where it stands, as under kAsync; a send blocks until
//                its receiver has posted the matching receive (MPI_Ssend against MPI_Irecv)
//   kAsync       neither blocks: a receive is posted where it stands and the compute that reads
//                the message (F after RECV_F, B after RECV_B) waits for it — a runtime whose
//                communicator returns completion handles
// Generators place messages by a CostModel{} timing (schedules.h), so at CostModel{} a buffered
// or asynchronous run of a generated schedule never waits for a message it does not yet need —
// unless its receives are posted ahead (ScheduleOptions::post_receives_ahead, off by default): a
// receive listed early is meant to be posted, and blocking there (kRendezvous, kBuffered) stalls
// the rank. The default, kAsync, is what the stage runtime does (Irecv where listed, Isend).
// Makespan is when the last rank finishes; a rank's idle time is the makespan minus its busy
// time, so the idle time before its first and after its last compute counts as bubble.
//
// Failure: both functions validate first and throw the validator's ScheduleError for a schedule
// that is not valid (validator.h) — unless `validated` says the caller has (a schedule of
// MakeSchedule, which validates: at P = 1024, M = 8192 a validation is a second of CPU, and
// `sluice schedule` made three). Thread-safety: pure functions.
//
// Example:
//   Schedule s = MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 8});
//   InFlightPeaks(s)[0].peak;             // 4 = min(P − 0, M)
//   Simulate(s).ranks[0].bubble;          // 3/11 = (P − 1)/(M + P − 1)
#pragma once

#include <vector>

#include "sluice/schedule/schedule.h"

namespace sluice::pipeline {

struct InFlight {
  int peak = 0;                     // max chunk-micro-batches in flight at once (all chunks)
  std::vector<int> peak_per_chunk;  // [V]: the same, counting each chunk alone
  int peak_awaiting_weight = 0;     // max chunk-micro-batches between B and W (0 unless split)
  int peak_until_weight = 0;        // max chunk-micro-batches between F and W: each holds some
                                    // memory (= peak unless split)
};

// One entry per rank.
std::vector<InFlight> InFlightPeaks(const Schedule& schedule, bool validated = false);

struct CostModel {
  double forward = 1;   // F
  double backward = 1;  // B: input gradients
  double weight = 1;    // W: weight gradients (part of B when the backward is not split)
};

enum class CommMode { kRendezvous, kRendezvousPosted, kBuffered, kAsync };

struct ActionTime {
  double start = 0;  // a send: when it is made; a receive: when it is posted
  double end = 0;    // a send: when it is made; a receive: when its message has arrived
};

struct RankTime {
  double busy = 0;                  // sum of compute costs
  double idle = 0;                  // makespan − busy
  double bubble = 0;                // idle / makespan
  std::vector<ActionTime> actions;  // [steps]: parallel to the rank's action list
};

struct Simulation {
  double makespan = 0;
  double bubble = 0;            // Σ idle / (P · makespan)
  std::vector<RankTime> ranks;  // [P]
};

// keep_action_times false leaves every RankTime::actions empty: the figures without 16 bytes per
// action (what `sluice schedule --format json` needs at P = 1024, M = 8192: 50 M actions).
Simulation Simulate(const Schedule& schedule, const CostModel& costs = {},
                    CommMode mode = CommMode::kAsync, bool keep_action_times = true,
                    bool validated = false);

}  // namespace sluice::pipeline
