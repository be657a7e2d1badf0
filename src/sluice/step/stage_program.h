// StageProgram: the one place where the programs of a training step are built and run — for the
// whole model on one stage (train/single_stage.h) and for every rank of a pipeline
// (pipeline/stage_runtime.h), which is why single-stage and pipelined training agree bit for bit.
//
// A rank trains one or more *chunks*: contiguous pieces of the model (the whole model on one
// stage). For each chunk, from its forward program, StageProgram builds
//   forward    keeping in the scope exactly the values its backward reads (Backward::saved): the
//              forward→backward hand-off
//   backward   autodiff over the chunk: the parameters' gradients and, unless the chunk is the
//              first, "x.grad" for the previous chunk; seeded by the loss on the last chunk, by
//              "y.grad" from the next chunk elsewhere. It donates its inputs, so saved activations
//              die at their last backward use. With split_backward, its B half (input gradients:
//              the pipeline's critical path) and W half (parameter gradients) instead (SplitBW);
//              and, for the micro-batches after the first, the same adding the parameter gradients
//              into the accumulated buffers (AccumulateGradients; TrainConfig::accumulate_in_place)
// and, for all of the rank's parameters: their initial values and optimizer state in the rank's
// allocator and the optimizer program that applies the accumulated gradients in place.
//
// Tied parameters (read by more than one unit of the model: nn/training_program.h TiedParams):
// each unit's read is a parameter of its own in the chunk's programs (SeparateTiedReads), bound to
// the rank's one tensor, so each unit's share of the gradient is accumulated apart over the
// micro-batches; FinishGradients then sums the shares in unit order. Every pipeline rank that
// reads the parameter holds a copy and gets the other ranks' shares from its runtime, so the sum —
// and with it the update — is bitwise the same on every copy and on one stage.
//
// A chunk's interface: "x" f32 [B, T, C] in from the previous chunk (absent on the first, which
// reads the batch's "ids"), "y" out to the next (absent on the last, whose output is the loss),
// and their gradients "y.grad" in, "x.grad" out.
//
// One step, as both engines run it:
//   for each micro-batch: Forward (+ hand-off) → Backward [→ Weight] → gradients accumulated
//   FinishGradients: mean over micro-batches, per-parameter sums of squares → GlobalNorm (over
//   every rank's, in model order); Update: clipping to that norm, the optimizer at the step's
//   learning rate.
//
// Ownership: the program keeps a reference to the TrainConfig it was built with (it must outlive
// the program) and allocates every tensor from options.allocator (likewise).
// Thread-safety: one thread uses a StageProgram (a rank's). Failure: the constructor throws
// ProgramError when the model cannot be differentiated; the run methods rethrow a failing run's
// error (the scope may then hold partial results).
//
// Example (one stage, what the single-stage engine does per step):
//   StageProgram program({{.model = model}}, config, {.allocator = &allocator});
//   for (int64_t k = 0; k < M; ++k) {
//     task.BindBatch(scope, DataSplit::kTrain, step * M + k, micro_batch_size, config.seed);
//     program.Forward(0, scope);
//     program.Backward(0, scope, grads);
//     scope.Clear();
//   }
//   const double norm = GlobalNorm(program.FinishGradients(grads, M));
//   program.Update(grads, norm, lr, step);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/allocator.h"
#include "sluice/exec/interpreter.h"
#include "sluice/exec/scope.h"
#include "sluice/nn/model.h"
#include "sluice/nn/optimizer.h"
#include "sluice/nn/training_program.h"
#include "sluice/step/train_config.h"

namespace sluice {

// The names of a chunk's interface.
inline constexpr const char* kChunkInput = "x";
inline constexpr const char* kChunkOutput = "y";
inline constexpr const char* kChunkOutputGrad = "y.grad";
inline constexpr const char* kChunkInputGrad = "x.grad";

// The type of a message across a chunk boundary: the chunk's input "x" or output "y" (`name`) as
// its forward program types it — and that value's gradient's alike: a bf16 message's gradient is
// bf16 (StageProgram asks autodiff for it, GradientSpec::bf16_gradients), an f32 one's f32.
inline TensorType ChunkMessageType(const Program& forward, const char* name) {
  return forward.type(forward.Get(name));
}

// ChunkMessageType's bytes.
inline int64_t ChunkMessageBytes(const Program& forward, const char* name) {
  const TensorType t = ChunkMessageType(forward, name);
  return t.shape.numel() * static_cast<int64_t>(SizeOf(t.dtype));
}

// One chunk to build: its forward program (one micro-batch) and where it sits in the model.
struct ChunkModel {
  Model model;
  bool first = true;  // reads the batch (no "x")
  bool last = true;   // ends in the loss (no "y")
};

struct StageProgramOptions {
  Allocator* allocator = nullptr;                       // every tensor of the rank; required
  int threads = 1;                                      // intra-op threads (parallel runs)
  bool split_backward = false;                          // B and W halves (zero-bubble schedules)
  RecomputePolicy recompute = RecomputePolicy::kCheap;  // this rank's (RecomputeForStage)
  // The whole model's tied parameters (TiedParams of its program). A rank of one chunk that is
  // the whole model (first and last) finds them itself.
  std::vector<TiedParam> tied;
  // Build the programs only: no parameters or optimizer state are allocated, and only the
  // accessors may be used (for step/memory_replay.h, which predicts what a run would hold).
  bool plan_only = false;
  // Optimizer state sharding (ZeRO stage 1, `--shard-optimizer`): this rank is replica `shard` of
  // `shards` data-parallel replicas and keeps and updates only its slice of every parameter —
  // elements OptimizerShard(numel, shard, shards) of the flattened parameter — and of its
  // optimizer state. After Update the caller makes the parameters whole again (GatherParams).
  int shard = 0;
  int shards = 1;
};

// The elements [begin, end) of a flattened parameter of `numel` elements that replica `shard` of
// `shards` updates: [numel·shard/shards, numel·(shard+1)/shards). The last shard is the largest.
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange OptimizerShard(int64_t numel, int shard, int shards);

// The recompute policy of pipeline stage `stage` of `stages` (0 of 1 on one stage): the one policy
// of config.recompute, or the stage's own when it lists one per stage. Throws InvalidArgument
// when the list has neither 1 nor `stages` entries.
RecomputePolicy RecomputeForStage(const TrainConfig& config, int stage, int stages);

// A built chunk. backward.saved is what its forward leaves in the scope for its backward.
struct Chunk {
  Model model;  // as given; its executables read a tied parameter once per unit
  bool first = true, last = true;
  Backward backward;
  SplitBackward split;  // when split_backward
  // Its parameters, model order: `value`, the name its programs read (the parameter's own, or
  // for a tied parameter each unit's read, TiedReadName), bound to the rank's tensor `param`.
  struct ParamRead {
    std::string value, param;
  };
  std::vector<ParamRead> params;
  bool output_saved = false;  // the backward reads "y": it may not be released early
  std::unique_ptr<Executable> forward, backward_exe, b_exe, w_exe;
  // The backward (or B, or W) that adds the parameter gradients `grads` into the accumulated
  // buffers, bound in the scope under those names (AccumulateGradients): run instead of the plain
  // one once every one of them has a buffer (TrainConfig::accumulate_in_place). exe is null when
  // the program gives out no parameter gradient or accumulation in place is off.
  struct Accumulating {
    std::unique_ptr<Executable> exe;
    std::vector<std::string> grads;
  };
  Accumulating backward_acc, b_acc, w_acc;
};

class StageProgram {
 public:
  StageProgram(std::vector<ChunkModel> chunks, const TrainConfig& config,
               StageProgramOptions options);
  ~StageProgram();
  StageProgram(const StageProgram&) = delete;
  StageProgram& operator=(const StageProgram&) = delete;

  int chunks() const { return static_cast<int>(chunks_.size()); }
  const Chunk& chunk(int c) const { return chunks_[c]; }
  // The rank's parameters, model order.
  const std::vector<ParamSpec>& params() const { return params_; }
  const Executable& optimizer() const { return *optimizer_; }
  const TrainConfig& config() const { return config_; }
  bool split_backward() const { return options_.split_backward; }

  // Runs chunk c's forward on `scope`, which holds its inputs ("x", or the batch on the first
  // chunk); binds the chunk's parameters. Afterwards `scope` holds exactly the values the
  // backward reads, plus the output: the loss on the last chunk, else "y".
  void Forward(int c, Scope& scope) const;
  // Runs chunk c's backward — its B half when split — on the forward's hand-off plus "y.grad"
  // (unless last) and adds the parameter gradients it produced to `grads` — in place, by the
  // accumulating program, once `grads` holds every one of them. Afterwards `scope`
  // holds "x.grad" unless the chunk is the first, and, when split, what W reads.
  void Backward(int c, Scope& scope, GradientAccumulator& grads) const;
  // Runs chunk c's W half (split only) and adds its parameter gradients to `grads`.
  void Weight(int c, Scope& scope, GradientAccumulator& grads) const;

  // One unit's share of a tied parameter's gradient, accumulated as `grad` ("<param>@<unit>.grad").
  struct TiedShare {
    std::string param, unit, grad;
    bool local = false;  // read by one of this rank's chunks; else another rank accumulates it
  };
  // The shares of the tied parameters this rank holds: parameter order, then unit order.
  const std::vector<TiedShare>& tied_shares() const { return tied_shares_; }

  // Sums each tied parameter's shares in unit order into "<param>.grad" — its local ones from
  // `grads` (a share without a gradient counts as none), the others from `others` (by share name,
  // from the ranks accumulating them; each must be there) — then the mean of `grads` over
  // `micro_batches`, then each of the rank's parameters' gradient sum of squares, in params()
  // order (0 for a parameter without a gradient).
  std::vector<double> FinishGradients(GradientAccumulator& grads, int64_t micro_batches,
                                      std::map<std::string, Tensor> others = {}) const;
  // Clips `grads` (averaged) to config.optimizer.clip_norm given their global norm, applies them
  // to the parameters in place with the optimizer at `lr` for 0-based `step`, then clears `grads`.
  void Update(GradientAccumulator& grads, double global_norm, double lr, int64_t step);
  // Update when the step is finite — `loss` (the step's loss, or any sum of its micro-batches'
  // losses) and `global_norm` both finite — and returns true. Otherwise withholds the update:
  // clears `grads`, leaves parameters and optimizer state as they were and returns false. Both
  // engines decide here, on figures every rank of a pipeline agrees on, so no rank updates alone.
  bool UpdateIfFinite(GradientAccumulator& grads, double global_norm, double loss, double lr,
                      int64_t step);

  // Post-validation (`--post-validate`, docs/pipeline.md "Post-validation"): a rank updates
  // before the global norm and the finite check are known, assuming neither will intervene, and
  // corrects afterwards — the result bitwise UpdateIfFinite's in every case.
  //
  // UpdateEagerly applies `grads` (averaged) unclipped at `lr` for 0-based `step` and keeps
  // `grads` for a redo. It double-buffers the state the update changes (every non-constant
  // parameter and its optimizer state): the optimizer reads the live tensors and writes the new
  // values into spares of the same size (BuildOptimizerInto; RollbackBytes of them, allocated at
  // the first call and kept for the run), then the live tensors and their spares exchange memory
  // (Storage::SwapMemory) — so every holder of State()'s tensors sees the update, as after
  // Update, and the spares hold the state before it. No copy is made: a rollback swaps back.
  // ValidateEagerUpdate then decides with the step's global norm and loss: kAccepted when both
  // are finite and clipping does not fire (ClipCoefficient 1: the eager update is the one
  // Update makes); kRedone when clipping fires (the saved state is restored and the update
  // redone with the clipped gradients, in place); kSkipped when either is not finite (restored,
  // no update: UpdateIfFinite's false). Either way the kept gradients are dropped. Restoring is
  // the swap back: the spares then hold what the eager update made, unused.
  // Throws InternalError (an invariant) naming the step when no eager update of `step` is
  // pending: a rollback that cannot find its saved state never updates silently.
  enum class Validation { kAccepted, kRedone, kSkipped };
  void UpdateEagerly(GradientAccumulator& grads, double lr, int64_t step);
  Validation ValidateEagerUpdate(double global_norm, double loss, double lr, int64_t step);
  // The bytes post-validation keeps for a rollback — UpdateEagerly's spares: every non-constant
  // parameter and its optimizer state (the gradients kept until validation are the step's own,
  // held by Update alike) — and SaveBuffers' copies of the buffers.
  int64_t RollbackBytes() const;
  // Buffers (ParamSpec::buffer; docs/program-format.md "Buffers"): the running statistics that
  // Forward updates in place. A run of a step that may be discarded and run again (interlocked
  // post-validation, pipeline/stage_runtime.h) saves them before its first forward and restores
  // them when it is discarded, so the run again — or the step after — starts from the statistics
  // the discarded run started from, as in the synchronous run. SaveBuffers copies each buffer
  // into a copy of its own (allocated at the first call, from the rank's allocator, and kept for
  // the run); RestoreBuffers copies the saved values back into the live tensors (every holder of
  // State()'s tensors sees them). Both do nothing on a rank without buffers; RestoreBuffers throws
  // InternalError when nothing was saved.
  void SaveBuffers();
  void RestoreBuffers();
  // Data parallelism (docs/mpi.md, "Running statistics"): sets every buffer to the mean of the
  // replicas' — `all_reduce_sum` sums a tensor over the `replicas` in place, in replica order, so
  // that every replica gets the same bits, then each element is divided by `replicas`. Called once
  // a step, after the forwards: the replicas' running statistics never diverge, and a running
  // mean is the one a single process moving it over the whole micro-batches would keep (each
  // replica's rows of a micro-batch are an equal share of it, and the mean is linear). Nothing on
  // a rank without buffers.
  void AverageBuffers(const std::function<void(const Tensor&)>& all_reduce_sum, int replicas);
  // Undoes the pending eager update of `step` without validating it: restores the saved state and
  // drops the kept gradients (a speculative step the trainer will not take, PipelineEngine::Drain).
  // Throws InternalError, as ValidateEagerUpdate, when no eager update of `step` is pending.
  void DiscardEagerUpdate(int64_t step);

  // Sharded optimizer only (options.shards > 1), after an Update that returned true: sets every
  // element outside this replica's slice of each parameter to −0.0 and calls all_reduce_sum on the
  // parameter, in params() order. An all-reduce over the replicas then adds, per element, the one
  // replica's updated value and −0.0 from the others — exact (−0.0 is the additive identity: x +
  // (−0.0) = x for every x, +0.0 and NaN included), so the gather is bitwise.
  void GatherParams(const std::function<void(const Tensor&)>& all_reduce_sum);
  int shard() const { return options_.shard; }
  int shards() const { return options_.shards; }
  // The bytes of optimizer state this rank keeps for `param` (its slice when sharded).
  int64_t OptimizerStateNumel(const ParamSpec& param) const;

  // Parameters and optimizer state by name, sharing the rank's memory. With a sharded optimizer
  // the state tensors are this replica's slices (1-D, OptimizerShard's size).
  std::map<std::string, Tensor> State() const;

 private:
  const TrainConfig& config_;
  StageProgramOptions options_;
  std::vector<Chunk> chunks_;
  std::vector<ParamSpec> params_;
  std::vector<TiedParam> tied_;  // those of the whole model that this rank holds
  std::vector<TiedShare> tied_shares_;
  Scope state_;  // parameters and optimizer state
  std::unique_ptr<Executable> optimizer_;
  ExecutableOptions exe_options_;  // the options every program of the rank runs with
  // Post-validation's double buffer: the state tensors an update changes, by name (looked up in
  // state_ at each use: a resume may rebind them), each with its spare, and the optimizer that
  // writes into the spares (both made at the first UpdateEagerly); the step whose eager update
  // awaits validation (-1: none) and its gradients, kept for a redo.
  struct Spare {
    std::string name;
    Tensor tensor;
  };
  std::vector<Spare> spares_;
  std::vector<Spare> saved_buffers_;  // SaveBuffers' copies, params() order
  std::unique_ptr<Executable> optimizer_into_;
  int64_t pending_step_ = -1;
  GradientAccumulator pending_grads_;

  // The names of the state tensors an update changes: each non-constant parameter and its state.
  std::vector<std::string> UpdatedStateNames() const;
  // Runs the optimizer on `grads` as they are (no clipping) and leaves them in place: in place,
  // or (`into_spares`) reading the live state and writing the spares.
  void Apply(const GradientAccumulator& grads, double lr, int64_t step, bool into_spares = false);
  // Exchanges the memory of every updated state tensor and its spare.
  void SwapSpares();
  std::vector<ParamSpec> shard_specs_;  // sharded: each parameter as its 1-D slice
};

// What ValidateEagerUpdate decides from a step's global norm and loss under `clip_norm` (the same
// on every rank, so an engine can tell the outcome from the reduced figures alone).
StageProgram::Validation EagerUpdateVerdict(double global_norm, double loss, double clip_norm);

// The bytes post-validation keeps for a rollback of `params`' update (StageProgram::UpdateEagerly):
// each non-constant parameter (f32) and its optimizer state. The memory forecast counts them
// with it (pipeline/memory_forecast.h).
int64_t RollbackBytes(const std::vector<ParamSpec>& params, const OptimizerConfig& optimizer);

// The global gradient norm from per-parameter sums of squares in the whole model's parameter
// order — summed in that order on one stage and on every rank of a pipeline alike, so the norm is
// bitwise the same however the model is split.
double GlobalNorm(const std::vector<double>& sum_squares_in_model_order);

// Intra-op threads for each of `ranks` ranks sharing this process, from the run's `threads`
// (0: every core). Sets BLAS's thread count and the intra-op pool of the other kernels
// (kernels/parallel.h) to it — the one place sluice sets them; docs/executor.md says how they
// share the cores.
int ShareIntraOpThreads(int threads, int ranks);
// The count ShareIntraOpThreads gives each rank, setting nothing.
int IntraOpThreadsPerRank(int threads, int ranks);
// Sets what a memory forecast of such a run reads of ShareIntraOpThreads' settings: oneDNN's
// count, which its primitives' scratchpads are sized for (kernels/onednn_runtime.h); starts no
// thread (plan/planner.h).
void ShareForecastThreads(int threads, int ranks);

}  // namespace sluice
