// StepEngine: how the trainer computes one optimizer step. The Trainer (train/trainer.h) owns
// what every run shares — the task and its data, evaluation, metrics, checkpoints, the loop — and
// asks its engine for each step:
//
//   single stage (train/single_stage.h)   one thread, one allocator: forward and backward per
//                                         micro-batch, accumulation, clipping, the optimizer
//   pipeline (pipeline/pipeline_engine.h) the model split into stages on their own threads and
//                                         allocators, micro-batches flowing through a schedule
//
// Both build and run their programs with one StageProgram per rank (step/stage_program.h).
//
// An engine owns the parameters and optimizer state, in its own memory. State() hands out
// tensors that share that memory: the trainer evaluates with them, saves them, and loads a
// checkpoint by copying into them in place — so the engine sees every change.
//
// Thread-safety: one thread calls an engine at a time. Failure modes: Step throws the error of the
// run that failed (a pipeline engine names the stage, action and micro-batch).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/core/allocator.h"
#include "sluice/core/tensor.h"
#include "sluice/nn/model.h"
#include "sluice/step/memory_replay.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice {

struct StepResult {
  double loss = 0;       // mean over micro-batches
  double grad_norm = 0;  // global, before clipping
  // False when the loss or the gradient norm was not finite: the engine then withheld the
  // update (StageProgram::UpdateIfFinite), parameters and optimizer state are as they were.
  bool updated = true;
  // Peak tensor memory of the step: every tensor the engine holds (parameters, optimizer state,
  // activations, gradients). A pipeline reports its largest stage.
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
};

// Which slice of each parameter's optimizer state an engine keeps: with `--shard-optimizer`
// (ZeRO stage 1) replica `shard` of `shards` keeps elements OptimizerShard(numel, shard, shards)
// (step/stage_program.h) of each flattened state tensor; {0, 1}: all of it. Checkpoints always
// hold the whole state (a sharded engine gathers it at save), so a resume cuts its slice out of
// them whatever D wrote them.
struct OptimizerStateSlice {
  int shard = 0;
  int shards = 1;
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // Step `step` (0-based, the optimizer's count): forward and backward over config.microbatches
  // micro-batches of training batch indices first_batch … first_batch + M − 1, gradient mean and
  // clipping, then the optimizer at `lr` — unless the loss or gradient norm is not finite, when
  // the update is withheld (`updated`). A run from scratch has first_batch = step·M; a resumed one
  // continues from the checkpoint's data position, whatever M the checkpoint's run used.
  virtual StepResult Step(int64_t step, int64_t first_batch, double lr) = 0;
  // The step the caller will ask for next, known in advance.
  struct NextStep {
    int64_t step = 0, first_batch = 0;
    double lr = 0;
  };
  // Step, telling the engine that the next call will be Step(next->step, next->first_batch,
  // next->lr): an engine that can (a pipeline with --post-validate, on threads) begins it before
  // this one is validated, and returns this step's figures once it is. Until the next call —
  // or Drain — the engine's state is in motion: the caller must not read or write State() then.
  // Without `next` the engine ends with this step, as Step does. The default ignores `next`.
  virtual StepResult Step(int64_t step, int64_t first_batch, double lr,
                          const std::optional<NextStep>& next) {
    (void)next;
    return Step(step, first_batch, lr);
  }
  // Whether a step announced by Step's `next` is running ahead (then the next call must be that
  // step, or Drain).
  virtual bool RunningAhead() const { return false; }
  // The caller will not take the step announced by Step's `next` (a non-finite step stops
  // training): the engine finishes and undoes it, and State() is again that after the last step
  // returned. Nothing when no step runs ahead.
  virtual void Drain() {}
  // Every parameter and optimizer-state tensor by name, sharing the engine's memory.
  virtual std::map<std::string, Tensor> State() const = 0;
  // The caller copied a checkpoint into State()'s tensors: an engine that keeps more than one copy
  // of a tensor (a pipeline's tied parameter on every stage reading it) brings the others to it.
  // Collective when distributed.
  virtual void StateLoaded() {}
  // The GC mode the engine's programs run with: config.gc, kAuto resolved against the engine's
  // allocators (exec/garbage_collector.h ResolveGcMode). Named in the metrics summary.
  virtual GcMode gc_mode() const = 0;
  // Extra fields for the metrics summary line ({"stages": [...]} for a pipeline); null when none.
  virtual nlohmann::json Summary() const { return nullptr; }
  // Each stage's memory forecast (step/memory_replay.h): what its allocator peaks at in a step,
  // predicted from the programs; empty where the engine cannot say (a distributed rank).
  virtual std::vector<StageMemoryForecast> Forecast() const { return {}; }
  // For people: one line saying how the engine runs a step (a pipeline: stages, schedule, layout,
  // release), printed before training; empty when there is nothing beyond the configuration.
  virtual std::string Describe() const { return {}; }
  // For people: lines reporting the run so far (a pipeline: one per stage), printed after training.
  virtual std::vector<std::string> ReportLines() const { return {}; }

  // Distributed engines run one rank per process (MPI). Only the leader (world rank 0) writes
  // metrics, evaluates and reports; every process calls every method below (they are collective).
  virtual bool leader() const { return true; }
  // Whether the engine is one rank of several processes (State() holds this rank's part only).
  virtual bool distributed() const { return false; }
  // The whole model's parameters on the leader (copies from the other ranks, in `allocator`);
  // empty on the other processes. One process: the parameters of State().
  virtual std::map<std::string, Tensor> GatherParams(Allocator& allocator);
  // Writes parameters and optimizer state with `metadata` as a checkpoint at `path`: one file
  // (io/checkpoint.h), or for a distributed engine a shard per stage and an index. Says how it
  // went instead of throwing an IoError: nothing when the whole checkpoint is written, else why
  // not (other errors, such as non-finite values, are thrown). Collective when distributed: a
  // failure on any rank is a failure on every rank (its own message there, elsewhere which ranks
  // failed), so that all ranks take the same next step — no rank waits for one that gave up.
  virtual std::optional<std::string> TrySaveCheckpoint(
      const std::string& path, const std::map<std::string, std::string>& metadata);
  // Side outputs (a pipeline's --trace and --profile-out files) that could not be written since the
  // last call, each an IoError's message. A failed side output never fails a step: the step's
  // update is done, so the trainer goes on, saves the model, and reports these at the end.
  virtual std::vector<std::string> TakeOutputFailures() { return {}; }
  // The request to stop training this process acts on (a signal number, train/stop_signals.h; 0:
  // none), given this process's own, before step `next_step` (0-based: the steps done so far).
  // One process: `mine`. Distributed: the first non-zero request of the world ranks (collective:
  // one all-reduce of a figure per rank), so that every rank stops after the same step even when
  // only one was signalled; its timeout names the step and the ranks waited for. Where the ranks
  // may be far apart — the first call (start-up), after an evaluation or a checkpoint — a
  // distributed engine first waits for every rank with no timeout short of a day (a dead process
  // ends the job through mpirun): that wait is no message of a step.
  virtual int AgreeOnStop(int mine, int64_t next_step) {
    (void)next_step;
    return mine;
  }
  // The slice of the optimizer state State() holds (OptimizerStateSlice).
  virtual OptimizerStateSlice optimizer_state_slice() const { return {}; }
  // TrySaveCheckpoint, throwing its failure as an IoError.
  void SaveCheckpoint(const std::string& path, const std::map<std::string, std::string>& metadata);
};

// What an engine is built from: the run's configuration, its task and the model of one
// micro-batch (config.batch / config.microbatches sequences).
struct EngineContext {
  const TrainConfig& config;
  const Task& task;
  const Model& model;
  int threads = 1;  // intra-op threads of the process, shared by its ranks (0: every core)
};

using EngineFactory = std::function<std::unique_ptr<StepEngine>(const EngineContext&)>;

}  // namespace sluice
