// The layout of a pipeline: the options of `sluice train --stages P` (PipelineOptions) and what
// they lay out — the schedule, the partition of the model's units into virtual stages and the
// setup every rank is built from (LayOutPipeline). Both the engine (pipeline_engine.h) and the
// memory forecast (memory_forecast.h) start from it, so neither includes the other.
//
// Thread-safety: plain values and a pure function.
//
// Example:
//   PipelineLayout l = LayOutPipeline(context, {.stages = 4}, /*replicas=*/1);
//   l.setup.schedule.stages;  // 4; l.layout names each stage's units ("embed,h.0|h.1|...")
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "sluice/comm/communicator.h"
#include "sluice/pipeline/partition.h"
#include "sluice/pipeline/stage_runtime.h"
#include "sluice/schedule/schedules.h"
#include "sluice/step/step_engine.h"

namespace sluice::pipeline {

struct PipelineOptions {
  int stages = 1;  // P
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int chunks = 0;  // V; 0: the schedule's default
  PartitionKind partition = PartitionKind::kUniform;
  std::string layout;  // explicit layout (partition.h syntax); overrides `partition`
  bool release_outputs = true;
  // ScheduleOptions::post_receives_ahead (schedules.h): each RECV listed right after the rank's
  // previous message, for sends that block until their receive is posted. Off by default: this
  // runtime's sends never block, so it only holds receive buffers longer (docs/pipeline.md).
  bool post_receives_ahead = false;
  // `--post-validate`: optimizer post-validation (StageSetup::post_validate, docs/pipeline.md).
  bool post_validate = false;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);  // a receive waiting longer fails
  std::string trace_path;  // Chrome trace of the last step; empty: none
  // Costs of every step but the first (warm-up) as JSON (step_simulator.h), written after the
  // last step; empty: none. In-process ranks only.
  std::string profile_path;
  FaultInjection fault;  // tests only

  // Distributed (MPI, docs/mpi.md): this process runs one rank. World rank w is stage w mod P of
  // replica w div P; `pipe` joins the P stages of this replica (rank = stage), `data` the D
  // replicas of this stage (rank = replica; null when D = 1), `world` all P·D processes (rank 0
  // leads: metrics, evaluation, checkpoint index). The communicators outlive the engine.
  struct Distributed {
    Communicator* world = nullptr;
    Communicator* pipe = nullptr;
    Communicator* data = nullptr;
    int replicas = 1;  // D
  };
  std::optional<Distributed> distributed;  // empty: every rank on a thread of this process
};

// The schedule the options run with M micro-batches a step: kind, P, M, V (0: the kind's
// default) and where receives are listed — the one translation of PipelineOptions into
// ScheduleOptions (schedules.h), for the layout, the engine's reports and the planner.
ScheduleOptions ScheduleOptionsOf(const PipelineOptions& options, int64_t micro_batches);

// How `sluice train --stages P` lays the model out: the schedule, the partition and what every
// rank is built from (threads, replica and communicators left for the engine to fill). The one
// source of the engine and of the memory forecast (memory_forecast.h). A parameter read by units of
// several ranks (a tied weight) is held by each of them (StageSetup::tied). Throws InvalidArgument
// for a model without units, `replicas` not dividing a micro-batch, and what MakeSchedule, the
// partitioner and Task::BuildPiece throw.
struct PipelineLayout {
  StageSetup setup;
  Partition partition;
  std::string layout;  // FormatLayout(partition, unit names): "embed,h.0-1|h.2-3,head"
};
PipelineLayout LayOutPipeline(const EngineContext& context, const PipelineOptions& options,
                              int replicas);

}  // namespace sluice::pipeline
