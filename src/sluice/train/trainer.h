// Trainer: runs `sluice train` — the training loop, evaluation, metrics and checkpoints around a
// step engine (step/step_engine.h) that computes each optimizer step: on one stage by default
// (train/single_stage.h), or split into pipeline stages (pipeline/pipeline_engine.h, given as the
// factory by the CLI). Both build their steps with step/stage_program.h.
//
// Data batch k of step s is batch index s·M + k of the dataset, a pure function of the seed, so
// resuming from a checkpoint replays exactly the batches an uninterrupted run would see.
//
// The per-step peak in the metrics is the engine's peak of requested bytes (parameters, optimizer
// state, activations, gradients — every tensor the step holds; a pipeline's largest stage).
// Evaluation runs on the calling thread with an allocator of its own, reading the engine's
// parameters in place (a distributed engine gathers them to the leader first). Checkpoints
// (train/training_checkpoint.h) hold parameters and optimizer state by name: one safetensors file,
// or under MPI a shard per stage and an index; any engine resumes any of them.
//
// Thread-safety: one Trainer per thread. Failure: the constructor throws InvalidArgument or
// IoError for a bad configuration, data or checkpoint file, naming what to change. A step whose
// loss or gradient norm is not finite throws NonFiniteError naming the step (after writing its
// metrics line, before any evaluation or checkpoint of it), and no checkpoint holding a non-finite
// value is ever written (io/checkpoint.h): a diverged run leaves the last good checkpoint alone.
// Run then keeps the last finite state (the engine withheld the failed step's update) when a
// checkpoint path is configured and this run trained a step before: it is saved beside it as
// LastFiniteCheckpointPath, and the NonFiniteError says where.
// With config.skip_nonfinite = N, the first N such steps are skipped instead: the engine withholds
// their update (StepEngine::Step), the step counter advances — and with it the learning-rate
// schedule and AdamW's step count, which are functions of the step number, so a skipped step's
// rate is simply not applied — and the N+1-th throws. A checkpoint that cannot be written by Run
// does not lose the trained state: it is saved to "<path>.rescue-step<N>.safetensors" beside
// the path or, failing that, in the temporary folder ($TMPDIR), and the IoError says where
// (under MPI too: the ranks agree on every attempt, so all write the rescue shards and index).
// A side output that cannot be written — the metrics (then abandoned), a pipeline's trace or
// costs file — never stops training: Run goes on, saves as configured and lists the failures in
// TrainSummary::output_failures.
//
// Stopping early (Run's `stop`, fed by train/stop_signals.h in `sluice train`): `stop` is asked
// before every step; once it names a signal (on any rank: StepEngine::AgreeOnStop), training
// stops there — every pipeline stage after the same step, since a step runs all of them — saves
// a checkpoint of the last step at StopCheckpointPath (config.save_path, or a file named for the
// stop beside the metrics or in the working directory), writes the metrics summary with
// "stopped" and returns. Nothing is saved when no step ran (the state is what was loaded).
// When the engine runs the next step ahead (StepEngine::Step's `next`: a pipeline with
// --post-validate on threads), the signal finds that step begun: it is finished and validated —
// a real step — and training stops after it (TrainSummary::stopped_ahead says so).
//
// Lookahead: Run tells the engine the next step in advance whenever nothing needs the engine's
// state between the two — no evaluation, no checkpoint, not the last step — so an engine that
// can interlock consecutive steps does; Step() (for tests) never does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/step/step_engine.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice {

struct StepRecord {
  int64_t step = 0;  // 1-based step just finished
  double loss = 0;   // mean over micro-batches
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double step_ms = 0;
  double per_s = 0;  // throughput: Trainer::throughput().unit per second
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  // The loss or gradient norm was not finite and --skip-nonfinite allowed the step: its update
  // was withheld (parameters and optimizer state as before it).
  bool skipped = false;
};

struct EvalRecord {
  int64_t step = 0;
  double val_loss = 0;
  double accuracy = -1;  // exact-match accuracy of generated answers (sort, blobs); -1 when n/a
};

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  EvalRecord last_eval;
  double wall_s = 0;
  double per_s = 0;  // over every step, Trainer::throughput().unit per second
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  // The process's peak resident set at the end (VmHWM: tensors, code, libraries, thread stacks,
  // allocator caches of every stage in this process); -1 where /proc does not say.
  int64_t peak_resident_bytes = -1;
  int64_t params = 0;         // trained parameter elements
  int64_t unused_params = 0;  // elements of parameters the loss does not depend on (left as loaded)
  int64_t skipped = 0;        // steps whose update was withheld (StepRecord::skipped)
  // Run stopped early at this signal's request (0: it ran to config.steps).
  int stop_signal = 0;
  // Where the early stop saved the state; empty when it did not (no step had run).
  std::string stop_checkpoint;
  // The stop found the step after the last one it saw begun (running ahead) and finished it first.
  bool stopped_ahead = false;
  // Side outputs that could not be written (metrics, a pipeline's trace or costs file), each an
  // IoError's message. Training went on past them and saved its checkpoints as configured.
  std::vector<std::string> output_failures;
};

// Where a run stopped early at step `step` saves its state: config.save_path when given, else
// "sluice-stopped-step<step>.safetensors" in the folder of config.metrics_path, or in the working
// directory without metrics.
std::string StopCheckpointPath(const TrainConfig& config, int64_t step);

// Where Run saves the last finite state (step `step`) of a run stopped by a non-finite step:
// "<save_path>.last-finite-step<step>.safetensors".
std::string LastFiniteCheckpointPath(const std::string& save_path, int64_t step);

class Trainer {
 public:
  // `engine` builds the step engine; null: the single-stage engine.
  explicit Trainer(TrainConfig config, const EngineFactory& engine = nullptr);
  ~Trainer();

  // Trains from the current step to config.steps. Calls the observers after each step and each
  // evaluation; writes metrics and checkpoints as configured. `stop`, asked before every step,
  // returns a signal number to stop there (see above; 0: go on). Collective when distributed:
  // every rank calls Run with a `stop` or every rank without.
  TrainSummary Run(const std::function<void(const StepRecord&)>& on_step = nullptr,
                   const std::function<void(const EvalRecord&)>& on_eval = nullptr,
                   const std::function<int()>& stop = nullptr);

  // One optimizer step (for tests); returns its record (skipped when its update was withheld),
  // or throws NonFiniteError.
  StepRecord Step();
  EvalRecord Evaluate();
  void SaveCheckpoint(const std::string& path) const;

  int64_t step() const;
  // What the throughput figures count (tokens or examples) and how many per example.
  Throughput throughput() const;
  // What a person should hear before training: parameters the loss does not depend on (left
  // untouched, nn/training_program.h), and what --resume accepted (the checkpoint was trained on
  // other data). `sluice train` prints each as a warning.
  const std::vector<std::string>& warnings() const;
  const TrainConfig& config() const;
  // The step engine, for its Describe() and ReportLines().
  const StepEngine& engine() const;
  // The task it trains, for what it says of its model (Task::PrecisionOps).
  const Task& task() const;
  // Current parameter and optimizer-state tensors by name.
  const Tensor& Value(const std::string& name) const;
  bool Has(const std::string& name) const;
  // Every parameter's name, constants (ParamSpec::constant, which have no optimizer state)
  // included, in the model's order.
  std::vector<std::string> ParamNames() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
