// PipelineEngine: the step engine (step/step_engine.h) of `sluice train --stages P`. The GPT is
// split into P·V virtual stages (partition.h), every rank runs on its own thread with its own
// allocator, interpreter and GC (stage_runtime.h), and micro-batches flow through a schedule
// (schedules.h) over the in-process communicator (comm/local.h).
//
// One step: the P rank threads — started with the engine and kept for its life, the calling
// thread being rank 0's — begin together, each executes its action list, and the step ends when
// all have finished. The loss is the last stage's mean over micro-batches; the gradient norm
// is global (all-reduced at OPT). A failing rank aborts the communicator, every other rank wakes
// and stops, and Step throws the failing rank's StageError (naming rank, action, micro-batch);
// a receive waiting beyond options.timeout fails the same way. The engine is unusable afterwards.
//
// A parameter read by units of several ranks (a tied embedding and head) is held by each of them;
// their shares of its gradient are summed at OPT, so the copies stay bitwise equal
// (stage_runtime.h, docs/pipeline.md "Tied parameters"). State() and checkpoints hold it once.
//
// Distributed (options.distributed, `mpirun -np P·D sluice train --comm mpi`): the process runs the
// one rank it is, over MPI communicators, and every step ends with one all-reduce that brings
// every rank's figures (loss, norm, memory, time) to every process; the leader reports them.
// Parameters for evaluation are gathered to the leader; checkpoints are a shard per stage
// (written by replica 0's ranks) and an index written by the leader (io/checkpoint.h). With a
// sharded optimizer (`--shard-optimizer`), replica 0 gathers its stage's state slices first, so
// the shards are those of an unsharded run and resume on any P × D.
//
// Records (reports(), and "stages" in the metrics summary): per rank, the peak of its allocator
// over a step, the bytes released after send completion per step, the in-flight peak (measured,
// and the schedule's theory beside it), busy and idle time summed over steps, and the bubble
// (idle / (busy + idle)). Idle is the step's span (StepSpanNs: the first rank's start to the last
// one's end; under MPI the slowest rank's wall) minus busy, as the simulator's makespan minus busy.
// With options.trace_path the last step is written as a Chrome trace: one process per stage, a
// track of computes (F/B/W/OPT spans labelled chunk and micro-batch), a track of communication
// (receive waits, sends, the all-reduce) and an allocated-bytes counter.
//
// Post-validation (options.post_validate, `--post-validate`): every rank updates before the
// all-reduce of the norm and validates after it (StageSetup::post_validate); Summary() adds
// "post_validation": {"rollbacks": steps rolled back, "rollback_bytes": kept by all ranks} (and
// nothing without post-validation).
//
// Interlocked steps (post-validation on threads): Step's `next` (StepEngine::Step) announces the
// step after this one, and the ranks do not stop in between. Each rank ends a step by updating
// eagerly and posting the reduction of its norm partials and loss without waiting
// (Communicator::IallReduceSum), and goes straight on to the next step's actions; it waits for
// that reduction only at the next step's update point, where it validates the previous step. Step
// returns a step's figures once every rank has posted its reduction (the verdict follows from the
// reduced figures, EagerUpdateVerdict), while the ranks may be inside the next step. When a step
// fails validation (clipping fires, or a skip), every rank sees it at the same point — the next
// step's OPT, all of that step's messages received — and restores and redoes the step's update as
// the synchronous run does, drops the next step's gradients and runs that step again: results
// stay bitwise the synchronous run's, and the rollbacks count the redone steps. A Step without
// `next` ends the chain after its step (validated before Step returns); Drain undoes a step
// announced but not taken. The span of an
// interlocked step starts at the previous step's last end, so that spans add up to the run's time.
// With --trace the last two steps are traced, so that their overlap shows.
//
// Interlocked steps under MPI (post-validation, D = 1): the process's one rank runs its chain on
// a thread of its own (the driver) and posts each step's reduction over the pipeline communicator
// (MPI IallReduceSum); the calling thread meets it as on threads, then reduces the step's figures
// — with every rank's norm partials, so that each process tells the norm and verdict the ranks
// will — in one all-reduce over the world, and the trainer's stop agreement follows: both block
// only the calling thread, one step behind the ranks, so neither is a barrier between steps. A
// chain starts after the world barrier a synchronous step begins with (the leader may have
// evaluated). `post_validation.overlapped_starts` counts the steps some rank began before the
// previous step's reduction had completed on it (StageStep::began_ahead). With data parallelism
// (D > 1, and so --shard-optimizer) steps stay synchronous: the replicas' all-reduce and the
// sharded gather sit inside OPT around the eager update, and `next` is ignored.
//
// Thread-safety: one thread calls the engine; it runs its own rank threads inside Step. Every
// process of a distributed run calls the same methods in the same order (they are collective).
// Failure modes: the constructor throws InvalidArgument for a model that is not a GPT, a
// schedule that cannot exist (MakeSchedule), or a bad partition/layout (partition.h), and
// ResourceError when the system refuses a rank's thread.
//
// Example:
//   PipelineOptions p{.stages = 4, .schedule = ScheduleKind::kOneFOneB};
//   Trainer trainer(config, PipelineEngineFactory(p));
//   trainer.Run();
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/comm/mpi.h"
#include "sluice/pipeline/layout.h"
#include "sluice/pipeline/partition.h"
#include "sluice/pipeline/stage_runtime.h"
#include "sluice/schedule/schedules.h"
#include "sluice/step/step_engine.h"

namespace sluice::pipeline {

// One rank over the steps run so far.
struct StageReport {
  int stage = 0;
  int replica = 0;
  int64_t peak_allocated_bytes = 0;  // max over steps
  int64_t peak_reserved_bytes = 0;
  int64_t released_output_bytes = 0;             // per step (the last one)
  int64_t allocated_at_inflight_peak_bytes = 0;  // the last step's (StageStep says when)
  int64_t output_bytes = 0;  // one forward output of chunk 0 (0 on the loss stage)
  int inflight_peak = 0;     // chunk-micro-batches between F and B, max over steps
  std::vector<int> inflight_peak_per_chunk;
  int theoretical_inflight = 0;     // TheoreticalInFlight for this rank
  double busy_ms = 0, idle_ms = 0;  // sums over steps; idle: the step's span minus busy
  double comm_ms = 0;               // sum over steps: time inside the communicator (part of idle)
  double busy_cpu_ms = 0;           // sum over steps: CPU time of the computes (StageStep)
  int64_t rollback_bytes = 0;       // post-validation: what the rank keeps for a rollback
  double bubble() const { return busy_ms + idle_ms > 0 ? idle_ms / (busy_ms + idle_ms) : 0; }
};

class PipelineEngine final : public StepEngine {
 public:
  PipelineEngine(const EngineContext& context, PipelineOptions options);
  ~PipelineEngine() override;

  StepResult Step(int64_t step, int64_t first_batch, double lr) override;
  // With post-validation on threads, `next` lets the ranks go on into that step without a join:
  // see "Interlocked steps" above. Otherwise `next` is ignored.
  StepResult Step(int64_t step, int64_t first_batch, double lr,
                  const std::optional<NextStep>& next) override;
  bool RunningAhead() const override;
  void Drain() override;
  // Interlocked post-validation: how many times a rank began a step's first action before every
  // rank had finished the previous step's actions (StepProgress; 0 otherwise).
  int64_t overlapped_starts() const;
  // A tied parameter (and its optimizer state) once: the copy of the first rank holding it.
  std::map<std::string, Tensor> State() const override;
  // In-process: copies the tensors State() returns into the other ranks' copies of tied
  // parameters. Distributed: nothing (each rank loaded its own copy from the checkpoint).
  void StateLoaded() override;
  nlohmann::json Summary() const override;
  GcMode gc_mode() const override;  // every rank allocates from the same kind of allocator
  // memory_forecast.h: in-process only, and empty above its action limit (kForecastActionLimit).
  std::vector<StageMemoryForecast> Forecast() const override;
  bool leader() const override;
  bool distributed() const override;
  // `--shard-optimizer` under MPI with D > 1: each rank's State() holds its replica's slice of
  // the optimizer state (optimizer_state_slice), and TrySaveCheckpoint gathers the slices whole
  // to replica 0 before it writes (the checkpoint is the one an unsharded run writes).
  bool sharded_optimizer() const;
  OptimizerStateSlice optimizer_state_slice() const override;
  std::map<std::string, Tensor> GatherParams(Allocator& allocator) override;
  std::optional<std::string> TrySaveCheckpoint(
      const std::string& path, const std::map<std::string, std::string>& metadata) override;
  int AgreeOnStop(int mine, int64_t next_step) override;
  std::vector<std::string> TakeOutputFailures() override;
  std::string Describe() const override;
  std::vector<std::string> ReportLines() const override;

  // Rank `rank`'s parameters and optimizer state by name, sharing its memory: its own copy of a
  // tied parameter. In-process only (a distributed engine holds its one rank: rank 0 here).
  std::map<std::string, Tensor> RankState(int rank) const;
  const std::vector<StageReport>& reports() const;
  const Schedule& schedule() const;
  const Partition& partition() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// For Trainer(config, PipelineEngineFactory(options)).
EngineFactory PipelineEngineFactory(PipelineOptions options);

// The one check of a job's shape: --stages P ≥ 1, --data-parallel D ≥ 1, and P·D processes (P
// threads in one process, or P·D MPI processes). Throws InvalidArgument naming the options and,
// for MPI, the mpirun -np to use.
void CheckJobSize(int stages, int replicas, int processes);

// The communicators of `mpirun -np P·D sluice train --comm mpi`: CheckJobSize on the world, then
// world rank w joins the pipeline of replica w div P (rank = stage w mod P) and, when D > 1, the
// data-parallel group of its stage (rank = replica). Collective: every process constructs it.
// The world must outlive it; it must outlive the engine using distributed().
class MpiJob {
 public:
  MpiJob(MpiCommunicator& world, int stages, int replicas);
  ~MpiJob();
  PipelineOptions::Distributed distributed() const;

 private:
  MpiCommunicator& world_;
  int replicas_;
  std::unique_ptr<MpiCommunicator> pipe_, data_;
};

}  // namespace sluice::pipeline
