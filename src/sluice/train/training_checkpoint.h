// Training checkpoints: what `sluice train --save` writes and what `--resume` and `--init-from`
// read — both directions in this one file, so the metadata written is the metadata read.
//
// A checkpoint (io/checkpoint.h: one safetensors file, or a shard per stage and an index) holds
// every parameter and its optimizer state by name, and the metadata
//   format         "sluice-checkpoint-1"
//   step           optimizer steps taken (the next step to run, 0-based)
//   data_seed      --seed: batches are a pure function of it, so a resume must use the same
//   data_position  training batches consumed: the next step's first batch index (step · M when
//                  the whole run used one M; a resumed run continues from it, so changing
//                  --microbatches on resume neither repeats nor skips data)
//   config         the task's description (model, sizes, data) and the optimizer
//   training       the hyperparameters, by option name: batch, lr, lr-schedule, warmup, min-lr,
//                  weight-decay, clip, and beta1 and beta2 (AdamW) or momentum (SGD); a resume
//                  that changes one is refused, or with TrainConfig::allow_changes warned about
//                  (absent from checkpoints of older versions, which are not checked)
// The engine writes the files (StepEngine::SaveCheckpoint: a distributed engine writes shards);
// LoadTrainingCheckpoint reads either layout, and a process reads only the shards holding its own
// tensors, so checkpoints move freely between single-stage, pipelined and MPI runs.
//
// Failure: IoError for an unreadable file or metadata that is missing or malformed (every key above
// is read strictly: "2 apples" is not a step); InvalidArgument listing every missing, unexpected or
// mis-shaped tensor at once (the first 12, and how many more), naming the --seed to resume with, or
// a checkpoint at or past --steps, or — on resume — a checkpoint of a model that differs from this
// run's in anything but its data (--heads 4 against 8 loads but is another model), or whose
// hyperparameters differ ("--lr 0.003 (this run: 0.01)") unless config.allow_changes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/exec/scope.h"
#include "sluice/nn/model.h"
#include "sluice/step/step_engine.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice {

inline constexpr const char* kTrainingCheckpointFormat = "sluice-checkpoint-1";

std::map<std::string, std::string> TrainingCheckpointMetadata(const Task& task,
                                                              const TrainConfig& config,
                                                              int64_t step, int64_t data_position);

// The metadata of a training checkpoint, parsed strictly (IoError naming `path`, the key, its text
// and what it must be).
struct TrainingCheckpointInfo {
  int64_t step = 0;
  uint64_t data_seed = 0;
  int64_t data_position = 0;
  // What a resumed run was told but may go on with (LoadTrainingCheckpoint): the checkpoint was
  // trained on other data ("--data a.txt (this run: b.txt)"). Empty after parsing alone.
  std::vector<std::string> warnings;
};
TrainingCheckpointInfo ParseTrainingCheckpointMetadata(
    const std::string& path, const std::map<std::string, std::string>& metadata);

enum class LoadKind {
  kResume,    // parameters and optimizer state; continue at the checkpoint's step
  kInitFrom,  // parameters only; start at step 0
};

// Copies the checkpoint at `path` into `state` in place: the tensors of `params` (the whole
// model's) that `state` holds, with their optimizer state when resuming. Checks everything first
// and changes nothing when a check fails. Returns where to continue: the checkpoint's step, data
// position and warnings for kResume; all zero and empty for kInitFrom.
// With a sharded optimizer (`slice`, StepEngine::optimizer_state_slice: {0, 1} when whole), the
// optimizer-state tensors of `state` are this replica's 1-D slices: each is checked against the
// checkpoint's whole tensor (the parameter's shape, as every save writes it) and its slice copied,
// so a checkpoint resumes on any D, sharded or not, whatever run wrote it.
// When tensors are missing or mis-shaped, the message leads with the options of the checkpoint's
// run that differ from this one's (its "config" beside `task`'s: "--layers 4 (this run: 6)") and
// lists the first tensors, then how many more.
TrainingCheckpointInfo LoadTrainingCheckpoint(const std::string& path, LoadKind kind,
                                              const Task& task,
                                              const std::vector<ParamSpec>& params,
                                              const TrainConfig& config, Scope& state,
                                              Allocator& scratch, OptimizerStateSlice slice = {});

}  // namespace sluice
