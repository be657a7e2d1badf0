// Task: what differs between the models `sluice train` trains — how the model is built, how a
// batch is bound into a scope, and how accuracy is measured — behind one interface, so the
// trainer and the step engines (step/step_engine.h) need not know which model they run.
//
//   gpt      a GPT (nn/gpt.h) on sort, a text or .bin token file: inputs "ids", "targets" [B, T]
//   mlp      an MLP classifier (nn/mlp.h) on Gaussian blobs: inputs "x" [B, F], "labels" [B]
//   program  a training program of the user's (step/program_task.h) on the data its inputs bind
// Every task also says where a pipeline may cut its model (Units) and builds each piece
// (BuildPiece), so the pipeline never asks which model it runs.
//
// Batches are a pure function of (split, index, batch size, seed) (nn/data.h), so any stage or
// rank can bind the same batch independently, and a resumed run replays the same batches.
//
// Thread-safety: const methods are safe to call concurrently (BindBatch included).
// Failure modes: MakeTask throws InvalidArgument or IoError for a configuration or data file that
// cannot be used, naming the option to change.
//
// Example:
//   std::unique_ptr<Task> task = MakeTask(config);
//   Model m = task->BuildTrain(/*batch=*/8);
//   Scope scope;
//   task->BindBatch(scope, DataSplit::kTrain, /*index=*/0, /*batch=*/8, config.seed);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/exec/interpreter.h"
#include "sluice/exec/scope.h"
#include "sluice/nn/data.h"
#include "sluice/nn/gpt.h"
#include "sluice/nn/model.h"
#include "sluice/nn/training_program.h"

namespace sluice {

struct TrainConfig;

// What a step's throughput counts per example of a batch: a language model's T tokens, or the one
// example itself (a classifier on arrays, the MLP). `unit` names it in the progress lines, the
// metrics ("<unit>_per_s") and the report: "tokens" or "examples".
struct Throughput {
  int64_t per_sample = 1;
  const char* unit = "tokens";
};

class Task {
 public:
  virtual ~Task() = default;
  // The training model (output "loss") and the evaluation model (output "logits") for `batch`.
  virtual Model BuildTrain(int64_t batch) const = 0;
  virtual Model BuildLogits(int64_t batch) const = 0;
  // Binds batch `index` of `split` (its inputs and targets) into `scope`.
  virtual void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch,
                         uint64_t seed) const = 0;
  virtual Throughput ThroughputPerSample() const = 0;
  // Exact-match accuracy over `batches` validation batches; -1 when the task has none.
  virtual double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch,
                          uint64_t seed) const = 0;
  // {"model": ..., sizes, "data": ...}: the configuration line of metrics and checkpoints.
  virtual nlohmann::json Describe() const = 0;
  // The model's units in order with their estimated forward FLOPs at micro-batch `batch`
  // (nn/model.h ModelUnits): what pipeline layouts and partitions cut. The GPT's are embed,
  // h.0 … h.L−1, head; the MLP's fc.0 … fc.L; a program's its `unit` blocks.
  virtual ModelUnits Units(int64_t batch) const = 0;
  // The training model of units `range` at micro-batch `batch`: one pipeline (virtual) stage.
  // Input "x" (the previous piece's "y") unless range.first is 0, output "y" unless the range
  // ends at the last unit (then the loss); each ParamSpec's init_index its position in the whole
  // model (nn/training_program.h SliceTrainingModel). Throws InvalidArgument naming the units when
  // the model cannot be cut there.
  virtual Model BuildPiece(int64_t batch, const UnitRange& range) const = 0;
  // The GPT's configuration with sizes filled in from the data; nullptr for other models.
  virtual const GptConfig* gpt() const { return nullptr; }
  // The precision the model trains in (--precision: the GPT's, or a program's mixed-precision
  // form, ir/autocast.h).
  virtual Precision precision() const { return Precision::kFp32; }
  // Under bf16 (the GPT's or a program's, both the autocast pass) the ops that run bf16 and those
  // that run f32 (the fallback): DescribeOps; null otherwise.
  virtual nlohmann::json PrecisionOps() const { return nullptr; }
  // The sequence length of every batch (1 for models without sequences).
  virtual int64_t seq_len() const { return 1; }
};

// {"bf16_ops": [...], "f32_ops": [...]}: the autocast pass's choice as Task::PrecisionOps gives it.
nlohmann::json DescribeOps(const AutocastOps& ops);

// The task of config.model; throws InvalidArgument naming the option for an unusable one.
std::unique_ptr<Task> MakeTask(const TrainConfig& config);

// The data `model` trains on when --data is not given: "sort" for gpt, "blobs" for mlp.
std::string DefaultData(const std::string& model);

// Throws InvalidArgument when config.model cannot train on config.data: the MLP takes "blobs"
// only; the GPT takes "sort" or a text file, not "blobs". MakeTask calls it.
void CheckModelData(const TrainConfig& config);

// Throws InvalidArgument for a configuration no task can run (steps, batch, micro-batches) or a
// number out of its range (step/config_checks.h: finite learning rates, min-lr ≤ lr, ...).
void ValidateTrainConfig(const TrainConfig& config);

}  // namespace sluice
