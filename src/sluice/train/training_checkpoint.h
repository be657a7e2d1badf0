// Training checkpoints: what `sluice train --save` writes and what `--resume` and `--init-from`
// read — both directions in this one file, so the metadata written is the metadata read.
//
// A checkpoint (io/checkpoint.h: one safetensors file, or a shard per stage and an index) holds
// every parameter and its optimizer state by name, and the metadata
//   format         "sluice-checkpoint-1"
//   step           optimizer steps taken (the next step to run, 0-based)
//   data_seed      --seed: batches are a pure function of it, so a resume must use the same
//   data_position  micro-batches consumed (step · M)
//   config         the task's description (model, sizes, data) and the optimizer
// The engine writes the files (StepEngine::SaveCheckpoint: a distributed engine writes shards);
// LoadTrainingCheckpoint reads either layout, and a process reads only the shards holding its own
// tensors, so checkpoints move freely between single-stage, pipelined and MPI runs.
//
// Failure: IoError for an unreadable file or metadata that is missing or malformed (every key above
// is read strictly: "2 apples" is not a step); InvalidArgument listing every missing, unexpected or
// mis-shaped tensor at once (the first 12, and how many more), naming the --seed to resume with, or
// a checkpoint at or past --steps.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/exec/scope.h"
#include "sluice/nn/model.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice {

inline constexpr const char* kTrainingCheckpointFormat = "sluice-checkpoint-1";

std::map<std::string, std::string> TrainingCheckpointMetadata(const Task& task,
                                                              const TrainConfig& config,
                                                              int64_t step);

// The metadata of a training checkpoint, parsed strictly (IoError naming `path`, the key, its text
// and what it must be).
struct TrainingCheckpointInfo {
  int64_t step = 0;
  uint64_t data_seed = 0;
  int64_t data_position = 0;
};
TrainingCheckpointInfo ParseTrainingCheckpointMetadata(
    const std::string& path, const std::map<std::string, std::string>& metadata);

enum class LoadKind {
  kResume,    // parameters and optimizer state; continue at the checkpoint's step
  kInitFrom,  // parameters only; start at step 0
};

// Copies the checkpoint at `path` into `state` in place: the tensors of `params` (the whole
// model's) that `state` holds, with their optimizer state when resuming. Checks everything first
// and changes nothing when a check fails. Returns the step to continue from (0 for kInitFrom).
// When tensors are missing or mis-shaped, the message leads with the options of the checkpoint's
// run that differ from this one's (its "config" beside `task`'s: "--layers 4 (this run: 6)") and
// lists the first tensors, then how many more.
int64_t LoadTrainingCheckpoint(const std::string& path, LoadKind kind, const Task& task,
                               const std::vector<ParamSpec>& params, const TrainConfig& config,
                               Scope& state, Allocator& scratch);

}  // namespace sluice
