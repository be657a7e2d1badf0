#include "sluice/pipeline/layout.h"

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/nn/training_program.h"

namespace sluice::pipeline {

ScheduleOptions ScheduleOptionsOf(const PipelineOptions& options, int64_t micro_batches) {
  return {.kind = options.schedule,
          .stages = options.stages,
          .micro_batches = static_cast<int>(micro_batches),
          .chunks = options.chunks,
          .post_receives_ahead = options.post_receives_ahead};
}

PipelineLayout LayOutPipeline(const EngineContext& ctx, const PipelineOptions& options,
                              int replicas) {
  const TrainConfig& config = ctx.config;
  const int64_t micro_batch_size = config.batch / config.microbatches;
  if (micro_batch_size % replicas != 0) {
    throw InvalidArgument(fmt::format(
        "--data-parallel {} must divide the {} sequences of a micro-batch (--batch {} / "
        "--microbatches {})",
        replicas, micro_batch_size, config.batch, config.microbatches));
  }
  PipelineLayout out;
  StageSetup& setup = out.setup;
  setup.config = &config;
  setup.task = &ctx.task;
  setup.micro_batch_size = micro_batch_size / replicas;
  setup.replicas = replicas;  // the engine adds its replica and the data communicator
  setup.units = ctx.task.Units(setup.micro_batch_size);
  setup.seq_len = ctx.task.seq_len();
  setup.schedule = MakeSchedule(ScheduleOptionsOf(options, config.microbatches));
  const int S = setup.schedule.virtual_stages();
  const Placement placement = setup.schedule.v_shape ? Placement::kVShape : Placement::kLooped;
  out.partition = options.layout.empty()
                      ? PartitionUnits(setup.units, S, options.partition, placement)
                      : ParseLayout(options.layout, setup.units, S, placement);
  out.layout = FormatLayout(out.partition, setup.units.names);
  setup.slices = out.partition.stages;
  for (const ParamSpec& p : ctx.model.params) setup.model_params.push_back(p.name);
  setup.tied = TiedParams(ctx.model.forward);
  setup.release_outputs = options.release_outputs;
  setup.post_validate = options.post_validate;
  setup.fault = options.fault;
  return out;
}

}  // namespace sluice::pipeline
