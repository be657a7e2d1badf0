#include "sluice/train/training_checkpoint.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/io/checkpoint.h"
#include "sluice/nn/optimizer.h"

namespace sluice {

std::map<std::string, std::string> TrainingCheckpointMetadata(const Task& task,
                                                              const TrainConfig& config,
                                                              int64_t step) {
  nlohmann::json description = task.Describe();
  description["optimizer"] = config.optimizer.kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
  return {
      {"format", "sluice-checkpoint-1"},
      {"step", std::to_string(step)},
      {"data_seed", std::to_string(config.seed)},
      {"data_position", std::to_string(step * config.microbatches)},
      {"config", description.dump()},
  };
}

int64_t LoadTrainingCheckpoint(const std::string& path, LoadKind kind,
                               const std::vector<ParamSpec>& params, const TrainConfig& config,
                               Scope& state, Allocator& scratch) {
  const bool resume = kind == LoadKind::kResume;
  // A sharded checkpoint: read only the shards holding this process's state (a stage's own).
  const Checkpoint ckpt =
      LoadCheckpoint(path, scratch, [&](const std::string& name) { return state.Has(name); });

  // Every problem in one message, before anything is copied.
  std::vector<std::string> problems;
  std::vector<std::string> expected;  // what this process holds: every parameter, or one stage's
  for (const ParamSpec& p : params) {
    if (!state.Has(p.name)) continue;
    expected.push_back(p.name);
    if (resume) {
      for (const std::string& s : OptimizerStateNames(p.name, config.optimizer))
        expected.push_back(s);
    }
  }
  const bool whole_model = std::all_of(params.begin(), params.end(),
                                       [&](const ParamSpec& p) { return state.Has(p.name); });
  for (const std::string& name : expected) {
    auto it = ckpt.tensors.find(name);
    const Tensor& current = state.Get(name);
    if (it == ckpt.tensors.end()) {
      problems.push_back(fmt::format("missing tensor '{}' ({}{})", name, Name(current.dtype()),
                                     current.shape().ToString()));
    } else if (it->second.shape() != current.shape() || it->second.dtype() != current.dtype()) {
      problems.push_back(fmt::format("tensor '{}' is {}{} but the model needs {}{}", name,
                                     Name(it->second.dtype()), it->second.shape().ToString(),
                                     Name(current.dtype()), current.shape().ToString()));
    }
  }
  for (const auto& [name, t] : ckpt.tensors) {
    if (whole_model && std::find(expected.begin(), expected.end(), name) == expected.end() &&
        (resume || !ckpt.metadata.count("step"))) {
      problems.push_back(fmt::format("unexpected tensor '{}' (not a {} of this model)", name,
                                     resume ? "parameter or optimizer state" : "parameter"));
    }
  }
  if (!problems.empty()) {
    throw InvalidArgument(fmt::format("cannot load '{}' into this model:\n  {}", ckpt.path,
                                      fmt::join(problems, "\n  ")));
  }
  int64_t step = 0;
  if (resume) {
    step = std::stoll(ckpt.metadata.at("step"));
    if (ckpt.metadata.count("data_seed") &&
        std::stoull(ckpt.metadata.at("data_seed")) != config.seed) {
      throw InvalidArgument(
          fmt::format("checkpoint '{}' was trained with --seed {}; resume with the same seed", path,
                      ckpt.metadata.at("data_seed")));
    }
  }
  for (const std::string& name : expected) state.Get(name).CopyFrom(ckpt.tensors.at(name));
  return step;
}

}  // namespace sluice
