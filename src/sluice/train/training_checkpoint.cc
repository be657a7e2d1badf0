#include "sluice/train/training_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/core/json_text.h"
#include "sluice/io/checkpoint.h"
#include "sluice/nn/optimizer.h"
#include "sluice/step/stage_program.h"

namespace sluice {

namespace {

// `text` as a JSON object (within ParseJsonText's bound on nesting); nullopt for anything else.
std::optional<nlohmann::json> JsonObject(const std::string& text) {
  try {
    nlohmann::json j = ParseJsonText(text);
    if (j.is_object()) return j;
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

// The "config" metadata: the task's description and the optimizer.
nlohmann::json DescribeRun(const Task& task, const TrainConfig& config) {
  nlohmann::json description = task.Describe();
  description["optimizer"] = config.optimizer.kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
  return description;
}

// The "training" metadata: the hyperparameters a resumed run must keep to give the losses an
// uninterrupted run would have, under the names of their options. --steps, --microbatches,
// --skip-nonfinite and the evaluation may change (docs/errors.md says why).
nlohmann::json DescribeTraining(const TrainConfig& config) {
  const OptimizerConfig& o = config.optimizer;
  nlohmann::json t = {{"batch", config.batch},
                      {"lr", o.lr},
                      {"lr-schedule", std::string(Name(o.schedule))},
                      {"warmup", o.warmup_steps},
                      {"min-lr", o.min_lr},
                      {"weight-decay", o.weight_decay},
                      {"clip", o.clip_norm}};
  if (o.kind == OptimizerKind::kAdamW) {
    t["beta1"] = o.beta1;
    t["beta2"] = o.beta2;
  } else {
    t["momentum"] = o.momentum;
  }
  return t;
}

// A key of the checkpoint's config whose value differs from this run's, as people read it:
// "--layers 4 (this run: 6)".
struct ConfigDifference {
  std::string key;
  std::string text;
};

// Every difference of the JSON object in metadata `key` ("config", "training"); nothing when the
// checkpoint has no such key or it is not a JSON object.
std::vector<ConfigDifference> ConfigDifferences(const std::map<std::string, std::string>& metadata,
                                                const std::string& key,
                                                const nlohmann::json& ours) {
  std::vector<ConfigDifference> differences;
  auto it = metadata.find(key);
  if (it == metadata.end()) return differences;
  const std::optional<nlohmann::json> theirs = JsonObject(it->second);
  if (!theirs) return differences;
  auto text = [](const nlohmann::json& v) {
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  for (const auto& [key, value] : theirs->items()) {
    if (ours.contains(key) && ours[key] != value) {
      differences.push_back(
          {key, fmt::format("--{} {} (this run: {})", key, text(value), text(ours[key]))});
    }
  }
  return differences;
}

std::string Texts(const std::vector<ConfigDifference>& differences) {
  std::vector<std::string> texts;
  for (const ConfigDifference& d : differences) texts.push_back(d.text);
  return fmt::format("{}", fmt::join(texts, ", "));
}

}  // namespace

std::map<std::string, std::string> TrainingCheckpointMetadata(const Task& task,
                                                              const TrainConfig& config,
                                                              int64_t step, int64_t data_position) {
  const nlohmann::json description = DescribeRun(task, config);
  return {
      {"format", kTrainingCheckpointFormat},
      {"step", std::to_string(step)},
      {"data_seed", std::to_string(config.seed)},
      {"data_position", std::to_string(data_position)},
      {"config", description.dump()},
      {"training", DescribeTraining(config).dump()},
  };
}

namespace {

// The whole of `text` as a number of type T (no sign for unsigned, no spaces, nothing after it).
template <typename T>
T ParseMetadataNumber(const std::string& path, const std::string& key, const std::string& text,
                      const char* allowed) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw IoError(fmt::format("checkpoint '{}': metadata \"{}\" is \"{}\", not {}", path, key, text,
                              allowed));
  }
  return value;
}

}  // namespace

TrainingCheckpointInfo ParseTrainingCheckpointMetadata(
    const std::string& path, const std::map<std::string, std::string>& metadata) {
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = metadata.find(key);
    if (it == metadata.end()) {
      throw IoError(fmt::format(
          "checkpoint '{}' has no metadata \"{}\": it was not written by sluice train (load "
          "weights alone with --init-from)",
          path, key));
    }
    return it->second;
  };
  if (const std::string& format = get("format"); format != kTrainingCheckpointFormat) {
    throw IoError(
        fmt::format("checkpoint '{}': metadata \"format\" is \"{}\"; this sluice reads \"{}\"",
                    path, format, kTrainingCheckpointFormat));
  }
  TrainingCheckpointInfo info;
  info.step = ParseMetadataNumber<int64_t>(path, "step", get("step"), "a step count (0 or more)");
  if (info.step < 0) {
    throw IoError(
        fmt::format("checkpoint '{}': metadata \"step\" is {}, not 0 or more", path, info.step));
  }
  info.data_seed =
      ParseMetadataNumber<uint64_t>(path, "data_seed", get("data_seed"), "a seed (0 or more)");
  info.data_position = ParseMetadataNumber<int64_t>(path, "data_position", get("data_position"),
                                                    "a batch count (0 or more)");
  if (info.data_position < 0) {
    throw IoError(fmt::format("checkpoint '{}': metadata \"data_position\" is {}, not 0 or more",
                              path, info.data_position));
  }
  const std::string& config = get("config");
  if (!JsonObject(config)) {
    throw IoError(fmt::format("checkpoint '{}': metadata \"config\" is not a JSON object", path));
  }
  return info;
}

TrainingCheckpointInfo LoadTrainingCheckpoint(const std::string& path, LoadKind kind,
                                              const Task& task,
                                              const std::vector<ParamSpec>& params,
                                              const TrainConfig& config, Scope& state,
                                              Allocator& scratch, OptimizerStateSlice slice) {
  const bool resume = kind == LoadKind::kResume;
  // A sharded checkpoint: read only the shards holding this process's state (a stage's own).
  const Checkpoint ckpt =
      LoadCheckpoint(path, scratch, [&](const std::string& name) { return state.Has(name); });

  // Every problem in one message, before anything is copied.
  std::vector<std::string> problems;
  std::vector<std::string> expected;  // what this process holds: every parameter, or one stage's
  // A sharded optimizer's state tensors: the whole shape the checkpoint holds, and this replica's
  // elements of it (the rest of `expected` is copied whole).
  struct Sliced {
    Shape whole;
    ShardRange range;
  };
  std::map<std::string, Sliced> sliced;
  for (const ParamSpec& p : params) {
    if (!state.Has(p.name)) continue;
    expected.push_back(p.name);
    if (!resume) continue;
    for (const std::string& s : OptimizerStateNames(p, config.optimizer)) {
      expected.push_back(s);
      if (slice.shards > 1) {
        sliced[s] = {.whole = p.shape,
                     .range = OptimizerShard(p.shape.numel(), slice.shard, slice.shards)};
      }
    }
  }
  const bool whole_model = std::all_of(params.begin(), params.end(),
                                       [&](const ParamSpec& p) { return state.Has(p.name); });
  for (const std::string& name : expected) {
    auto it = ckpt.tensors.find(name);
    const Tensor& current = state.Get(name);
    auto s = sliced.find(name);
    const Shape& needed = s == sliced.end() ? current.shape() : s->second.whole;
    if (it == ckpt.tensors.end()) {
      problems.push_back(fmt::format("missing tensor '{}' ({}{})", name, Name(current.dtype()),
                                     needed.ToString()));
    } else if (it->second.shape() != needed || it->second.dtype() != current.dtype()) {
      problems.push_back(fmt::format("tensor '{}' is {}{} but the model needs {}{}", name,
                                     Name(it->second.dtype()), it->second.shape().ToString(),
                                     Name(current.dtype()), needed.ToString()));
    }
  }
  // Optimizer state that an earlier sluice kept for a parameter the loss does not depend on
  // (nn/training_program.h), which training now leaves alone: ignored, with a warning.
  std::set<std::string> stale;
  for (const ParamSpec& p : params) {
    if (!p.constant || !state.Has(p.name)) continue;
    for (const std::string& s : OptimizerStateNames(p.name, config.optimizer)) stale.insert(s);
  }
  std::vector<std::string> ignored;
  for (const auto& [name, t] : ckpt.tensors) {
    if (resume && stale.count(name)) {
      ignored.push_back(name);
      continue;
    }
    if (whole_model && std::find(expected.begin(), expected.end(), name) == expected.end() &&
        (resume || !ckpt.metadata.count("step"))) {
      problems.push_back(fmt::format("unexpected tensor '{}' (not a {} of this model)", name,
                                     resume ? "parameter or optimizer state" : "parameter"));
    }
  }
  const std::vector<ConfigDifference> differences =
      ConfigDifferences(ckpt.metadata, "config", DescribeRun(task, config));
  if (!problems.empty()) {
    // A model of another size misses every tensor of a layer: name the sizes, then a few tensors.
    const std::string written_by = differences.empty()
                                       ? std::string()
                                       : fmt::format(" it was written with {}", Texts(differences));
    constexpr size_t kListed = 12;
    const size_t more = problems.size() > kListed ? problems.size() - kListed : 0;
    problems.resize(problems.size() - more);
    if (more > 0) problems.push_back(fmt::format("… and {} more", more));
    throw InvalidArgument(fmt::format("cannot load '{}' into this model:{}\n  {}", ckpt.path,
                                      written_by, fmt::join(problems, "\n  ")));
  }
  TrainingCheckpointInfo info;
  if (resume) {
    info = ParseTrainingCheckpointMetadata(ckpt.path, ckpt.metadata);
    if (!ignored.empty()) {
      info.warnings.push_back(fmt::format(
          "checkpoint '{}' holds optimizer state of parameters the loss does not depend on, "
          "which training leaves alone: {} ignored",
          path, fmt::join(ignored, ", ")));
    }
    const int64_t step = info.step;
    // Resuming continues the checkpoint's run: another model whose tensors happen to fit (--heads
    // 8 against 4) is refused; other data is allowed, with a warning.
    std::vector<ConfigDifference> model_differences;
    for (const ConfigDifference& d : differences) {
      if (d.key == "program_digest") {
        // The program file was edited since: another computation, so not the run continued
        // bitwise; refused like a changed hyperparameter, unless --allow-changes.
        const std::string what = fmt::format(
            "checkpoint '{}' was trained with another text of {} (the file changed since it was "
            "saved)",
            path, config.program);
        if (!config.allow_changes) {
          throw InvalidArgument(fmt::format(
              "{}: --resume continues the run bitwise, so restore the program it was trained "
              "with, or add --allow-changes to go on with the file as it is now (or start a new "
              "run from its weights with --init-from)",
              what));
        }
        info.warnings.push_back(
            fmt::format("{}; training goes on with the file as it is now (--allow-changes)", what));
      } else if (d.key == "data") {
        info.warnings.push_back(
            fmt::format("checkpoint '{}' was trained with {}; training goes on with this run's "
                        "data",
                        path, d.text));
      } else {
        model_differences.push_back(d);
      }
    }
    if (!model_differences.empty()) {
      throw InvalidArgument(fmt::format(
          "checkpoint '{}' was written with {}: --resume continues the same run, so give the "
          "checkpoint's options (or start a new run from its weights with --init-from)",
          path, Texts(model_differences)));
    }
    // Changed hyperparameters give other losses than the run being continued: refused, each named
    // with its two values, unless --allow-changes (then each is a warning). A checkpoint written
    // before sluice recorded them ("training" absent) is not checked.
    const std::vector<ConfigDifference> changes =
        ConfigDifferences(ckpt.metadata, "training", DescribeTraining(config));
    if (!changes.empty() && !config.allow_changes) {
      throw InvalidArgument(fmt::format(
          "checkpoint '{}' was trained with {}: --resume continues the run bitwise, so give the "
          "checkpoint's values, or add --allow-changes to go on with this run's",
          path, Texts(changes)));
    }
    for (const ConfigDifference& d : changes) {
      info.warnings.push_back(fmt::format(
          "checkpoint '{}' was trained with {}; training goes on with this run's (--allow-changes)",
          path, d.text));
    }
    if (info.data_seed != config.seed) {
      throw InvalidArgument(fmt::format(
          "checkpoint '{}' was trained with --seed {}; resume with the same seed, not {}", path,
          info.data_seed, config.seed));
    }
    if (step >= config.steps) {
      throw InvalidArgument(fmt::format(
          "checkpoint '{}' is at step {}, at or past --steps {}: nothing is left to train; give "
          "--steps above {}",
          path, step, config.steps, step));
    }
  }
  for (const std::string& name : expected) {
    const Tensor& source = ckpt.tensors.at(name);
    auto s = sliced.find(name);
    if (s == sliced.end()) {
      state.Get(name).CopyFrom(source);
    } else {
      const ShardRange& r = s->second.range;
      state.Get(name).CopyFrom(source.Reshape({source.numel()}).Slice(0, r.begin, r.end));
    }
  }
  return info;
}

}  // namespace sluice
