#include "sluice/pipeline/pipeline_engine.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/comm/local.h"
#include "sluice/comm/rank_order_sum.h"
#include "sluice/core/clock.h"
#include "sluice/core/files.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_pool.h"
#include "sluice/io/checkpoint.h"
#include "sluice/io/chrome_trace.h"
#include "sluice/nn/optimizer.h"
#include "sluice/pipeline/cost_profiler.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/schedule/step_simulator.h"
#include "sluice/step/stage_program.h"

namespace sluice::pipeline {

namespace {

// The figures one rank contributes to the end-of-step all-reduce of a distributed run: the
// columns of its row of the reduced [P·D, kReducedFigures] tensor.
enum ReducedFigure {
  kPeakAllocated,
  kPeakReserved,
  kReleased,
  kAtInflightPeak,
  kInflight,
  kBusyNs,
  kBusyCpuNs,
  kCommNs,
  kWallNs,
  kLossSum,
  kLosses,
  kNorm,
  kRollbackBytes,
  kBeganAhead,  // interlocked: whether the rank began the step before the last one was reduced
  kReducedFigures
};

// Writes `s`'s figures into its row of the end-of-step all-reduce (all but kNorm and
// kBeganAhead, which each kind of step sets itself).
void PutReducedFigures(const StageStep& s, double* row) {
  double loss_sum = 0;
  for (double l : s.losses) loss_sum += l;
  row[kPeakAllocated] = static_cast<double>(s.peak_allocated_bytes);
  row[kPeakReserved] = static_cast<double>(s.peak_reserved_bytes);
  row[kReleased] = static_cast<double>(s.released_output_bytes);
  row[kAtInflightPeak] = static_cast<double>(s.allocated_at_inflight_peak_bytes);
  row[kInflight] = s.inflight_peak;
  row[kBusyNs] = static_cast<double>(s.busy_ns);
  row[kCommNs] = static_cast<double>(s.comm_ns);
  row[kBusyCpuNs] = static_cast<double>(s.busy_cpu_ns);
  row[kWallNs] = static_cast<double>(s.wall_ns);
  row[kLossSum] = loss_sum;
  row[kLosses] = static_cast<double>(s.losses.size());
  row[kRollbackBytes] = static_cast<double>(s.rollback_bytes);
}

bool IsStageError(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const StageError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

struct PipelineEngine::Impl {
  PipelineOptions options;
  StageSetup setup;
  Partition partition;
  std::string layout;                                // the partition's --layout text
  std::unique_ptr<LocalWorld> world;                 // in-process: every rank here
  std::vector<std::unique_ptr<StageRuntime>> ranks;  // in-process: P; distributed: this rank
  std::vector<StageReport> reports;                  // every rank of the job, by world rank
  std::vector<std::vector<std::string>> owned;       // [stage]: its parameter names, model order
  std::vector<ParamSpec> params;                     // the whole model's
  std::exception_ptr failure;                // a failed step leaves the communicator aborted
  std::vector<std::string> output_failures;  // TakeOutputFailures: trace and costs files
  // Writes a side output with `write`; a failure is kept for TakeOutputFailures, never thrown.
  void WriteSideOutput(const std::function<void()>& write) {
    try {
      write();
    } catch (const IoError& e) {
      output_failures.push_back(e.what());
    }
  }
  std::unique_ptr<CostProfiler> profiler;  // with options.profile_path
  int64_t rollbacks = 0;  // post-validation: steps whose eager update was rolled back

  // Interlocked post-validation (options.post_validate on threads): the ranks run a chain of
  // steps without joining between them — RankChain on every rank, started by StartChain on the
  // `driver` thread — and Step meets them through `chain`: it sets what each step is and what
  // follows it, and takes each step's StageSteps once every rank has posted its reduction.
  struct Chain {
    struct Spec {
      int64_t step = 0, first_batch = 0;
      double lr = 0;
      bool trace = false;
    };
    enum class After { kContinue, kStop, kDiscard };
    Mutex mu;
    CondVar cv;                                     // notified at every change below
    std::map<int64_t, Spec> specs GUARDED_BY(mu);   // the steps to run, by index
    std::map<int64_t, After> after GUARDED_BY(mu);  // what each rank does after a step
    // [step][rank]: the rank's StageStep of the step, once it posted the step's reduction.
    std::map<int64_t, std::vector<std::optional<StageStep>>> posted GUARDED_BY(mu);
    std::map<int64_t, int> settled GUARDED_BY(mu);  // ranks that ended the chain after a step
    std::exception_ptr error GUARDED_BY(mu);        // a rank failed: the chain is over
    bool ended GUARDED_BY(mu) = true;               // no driver runs the ranks
  };
  std::unique_ptr<Chain> chain;            // post-validation on threads; null otherwise
  std::unique_ptr<StepProgress> progress;  // likewise: how far each rank got
  std::thread driver;  // runs stage_threads (or, under MPI, the rank) over one chain
  int64_t ahead = -1;  // the step announced by Step's `next` and running ahead; -1: none
  // Interlocked under MPI: steps some rank began before the previous step's reduction had
  // completed on it (StageStep::began_ahead), summed over the world's ranks and the steps.
  int64_t began_ahead = 0;
  // The ranks a chain runs in this process: P on threads, the one rank under MPI.
  int chain_ranks() const { return distributed() ? 1 : options.stages; }
  int64_t chain_last_end_ns = -1;        // the previous step's last rank end in this chain
  std::vector<StageStep> traced_before;  // the traced step before the last (its spans)
  // Distributed: the ranks may be far apart — at start-up, after the leader's evaluation
  // (GatherParams), after a checkpoint — so the next AgreeOnStop first waits for every rank
  // without the communicator's timeout.
  bool apart = true;
  void StartChain(int64_t first);
  void RankChain(int r, int64_t step);
  // Waits until every rank posted `step` (and with `settle`, ended the chain after it); rethrows
  // a rank's failure once the driver is joined.
  std::vector<StageStep> AwaitChain(int64_t step, bool settle);
  StepResult StepInterlocked(int64_t step, int64_t first_batch, double lr,
                             const std::optional<StepEngine::NextStep>& next);
  // Interlocked under MPI: the figures of this rank's step (posted by its chain, which may be
  // inside the next step) to every process by one all-reduce over the world on the calling
  // thread — no barrier for the ranks — with every rank's norm partials, from which each process
  // tells the step's norm and verdict as the ranks will.
  StepResult FinishDistributedInterlocked(int64_t step, StageStep s, int64_t begin_ns);
  bool TracedStep(int64_t step) const {
    if (options.trace_path.empty()) return false;
    const int64_t last = setup.config->steps - 1;
    return step == last || (chain != nullptr && step == last - 1);  // the last two, interlocked
  }
  // What post-validation kept and redid: null without it.
  nlohmann::json PostValidationSummary() const {
    if (!options.post_validate) return nullptr;
    int64_t bytes = 0;
    for (const StageReport& r : reports) bytes += r.rollback_bytes;
    nlohmann::json out = {{"rollbacks", rollbacks}, {"rollback_bytes", bytes}};
    if (progress != nullptr) out["overlapped_starts"] = progress->overlapped_starts();
    if (chain != nullptr && distributed()) out["overlapped_starts"] = began_ahead;
    return out;
  }
  // In-process: the stages' threads, kept for the engine's life (the caller's thread is stage
  // 0's), so that a step starts no thread and each stage's thread-local state — its caches in the
  // allocator and the storage pool, the kernels' scratch — carries over from step to step.
  // Declared last: its workers are joined before the ranks they ran are destroyed.
  std::unique_ptr<ThreadPool> stage_threads;

  bool distributed() const { return options.distributed.has_value(); }
  int world_rank() const { return distributed() ? options.distributed->world->rank() : 0; }
  int stage() const { return distributed() ? options.distributed->pipe->rank() : 0; }
  int replica() const { return world_rank() / options.stages; }

  std::vector<StageStep> RunLocal(int64_t step, int64_t first_batch, double lr, bool trace);
  // Sharded optimizer (ZeRO stage 1), for a checkpoint: the optimizer state tensors of the
  // parameters this stage owns (`names`, in the order the shard's file holds them), each gathered
  // whole over the data-parallel communicator from every replica's slice onto replica 0 — one
  // tensor at a time, as the file is written. On replica 0, `gather(name)` returns the tensor
  // whole (in the heap, DefaultAllocator, outside the stage's allocator and its budget), the
  // names in `names` order; before returning, GatherOptimizerState drains the gathers of the names
  // `write` did not ask for (a write that failed part way), so that no replica waits on a send.
  // The other replicas send their slices of `state` (this rank's State()) and `write` is not
  // called. Collective over the stage's replicas.
  void GatherOptimizerState(
      const std::map<std::string, Tensor>& state, const std::vector<std::string>& names,
      const std::function<void(const std::function<Tensor(const std::string&)>& gather)>& write);
  StageStep RunDistributed(int64_t step, int64_t first_batch, double lr, bool trace);
  // Sums `t` over the world ranks in place (collective). A timeout — a rank or its host is gone —
  // is rethrown saying where this rank stood: "stage S of replica R <what>: <the timeout>".
  void AllReduceOverWorld(Tensor& t, std::string_view what) {
    try {
      options.distributed->world->AllReduceSum(t);
    } catch (const CommTimeout& e) {
      throw CommTimeout(
          fmt::format("stage {} of replica {} {}: {}", stage(), replica(), what, e.what()));
    }
  }
  // Adds rank `world_rank`'s step to its report; its idle time is the step's span (StepSpanNs)
  // minus its busy time.
  void Record(int world_rank, const StageStep& s, int64_t released, int64_t span_ns);
  // An interlocked step's validation, as every rank computes it: `sources` (one per rank, in rank
  // order) each hold `n` doubles — the rank's norm partials and last its loss, zeros where another
  // rank owns them — summed in rank order; sets `result`'s gradient norm and whether it updated,
  // counts a rollback, and returns the verdict.
  StageProgram::Validation Validate(const std::vector<const void*>& sources, int64_t n,
                                    StepResult& result);
  // Records every rank's row of the end-of-step all-reduce `all` ([W, columns]) over the step's
  // span, and this rank's per-chunk figures from its own step `s`; sets `result`'s loss (the mean
  // over every rank's losses) and peaks (the largest of any rank's).
  void RecordReducedFigures(const Tensor& all, int64_t columns, const StageStep& s, int64_t span_ns,
                            StepResult& result);
  void WriteTrace(const std::vector<StageStep>& steps, int first_stage,
                  const std::string& path) const;
};

PipelineEngine::PipelineEngine(const EngineContext& ctx, PipelineOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  impl.options = std::move(options);
  const TrainConfig& config = ctx.config;
  const int P = impl.options.stages;
  const int D = impl.distributed() ? impl.options.distributed->replicas : 1;
  CheckJobSize(P, D, impl.distributed() ? impl.options.distributed->world->size() : P);
  if (impl.distributed()) {
    const auto& d = *impl.options.distributed;
    SLUICE_CHECK(d.pipe->size() == P && (D == 1 || (d.data != nullptr && d.data->size() == D)),
                 "pipeline communicators do not match --stages {} and --data-parallel {}", P, D);
  }
  PipelineLayout layout = LayOutPipeline(ctx, impl.options, D);
  impl.setup = std::move(layout.setup);
  impl.partition = std::move(layout.partition);
  impl.layout = std::move(layout.layout);
  const int S = impl.setup.schedule.virtual_stages();
  impl.params = ctx.model.params;
  // Stages on threads share the process's cores: intra-op threads (BLAS included) are divided.
  impl.setup.threads = ShareIntraOpThreads(ctx.threads, impl.distributed() ? 1 : P);

  // Which stage owns which parameter (for gathering and the checkpoint index: a tied parameter,
  // held by every rank reading it, is owned by the first), and the largest output a rank sends
  // (for its report).
  impl.owned.resize(P);
  std::vector<int64_t> output_bytes(static_cast<size_t>(P), 0);
  std::set<std::string> owned;
  for (int v = 0; v < S; ++v) {
    const Model piece = ctx.task.BuildPiece(impl.setup.micro_batch_size, impl.setup.slices[v]);
    const int rank = impl.setup.schedule.RankOf(v);
    for (const ParamSpec& p : piece.params) {
      if (owned.insert(p.name).second) impl.owned[rank].push_back(p.name);
    }
    if (std::optional<ValueId> y = piece.forward.Find(kChunkOutput)) {
      output_bytes[rank] =
          std::max(output_bytes[rank], static_cast<int64_t>(piece.forward.Bytes(*y)));
    }
  }

  if (!impl.options.profile_path.empty()) {
    impl.profiler =
        std::make_unique<CostProfiler>(impl.setup.schedule, ProfileJob(impl.setup, impl.layout));
  }
  if (impl.distributed()) {
    impl.setup.replica = impl.replica();
    impl.setup.replicas = D;
    impl.setup.data = impl.options.distributed->data;
    impl.ranks.push_back(std::make_unique<StageRuntime>(impl.setup, impl.stage()));
    // Interlocked steps over MPI: the rank runs its chain on a thread of its own, the caller's
    // thread reduces the figures a step behind. Not with data parallelism: the replicas' gradient
    // all-reduce and the sharded optimizer's gather sit inside OPT, around the eager update.
    if (impl.options.post_validate && D == 1) impl.chain = std::make_unique<Impl::Chain>();
  } else {
    for (int r = 0; r < P; ++r) impl.ranks.push_back(std::make_unique<StageRuntime>(impl.setup, r));
    impl.world =
        std::make_unique<LocalWorld>(P, LocalWorldOptions{.timeout = impl.options.timeout});
    impl.stage_threads = std::make_unique<ThreadPool>(P, ThreadPool::Jobs::kOwnWork);
    if (impl.options.post_validate) {
      impl.chain = std::make_unique<Impl::Chain>();
      impl.progress = std::make_unique<StepProgress>(P);
      impl.setup.progress = impl.progress.get();  // the ranks hold impl.setup by reference
    }
  }
  const ScheduleOptions sched = ScheduleOptionsOf(impl.options, config.microbatches);
  for (int w = 0; w < P * D; ++w) {
    StageReport rep;
    rep.stage = w % P;
    rep.replica = w / P;
    rep.output_bytes = output_bytes[static_cast<size_t>(rep.stage)];
    rep.theoretical_inflight = TheoreticalInFlight(sched, rep.stage);
    rep.inflight_peak_per_chunk.assign(impl.setup.schedule.chunks, 0);
    impl.reports.push_back(rep);
  }
}

PipelineEngine::~PipelineEngine() {
  try {
    Drain();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a failed chain is over; nothing to undo
  }
  if (impl_->driver.joinable()) impl_->driver.join();
}

void PipelineEngine::Impl::StartChain(int64_t first) {
  {
    MutexLock lock(&chain->mu);
    chain->ended = false;
  }
  if (distributed()) {
    // One rank: a failing action has already ended the job (MPI_Abort); anything else thrown
    // (a reduction that timed out between actions) is rethrown by Step on the caller's thread.
    driver = std::thread([this, first] {
      std::exception_ptr error;
      try {
        RankChain(0, first);
      } catch (...) {
        error = std::current_exception();
      }
      MutexLock lock(&chain->mu);
      if (error && !chain->error) chain->error = error;
      chain->ended = true;
      chain->cv.NotifyAll();
    });
    return;
  }
  driver = std::thread([this, first] {
    const int P = options.stages;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
    stage_threads->RunOnAll([&](int r) {
      try {
        RankChain(r, first);
      } catch (...) {
        errors[r] = std::current_exception();
        std::string what = fmt::format("stage {} failed", r);
        try {
          std::rethrow_exception(errors[r]);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the generic message stands
        }
        world->comm(r).Abort(what);  // the first abort wins: a StageError's already did
        MutexLock lock(&chain->mu);
        if (!chain->error) chain->error = errors[r];
        chain->cv.NotifyAll();
      }
    });
    // Report the rank that failed first — its StageError; the others were woken by its abort.
    std::exception_ptr first_error;
    for (const std::exception_ptr& e : errors) {
      if (e && (!first_error || IsStageError(e))) first_error = e;
      if (first_error && IsStageError(first_error)) break;
    }
    MutexLock lock(&chain->mu);
    if (first_error) chain->error = first_error;
    chain->ended = true;
    chain->cv.NotifyAll();
  });
}

// One rank's chain: each step's actions, its reduction posted at its end (StageStep to `posted`),
// then on to the next step when Step announced it, else the last validation. A step whose run
// was discarded (the previous step failed validation at its update point) runs again.
void PipelineEngine::Impl::RankChain(int r, int64_t step) {
  Chain& c = *chain;
  Communicator& comm = distributed() ? *options.distributed->pipe : world->comm(r);
  bool began_ahead = false;  // a discarded run of the step began ahead: the step did
  for (;;) {
    Chain::Spec spec;
    {
      MutexLock lock(&c.mu);
      spec = c.specs.at(step);  // set before any rank could reach it
    }
    StageStep s =
        ranks[r]->RunStepInterlocked(spec.step, spec.first_batch, spec.lr, comm, spec.trace);
    began_ahead = began_ahead || s.began_ahead;
    if (s.redo) continue;
    s.began_ahead = std::exchange(began_ahead, false);
    Chain::After after = Chain::After::kStop;
    {
      MutexLock lock(&c.mu);
      auto& slot = c.posted[step];
      slot.resize(static_cast<size_t>(chain_ranks()));
      slot[r] = std::move(s);
      c.cv.NotifyAll();
      while (c.after.count(step) == 0 && !c.error) c.cv.Wait(&c.mu);
      if (c.error) return;  // another rank failed; the driver reports its error
      after = c.after.at(step);
    }
    if (after == Chain::After::kContinue) {
      ++step;
      continue;
    }
    if (after == Chain::After::kStop) {
      ranks[r]->Settle();
    } else {
      ranks[r]->DiscardPending();
    }
    MutexLock lock(&c.mu);
    ++c.settled[step];
    c.cv.NotifyAll();
    return;
  }
}

std::vector<StageStep> PipelineEngine::Impl::AwaitChain(int64_t step, bool settle) {
  Chain& c = *chain;
  const size_t P = static_cast<size_t>(chain_ranks());
  std::vector<StageStep> steps;
  {
    MutexLock lock(&c.mu);
    while (!c.error) {
      const auto it = c.posted.find(step);
      const bool all_posted =
          it != c.posted.end() && it->second.size() == P &&
          std::all_of(it->second.begin(), it->second.end(),
                      [](const std::optional<StageStep>& x) { return x.has_value(); });
      if (all_posted && (!settle || c.settled[step] == static_cast<int>(P))) break;
      c.cv.Wait(&c.mu);
    }
    if (!c.error) {
      for (std::optional<StageStep>& x : c.posted[step]) steps.push_back(std::move(*x));
      // Every rank has read what it needs of this step and the previous one (a rank posts a step
      // after reading the decision that led to it; it settles after reading this step's).
      c.posted.erase(step);
      c.specs.erase(step);
      c.after.erase(c.after.begin(), c.after.lower_bound(settle ? step + 1 : step));
      c.settled.erase(step);
    } else {
      while (!c.ended) c.cv.Wait(&c.mu);
    }
  }
  if (settle || steps.empty()) {
    if (driver.joinable()) driver.join();
    ahead = -1;
    chain_last_end_ns = -1;
  }
  if (steps.empty()) {
    MutexLock lock(&c.mu);
    failure = c.error;
    std::rethrow_exception(failure);
  }
  return steps;
}

namespace {

// Writes the costs file; a run with post-validation says so in its "measured" (its update held
// the rollback copy, which the simulator then does not charge again: plan/simulation.h).
void WriteCosts(StepCosts costs, const std::string& path, bool post_validate) {
  if (post_validate) costs.measured["post_validate"] = true;
  WriteFileAtomic("--profile-out costs file", path, CostsToJson(costs).dump(2) + "\n");
}

// A distributed run's costs: every process profiled its own rank (`profiler`); all-reduces over
// the world bring replica 0's ranks to every process. A rank's figures are its own medians (and
// its mean wait for a core); the message costs are the mean of the ranks' medians; the all-reduce
// of the norm is, per step, the shortest of the ranks' (the last rank to reach it waits least),
// averaged over the steps as in-process; the replicas' gradient all-reduce likewise per stage,
// the shortest of the stage's replicas'; and the transit of a message from the steps' own round
// trips (TransitInStepMs over every replica's: what a message cost in the step, the network, a
// waiting rank's wake-up and its wait for a core included), split into latency and bytes by the
// cost per byte of every neighbour pair's ping-pong (MeasureTransit). Collective.
StepCosts GatherCosts(const CostProfiler& profiler, int stage, int replica,
                      const PipelineOptions::Distributed& d) {
  StepCosts mine = profiler.Costs();
  Communicator& world = *d.world;
  const bool contributes = replica == 0;
  const int P = mine.stages, V = mine.chunks;
  const int fields = 6 * V + 8;
  Tensor all = Tensor::Zeros({P, fields}, DType::kF64);
  if (contributes) {
    double* row = all.data<double>() + stage * fields;
    const RankCosts& r = mine.ranks[stage];
    for (int v = 0; v < V; ++v) {
      const ChunkCosts& c = r.chunks[v];
      for (double x : {c.forward_ms, c.backward_ms, c.weight_ms, c.forward_cpu_ms,
                       c.backward_cpu_ms, c.weight_cpu_ms})
        *row++ = x;
    }
    const nlohmann::json& bubbles = mine.measured["stage_bubble"];
    for (double x : {r.optimizer_ms, r.update_ms, r.overhead_ms, mine.post_ms, mine.copy_ms,
                     static_cast<double>(mine.message_bytes), bubbles[stage].get<double>(),
                     profiler.MeanCoreWaitMs(stage)})
      *row++ = x;
  }
  world.AllReduceSum(all);
  StepCosts c = std::move(mine);
  c.post_ms = c.copy_ms = 0;
  c.message_bytes = 0;
  nlohmann::json bubbles = nlohmann::json::array(), core_waits = nlohmann::json::array();
  for (int s = 0; s < P; ++s) {
    const double* row = all.data<double>() + s * fields;
    RankCosts& r = c.ranks[s];
    for (int v = 0; v < V; ++v) {
      ChunkCosts& ch = r.chunks[v];
      for (double* x : {&ch.forward_ms, &ch.backward_ms, &ch.weight_ms, &ch.forward_cpu_ms,
                        &ch.backward_cpu_ms, &ch.weight_cpu_ms})
        *x = *row++;
    }
    r.optimizer_ms = *row++;
    r.update_ms = *row++;
    r.overhead_ms = *row++;
    c.post_ms += *row++ / P;
    c.copy_ms += *row++ / P;
    c.message_bytes = std::max(c.message_bytes, static_cast<int64_t>(*row++));
    bubbles.push_back(*row++);
    if (const double wait = *row++; wait >= 0 && core_waits.is_array()) {
      core_waits.push_back(wait);
    } else {
      core_waits = nullptr;  // a rank whose system does not say: none
    }
  }
  c.measured["stage_bubble"] = bubbles;
  if (core_waits.is_array()) c.measured["stage_core_wait_ms"] = core_waits;
  // Per step, the shortest of the durations in `each` ([ranks, S] by world rank) of `ranks`,
  // averaged over the steps.
  auto shortest_mean = [](const Tensor& each, int S, const std::vector<int>& ranks) {
    double sum = 0;
    for (int k = 0; k < S; ++k) {
      double least = std::numeric_limits<double>::infinity();
      for (int w : ranks) least = std::min(least, each.data<double>()[w * S + k]);
      sum += least;
    }
    return sum / S;
  };
  // Every process profiled the same steps: the same S everywhere, so all take part or none.
  const std::vector<double>& allreduce = profiler.RankAllReduceMs();
  if (const int S = static_cast<int>(allreduce.size()); S > 0) {
    Tensor each = Tensor::Zeros({P, S}, DType::kF64);
    if (contributes) std::copy(allreduce.begin(), allreduce.end(), each.data<double>() + stage * S);
    world.AllReduceSum(each);
    std::vector<int> stages(static_cast<size_t>(P));
    for (int s = 0; s < P; ++s) stages[s] = s;
    c.allreduce_ms = shortest_mean(each, S, stages);
  }
  // The replicas' gradient all-reduce: every replica's ranks (each step's shortest is the
  // replica that came last).
  const std::vector<double>& data = profiler.RankDataAllReduceMs();
  if (const int S = static_cast<int>(data.size()); d.replicas > 1 && S > 0) {
    const int W = world.size();
    Tensor each = Tensor::Zeros({W, S}, DType::kF64);
    std::copy(data.begin(), data.end(), each.data<double>() + world.rank() * S);
    world.AllReduceSum(each);
    for (int s = 0; s < P; ++s) {
      std::vector<int> replicas;
      for (int q = 0; q < d.replicas; ++q) replicas.push_back(q * P + s);  // world rank q·P + s
      c.ranks[s].data_allreduce_ms = shortest_mean(each, S, replicas);
    }
  }
  // The transit of a message. In the steps: every replica's round trips, their halves joined
  // (each measured by one rank; the same number of steps everywhere).
  const std::vector<std::vector<double>>& mine_halves = profiler.RoundTrips();
  std::optional<double> in_step;
  if (const int S = static_cast<int>(mine_halves.size()); S > 0) {
    const int64_t L = static_cast<int64_t>(mine_halves[0].size());
    Tensor halves = Tensor::Zeros({d.replicas, S, L}, DType::kF64);
    Tensor measured = Tensor::Zeros({d.replicas, S, L}, DType::kF64);
    const int64_t base = static_cast<int64_t>(replica) * S * L;
    for (int k = 0; k < S; ++k) {
      for (int64_t i = 0; i < L; ++i) {
        if (std::isnan(mine_halves[k][i])) continue;
        halves.data<double>()[base + k * L + i] = mine_halves[k][i];
        measured.data<double>()[base + k * L + i] = 1;
      }
    }
    world.AllReduceSum(halves);
    world.AllReduceSum(measured);
    std::vector<double> joined(static_cast<size_t>(halves.numel()));
    for (size_t i = 0; i < joined.size(); ++i) {
      joined[i] = measured.data<double>()[i] > 0 ? halves.data<double>()[i]
                                                 : std::numeric_limits<double>::quiet_NaN();
    }
    in_step = TransitInStepMs(joined);
  }
  // Idle: every neighbour pair's ping-pong, in every replica's pipeline — its cost per byte is
  // the fit's; its latency stands only where no round trip of the steps was measured.
  const std::optional<TransitFit> fit = MeasureTransit(*d.pipe, c.message_bytes);
  Tensor fits = Tensor::Zeros({3}, DType::kF64);
  if (fit) {
    fits.data<double>()[0] = fit->latency_ms;
    fits.data<double>()[1] = fit->ms_per_byte;
    fits.data<double>()[2] = 1;
  }
  world.AllReduceSum(fits);
  if (const double pairs = fits.data<double>()[2]; pairs > 0) {
    c.transit_latency_ms = fits.data<double>()[0] / pairs;
    c.transit_ms_per_byte = fits.data<double>()[1] / pairs;
    c.measured["transit_ping_pong_ms"] = TransitMs(c);
  }
  if (in_step) {
    const double bytes_ms = c.transit_ms_per_byte * static_cast<double>(c.message_bytes);
    c.transit_latency_ms = std::max(0.0, *in_step - bytes_ms);
    c.measured["transit_in_step_ms"] = *in_step;
  }
  return c;
}

}  // namespace

std::vector<StageStep> PipelineEngine::Impl::RunLocal(int64_t step, int64_t first_batch, double lr,
                                                      bool trace) {
  const int P = options.stages;
  std::vector<StageStep> steps(P);
  std::vector<std::exception_ptr> errors(P);
  stage_threads->RunOnAll([&](int r) {
    try {
      steps[r] = ranks[r]->RunStep(step, first_batch, lr, world->comm(r), trace);
    } catch (...) {
      errors[r] = std::current_exception();
    }
  });
  // Report the rank that failed first — its StageError; the others were woken by its abort.
  for (const std::exception_ptr& e : errors) {
    if (e && (!failure || IsStageError(e))) failure = e;
    if (failure && IsStageError(failure)) break;
  }
  if (failure) std::rethrow_exception(failure);
  return steps;
}

// A failing rank aborts the job (MPI_Abort: every process ends), so a return here is a success.
StageStep PipelineEngine::Impl::RunDistributed(int64_t step, int64_t first_batch, double lr,
                                               bool trace) {
  const auto& d = *options.distributed;
  // The leader may have evaluated since the last step: wait for it here, not in a receive that
  // would time out (a dead process ends the job through mpirun, so a long wait cannot hang).
  d.world->Barrier(std::chrono::hours(24));
  return ranks[0]->RunStep(step, first_batch, lr, *d.pipe, trace);
}

void PipelineEngine::Impl::Record(int w, const StageStep& s, int64_t released, int64_t span_ns) {
  StageReport& rep = reports[w];
  rep.peak_allocated_bytes = std::max(rep.peak_allocated_bytes, s.peak_allocated_bytes);
  rep.peak_reserved_bytes = std::max(rep.peak_reserved_bytes, s.peak_reserved_bytes);
  rep.released_output_bytes = released;
  rep.allocated_at_inflight_peak_bytes = s.allocated_at_inflight_peak_bytes;
  rep.inflight_peak = std::max(rep.inflight_peak, s.inflight_peak);
  for (size_t c = 0; c < s.inflight_peak_per_chunk.size(); ++c) {
    rep.inflight_peak_per_chunk[c] =
        std::max(rep.inflight_peak_per_chunk[c], s.inflight_peak_per_chunk[c]);
  }
  rep.busy_ms += static_cast<double>(s.busy_ns) / 1e6;
  rep.comm_ms += static_cast<double>(s.comm_ns) / 1e6;
  rep.busy_cpu_ms += static_cast<double>(s.busy_cpu_ns) / 1e6;
  rep.idle_ms += static_cast<double>(span_ns - s.busy_ns) / 1e6;
  rep.rollback_bytes = std::max(rep.rollback_bytes, s.rollback_bytes);
}

StepResult PipelineEngine::Step(int64_t step, int64_t first_batch, double lr) {
  return Step(step, first_batch, lr, std::nullopt);
}

bool PipelineEngine::RunningAhead() const { return impl_->ahead >= 0; }

void PipelineEngine::Drain() {
  Impl& impl = *impl_;
  if (impl.chain == nullptr || impl.ahead < 0) return;
  {
    MutexLock lock(&impl.chain->mu);
    impl.chain->after[impl.ahead] = Impl::Chain::After::kDiscard;
    impl.chain->cv.NotifyAll();
  }
  impl.AwaitChain(impl.ahead, /*settle=*/true);  // its figures are no step's: dropped
}

StepResult PipelineEngine::Impl::StepInterlocked(int64_t step, int64_t first_batch, double lr,
                                                 const std::optional<StepEngine::NextStep>& next) {
  const int64_t begin_ns = NowNs();
  const int P = options.stages;
  const int M = setup.schedule.micro_batches;
  const bool trace = TracedStep(step);
  bool start = false;
  {
    MutexLock lock(&chain->mu);
    if (ahead >= 0) {
      const Chain::Spec& spec = chain->specs.at(ahead);
      SLUICE_CHECK(ahead == step && spec.first_batch == first_batch && spec.lr == lr,
                   "step {} (batch {}, lr {}) asked for while step {} (batch {}, lr {}) runs ahead",
                   step + 1, first_batch, lr, ahead + 1, spec.first_batch, spec.lr);
    } else {
      chain->specs[step] = {step, first_batch, lr, trace};
      start = true;
    }
    chain->after[step] = next ? Chain::After::kContinue : Chain::After::kStop;
    if (next) {
      chain->specs[next->step] = {next->step, next->first_batch, next->lr, TracedStep(next->step)};
    }
    chain->cv.NotifyAll();
  }
  if (start && distributed()) {
    // As RunDistributed: the leader may have evaluated since the last chain ended.
    options.distributed->world->Barrier(std::chrono::hours(24));
  }
  if (start) StartChain(step);
  const int64_t previous_end = chain_last_end_ns;
  std::vector<StageStep> steps = AwaitChain(step, /*settle=*/!next);
  ahead = next ? next->step : -1;
  if (distributed()) return FinishDistributedInterlocked(step, std::move(steps[0]), begin_ns);

  // The reduction every rank computes (or will): the partials added in rank order.
  const size_t n = steps[0].norm_partials.size();
  std::vector<const void*> sources;
  for (const StageStep& s : steps) {
    SLUICE_CHECK(s.norm_partials.size() == n, "stage partials of step {} differ in size", step + 1);
    sources.push_back(s.norm_partials.data());
  }
  StepResult result;
  const StageProgram::Validation verdict = Validate(sources, static_cast<int64_t>(n), result);
  const StageStep& last = steps[setup.schedule.RankOf(setup.schedule.virtual_stages() - 1)];
  double loss_sum = 0;
  for (double l : last.losses) loss_sum += l;
  result.loss = loss_sum / static_cast<double>(M);
  for (StageStep& s : steps) {
    s.grad_norm = result.grad_norm;
    s.updated = result.updated;
    s.rolled_back = verdict != StageProgram::Validation::kAccepted;
  }
  // The step's span: from its first rank's start — or, where steps overlap, from the previous
  // step's last end — to its last rank's end, so that the spans of a chain add up to its time.
  int64_t begin = std::numeric_limits<int64_t>::max(), end = 0;
  for (const StageStep& s : steps) {
    begin = std::min(begin, s.begin_ns);
    end = std::max(end, s.begin_ns + s.wall_ns);
  }
  if (previous_end >= 0) begin = std::max(begin, std::min(previous_end, end));
  chain_last_end_ns = next ? end : -1;
  if (profiler) {
    const int64_t steps_run = setup.config->steps;
    if (step > 0 || steps_run == 1) profiler->Add(steps, end - begin);  // step 0 warms up
    if (step == steps_run - 1)
      WriteSideOutput(
          [&] { WriteCosts(profiler->Costs(), options.profile_path, options.post_validate); });
  }
  for (int r = 0; r < P; ++r) {
    Record(r, steps[r], steps[r].released_output_bytes, end - begin);
    result.peak_allocated_bytes =
        std::max(result.peak_allocated_bytes, steps[r].peak_allocated_bytes);
    result.peak_reserved_bytes = std::max(result.peak_reserved_bytes, steps[r].peak_reserved_bytes);
  }
  if (trace && step == setup.config->steps - 1) {
    // The last two steps, where they overlap: each stage's spans of both, in time order.
    for (size_t r = 0; r < traced_before.size() && r < steps.size(); ++r) {
      StageStep& s = steps[r];
      s.spans.insert(s.spans.begin(), traced_before[r].spans.begin(), traced_before[r].spans.end());
      s.memory.insert(s.memory.begin(), traced_before[r].memory.begin(),
                      traced_before[r].memory.end());
    }
    WriteSideOutput([&] { WriteTrace(steps, 0, options.trace_path); });
    traced_before.clear();
  } else if (trace) {
    traced_before = std::move(steps);
  }
  return result;
}

StageProgram::Validation PipelineEngine::Impl::Validate(const std::vector<const void*>& sources,
                                                        int64_t n, StepResult& result) {
  std::vector<double> sums(static_cast<size_t>(n));
  SumInRankOrder(DType::kF64, sources, n, sums.data());
  result.grad_norm = GlobalNorm({sums.begin(), sums.end() - 1});
  const StageProgram::Validation verdict =
      EagerUpdateVerdict(result.grad_norm, sums.back(), setup.config->optimizer.clip_norm);
  result.updated = verdict != StageProgram::Validation::kSkipped;
  rollbacks += verdict != StageProgram::Validation::kAccepted ? 1 : 0;
  return verdict;
}

void PipelineEngine::Impl::RecordReducedFigures(const Tensor& all, int64_t columns,
                                                const StageStep& s, int64_t span_ns,
                                                StepResult& result) {
  const int W = static_cast<int>(reports.size()), w = world_rank();
  double losses = 0, sum = 0;
  for (int r = 0; r < W; ++r) {
    const double* f = all.data<double>() + r * columns;
    StageStep figures;
    figures.peak_allocated_bytes = static_cast<int64_t>(f[kPeakAllocated]);
    figures.peak_reserved_bytes = static_cast<int64_t>(f[kPeakReserved]);
    figures.inflight_peak = static_cast<int>(f[kInflight]);
    figures.allocated_at_inflight_peak_bytes = static_cast<int64_t>(f[kAtInflightPeak]);
    figures.busy_ns = static_cast<int64_t>(f[kBusyNs]);
    figures.comm_ns = static_cast<int64_t>(f[kCommNs]);
    figures.busy_cpu_ns = static_cast<int64_t>(f[kBusyCpuNs]);
    figures.wall_ns = static_cast<int64_t>(f[kWallNs]);
    figures.rollback_bytes = static_cast<int64_t>(f[kRollbackBytes]);
    Record(r, figures, static_cast<int64_t>(f[kReleased]), span_ns);
    if (r == w) {  // only this rank's per-chunk figures are known here
      for (size_t c = 0; c < s.inflight_peak_per_chunk.size(); ++c) {
        reports[r].inflight_peak_per_chunk[c] =
            std::max(reports[r].inflight_peak_per_chunk[c], s.inflight_peak_per_chunk[c]);
      }
    }
    sum += f[kLossSum];
    losses += f[kLosses];
    result.peak_allocated_bytes =
        std::max(result.peak_allocated_bytes, figures.peak_allocated_bytes);
    result.peak_reserved_bytes = std::max(result.peak_reserved_bytes, figures.peak_reserved_bytes);
  }
  result.loss = losses > 0 ? sum / losses : 0;
}

StepResult PipelineEngine::Impl::FinishDistributedInterlocked(int64_t step, StageStep s,
                                                              int64_t begin_ns) {
  const int W = static_cast<int>(reports.size()), w = world_rank();
  const int64_t n = static_cast<int64_t>(s.norm_partials.size());
  const int64_t F = kReducedFigures + n;  // the figures, then the rank's norm partials
  Tensor all = Tensor::Zeros({W, F}, DType::kF64);
  double* row = all.data<double>() + w * F;
  PutReducedFigures(s, row);
  row[kBeganAhead] = s.began_ahead ? 1 : 0;
  std::copy(s.norm_partials.begin(), s.norm_partials.end(), row + kReducedFigures);
  AllReduceOverWorld(
      all, fmt::format("finished step {} and waited for every rank's figures of it", step + 1));
  // The step's reduction as the ranks compute it (D = 1: world rank = pipeline rank): each row
  // holds one rank's partials exactly (the others added zeros), summed in rank order.
  std::vector<const void*> sources;
  for (int r = 0; r < W; ++r) sources.push_back(all.data<double>() + r * F + kReducedFigures);
  StepResult result;
  const StageProgram::Validation verdict = Validate(sources, n, result);
  s.grad_norm = result.grad_norm;
  s.updated = result.updated;
  s.rolled_back = verdict != StageProgram::Validation::kAccepted;
  // Processes share no clock: the step's span is its slowest rank's wall, from the rank's own
  // start of the step (right after its end of the previous one) to its post.
  int64_t span = 0;
  for (int r = 0; r < W; ++r) {
    const double* f = all.data<double>() + r * F;
    span = std::max(span, static_cast<int64_t>(f[kWallNs]));
    began_ahead += f[kBeganAhead] != 0 ? 1 : 0;
  }
  RecordReducedFigures(all, F, s, span, result);
  const int64_t steps_run = setup.config->steps;
  if (profiler) {
    if (step > 0 || steps_run == 1) {  // step 0 warms up
      profiler->AddRank(stage(), s, span);
      profiler->AddStep(NowNs() - begin_ns, span);
    }
    if (step == steps_run - 1) {
      const StepCosts costs = GatherCosts(*profiler, stage(), replica(), *options.distributed);
      if (world_rank() == 0)
        WriteSideOutput([&] { WriteCosts(costs, options.profile_path, options.post_validate); });
    }
  }
  if (TracedStep(step)) {
    if (step == steps_run - 1) {
      // The last two steps, where they overlap: this rank's spans of both, in time order.
      if (!traced_before.empty()) {
        s.spans.insert(s.spans.begin(), traced_before[0].spans.begin(),
                       traced_before[0].spans.end());
        s.memory.insert(s.memory.begin(), traced_before[0].memory.begin(),
                        traced_before[0].memory.end());
      }
      std::string stem = options.trace_path;
      if (stem.ends_with(".json")) stem.resize(stem.size() - 5);
      WriteSideOutput([&] { WriteTrace({s}, stage(), fmt::format("{}.rank{}.json", stem, w)); });
      traced_before.clear();
    } else {
      traced_before = {std::move(s)};
    }
  }
  return result;
}

StepResult PipelineEngine::Step(int64_t step, int64_t first_batch, double lr,
                                const std::optional<NextStep>& next) {
  Impl& impl = *impl_;
  if (impl.failure) std::rethrow_exception(impl.failure);
  if (impl.chain != nullptr) return impl.StepInterlocked(step, first_batch, lr, next);
  const int P = impl.options.stages;
  const int M = impl.setup.schedule.micro_batches;
  const bool trace = !impl.options.trace_path.empty() && step == impl.setup.config->steps - 1;
  StepResult result;

  if (!impl.distributed()) {
    const int64_t begin = NowNs();
    std::vector<StageStep> steps = impl.RunLocal(step, first_batch, lr, trace);
    const int64_t span = StepSpanNs(steps);
    if (impl.profiler) {
      const int64_t steps_run = impl.setup.config->steps;
      if (step > 0 || steps_run == 1)
        impl.profiler->Add(steps, NowNs() - begin);  // step 0 warms up
      if (step == steps_run - 1) {
        impl.WriteSideOutput([&] {
          WriteCosts(impl.profiler->Costs(), impl.options.profile_path, impl.options.post_validate);
        });
      }
    }
    const StageStep& last =
        steps[impl.setup.schedule.RankOf(impl.setup.schedule.virtual_stages() - 1)];
    double loss_sum = 0;
    for (double l : last.losses) loss_sum += l;
    result.loss = loss_sum / static_cast<double>(M);
    result.grad_norm = steps[0].grad_norm;
    result.updated = steps[0].updated;  // every rank decided on the same all-reduced figures
    impl.rollbacks += steps[0].rolled_back ? 1 : 0;  // likewise
    for (int r = 0; r < P; ++r) {
      impl.Record(r, steps[r], steps[r].released_output_bytes, span);
      result.peak_allocated_bytes =
          std::max(result.peak_allocated_bytes, steps[r].peak_allocated_bytes);
      result.peak_reserved_bytes =
          std::max(result.peak_reserved_bytes, steps[r].peak_reserved_bytes);
    }
    if (trace) impl.WriteSideOutput([&] { impl.WriteTrace(steps, 0, impl.options.trace_path); });
    return result;
  }

  // Distributed: run this rank, then one all-reduce brings every rank's figures everywhere.
  const int64_t begin = NowNs();
  const StageStep s = impl.RunDistributed(step, first_batch, lr, trace);
  const int W = static_cast<int>(impl.reports.size()), w = impl.world_rank();
  Tensor all = Tensor::Zeros({W, kReducedFigures}, DType::kF64);
  double* row = all.data<double>() + w * kReducedFigures;
  PutReducedFigures(s, row);
  row[kNorm] = s.grad_norm;
  impl.AllReduceOverWorld(
      all, fmt::format("finished step {} and waited for every rank's figures of it", step + 1));
  // Processes share no clock: the step's span is its slowest rank's wall (each starts its step
  // as the barrier above releases it).
  int64_t span = 0;
  for (int r = 0; r < W; ++r)
    span = std::max(span, static_cast<int64_t>(all.data<double>()[r * kReducedFigures + kWallNs]));
  impl.RecordReducedFigures(all, kReducedFigures, s, span, result);
  result.grad_norm = all.data<double>()[kNorm];  // equal on every rank
  result.updated = s.updated;                    // likewise
  impl.rollbacks += s.rolled_back ? 1 : 0;       // likewise
  if (impl.profiler) {
    const int64_t steps_run = impl.setup.config->steps;
    if (step > 0 || steps_run == 1) {  // step 0 warms up
      impl.profiler->AddRank(impl.stage(), s, span);
      impl.profiler->AddStep(NowNs() - begin, span);
    }
    if (step == steps_run - 1) {
      const StepCosts costs =
          GatherCosts(*impl.profiler, impl.stage(), impl.replica(), *impl.options.distributed);
      if (leader())
        impl.WriteSideOutput(
            [&] { WriteCosts(costs, impl.options.profile_path, impl.options.post_validate); });
    }
  }
  if (trace) {
    std::string stem = impl.options.trace_path;
    if (stem.ends_with(".json")) stem.resize(stem.size() - 5);
    impl.WriteSideOutput(
        [&] { impl.WriteTrace({s}, impl.stage(), fmt::format("{}.rank{}.json", stem, w)); });
  }
  return result;
}

void PipelineEngine::Impl::WriteTrace(const std::vector<StageStep>& steps, int first_stage,
                                      const std::string& path) const {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const StageStep& s : steps) {
    for (const TraceSpan& span : s.spans) t0 = std::min(t0, span.begin_ns);
    for (const MemorySample& sample : s.memory) t0 = std::min(t0, sample.time_ns);
  }
  auto us = [&](int64_t ns) { return static_cast<double>(ns - t0) / 1e3; };
  ChromeTrace trace;
  const int V = setup.schedule.chunks;
  for (size_t i = 0; i < steps.size(); ++i) {
    const int stage = first_stage + static_cast<int>(i);
    const int pid = stage + 1;
    trace.NameProcess(pid, fmt::format("stage {}", stage));
    trace.NameThread(pid, 0, "compute");
    trace.NameThread(pid, 1, "communication");
    for (const TraceSpan& span : steps[i].spans) {
      // Post-validation's check after the all-reduce (and its rollback) is OPT's work too.
      const bool step_end =
          span.name == "OPT" || span.name == "VALIDATE" || span.name == "ROLLBACK";
      const bool compute = span.name == "F" || span.name == "B" || span.name == "W" || step_end;
      const std::string label =
          step_end || span.name.starts_with("ALLREDUCE")
              ? span.name
              : (V > 1 ? fmt::format("{}{}.{}", span.name, span.chunk, span.micro_batch)
                       : fmt::format("{}{}", span.name, span.micro_batch));
      trace.AddSpan(pid, compute ? 0 : 1, label, compute ? "compute" : "comm", us(span.begin_ns),
                    static_cast<double>(span.end_ns - span.begin_ns) / 1e3,
                    {{"chunk", span.chunk}, {"micro_batch", span.micro_batch}});
    }
    for (const MemorySample& sample : steps[i].memory) {
      trace.AddCounter(pid, "allocated bytes", "bytes", us(sample.time_ns),
                       static_cast<double>(sample.allocated_bytes));
    }
  }
  trace.Write(path);
}

std::map<std::string, Tensor> PipelineEngine::State() const {
  std::map<std::string, Tensor> out;
  for (const auto& rank : impl_->ranks) out.merge(rank->State());
  return out;
}

void PipelineEngine::StateLoaded() {
  if (impl_->distributed()) return;
  const std::map<std::string, Tensor> loaded = State();
  for (const auto& rank : impl_->ranks) {
    for (const auto& [name, copy] : rank->State()) {
      const Tensor& source = loaded.at(name);
      if (copy.raw_data() != source.raw_data()) copy.CopyFrom(source);
    }
  }
}

bool PipelineEngine::leader() const { return impl_->world_rank() == 0; }

// Distributed: replica 0's stages send their parameters to the leader (stage 0 of replica 0),
// in model order; one message per parameter, tagged by its index.
std::map<std::string, Tensor> PipelineEngine::GatherParams(Allocator& allocator) {
  Impl& impl = *impl_;
  if (!impl.distributed()) return State();
  impl.apart = true;  // the leader evaluates on what it gathers, alone
  if (impl.replica() != 0) return {};
  Communicator& pipe = *impl.options.distributed->pipe;
  std::map<std::string, Tensor> state = State(), out;
  std::vector<Request> pending;
  for (size_t i = 0; i < impl.params.size(); ++i) {
    const ParamSpec& p = impl.params[i];
    const int tag = static_cast<int>(i % (kMaxTag + 1));
    int owner = 0;
    while (std::find(impl.owned[owner].begin(), impl.owned[owner].end(), p.name) ==
           impl.owned[owner].end())
      ++owner;
    if (leader()) {
      if (owner == 0) {
        out.emplace(p.name, state.at(p.name));
      } else {
        pending.push_back(pipe.Irecv(owner, tag, DType::kF32, p.shape, allocator));
      }
    } else if (owner == impl.stage()) {
      pending.push_back(pipe.Isend(state.at(p.name), 0, tag));
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < impl.params.size() && leader(); ++i) {
    if (out.count(impl.params[i].name)) continue;
    out.emplace(impl.params[i].name, pending[k++].Wait());
  }
  for (; k < pending.size(); ++k) pending[k].Wait();
  return out;
}

std::vector<std::string> PipelineEngine::TakeOutputFailures() {
  return std::exchange(impl_->output_failures, {});
}

int PipelineEngine::AgreeOnStop(int mine, int64_t next_step) {
  Impl& impl = *impl_;
  if (!impl.distributed()) return mine;
  Communicator& world = *impl.options.distributed->world;
  // Where the ranks may be far apart — start-up (building the stages, loading a checkpoint: a
  // rank under a sanitizer on a loaded machine runs seconds behind), the leader's evaluation, a
  // checkpoint — the meeting waits for every rank as long as that takes: it is no message of a
  // step. As RunDistributed's barrier, with a limit a dead process cannot hold (mpirun ends the
  // job). Between two steps `--comm-timeout` bounds the wait.
  if (impl.apart) {
    world.Barrier(std::chrono::hours(24));
    impl.apart = false;
  }
  Tensor requests = Tensor::Zeros({world.size()}, DType::kF64);
  requests.data<double>()[world.rank()] = mine;
  impl.AllReduceOverWorld(requests, fmt::format("before step {} waited for every rank to say "
                                                "whether to stop (a signal on any rank)",
                                                next_step + 1));
  for (int w = 0; w < world.size(); ++w) {
    if (const double r = requests.data<double>()[w]; r != 0) return static_cast<int>(r);
  }
  return 0;
}

void PipelineEngine::Impl::GatherOptimizerState(
    const std::map<std::string, Tensor>& state, const std::vector<std::string>& names,
    const std::function<void(const std::function<Tensor(const std::string&)>& gather)>& write) {
  Communicator& data = *options.distributed->data;
  const int D = data.size();
  const int me = data.rank();  // the replica: the data communicator is split by replica
  // Each state tensor's shape, its parameter's; its tag is its place in `names`.
  std::map<std::string, Shape> shape;
  for (const std::string& name : owned[stage()]) {
    const auto spec = std::find_if(params.begin(), params.end(),
                                   [&](const ParamSpec& p) { return p.name == name; });
    SLUICE_CHECK(spec != params.end(), "stage {} owns '{}', which the model does not", stage(),
                 name);
    for (const std::string& o : OptimizerStateNames(*spec, setup.config->optimizer))
      shape.emplace(o, spec->shape);
  }
  auto tag = [&](size_t i) { return static_cast<int>(i % (kMaxTag + 1)); };
  if (me != 0) {
    std::vector<Request> sends;
    for (size_t i = 0; i < names.size(); ++i)
      sends.push_back(data.Isend(state.at(names[i]), 0, tag(i)));
    for (Request& s : sends) s.Wait();
    return;
  }
  size_t next = 0;  // the index in `names` of the next tensor to gather
  // One tensor: its D − 1 other slices are received one replica at a time (a receive's buffer is
  // allocated when it is posted), each copied into place and freed before the next is posted.
  auto gather = [&](const std::string& name) {
    SLUICE_CHECK(next < names.size() && names[next] == name,
                 "the sharded save gathers '{}' out of order", name);
    const int t = tag(next++);
    const Shape& whole = shape.at(name);
    const int64_t n = whole.numel();
    Tensor full = Tensor::Empty(whole, DType::kF32, DefaultAllocator());
    const Tensor flat = full.Reshape({n});
    const ShardRange mine = OptimizerShard(n, 0, D);
    flat.Slice(0, mine.begin, mine.end).CopyFrom(state.at(name));
    for (int r = 1; r < D; ++r) {
      const ShardRange range = OptimizerShard(n, r, D);
      Request receive = data.Irecv(r, t, DType::kF32, Shape({range.size()}), DefaultAllocator());
      flat.Slice(0, range.begin, range.end).CopyFrom(receive.Wait());
    }
    return full;
  };
  try {
    write(gather);
  } catch (...) {
    while (next < names.size()) gather(names[next]);  // drained: the senders complete
    throw;
  }
  while (next < names.size()) gather(names[next]);
}

// Distributed: a shard per stage (replica 0's ranks write their own), then the leader's index.
// Each write is followed by an all-reduce of who failed (it is also the barrier: the index is
// written once every shard is), so one rank's failure reaches every rank and none waits alone.
std::optional<std::string> PipelineEngine::TrySaveCheckpoint(
    const std::string& path, const std::map<std::string, std::string>& metadata) {
  Impl& impl = *impl_;
  if (!impl.distributed()) return StepEngine::TrySaveCheckpoint(path, metadata);
  impl.apart = true;  // ranks write their shards at their own pace
  const int P = impl.options.stages;
  Communicator& world = *impl.options.distributed->world;
  std::optional<std::string> mine;
  // Shards are named by step, so that this save never overwrites the previous one's.
  const auto step_it = metadata.find("step");
  const std::string step = step_it != metadata.end() ? step_it->second : "";
  // A parameter's optimizer state, by its spec (a constant has none).
  auto state_names = [&](const std::string& name) {
    for (const ParamSpec& p : impl.params) {
      if (p.name == name) return OptimizerStateNames(p, impl.setup.config->optimizer);
    }
    return OptimizerStateNames(name, impl.setup.config->optimizer);
  };
  // The world ranks whose write failed, the same list on every rank.
  auto agree = [&] {
    Tensor failed = Tensor::Zeros({world.size()}, DType::kF64);
    failed.data<double>()[world.rank()] = mine ? 1 : 0;
    impl.AllReduceOverWorld(failed, fmt::format("saved checkpoint '{}' of step {} and waited for "
                                                "every rank to say whether its part was written",
                                                path, step));
    std::vector<int> ranks;
    for (int w = 0; w < world.size(); ++w)
      if (failed.data<double>()[w] != 0) ranks.push_back(w);
    return ranks;
  };
  const std::map<std::string, Tensor> state = State();
  // The stage's shard: its parameters and their optimizer state, written one tensor at a time. A
  // tied parameter's copies are equal: the shard of the stage owning it holds it once.
  std::map<std::string, SafetensorsEntry> entries;
  std::vector<std::string> sharded;  // the optimizer state tensors gathered whole, in file order
  for (const std::string& p : impl.owned[impl.stage()]) {
    const Tensor& param = state.at(p);
    entries.emplace(p, SafetensorsEntry{param.dtype(), param.shape()});
    for (const std::string& o : state_names(p)) {
      // A sharded optimizer's slices are gathered whole to replica 0, which writes the stage's
      // shard as an unsharded run does: the checkpoint is the same whatever D and
      // --shard-optimizer.
      const Tensor& t = state.at(o);
      entries.emplace(o,
                      SafetensorsEntry{t.dtype(), sharded_optimizer() ? param.shape() : t.shape()});
    }
  }
  if (sharded_optimizer()) {
    for (const auto& [name, entry] : entries) {
      if (std::find(impl.owned[impl.stage()].begin(), impl.owned[impl.stage()].end(), name) ==
          impl.owned[impl.stage()].end())
        sharded.push_back(name);
    }
  }
  // Writes the shard, each optimizer state tensor from `gather` when sharded.
  auto write = [&](const std::function<Tensor(const std::string&)>& gather) {
    std::map<std::string, std::string> shard_metadata = metadata;
    shard_metadata["shard"] = fmt::format("{} of {}", impl.stage(), P);
    const std::set<std::string> gathered(sharded.begin(), sharded.end());
    try {
      SaveCheckpointStreamed(CheckpointShardPath(path, impl.stage(), P, step), entries,
                             shard_metadata, [&](const std::string& name) {
                               return gathered.contains(name) ? gather(name) : state.at(name);
                             });
    } catch (const IoError& e) {
      mine = e.what();
    }
  };
  if (sharded_optimizer()) {
    impl.GatherOptimizerState(state, sharded, write);
  } else if (impl.replica() == 0) {
    write(nullptr);
  }
  // Names what the failed ranks were writing, for the ranks that did not fail.
  auto others = [&](const std::vector<int>& failed, bool index) {
    std::vector<std::string> parts;
    for (int w : failed) {
      parts.push_back(fmt::format(
          "rank {} could not write '{}'", w,
          index ? CheckpointIndexPath(path) : CheckpointShardPath(path, w % P, P, step)));
    }
    return fmt::format("checkpoint '{}' not written: {} (the error is in that rank's output)", path,
                       fmt::join(parts, ", "));
  };
  if (std::vector<int> failed = agree(); !failed.empty())
    return mine ? mine : others(failed, false);
  if (leader()) {
    std::vector<std::vector<std::string>> names(P);
    for (int s = 0; s < P; ++s) {
      for (const std::string& p : impl.owned[s]) {
        names[s].push_back(p);
        for (const std::string& o : state_names(p)) names[s].push_back(o);
      }
    }
    try {
      SaveCheckpointIndex(path, names, metadata, step);
    } catch (const IoError& e) {
      mine = e.what();
    }
  }
  if (std::vector<int> failed = agree(); !failed.empty()) return mine ? mine : others(failed, true);
  // The new index names this save's shards: the previous save's are no checkpoint's any more.
  if (impl.replica() == 0) RemoveShardsOfOtherSaves(path, impl.stage(), P, step);
  return std::nullopt;
}

bool PipelineEngine::distributed() const { return impl_->distributed(); }

bool PipelineEngine::sharded_optimizer() const {
  return impl_->distributed() && impl_->setup.config->shard_optimizer && impl_->setup.replicas > 1;
}

OptimizerStateSlice PipelineEngine::optimizer_state_slice() const {
  if (!sharded_optimizer()) return {};
  return {.shard = impl_->replica(), .shards = impl_->setup.replicas};
}

GcMode PipelineEngine::gc_mode() const { return impl_->ranks.front()->gc_mode(); }

std::vector<StageMemoryForecast> PipelineEngine::Forecast() const {
  if (impl_->distributed() || ForecastRefusal(impl_->setup.schedule)) return {};
  return ForecastStages(impl_->setup);
}

nlohmann::json PipelineEngine::Summary() const {
  const Impl& impl = *impl_;
  nlohmann::json stages = nlohmann::json::array();
  for (const StageReport& r : impl.reports) {
    nlohmann::json entry = {
        {"stage", r.stage},
        {"peak_allocated_bytes", r.peak_allocated_bytes},
        {"peak_reserved_bytes", r.peak_reserved_bytes},
        {"released_output_bytes", r.released_output_bytes},
        {"output_bytes", r.output_bytes},
        {"allocated_at_inflight_peak_bytes", r.allocated_at_inflight_peak_bytes},
        {"inflight_peak", r.inflight_peak},
        {"theoretical_inflight", r.theoretical_inflight},
        {"busy_ms", r.busy_ms},
        {"busy_cpu_ms", r.busy_cpu_ms},
        {"idle_ms", r.idle_ms},
        {"comm_ms", r.comm_ms},
        {"bubble", r.bubble()}};
    if (impl.options.post_validate) entry["rollback_bytes"] = r.rollback_bytes;
    if (!impl.distributed()) entry["inflight_peak_per_chunk"] = r.inflight_peak_per_chunk;
    if (impl.distributed()) entry["replica"] = r.replica;
    stages.push_back(entry);
  }
  nlohmann::json out = {{"stages", stages},
                        {"pipeline",
                         {{"schedule", std::string(ScheduleKindName(impl.options.schedule))},
                          {"stages", impl.options.stages},
                          {"chunks", impl.setup.schedule.chunks},
                          {"micro_batches", impl.setup.schedule.micro_batches},
                          {"data_parallel", impl.setup.replicas},
                          {"comm", impl.distributed() ? "mpi" : "local"},
                          {"layout", impl.layout},
                          {"release_outputs", impl.options.release_outputs}}}};
  if (impl.options.post_validate) {  // a summary without it stays as it was
    out["pipeline"]["post_validate"] = true;
    out["post_validation"] = impl.PostValidationSummary();
  }
  return out;
}

std::map<std::string, Tensor> PipelineEngine::RankState(int rank) const {
  return impl_->ranks.at(static_cast<size_t>(rank))->State();
}
const std::vector<StageReport>& PipelineEngine::reports() const { return impl_->reports; }
int64_t PipelineEngine::overlapped_starts() const {
  return impl_->progress != nullptr ? impl_->progress->overlapped_starts() : 0;
}
const Schedule& PipelineEngine::schedule() const { return impl_->setup.schedule; }
const Partition& PipelineEngine::partition() const { return impl_->partition; }

void CheckJobSize(int stages, int replicas, int processes) {
  if (stages < 1) throw InvalidArgument(fmt::format("--stages must be at least 1, got {}", stages));
  if (replicas < 1)
    throw InvalidArgument(fmt::format("--data-parallel must be at least 1, got {}", replicas));
  if (processes != stages * replicas) {
    throw InvalidArgument(fmt::format(
        "the job has {} process{} but --stages {} × --data-parallel {} needs {}: launch "
        "with mpirun -np {}",
        processes, processes == 1 ? "" : "es", stages, replicas, stages * replicas,
        stages * replicas));
  }
}

MpiJob::MpiJob(MpiCommunicator& world, int stages, int replicas)
    : world_(world), replicas_(replicas) {
  CheckJobSize(stages, replicas, world.size());
  const int w = world.rank();
  pipe_ = world.Split(/*color=*/w / stages, /*key=*/w % stages);
  if (replicas > 1) data_ = world.Split(/*color=*/w % stages, /*key=*/w / stages);
}

MpiJob::~MpiJob() = default;

PipelineOptions::Distributed MpiJob::distributed() const {
  return {.world = &world_, .pipe = pipe_.get(), .data = data_.get(), .replicas = replicas_};
}

std::string PipelineEngine::Describe() const {
  const Impl& impl = *impl_;
  return fmt::format(
      "pipeline: {} stages{}, {}, layout {}, output release {}{}", impl.options.stages,
      impl.distributed() ? fmt::format(" × {} replicas as MPI processes", impl.setup.replicas)
                         : " as threads",
      impl.setup.schedule.Describe(), impl.layout, impl.options.release_outputs ? "on" : "off",
      !impl.options.post_validate ? ""
      : impl.chain != nullptr     ? ", post-validation on (steps interlock)"
                              : ", post-validation on (steps synchronous with data parallelism)");
}

std::vector<std::string> PipelineEngine::ReportLines() const {
  const Impl& impl = *impl_;
  std::vector<std::string> lines;
  auto mib = [](int64_t bytes) {
    return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / 1048576.0);
  };
  for (const StageReport& r : impl.reports) {
    const std::string replica =
        impl.setup.replicas > 1 ? fmt::format(" (replica {})", r.replica) : "";
    lines.push_back(fmt::format(
        "stage {}{}: peak {}, released {} per step, in flight {} (theory {}), bubble {:.0f}%",
        r.stage, replica, mib(r.peak_allocated_bytes), mib(r.released_output_bytes),
        r.inflight_peak, r.theoretical_inflight, 100 * r.bubble()));
  }
  if (impl.options.post_validate) {
    const nlohmann::json pv = impl.PostValidationSummary();
    lines.push_back(fmt::format(
        "post-validation: {} step(s) rolled back and redone; {} kept for a rollback (all stages)",
        pv["rollbacks"].get<int64_t>(), mib(pv["rollback_bytes"].get<int64_t>())));
  }
  if (!impl.options.trace_path.empty())
    lines.push_back(fmt::format(
        "trace of the last {}: {}",
        impl.chain != nullptr && impl.setup.config->steps > 1 ? "two steps (interlocked)" : "step",
        impl.options.trace_path));
  return lines;
}

EngineFactory PipelineEngineFactory(PipelineOptions options) {
  return [options](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    return std::make_unique<PipelineEngine>(ctx, options);
  };
}

}  // namespace sluice::pipeline
