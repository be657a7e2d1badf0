// The planner: what `sluice plan` prints and what `--memory-budget` and `--schedule auto` train
// with, decided before any step — the recompute policy of every stage and (under auto) the
// pipeline schedule, from the memory forecasts of the job (step/memory_replay.h for one stage,
// pipeline/memory_forecast.h for a pipeline) and the unit-cost simulation of each schedule
// (schedule/schedule_analysis.h). The CLI parses the options into a PlanRequest, calls ChoosePlan
// and prints the PlanChoice; nothing here reads a command line.
//
// The choice:
//   - no budget: the request's own recompute list, every stage's forecast, fits;
//   - a budget (one size per stage): per stage, the recompute policy with the least estimated
//     extra work whose forecast fits (step/memory_budget.h PlanForBudget);
//   - `automatic` (--schedule auto): every schedule kind is planned so; a kind the job cannot run
//     (too few micro-batches, layers or a forecast too large) is skipped, and among the kinds that
//     fit the one with the least estimated step time wins — its unit-cost makespan per chunk
//     times 1 + the largest stage's extra work (ties: the first in kScheduleKindNames). With
//     pipe.post_validate, auto takes it as allowed, not required: each kind is planned with and
//     without post-validation, and keeps it only where its forecast (the rollback copy and the
//     interlock's gradients counted) fits and its steady-state step is strictly shorter than the
//     synchronous one at unit cost (zb-h2, zb-v; not 1f1b, whose steady state is its step);
//     PlanChoice::post_validate says which. Auto never turns post-validation on unasked: unit
//     costs do not know the time keeping the rollback state adds to each step, nor how often
//     clipping fires (a rollback costs a step more) — docs/pipeline.md, "Post-validation".
// When nothing fits, the error names each stage's smallest achievable peak — under auto, of the
// schedule that comes closest (the least overshoot of its worst stage), named too.
//
// The forecasts follow the request's --gc and --mode (ReplayFreesFor): exact in trace mode with
// sync GC (the default, auto, on the caching allocator) and with gc none; an upper bound (every
// run's values held to its end) under async GC or parallel mode, where thread timing decides.
//
// The forecasts count the scratch of the oneDNN products and convolutions the run takes, which
// oneDNN sizes for the threads each call runs on (kernels/onednn_runtime.h): ForecastJob first
// sets the process's oneDNN thread count to the run's (step/stage_program.h ShareForecastThreads:
// the request's --threads shared by the stages on threads, all of them in a process per stage).
//
// Thread-safety: functions of their arguments, but for that setting of the process's oneDNN
// thread count (call them before a run, not beside one). Failure: InvalidArgument naming the option
// and the place (what MakeJob, LayOutPipeline, MakeSchedule and the forecast throw, or the
// budget no plan meets).
//
// Example:
//   PlanRequest r{.config = config, .pipeline = true, .pipe = {.stages = 4}, .automatic = true,
//                 .budget = ParseMemoryBudget("6MiB", 4), .budget_text = "6MiB"};
//   PlanChoice c = ChoosePlan(r);
//   c.schedule;              // the fastest kind whose every stage fits 6 MiB
//   c.plan.Policies();       // the recompute list to train with
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/nn/model.h"
#include "sluice/pipeline/layout.h"
#include "sluice/schedule/schedules.h"
#include "sluice/step/memory_budget.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice {

// The model and data of a job, built as Trainer builds them, for forecasting before training.
struct Job {
  std::unique_ptr<Task> task;
  Model model;  // the micro-batch's
};

// Validates the config (ValidateTrainConfig) and builds the job's task and model.
Job MakeJob(const TrainConfig& config);

// What to plan: the job and how it would train.
struct PlanRequest {
  TrainConfig config;              // its recompute list is the plan's when no budget is given
  bool pipeline = false;           // false: one stage (SingleStageEngine)
  pipeline::PipelineOptions pipe;  // with a pipeline: stages, schedule, chunks, partition, layout
  int data_parallel = 1;           // D replicas of the pipeline
  bool stage_processes = false;    // a process per stage (--comm mpi), not a thread per stage
  bool automatic = false;          // --schedule auto: choose the kind too (pipe.schedule ignored)
  std::vector<int64_t> budget;     // bytes per stage (ParseMemoryBudget); empty: no budget
  std::string budget_text;         // the budget as given, for messages ("6MiB")
  bool explain = false;  // list each stage's tensors live at its peak (--explain; live_at_peak)
};

// The decision: the schedule, and per stage the policy and its forecast.
struct PlanChoice {
  bool pipeline = false;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kOneFOneB;
  double bubble = 0;     // the schedule's at unit cost (Simulate); 0 on one stage. With
                         // pipe.post_validate, its interlocked steps' steady state's
                         // (schedule/steady_state.h), and step_time that state's period
  double step_time = 1;  // estimated: unit-cost makespan per chunk × (1 + largest extra work)
  bool post_validate = false;   // the plan's steps are post-validated (interlocked)
  std::vector<int64_t> budget;  // per stage; empty: none given
  MemoryPlan plan;
};

// Every stage's forecast of `job` for `config` (its recompute list included) under schedule
// `kind` — one stage without a pipeline — with the frees of the config's --gc and --mode;
// `explain`: with each stage's live_at_peak.
std::vector<StageMemoryForecast> ForecastJob(const PlanRequest& request, const Job& job,
                                             const TrainConfig& config, pipeline::ScheduleKind kind,
                                             bool explain = false);

// The plan for the request (see the top of this file); under request.explain the chosen plan's
// forecasts list the tensors live at each stage's peak (one more replay of the chosen plan, after
// the choice). Throws InvalidArgument when nothing fits,
// naming each stage's smallest achievable peak, or under auto when no schedule can run the job,
// naming why each was skipped.
PlanChoice ChoosePlan(const PlanRequest& request);

}  // namespace sluice
