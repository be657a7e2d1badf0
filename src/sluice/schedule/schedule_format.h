// How a schedule (schedule.h) looks to a person and to a program: the action grid `sluice
// schedule` prints, and JSON.
//
// Table: one row per rank, one column per time step of a unit-cost run (every F, B and W takes
// one step, the unsplit backward too; messages are free and receives posted ahead: Simulate with
// CommMode::kAsync, schedule_analysis.h), so a column holds what runs at the same time and the
// shape and bubbles of the compute order are visible. Cells use the grid glossary of
// schedule.h: "F3" forward of micro-batch 3, "B3" its backward, "W3" its weight gradients under a
// split backward, "F1.3" chunk 1 of micro-batch 3 when interleaved, "." idle. Sends and receives
// are not drawn (they take no time); the JSON lists them. Below the grid, per rank: peak
// micro-batches in flight (F run, B not: chunk-micro-batches when interleaved), peak awaiting W
// (split backward only) and the bubble fraction of that unit-cost run.
//
//   1f1b (P=2, M=3): 8 steps at unit cost (F = B = 1, messages free)
//   step    0  1  2  3  4  5  6  7
//   rank 0  F0 F1 .  B0 F2 B1 .  B2
//   rank 1  .  F0 B0 F1 B1 F2 B2 .
//
// JSON (keys in this order): {"schedule", "stages", "micro_batches", "chunks", "split_backward",
// "bubble", "ranks": [{"rank", "in_flight_peak", "awaiting_weight_peak", "bubble",
// "actions": [{"op": "F", "chunk": 0, "mb": 0}, {"op": "SEND_F", "chunk": 0, "mb": 0,
// "peer": 1}, …, {"op": "OPT"}]}]} — every action in execution order, the IR itself.
//
// Failure: both validate first and throw ScheduleError for an invalid schedule.
// Thread-safety: pure functions.
//
// Example:
//   fmt::print("{}", FormatScheduleTable(MakeSchedule({.stages = 4, .micro_batches = 8})));
//   fmt::print("{}\n", ScheduleToJson(schedule).dump(2));
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/schedule/schedule.h"
#include "sluice/schedule/steady_state.h"

namespace sluice::pipeline {

std::string FormatScheduleTable(const Schedule& schedule);
// The same, written to `out` one row at a time (the unit-cost run keeps every action's time:
// 16 bytes an action). Both writers validate the schedule once (ScheduleError) unless
// `validated` says the caller has (MakeSchedule validates).
void WriteScheduleTable(const Schedule& schedule, std::ostream& out, bool validated = false);

nlohmann::ordered_json ScheduleToJson(const Schedule& schedule);
// Post-validation (`sluice schedule --post-validate`, steady_state.h): the steady state of the
// schedule's steps interlocked at the grid's unit costs; the lines printed below the grid; and
// the object the JSON then holds as "post_validation" after "bubble": {"steady_state_bubble",
// "steady_state_step", "synchronous_step", "synchronous_bubble", "fill", "drain"} (unit steps).
SteadyState GridSteadyState(const Schedule& schedule);
std::string FormatSteadyState(const SteadyState& steady);
nlohmann::ordered_json SteadyStateJson(const SteadyState& steady);
// ScheduleToJson(schedule).dump(), written to `out` one rank at a time without a JSON tree:
// beyond the schedule it holds one rank's text and O(P + V·M) figures, so P = 1024, M = 8192
// (50 M actions, 2 GB of JSON) streams out in the memory of its action lists.
// `steady`: adds its "post_validation" object (SteadyStateJson).
void WriteScheduleJson(const Schedule& schedule, std::ostream& out, bool validated = false,
                       const SteadyState* steady = nullptr);

}  // namespace sluice::pipeline
