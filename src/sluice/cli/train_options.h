// The options `sluice train`, `sluice plan` and `sluice simulate` share, and what they make of
// them: TrainArgs holds the parsed text, Configure turns it into a TrainConfig and the pipeline's
// options (every bad value an InvalidArgument that says what to change), and MakePlanRequest into
// what the planner (plan/planner.h) decides from; MakeJob (plan/planner.h) builds the job's model
// and data as Trainer would, for a forecast or a simulation before any training.
//
// Thread-safety: called from main only.
//
// Example (what a command's setup does):
//   TrainOptions options = AddTrainOptions(sub, TrainCommand::kNoTraining);
//   return [options] {
//     options.finish();            // once CLI11 has parsed the command line
//     TrainArgs& a = *options.args;
//     Configure(a);
//     Job job = MakeJob(a.config);
//     ...
//   };
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sluice/core/system_memory.h"
#include "sluice/nn/model.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/plan/planner.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice::cli {

struct TrainArgs {
  TrainConfig config;
  std::string optimizer = "adamw";
  std::string lr_schedule = "cosine";  // --lr-schedule: the learning rate's
  std::string gc = "auto";
  std::string memory_plan = "dynamic";
  std::string attention = "fused";
  std::string precision = "fp32";  // --precision: a Precision's name (nn/layers.h)
  std::string mode = "trace";
  std::string recompute = "cheap";  // a policy, or a comma list of one per stage
  bool no_recompute = false;
  bool no_memory_check = false;  // --no-memory-check: skip CheckMemoryFits
  bool quiet = false;
  // Pipeline: used when --stages > 1 or any pipeline option is given.
  bool pipeline = false;
  pipeline::PipelineOptions pipe;
  std::string pipeline_schedule = "1f1b";  // --schedule: a ScheduleKind's name or auto
  std::string partition = "uniform";
  bool release_outputs = true;
  double comm_timeout_s = 60;
  std::string comm = "local";  // local (stages as threads) or mpi (stages as processes)
  int data_parallel = 1;
  std::string fault;            // tests: MODE:STAGE:ACTION:MICRO_BATCH
  double compute_sleep_ms = 0;  // tests: every F, B and W sleeps this long
  // Memory: a budget per stage (step/memory_budget.h) that picks the recompute policies (and, with
  // --schedule auto, the schedule) before training.
  std::string memory_budget;
  bool recompute_given = false;     // --recompute or --no-recompute on the command line
  bool microbatches_given = false;  // --microbatches on the command line
  bool partition_given = false;     // --partition on the command line
  std::string format = "table";     // sluice plan and simulate: table or json
  std::vector<std::string> costs;   // sluice simulate: costs files of --profile-out
  std::string compare;              // sluice simulate: schedules to rank
  int cores = 0;                    // sluice simulate: cores the stage threads share (0: one each)
  int draws = -1;                   // sluice simulate: replays of recorded costs (0: medians;
                                    // -1: kDefaultDraws where the costs recorded steps)
  std::string draw_mode = "computes";  // sluice simulate: computes or steps (pipeline::DrawMode)
};

// The options `sluice train`, `plan` and `simulate` share. `finish`, called once the command line
// is parsed, settles what depends on which options were given.
struct TrainOptions {
  std::shared_ptr<TrainArgs> args;
  std::function<void()> finish;
};

// Which command the options are for: `train` reads them all; a command that trains nothing
// (`plan`, `simulate`, `export`) refuses those only training reads (--save, --metrics, --trace,
// --resume, --inject-fault, ...), naming each, instead of ignoring them.
enum class TrainCommand { kTrain, kNoTraining };

TrainOptions AddTrainOptions(CLI::App& sub, TrainCommand command);

// Reads the textual options into a.config and a.pipe (everything but the memory budget).
void Configure(TrainArgs& a);

// What the planner decides from, for a's job once configured: the config, the pipeline's options,
// auto, the budget per stage. Throws InvalidArgument for --recompute given with --memory-budget
// (both choose the policy) and for a budget ParseMemoryBudget refuses.
PlanRequest MakePlanRequest(const TrainArgs& a);

// For people: the plan as `sluice plan` prints it, and `sluice train` before training under a
// budget or auto (plan_command.cc).
std::string DescribePlan(const PlanChoice& choice, const TrainArgs& a);
// `sluice plan --explain`: per stage, the tensors live at its peak (an explained choice).
std::string DescribeLiveAtPeak(const PlanChoice& choice);
// Under --precision bf16 (the GPT, a --program), the line `train` and `plan` print: the ops of
// `task`'s model that run bf16 and the f32 fallback (Task::PrecisionOps, ir/autocast.h); empty
// when the task names none (fp32).
std::string DescribePrecisionOps(const Task& task);

// The resource check before allocation (`sluice train`, unless --no-memory-check): the forecast
// peak of every stage this process runs (pipeline/memory_forecast.h, what `sluice plan` prints)
// against the memory Linux reports available and the room an address-space limit leaves (core/
// system_memory.h). Throws ResourceError when the peak exceeds either — a run certain to fail in
// the allocator, perhaps after minutes — naming the sizes and the options that make most of it.
// Call after Configure, with a.config's recompute policies and a.pipe's schedule final.
// `forecast`: the job's per-stage forecasts when already made (the plan of --memory-budget or
// --schedule auto); empty: made here.
void CheckMemoryFits(const TrainArgs& a, std::vector<StageMemoryForecast> forecast = {});

// What keeps `bytes` of tensor memory from fitting, in words: "this machine has 18.3 GiB available
// (MemAvailable)" and/or "the address-space limit (ulimit -v, 4.00 GiB) leaves 3.21 GiB"; "" when
// they fit or the system says nothing. CheckMemoryFits and `sluice run`'s check share it.
std::string MemoryShortfall(const SystemMemory& system, int64_t bytes);

}  // namespace sluice::cli
