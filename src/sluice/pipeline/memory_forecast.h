// Memory forecast of a pipeline: each rank's peak allocated bytes over a step, predicted before
// the run by replaying the rank's action list (schedule.h) on a symbolic allocator
// (step/memory_replay.h) exactly as StageRuntime executes it — receives allocating their buffer
// when posted, forwards keeping what their backward reads, outputs held until their send has
// completed (output release), input gradients until theirs has, gradients accumulating, the
// optimizer — with the programs' own execution plans.
//
// The one thing a rank's list does not say is *when* a send completes: when its receiver posts
// the matching receive, on another thread. The forecast counts a message as still held by its
// sender until the receive was *certainly* posted — it happens before the sender's current action
// through rank order and messages (a vector clock per action: a compute reading a message runs
// after its send; B(c, m) after the receive of its output was posted, since B waits for that
// send; OPT's all-reduce after every rank's last receive). That is the most any timing can hold:
// the forecast peak. least_peak_allocated_bytes replays the other extreme, every send completing
// at once. A real run lies in between (tests/pipeline/memory_forecast_test.cc): at most one stage
// output apart for gpipe and 1f1b, two for zb-h1, three for zb-h2 and the V-shaped zb-v, v-half
// and v-min (chunk outputs), four chunk outputs for interleaved (V = 2).
//
// Exact where the replay is (trace mode, sync GC — the default on the caching allocator — or gc
// none), an upper bound under async GC or parallel mode (memory_replay.h ReplayFrees); the same
// for in-process threads and MPI ranks, whose per-rank memory does not differ.
//
// Cost: the replay runs every action's programs (docs/simulator.md, "Scale", has the time) and
// the vector clocks take 4·P bytes an action, so a schedule of over kForecastActionLimit actions is
// not forecast: ForecastRefusal says why, ForecastStages throws that as InvalidArgument, and
// every caller (plan, --memory-budget, --schedule auto, simulate, the train summary) either
// reports it or goes without (docs/simulator.md, "Scale").
//
// Thread-safety: a pure function of its arguments. Failure: what LayOutPipeline throws, and the
// refusal above.
//
// Example:
//   std::vector<StageMemoryForecast> f = ForecastPipeline(context, {.stages = 4});
//   f[0].peak_allocated_bytes;  // what stage 0's allocator will peak at, in bytes
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/pipeline/layout.h"
#include "sluice/step/memory_replay.h"

namespace sluice::pipeline {

inline constexpr int64_t kForecastActionLimit = 400'000;

// Why `schedule` is too large to forecast — "memory not forecast: N actions, over the
// forecast's 400000 …" — or nullopt when it can be.
std::optional<std::string> ForecastRefusal(const Schedule& schedule);

// One forecast per stage (rank), for `replicas` data-parallel replicas of the pipeline.
// `explain`: each rank's replay runs once more to list the tensors live at its peak
// (StageMemoryForecast::live_at_peak; memory_replay.h).
std::vector<StageMemoryForecast> ForecastPipeline(const EngineContext& context,
                                                  const PipelineOptions& options, int replicas = 1,
                                                  bool explain = false);
// The same from the setup the ranks are built from (PipelineEngine's); its programs are planned
// as trace mode plans them, its frees follow the config's --gc and --mode.
std::vector<StageMemoryForecast> ForecastStages(const StageSetup& setup, bool explain = false);

}  // namespace sluice::pipeline
