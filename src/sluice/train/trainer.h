// Trainer: runs `sluice train` — the training loop, evaluation, metrics and checkpoints around a
// step engine (train/step_engine.h) that computes each optimizer step: on one stage by default
// (train/single_stage.h: micro-batched forward and backward, accumulation, clipping, the
// optimizer program), or split into pipeline stages (pipeline/pipeline_engine.h).
//
// Data batch k of step s is batch index s·M + k of the dataset, a pure function of the seed, so
// resuming from a checkpoint replays exactly the batches an uninterrupted run would see.
//
// The per-step peak in the metrics is the engine's peak of requested bytes (parameters, optimizer
// state, activations, gradients — every tensor the step holds; a pipeline's largest stage).
// Evaluation runs on the calling thread with an allocator of its own, reading the engine's
// parameters in place. Checkpoints hold parameters and optimizer state by name in one safetensors
// file, whatever the engine: a pipeline run can resume a single-stage checkpoint and vice versa.
//
// Thread-safety: one Trainer per thread. Failure: the constructor throws InvalidArgument or
// IoError for a bad configuration, data or checkpoint file, naming what to change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/exec/garbage_collector.h"
#include "sluice/exec/interpreter.h"
#include "sluice/nn/gpt.h"
#include "sluice/nn/mlp.h"
#include "sluice/nn/optimizer.h"
#include "sluice/train/step_engine.h"

namespace sluice {

struct TrainConfig {
  std::string model = "gpt";  // gpt | mlp
  GptConfig gpt{.vocab = 0, .seq = 0, .layers = 2, .heads = 4, .dim = 64};  // vocab/seq 0: from the data
  MlpConfig mlp;
  std::string data = "sort";  // "sort", "blobs" (mlp) or a text file path
  // Defaults are the default job (`make run`): a GPT that learns to sort digits in ~10 s.
  int64_t steps = 1000;
  int64_t batch = 32;
  int64_t microbatches = 1;
  OptimizerConfig optimizer{.lr = 3e-3, .schedule = LrSchedule::kCosine, .warmup_steps = 50, .min_lr = 3e-4};
  uint64_t seed = 1;
  GcMode gc = GcMode::kAsync;
  bool recompute = true;        // recompute cheap activations in backward (GradientSpec::recompute)
  RunMode mode = RunMode::kTrace;
  int threads = 0;              // intra-op threads (BLAS and parallel runs); 0 = all cores
  int64_t eval_every = 250;     // 0: only after the last step
  int64_t eval_batches = 4;
  std::string metrics_path;     // JSON lines; empty = none
  std::string save_path;        // checkpoint file; empty = none
  int64_t save_every = 0;       // 0: only at the end (when save_path is set)
  std::string resume_path;      // continue a run from this checkpoint
  std::string init_from;        // load weights only from this safetensors file
};

struct StepRecord {
  int64_t step = 0;             // 1-based step just finished
  double loss = 0;              // mean over micro-batches
  double lr = 0;
  double grad_norm = 0;         // before clipping
  double step_ms = 0;
  double tokens_per_s = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
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
  double tokens_per_s = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t params = 0;
};

class Trainer {
 public:
  // `engine` builds the step engine; null: the single-stage engine.
  explicit Trainer(TrainConfig config, const EngineFactory& engine = nullptr);
  ~Trainer();

  // Trains from the current step to config.steps. Calls the observers after each step and each
  // evaluation; writes metrics and checkpoints as configured.
  TrainSummary Run(const std::function<void(const StepRecord&)>& on_step = nullptr,
                   const std::function<void(const EvalRecord&)>& on_eval = nullptr);

  // One optimizer step (for tests); returns its record.
  StepRecord Step();
  EvalRecord Evaluate();
  void SaveCheckpoint(const std::string& path) const;

  int64_t step() const;
  const TrainConfig& config() const;
  // Current parameter and optimizer-state tensors by name.
  const Tensor& Value(const std::string& name) const;
  std::vector<std::string> ParamNames() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
