// TrainConfig: everything a training run is made of — the model, the data, the step (batch,
// micro-batches, optimizer, GC, recompute, threads) and the files around it. `sluice train` fills
// it from its flags; the trainer (train/), the step engines (train/single_stage.h,
// pipeline/pipeline_engine.h) and the stage programs (step/stage_program.h) read it.
//
// It sits in step/, below both train/ and pipeline/, so that neither needs the other.
// ValidateTrainConfig (step/task.h) checks it; the defaults are the default job (`make run`).
// RecomputePolicy is here too: a property of the step, chosen per stage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/exec/garbage_collector.h"
#include "sluice/exec/interpreter.h"
#include "sluice/nn/gpt.h"
#include "sluice/nn/mlp.h"
#include "sluice/nn/optimizer.h"

namespace sluice {

// Activation recomputation, per stage (step/stage_program.cc maps it onto GradientSpec). Gradients
// are bitwise the same under every policy; the forward keeps fewer bytes, the backward does more.
//   none       keep every value the backward reads
//   cheap      recompute the outputs of cheap ops (layer norm, GELU, …) from values kept anyway
//   full       keep only each block's input; recompute the rest of the block in backward
//              (activation checkpointing: about one more forward per step)
//   selective  cheap, and never keep the attention scores and probabilities [B, H, T, T]
//              (recomputed from q and k, which the backward reads anyway)
//   sublayer   keep what full keeps; recompute and back-propagate each block one sub-layer at a
//              time (nn/training_program.h SublayerInputs: a GPT block's attention, then its MLP),
//              so the backward holds one sub-layer's recomputed forward, not the whole block's;
//              the first sub-layer's forward runs twice (GradientSpec::recompute_cuts)
enum class RecomputePolicy : uint8_t { kNone, kCheap, kFull, kSelective, kSublayer };
std::string_view Name(RecomputePolicy policy);
std::optional<RecomputePolicy> ParseRecomputePolicy(std::string_view name);
// "none|cheap|full|selective|sublayer", for messages.
std::string RecomputePolicyNames();

struct TrainConfig {
  std::string model = "gpt";  // gpt | mlp | program (`--program`: the file in `program`)
  std::string program;        // a training program's file (nn/training_program.h)
  GptConfig gpt{
      .vocab = 0, .seq = 0, .layers = 2, .heads = 4, .dim = 64};  // vocab/seq 0: from the data
  MlpConfig mlp;
  // gpt: "sort" or a text file path; mlp: "blobs". `sluice train` without --data takes
  // DefaultData(model) (step/task.h); MakeTask refuses a pair that does not fit.
  std::string data = "sort";
  // Defaults are the default job (`make run`): a GPT that learns to sort digits in ~10 s.
  int64_t steps = 1000;
  int64_t batch = 32;
  int64_t microbatches = 1;
  OptimizerConfig optimizer{
      .lr = 3e-3, .schedule = LrSchedule::kCosine, .warmup_steps = 50, .min_lr = 3e-4};
  uint64_t seed = 1;
  GcMode gc =
      GcMode::kAuto;  // sync on the caching allocators training uses (exec/garbage_collector.h)
  // `--memory-plan`: dynamic (the default) or static — every run's intermediates in one arena
  // (exec/memory_plan.h; trace mode only). Bitwise the same results.
  MemoryPlanMode memory_plan = MemoryPlanMode::kDynamic;
  // `--no-in-place` turns off writing elementwise outputs into the storage of inputs dying at
  // their instruction (ExecutableOptions::in_place, exec/analysis.h). Bitwise the same results.
  bool in_place = true;
  // Every micro-batch after the first adds its weight gradients straight into the accumulated
  // buffers (autodiff.h's AccumulateGradients: a GEMM with beta = 1, or an add right where the
  // gradient is made), so no micro-batch's gradients live beside the accumulated ones. false: each
  // backward gives its gradients out and they are added afterwards. Bitwise the same results.
  bool accumulate_in_place = true;
  // What the backward recomputes instead of keeping from the forward (RecomputePolicy): one policy
  // for every pipeline stage, or one per stage (`--recompute full,cheap,cheap,none`).
  std::vector<RecomputePolicy> recompute = {RecomputePolicy::kCheap};
  // `--memory-budget`: per stage, the most bytes its allocator may hold at once (an allocation
  // beyond it fails the step with OutOfMemory); empty: no bound. The CLI plans the recompute
  // policies to fit it before training (step/memory_budget.h).
  std::vector<int64_t> memory_budget;
  // `--reserved-headroom`: every allocator of the run (and the forecast's model of it) keeps its
  // reserved bytes within (1 + this) x the most it ever had allocated, returning free blocks'
  // pages past it (CachingAllocatorOptions::reserved_headroom; docs/memory.md, "Reserved bytes").
  // 0 keeps them. From 0 to 1.
  double reserved_headroom = 0.04;
  // ZeRO stage 1 (`--shard-optimizer`): with D data-parallel replicas, each keeps and updates 1/D
  // of every parameter's optimizer state and the updated parameters are gathered (StageProgram).
  bool shard_optimizer = false;
  RunMode mode = RunMode::kTrace;
  int threads = 0;           // intra-op threads (BLAS and parallel runs); 0 = all cores
  int64_t eval_every = 250;  // 0: only after the last step
  int64_t eval_batches = 4;
  // `--skip-nonfinite N`: up to N steps whose loss or gradient norm is not finite have their
  // update withheld and training goes on; the next one stops it (NonFiniteError). Counted per run.
  int64_t skip_nonfinite = 0;
  std::string metrics_path;  // JSON lines; empty = none
  std::string save_path;     // checkpoint file; empty = none
  int64_t save_every = 0;    // 0: only at the end (when save_path is set)
  std::string resume_path;   // continue a run from this checkpoint
  std::string init_from;     // load weights only from this safetensors file
  // `--allow-changes`: a --resume whose hyperparameters (--lr, --batch, ...) differ from the
  // checkpoint's goes on with a warning for each instead of being refused.
  bool allow_changes = false;

  // What messages call the model: "gpt", "mlp", or the program's file.
  const std::string& ModelName() const { return model == "program" ? program : model; }
};

}  // namespace sluice
