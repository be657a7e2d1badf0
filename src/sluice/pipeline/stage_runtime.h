// StageRuntime: one rank of a pipeline — its chunks' programs, parameters and optimizer state in
// its own CachingAllocator, and the loop that executes its list of schedule actions (schedule.h)
// for one training step over a Communicator (comm/communicator.h).
//
// Its chunks (virtual stages: GPT slices, partition.h) are built by a StageProgram
// (step/stage_program.h), the same builder the single-stage engine uses: per chunk the forward
// program keeping exactly the values its backward reads, the backward (parameter gradients and
// "x.grad" for the previous stage, seeded by "y.grad" from the next one) or its B/W split when the
// schedule splits the backward, and one optimizer program for all of the rank's parameters. This
// file adds what only a pipeline has: the action loop, messages, output release, the records.
//
// Executing the actions of one step, micro-batch (c, m) by micro-batch:
//   RECV_F  posts a receive of the input "x" f32[B, T, C] (memory from this rank's allocator).
//   F       waits for that input (or binds "ids" on the first stage, "targets" on the last),
//           runs the forward, and keeps in (c, m)'s scope only what backward reads — the explicit
//           forward→backward hand-off. The output "y" is held for its send.
//   SEND_F  starts sending "y". Output release (on by default): once the send has *completed* —
//           the receiver holds its own copy — the runtime drops "y" unless backward reads it.
//           Completion is checked before every action and after every wait for a message, and
//           awaited before B of (c, m). Never earlier: a buffer freed under a running send would
//           corrupt the receiver's input.
//           Release off: "y" is kept until B of (c, m) has run (what frameworks holding the
//           output object do), the baseline the saving is measured against.
//   RECV_B  posts a receive of "y.grad".  B  runs the backward (or its B half: input gradients),
//           accumulates parameter gradients, and holds "x.grad" for SEND_B.  W runs the W half.
//   OPT     with data parallelism, the sum of every gradient over the replicas (all-reduce);
//           then, for each tied parameter (one read by units on several ranks, each holding a
//           copy), every holder sends its units' shares of the gradient to the other holders and
//           sums all shares in unit order (StageProgram::FinishGradients: the same sum on every
//           copy, bitwise one stage's); then the mean over micro-batches (and replicas), the global
//           gradient norm (all-reduce of every parameter's sum of squares, each rank filling its
//           own — a tied one only on the rank of its first unit — summed in model order: bitwise
//           the single stage's norm), clipping, and the optimizer in place, identical on every
//           copy. With post_validate the optimizer runs first, unclipped, before the norm's
//           all-reduce, and is validated after it (rolled back and redone, or withheld, where
//           clipping or the finite check intervenes): the same results, bit for bit.
// Message tags: the receiving virtual stage v, micro-batch m and direction d: ((v·M + m)·2 + d)
// mod (kMaxTag + 1); per-peer order (validated schedules) keeps wrapped tags unambiguous. OPT's
// shares of tied parameters take kMaxTag, kMaxTag − 1, … (one per share of the whole model): by
// OPT every message of the step has been received, and per-peer order covers the rest.
// Gradients of one parameter are summed in micro-batch order and the norm per parameter in model
// order, as on one stage, so losses, norms, weights and optimizer state match single-stage
// training bit for bit (with one BLAS thread on both sides), clipping included.
//
// Records per step (StageStep): the allocator's peak over the step and its allocated bytes at the
// in-flight peak, bytes released after their send completed, chunk-micro-batches in flight
// between F and B (peak, per chunk), busy time (F, B, W, OPT compute; wall and thread CPU), time
// inside the communicator and, when tracing, every action's span and a memory sample after it.
//
// Failure: any error inside an action aborts the communicator with, and throws, a StageError
// naming the rank, step, action and micro-batch; a rank woken by another's abort throws the
// CommAborted it got. Thread-safety: one thread runs a StageRuntime; ranks run on their own
// threads (or processes) and share nothing but the communicator.
//
// Example (what PipelineEngine does for each rank r on its own thread):
//   StageRuntime rank(setup, r);
//   StageStep s = rank.RunStep(/*step=*/0, /*first_batch=*/0, /*lr=*/1e-3, world.comm(r),
//   /*trace=*/false);
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/comm/communicator.h"
#include "sluice/core/error.h"
#include "sluice/core/memory_stats.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/nn/model.h"
#include "sluice/schedule/schedule.h"
#include "sluice/step/stage_program.h"
#include "sluice/step/task.h"
#include "sluice/step/train_config.h"

namespace sluice::pipeline {

// A rank failed while executing an action; the message names the rank, step, action and
// micro-batch, and the cause.
class StageError : public Error {
  using Error::Error;
};

// Fault injection for tests of failure handling: rank `rank` fails at its action of `kind` for
// micro-batch `micro_batch` (chunk 0) in step `step` — by throwing, or by skipping the action
// (a skipped send leaves its receiver waiting until the timeout).
// compute_sleep_ns makes every F, B and W of every rank sleep that long inside its timed compute
// (an unsplit B twice: its W is part of it) — a slow device whose costs the machine's load does
// not move, for tests of the simulator against measured runs.
struct FaultInjection {
  enum class Mode { kNone, kThrow, kSkip };
  Mode mode = Mode::kNone;
  int rank = 0;
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  int64_t step = 0;
  int64_t compute_sleep_ns = 0;
  // Interlocked post-validation (StageRuntime::RunStepInterlocked): rank `rank` holds before its
  // last action of step hold_step until rank 0 has begun step hold_step + 1 (StepProgress), and
  // fails naming both when that does not happen within the communicator's timeout — a run whose
  // steps did not interlock. -1: no hold.
  int64_t hold_step = -1;
};

// Interlocked post-validation: how far each rank of one process got, shared by their threads.
// Thread-safe (one mutex).
class StepProgress {
 public:
  explicit StepProgress(int ranks);
  // Rank `rank` begins step `step`'s actions. Returns true, and counts it, when some rank had not
  // yet finished step − 1's actions: the two steps overlap. Causal, not timed: both events are
  // recorded by the ranks themselves, in their order under this object's mutex.
  bool Begin(int rank, int64_t step);
  // Rank `rank` finished step `step`'s actions (its update included).
  void Finish(int rank, int64_t step);
  // Waits until rank `rank` has begun step `step`; false when `timeout` passed first.
  bool WaitBegun(int rank, int64_t step, std::chrono::milliseconds timeout);
  // Begins that overlapped the previous step, summed over ranks and steps.
  int64_t overlapped_starts() const;

 private:
  mutable Mutex mu_;
  CondVar cv_;
  int ranks_;
  std::vector<int64_t> begun_ GUARDED_BY(mu_);       // [rank]: the last step it began
  std::map<int64_t, int> finished_ GUARDED_BY(mu_);  // step → ranks that finished it
  int64_t overlapped_ GUARDED_BY(mu_) = 0;
};

// What every rank is built from (shared, read-only while ranks run).
struct StageSetup {
  const TrainConfig* config = nullptr;
  const Task* task = nullptr;
  ModelUnits units;              // the model's, in order (Task::Units)
  int64_t micro_batch_size = 1;  // sequences per micro-batch (of one replica)
  int64_t seq_len = 1;
  Schedule schedule;
  std::vector<UnitRange> slices;          // [P·V] by virtual stage: the units each one runs
  std::vector<std::string> model_params;  // the whole model's parameter names, model order
  // The whole model's tied parameters (nn/training_program.h TiedParams): every rank reading one
  // holds a copy, and OPT sums the units' shares of its gradient across them (StageRuntime).
  std::vector<TiedParam> tied;
  bool release_outputs = true;
  // Post-validation (--post-validate): OPT updates before the all-reduce of the norm and the
  // loss, then validates — accepting, or rolling back and redoing the update clipped, or
  // withholding it (StageProgram::UpdateEagerly, ValidateEagerUpdate): bitwise the same results.
  bool post_validate = false;
  int threads = 1;  // intra-op threads per rank
  FaultInjection fault;
  // Interlocked post-validation on threads (PipelineEngine): the ranks' shared progress record
  // (FaultInjection::hold_step waits on it). Null otherwise.
  StepProgress* progress = nullptr;
  // Data parallelism: this rank belongs to replica `replica` of `replicas`; each replica takes
  // rows [replica·b, (replica+1)·b) of every micro-batch of b·replicas sequences, and OPT sums the
  // gradients over `data` (the replicas of this stage) before the norm. Null when replicas = 1.
  int replica = 0, replicas = 1;
  Communicator* data = nullptr;
};

struct TraceSpan {
  std::string name;  // "F", "B", "W", "SEND_F", "RECV_F" (the wait), "OPT", ...
  int chunk = 0, micro_batch = 0;
  int64_t begin_ns = 0, end_ns = 0;  // steady clock
};

struct StageStep {
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t released_output_bytes = 0;  // forward outputs dropped after their send completed
  // Allocated bytes right before the step's first backward (after its input arrived): the moment
  // every schedule here reaches its in-flight peak. Release on and off differ there by exactly
  // the outputs released (nothing else differs): what release saves at the in-flight peak.
  int64_t allocated_at_inflight_peak_bytes = 0;
  int inflight_peak = 0;  // chunk-micro-batches between F and B
  std::vector<int> inflight_peak_per_chunk;
  int awaiting_weight_peak = 0;  // between B and W (split backward)
  int64_t busy_ns = 0;           // F, B, W and OPT compute (wall clock)
  int64_t busy_cpu_ns = 0;       // the same computes' CPU time on this rank's thread: less than
                                 // busy_ns by the time the thread waited for a core (BLAS
                                 // worker threads, when threads > 1, are not counted)
  int64_t comm_ns = 0;           // inside the communicator: posting, testing and waiting for
                                 // messages (a wait for a message not yet sent included),
                                 // the all-reduces
  int64_t begin_ns = 0;          // steady clock when this rank began the step
  int64_t wall_ns = 0;           // the whole step on this rank
  // Time this rank's thread was ready to run but waited for a core (ThreadCoreWaitNs over the
  // step); -1 where the system does not say. The step simulator assumes a core per stage: a run
  // whose threads waited is not the machine it models (docs/simulator.md, "Accuracy").
  int64_t core_wait_ns = -1;
  std::vector<double> losses;  // [M] on the last virtual stage's rank; empty elsewhere
  double grad_norm = 0;
  bool updated = true;  // false: the step's loss or gradient norm was not finite (no update)
  // Post-validation (StageSetup::post_validate): whether the eager update was rolled back (redone
  // clipped, or withheld), and the bytes kept for a rollback (StageProgram::RollbackBytes).
  bool rolled_back = false;
  int64_t rollback_bytes = 0;
  // Interlocked post-validation (RunStepInterlocked): this rank's contribution to the step's
  // reduction — its parameters' sums of squares by model order, then the loss sum — from which the
  // engine tells the step's norm and verdict (EagerUpdateVerdict) as every rank will; and
  // `redo`: the previous step failed its validation at this step's update point, so this run was
  // discarded (no update, gradients dropped) and the step must run again.
  std::vector<double> norm_partials;
  bool redo = false;
  // Interlocked: this rank began the step while the reduction of the previous step, which it had
  // posted, had not yet completed here (a Test when the step began: some rank's part had not
  // arrived) — the step overlapped the previous one's validation, which a synchronous step waits
  // for inside its OPT. Causal, not timed. Processes without a shared StepProgress count these.
  bool began_ahead = false;
  std::vector<TraceSpan> spans;      // when tracing
  std::vector<MemorySample> memory;  // when tracing
  // Profile (step_simulator.h's costs): every compute's wall and thread CPU time, one sample per
  // action, [kind] = F, B, W, OPT before its all-reduce ("optimizer"), OPT after it ("update");
  // and every message post (Isend or Irecv call): its thread CPU time, split by whether the call
  // copied the message (the later of a matched pair copies, comm/local.h). CPU, not wall: a
  // copying Isend wakes its blocked receiver, and on a loaded machine the wall time of the call
  // then holds the time the sender lost its core to it — far more than the copy (docs/simulator.md
  // has the figures) — which the simulator charged on every message.
  struct Sample {
    int chunk = 0, micro_batch = 0;  // OPT's: 0, 0
    int64_t wall_ns = 0, cpu_ns = 0;
  };
  std::vector<Sample> computes[5];
  std::vector<int64_t> post_ns, post_copy_ns;  // CPU of posts that did not / did copy a message
  int64_t message_bytes = 0;  // the largest message: a chunk's "x" or "y" (its gradient alike)
  // The waits a replay does not see in the costs above: when a message this rank sent was copied
  // by its Isend (end_ns; the receiver may be blocked on it), every wait for a receive that had
  // not completed when the wait began (begin_ns, end_ns) — joined by message, the delay from a
  // message's arrival to its blocked receiver running — and OPT's all-reduce of the norm.
  // `message`: (receiving virtual stage · M + micro-batch) · 2 + direction (0 F, 1 B).
  struct MessageEvent {
    int64_t message = 0;
    int64_t begin_ns = 0, end_ns = 0;
  };
  std::vector<MessageEvent> copied_sends, blocked_receives;
  // Every send's post (begin_ns, end_ns of the Isend call), copied or not: with the blocked
  // receives, the round trips of a pipeline's messages on each rank's own clock (CostProfiler's
  // transit under MPI).
  std::vector<MessageEvent> sends;
  int64_t allreduce_begin_ns = 0, allreduce_end_ns = 0;
  // The replicas' gradient all-reduce at the start of OPT (data parallelism); -1 without replicas.
  int64_t data_allreduce_ns = -1;
};

// The span of one step over ranks that share a clock (threads of one process): from the earliest
// rank's start to the latest rank's end. A stage's idle time in the step is the span minus its
// busy time, its bubble idle / span: the stage's time not computing within the step the pipeline
// took — the simulator's definition with its makespan (step_simulator.h). A rank's own wall is
// shorter by its start after the first and its end before the last, which a per-rank bubble
// would leave out. (Ranks in processes without a common clock use their slowest rank's wall.)
int64_t StepSpanNs(const std::vector<StageStep>& steps);

// The calling thread's time so far runnable but not running — waiting in the run queue for a core
// that other threads held — in ns: the second figure of Linux's /proc/thread-self/schedstat. -1
// where the system does not say (not Linux, or a kernel without scheduler statistics).
int64_t ThreadCoreWaitNs();

// The rank that runs unit `unit` (a name of setup.units) under setup's partition and schedule.
int RankOfUnit(const StageSetup& setup, const std::string& unit);

// The StageProgram of rank `rank` (its V chunks, its recompute policy) from `setup`, allocating
// from `allocator` — or, with plan_only, allocating nothing (step/memory_replay.h).
std::unique_ptr<StageProgram> BuildStageProgram(const StageSetup& setup, int rank,
                                                Allocator& allocator, bool plan_only = false);

class StageRuntime {
 public:
  StageRuntime(const StageSetup& setup, int rank);
  ~StageRuntime();
  StageRuntime(const StageRuntime&) = delete;
  StageRuntime& operator=(const StageRuntime&) = delete;

  // Executes this rank's actions for step `step` (0-based) at learning rate `lr`, on training
  // batches first_batch … first_batch + M − 1 (StepEngine::Step).
  StageStep RunStep(int64_t step, int64_t first_batch, double lr, Communicator& comm, bool trace);

  // Interlocked post-validation (threads or MPI; setup.post_validate, no data parallelism): as
  // RunStep, but OPT first validates the previous step's eager update, whose reduction it waits for
  // only now — when that fails (clipping or a skip), it restores and redoes that update, drops this
  // step's gradients, restores the buffers its forwards moved (StageProgram::SaveBuffers, saved
  // as the run began) and returns with `redo` set (run this step again) — then updates eagerly and
  // posts this step's reduction without waiting (IallReduceSum); its StageStep carries the
  // partials (norm_partials). Settle or DiscardPending ends the chain.
  StageStep RunStepInterlocked(int64_t step, int64_t first_batch, double lr, Communicator& comm,
                               bool trace);
  // Waits for the pending step's reduction and validates its eager update (nothing pending:
  // kAccepted).
  StageProgram::Validation Settle();
  // Waits for the pending step's reduction and undoes its eager update (StageProgram::
  // DiscardEagerUpdate) and its forwards' moves of the buffers: the state is the previous step's.
  void DiscardPending();

  int rank() const;
  // This rank's parameters and optimizer state by name (sharing its memory).
  std::map<std::string, Tensor> State() const;
  // The GC mode of this rank's programs: config.gc resolved against its allocator.
  GcMode gc_mode() const;

 private:
  struct Impl;
  struct StepRun;  // the execution of one step (stage_runtime.cc)
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::pipeline
