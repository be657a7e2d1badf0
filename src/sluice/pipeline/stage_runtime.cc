#include "sluice/pipeline/stage_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/clock.h"

namespace sluice::pipeline {

namespace {

// The state of one chunk-micro-batch between its actions.
struct MicroBatch {
  Scope scope;
  Tensor output;      // "y" awaiting its send's completion (or B, when release is off)
  Tensor input_grad;  // "x.grad" awaiting SEND_B
  Request recv_f, recv_b, send_f, send_b;
  bool f_done = false, b_done = false;
};

// Which way a message travels between virtual stages: its number's lowest bit (Message).
enum class Direction : int {
  kForward = 0,   // a stage output, to virtual stage v + 1 (SEND_F / RECV_F)
  kBackward = 1,  // an input gradient, to virtual stage v − 1 (SEND_B / RECV_B)
};

}  // namespace

struct StageRuntime::Impl {
  const StageSetup& setup;
  int rank;
  int P, V, M;
  CachingAllocator allocator;  // declared before program, which allocates from it
  std::unique_ptr<StageProgram> program;
  std::vector<int> model_index;  // [program->params()]: each parameter's index in the whole model
  // [program->params()]: whether this rank adds the parameter's sum of squares to the global
  // norm — every untied one; a tied one only on the rank of its first unit (counted once).
  std::vector<bool> in_norm;
  // OPT's exchange of tied shares (StageProgram::tied_shares): this rank sends each share it
  // accumulates to every other rank holding the parameter, and receives each share it does not.
  struct TiedMessage {
    std::string grad;  // the share's name
    int peer = 0, tag = 0;
    bool send = false;
    Shape shape;
  };
  std::vector<TiedMessage> tied_messages;
  // Interlocked post-validation: the step whose eager update awaits its reduction (posted, not
  // yet waited for), with what validating it needs.
  struct Pending {
    int64_t step = 0;
    double lr = 0;
    Tensor sums;  // [n + 1]: the reduction's operand, its result once waited for
    Request reduce;
  };
  std::optional<Pending> pending;
  // The last run was discarded (StageStep::redo): the run of the same step again keeps its peak,
  // so that the step's reported peak covers both runs.
  bool redoing = false;
  // Reduced, at the end of a chain (outside any action): a timeout or failure names the rank,
  // the step and what it was waiting to do (`what`: "validate", "undo").
  std::pair<double, double> ReducedAtChainEnd(std::string_view what) {
    try {
      return Reduced();
    } catch (const CommTimeout& e) {
      throw CommTimeout(
          fmt::format("stage {} waited for the reduction of step {} to {} its eager "
                      "update: {}",
                      rank, pending->step + 1, what, e.what()));
    }
  }
  // Waits for `pending`'s reduction and returns its global norm and loss sum.
  std::pair<double, double> Reduced() {
    const Tensor sums = pending->reduce.Wait();
    const auto n = static_cast<size_t>(sums.numel() - 1);
    const double* x = sums.data<double>();
    return {GlobalNorm({x, x + n}), x[n]};
  }

  Impl(const StageSetup& s, int r);
  // One step's messages, numbered as StageStep::MessageEvent says; tags wrap it.
  int64_t Message(int receiving_virtual_stage, int micro_batch, Direction direction) const {
    return (static_cast<int64_t>(receiving_virtual_stage) * M + micro_batch) * 2 +
           static_cast<int>(direction);
  }
  int Tag(int receiving_virtual_stage, int micro_batch, Direction direction) const {
    return static_cast<int>(Message(receiving_virtual_stage, micro_batch, direction) %
                            (kMaxTag + 1));
  }
};

std::unique_ptr<StageProgram> BuildStageProgram(const StageSetup& s, int rank, Allocator& allocator,
                                                bool plan_only) {
  const int V = s.schedule.chunks;
  std::vector<ChunkModel> chunks;
  for (int c = 0; c < V; ++c) {
    const int v = s.schedule.VirtualStage(rank, c);
    chunks.push_back({.model = s.task->BuildPiece(s.micro_batch_size, s.slices[v]),
                      .first = v == 0,
                      .last = v == s.schedule.virtual_stages() - 1});
  }
  return std::make_unique<StageProgram>(
      std::move(chunks), *s.config,
      StageProgramOptions{.allocator = &allocator,
                          .threads = s.threads,
                          .split_backward = s.schedule.split_backward,
                          .recompute = RecomputeForStage(*s.config, rank, s.schedule.stages),
                          .tied = s.tied,
                          .plan_only = plan_only,
                          // A forecast takes the largest slice, the last replica's.
                          .shard = !s.config->shard_optimizer ? 0
                                   : plan_only                ? s.replicas - 1
                                                              : s.replica,
                          .shards = s.config->shard_optimizer ? s.replicas : 1});
}

StageRuntime::Impl::Impl(const StageSetup& s, int r)
    : setup(s),
      rank(r),
      P(s.schedule.stages),
      V(s.schedule.chunks),
      M(s.schedule.micro_batches),
      allocator(CachingAllocatorOptions{
          .max_reserved_bytes =
              s.config->memory_budget.empty()
                  ? 0
                  : static_cast<size_t>(s.config->memory_budget.at(static_cast<size_t>(r))),
          .reserved_headroom = s.config->reserved_headroom}) {
  program = BuildStageProgram(s, rank, allocator);
  for (const ParamSpec& p : program->params()) {
    auto it = std::find(s.model_params.begin(), s.model_params.end(), p.name);
    SLUICE_CHECK(it != s.model_params.end(), "stage {} holds '{}', which the model does not", rank,
                 p.name);
    model_index.push_back(static_cast<int>(it - s.model_params.begin()));
    in_norm.push_back(true);
  }
  // Tags from kMaxTag down, one per share of the whole model's tied parameters, the same on every
  // rank; at OPT every message of the step's schedule has been received, so none is mistaken.
  int tag = kMaxTag;
  for (const TiedParam& t : s.tied) {
    const int first = RankOfUnit(s, t.units.front());
    std::vector<int> holders;
    for (const std::string& unit : t.units) {
      const int holder = RankOfUnit(s, unit);
      if (std::find(holders.begin(), holders.end(), holder) == holders.end())
        holders.push_back(holder);
    }
    const auto held = std::find_if(program->params().begin(), program->params().end(),
                                   [&](const ParamSpec& p) { return p.name == t.name; });
    if (held != program->params().end() && first != rank)
      in_norm[static_cast<size_t>(held - program->params().begin())] = false;
    for (const std::string& unit : t.units) {
      const int holder = RankOfUnit(s, unit), k = tag--;
      if (held == program->params().end()) continue;
      const std::string grad = TiedReadName(t.name, unit) + ".grad";
      if (holder != rank) {
        tied_messages.push_back({grad, holder, k, /*send=*/false, held->shape});
        continue;
      }
      for (int other : holders) {
        if (other != rank) tied_messages.push_back({grad, other, k, /*send=*/true, held->shape});
      }
    }
  }
}

int RankOfUnit(const StageSetup& s, const std::string& unit) {
  const auto& names = s.units.names;
  const auto u = std::find(names.begin(), names.end(), unit) - names.begin();
  for (size_t v = 0; v < s.slices.size(); ++v) {
    if (s.slices[v].first <= u && u < s.slices[v].end)
      return s.schedule.RankOf(static_cast<int>(v));
  }
  SLUICE_CHECK(false, "unit '{}' lies in no virtual stage", unit);
  return -1;
}

StageRuntime::StageRuntime(const StageSetup& setup, int rank)
    : impl_(std::make_unique<Impl>(setup, rank)) {}
StageRuntime::~StageRuntime() = default;

int StageRuntime::rank() const { return impl_->rank; }

std::map<std::string, Tensor> StageRuntime::State() const { return impl_->program->State(); }

GcMode StageRuntime::gc_mode() const {
  return ResolveGcMode(impl_->setup.config->gc, impl_->allocator);
}

// Executes one step of one rank; lives for the duration of RunStep.
class StageRuntime::StepRun {
 public:
  StepRun(StageRuntime::Impl& rt, int64_t step, int64_t first_batch, double lr, Communicator& comm,
          bool trace, bool interlocked = false)
      : interlocked_(interlocked),
        rt_(rt),
        cfg_(*rt.setup.config),
        step_(step),
        first_batch_(first_batch),
        lr_(lr),
        comm_(comm),
        trace_(trace),
        mbs_(static_cast<size_t>(rt.V * rt.M)) {
    out_.inflight_peak_per_chunk.assign(rt.V, 0);
    for (int c = 0; c < rt.V; ++c) {  // the largest message this rank sends or receives
      const Program& p = rt.program->chunk(c).model.forward;
      for (const char* name : {kChunkInput, kChunkOutput}) {
        if (p.Find(name))
          out_.message_bytes = std::max(out_.message_bytes, ChunkMessageBytes(p, name));
      }
    }
    inflight_chunk_.assign(rt.V, 0);
  }

  StageStep Run() {
    const auto& actions = rt_.setup.schedule.ranks[rt_.rank];
    if (!rt_.redoing) rt_.allocator.ResetPeak();
    const int64_t t0 = NowNs(), core_wait0 = ThreadCoreWaitNs();
    out_.begin_ns = t0;
    StepProgress* progress = rt_.setup.progress;
    if (progress != nullptr) progress->Begin(rt_.rank, step_);
    // A run that may be discarded (the previous step fails its validation at this step's OPT,
    // or the chain drains it) keeps the running statistics it starts from, to restore them.
    if (interlocked_) rt_.program->SaveBuffers();
    if (interlocked_ && rt_.pending) {
      try {
        Comm([&] { out_.began_ahead = !rt_.pending->reduce.Test(); });
      } catch (const CommAborted&) {
        throw;
      } catch (const std::exception& e) {
        const std::string what =
            fmt::format("stage {} failed at the start of step {}, testing step {}'s reduction: {}",
                        rt_.rank, step_ + 1, rt_.pending->step + 1, e.what());
        comm_.Abort(what);
        throw StageError(what);
      }
    }
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      try {
        if (i + 1 == actions.size()) Hold();
        Comm([&] { PollSends(); });
        if (Faulty(a)) continue;
        if (IsCompute(a.kind) || a.kind == ActionKind::kOptimizer) {
          Execute(a);
        } else {
          Comm([&] { Execute(a); });
        }
      } catch (const CommAborted&) {
        throw;  // another rank failed first; its error is the one to report
      } catch (const std::exception& e) {
        const std::string what =
            fmt::format("stage {} failed at step {}, action {} of {} ({}{}): {}", rt_.rank,
                        step_ + 1, i + 1, actions.size(), ActionName(a, rt_.V),
                        a.kind == ActionKind::kOptimizer
                            ? ""
                            : fmt::format(", chunk {}, micro-batch {}", a.chunk, a.micro_batch),
                        e.what());
        comm_.Abort(what);
        throw StageError(what);
      }
      if (trace_) out_.memory.push_back({NowNs(), rt_.allocator.Stats().allocated_bytes});
    }
    // Every send must have completed before the step ends (its receiver has its copy).
    try {
      Comm([&] {
        for (MicroBatch& mb : mbs_) {
          if (mb.send_f.valid()) mb.send_f.Wait();
          if (mb.send_b.valid()) mb.send_b.Wait();
        }
        PollSends();
      });
    } catch (const CommAborted&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = fmt::format(
          "stage {} failed at the end of step {}, waiting for its sends to complete: {}", rt_.rank,
          step_ + 1, e.what());
      comm_.Abort(what);
      throw StageError(what);
    }
    if (progress != nullptr && !out_.redo) progress->Finish(rt_.rank, step_);
    out_.wall_ns = NowNs() - t0;
    if (core_wait0 >= 0) {
      const int64_t core_wait1 = ThreadCoreWaitNs();
      if (core_wait1 >= core_wait0) out_.core_wait_ns = core_wait1 - core_wait0;
    }
    const MemoryStats stats = rt_.allocator.Stats();
    out_.peak_allocated_bytes = stats.peak_allocated_bytes;
    out_.peak_reserved_bytes = stats.peak_reserved_bytes;
    rt_.redoing = out_.redo;
    return std::move(out_);
  }

 private:
  MicroBatch& Mb(int chunk, int micro_batch) { return mbs_[chunk * rt_.M + micro_batch]; }
  int VirtualStage(int chunk) const { return rt_.setup.schedule.VirtualStage(rt_.rank, chunk); }

  // The same micro-batch of the virtual stage `delta` away, when this rank holds it too, whose
  // output (or input gradient) an action takes without a message: on a single rank (P = 1), and at
  // the turn of a V (virtual stages P − 1 and P both on rank P − 1). Anywhere else the value had
  // to come by a receive, and a schedule (or an injected fault) that skipped it is an error here,
  // not a read past the chunks.
  MicroBatch& LocalNeighbour(const Action& a, int delta, const char* why) {
    const Schedule& s = rt_.setup.schedule;
    const int v = VirtualStage(a.chunk) + delta;
    if (v < 0 || v >= s.virtual_stages() || s.RankOf(v) != rt_.rank) throw Missing(a, why);
    return Mb(s.ChunkOf(v), a.micro_batch);
  }

  static ProgramError NothingToSend(const char* what, const char* producer) {
    return ProgramError(fmt::format("no {} to send: {} did not produce one", what, producer));
  }

  // Run() wraps it with the stage, step, action, chunk and micro-batch.
  static ProgramError Missing(const Action& a, const char* why) {
    return ProgramError(fmt::format(
        "no {}: {}", a.kind == ActionKind::kForward ? "input" : "output gradient", why));
  }

  bool Faulty(const Action& a) {
    const FaultInjection& f = rt_.setup.fault;
    if (f.mode == FaultInjection::Mode::kNone || f.rank != rt_.rank || f.kind != a.kind ||
        f.micro_batch != a.micro_batch || a.chunk != 0 || f.step != step_) {
      return false;
    }
    if (f.mode == FaultInjection::Mode::kThrow) throw Error("injected fault");
    return true;  // kSkip
  }

  // FaultInjection::hold_step: before this rank's last action of that step, wait for rank 0 to
  // begin the next one.
  void Hold() {
    const FaultInjection& f = rt_.setup.fault;
    if (f.hold_step != step_ || f.rank != rt_.rank || rt_.setup.progress == nullptr) return;
    const std::chrono::milliseconds timeout = comm_.default_timeout();
    if (!rt_.setup.progress->WaitBegun(0, step_ + 1, timeout)) {
      throw Error(fmt::format(
          "held before its last action of step {} until rank 0 began step {}, which it did not "
          "within {} ms: consecutive steps do not interlock",
          step_ + 1, step_ + 2, timeout.count()));
    }
  }

  // Times a compute action: busy time, and a span when tracing.
  // `profile` is the index into StageStep::computes (0 F, 1 B, 2 W, 3 optimizer, 4 update).
  template <typename F>
  void Compute(const Action& a, const char* name, int profile, F&& body) {
    const int64_t begin = NowNs(), cpu_begin = ThreadCpuNs();
    body();
    if (const int64_t sleep = rt_.setup.fault.compute_sleep_ns; sleep > 0 && profile <= 2) {
      const bool with_w = profile == 1 && !rt_.setup.schedule.split_backward;
      std::this_thread::sleep_for(std::chrono::nanoseconds(with_w ? 2 * sleep : sleep));
    }
    const int64_t end = NowNs(), cpu = ThreadCpuNs() - cpu_begin;
    out_.busy_ns += end - begin;
    out_.busy_cpu_ns += cpu;
    out_.computes[profile].push_back({a.chunk, static_cast<int>(a.micro_batch), end - begin, cpu});
    Span(name, a, begin, end);
  }

  // Times one Isend or Irecv call for the profile; `request` tells whether the call copied the
  // message (it completed at once: the peer had posted first). A send that copied is when
  // `message` arrived (its receiver may be waiting for it).
  template <typename F>
  Request Post(F&& post, int64_t message, bool send) {
    const int64_t begin = NowNs(), cpu_begin = ThreadCpuNs();
    Request request = post();
    const int64_t end = NowNs(), cpu = ThreadCpuNs() - cpu_begin;
    const bool copied = request.Test();
    (copied ? out_.post_copy_ns : out_.post_ns).push_back(cpu);
    if (copied && send) out_.copied_sends.push_back({message, begin, end});
    if (send) out_.sends.push_back({message, begin, end});
    return request;
  }

  void Span(const char* name, const Action& a, int64_t begin, int64_t end) {
    if (trace_) out_.spans.push_back({name, a.chunk, static_cast<int>(a.micro_batch), begin, end});
  }

  // Times communication: posting, testing and waiting for messages, and the all-reduces.
  template <typename F>
  void Comm(F&& body) {
    const int64_t begin = NowNs();
    body();
    out_.comm_ns += NowNs() - begin;
  }

  // Waits for a receive of `message`, timing the wait as a span (and, when the message had not
  // arrived, for the profile); then releases what completed meanwhile.
  Tensor Receive(Request& request, const Action& a, const char* name, int64_t message) {
    const int64_t begin = NowNs();
    const bool arrived = request.Test();
    Tensor t = request.Wait();
    if (!arrived) out_.blocked_receives.push_back({message, begin, NowNs()});
    PollSends();
    const int64_t end = NowNs();
    out_.comm_ns += end - begin;
    Span(name, a, begin, end);
    return t;
  }

  // Output release: drop every forward output whose send has completed.
  void PollSends() {
    std::erase_if(sending_, [&](int index) {
      MicroBatch& mb = mbs_[index];
      if (mb.send_f.valid() && !mb.send_f.Test()) return false;
      mb.send_f = Request();
      if (rt_.setup.release_outputs && mb.output.defined() &&
          !rt_.program->chunk(index / rt_.M).output_saved) {
        out_.released_output_bytes +=
            mb.output.numel() * static_cast<int64_t>(SizeOf(mb.output.dtype()));
        mb.output = Tensor();
      }
      return true;
    });
  }

  // What crosses to a neighbour: a chunk's input "x" or output "y", or its gradient (of the same
  // type).
  static TensorType MessageType(const Chunk& ch, const char* name) {
    return ChunkMessageType(ch.model.forward, name);
  }

  void Execute(const Action& a) {
    const Chunk& ch = rt_.program->chunk(a.chunk);
    MicroBatch& mb = Mb(a.chunk, a.micro_batch);
    int64_t begin = 0;  // a send's span: the post (Isend), copy included when the peer was first
    switch (a.kind) {
      case ActionKind::kRecvF:
        mb.recv_f = Post(
            [&] {
              const TensorType t = MessageType(ch, kChunkInput);
              return comm_.Irecv(a.peer,
                                 rt_.Tag(VirtualStage(a.chunk), a.micro_batch, Direction::kForward),
                                 t.dtype, t.shape, rt_.allocator);
            },
            rt_.Message(VirtualStage(a.chunk), a.micro_batch, Direction::kForward), /*send=*/false);
        break;
      case ActionKind::kSendF:
        if (!mb.output.defined()) throw NothingToSend("output", "its forward");
        begin = NowNs();
        mb.send_f = Post(
            [&] {
              return comm_.Isend(
                  mb.output, a.peer,
                  rt_.Tag(VirtualStage(a.chunk) + 1, a.micro_batch, Direction::kForward));
            },
            rt_.Message(VirtualStage(a.chunk) + 1, a.micro_batch, Direction::kForward),
            /*send=*/true);
        sending_.push_back(a.chunk * rt_.M + a.micro_batch);
        Span("SEND_F", a, begin, NowNs());
        break;
      case ActionKind::kRecvB:
        mb.recv_b = Post(
            [&] {
              const TensorType t = MessageType(ch, kChunkOutput);
              return comm_.Irecv(
                  a.peer, rt_.Tag(VirtualStage(a.chunk), a.micro_batch, Direction::kBackward),
                  t.dtype, t.shape, rt_.allocator);
            },
            rt_.Message(VirtualStage(a.chunk), a.micro_batch, Direction::kBackward),
            /*send=*/false);
        break;
      case ActionKind::kSendB:
        if (!mb.input_grad.defined()) throw NothingToSend("input gradient", "its backward");
        begin = NowNs();
        mb.send_b = Post(
            [&] {
              return comm_.Isend(
                  mb.input_grad, a.peer,
                  rt_.Tag(VirtualStage(a.chunk) - 1, a.micro_batch, Direction::kBackward));
            },
            rt_.Message(VirtualStage(a.chunk) - 1, a.micro_batch, Direction::kBackward),
            /*send=*/true);
        mb.input_grad = Tensor();  // the send holds it until completion, then it is freed
        Span("SEND_B", a, begin, NowNs());
        break;
      case ActionKind::kForward:
        Forward(a, ch, mb);
        break;
      case ActionKind::kBackward:
        Backward(a, ch, mb);
        break;
      case ActionKind::kWeight:
        Weight(a, ch, mb);
        break;
      case ActionKind::kOptimizer:
        Optimize(a);
        break;
    }
  }

  void Forward(const Action& a, const Chunk& ch, MicroBatch& mb) {
    Scope& scope = mb.scope;
    const auto& inputs = ch.model.forward.inputs();
    const bool reads_data =  // only the chunks that need data read it
        std::any_of(inputs.begin(), inputs.end(), [&](ValueId v) {
          return ch.first || ch.model.forward.value(v).name != kChunkInput;
        });
    if (reads_data) {
      const StageSetup& s = rt_.setup;
      Scope batch;
      s.task->BindBatch(batch, DataSplit::kTrain, first_batch_ + a.micro_batch,
                        s.micro_batch_size * s.replicas, cfg_.seed);
      auto rows = [&](const std::string& name) {  // this replica's share
        Tensor t = batch.Take(name);
        return s.replicas == 1 ? t
                               : t.Slice(0, s.replica * s.micro_batch_size,
                                         (s.replica + 1) * s.micro_batch_size);
      };
      for (ValueId v : ch.model.forward.inputs()) {  // the data this chunk reads
        const std::string& name = ch.model.forward.value(v).name;
        if (ch.first || name != kChunkInput) scope.Set(name, rows(name));
      }
    }
    if (!ch.first) {
      // The input comes from the previous virtual stage: a message, or this rank's own chunk.
      if (mb.recv_f.valid()) {
        scope.Set(kChunkInput,
                  Receive(mb.recv_f, a, "RECV_F",
                          rt_.Message(VirtualStage(a.chunk), a.micro_batch, Direction::kForward)));
        mb.recv_f = Request();
      } else {
        MicroBatch& prev = LocalNeighbour(a, -1, "its RECV_F was not posted");
        if (!prev.output.defined()) throw Missing(a, "the previous chunk produced no output");
        scope.Set(kChunkInput, std::move(prev.output));
        prev.output = Tensor();
      }
    }
    Compute(a, "F", 0, [&] { rt_.program->Forward(a.chunk, scope); });
    if (ch.last) {
      out_.losses.resize(rt_.M);
      out_.losses[a.micro_batch] = scope.Take(ch.model.loss).FlatAt(0);
    } else {
      mb.output = ch.output_saved ? scope.Get(kChunkOutput) : scope.Take(kChunkOutput);
    }
    mb.f_done = true;
    ++inflight_;
    ++inflight_chunk_[a.chunk];
    out_.inflight_peak = std::max(out_.inflight_peak, inflight_);
    out_.inflight_peak_per_chunk[a.chunk] =
        std::max(out_.inflight_peak_per_chunk[a.chunk], inflight_chunk_[a.chunk]);
  }

  void Backward(const Action& a, const Chunk& ch, MicroBatch& mb) {
    Scope& scope = mb.scope;
    if (!ch.last) {
      if (mb.recv_b.valid()) {
        scope.Set(kChunkOutputGrad,
                  Receive(mb.recv_b, a, "RECV_B",
                          rt_.Message(VirtualStage(a.chunk), a.micro_batch, Direction::kBackward)));
        mb.recv_b = Request();
      } else {
        MicroBatch& next = LocalNeighbour(a, +1, "its RECV_B was not posted");
        if (!next.input_grad.defined()) throw Missing(a, "the next chunk produced no gradient");
        scope.Set(kChunkOutputGrad, std::move(next.input_grad));
        next.input_grad = Tensor();
      }
    }
    if (mb.send_f.valid()) {  // the output's receiver has long taken it: this returns at once
      Comm([&] {
        mb.send_f.Wait();
        PollSends();
      });
    }
    if (!backward_seen_) {
      backward_seen_ = true;
      out_.allocated_at_inflight_peak_bytes = rt_.allocator.Stats().allocated_bytes;
    }
    Compute(a, "B", 1, [&] { rt_.program->Backward(a.chunk, scope, grads_); });
    if (!ch.first) mb.input_grad = scope.Take(kChunkInputGrad);
    mb.output = Tensor();  // release off: kept until now
    const bool split = rt_.setup.schedule.split_backward;
    if (!split) scope.Clear();
    mb.b_done = true;
    --inflight_;
    --inflight_chunk_[a.chunk];
    if (split) out_.awaiting_weight_peak = std::max(out_.awaiting_weight_peak, ++awaiting_);
  }

  void Weight(const Action& a, const Chunk&, MicroBatch& mb) {
    Compute(a, "W", 2, [&] { rt_.program->Weight(a.chunk, mb.scope, grads_); });
    mb.scope.Clear();
    --awaiting_;
  }

  // The gradient sums over replicas (data parallelism), the mean over micro-batches, the global
  // norm from every stage's per-parameter sums of squares (all-reduced: each rank fills its own
  // parameters' entries, so the sum in model order is bitwise the single stage's), clipping and
  // the optimizer. The same all-reduces carry the sum of the step's losses (the last stage's,
  // every replica's) to every rank, so that all of them withhold the update together when the
  // loss or the norm is not finite (StageProgram::UpdateIfFinite).
  void Optimize(const Action& a) {
    const StageSetup& setup = rt_.setup;
    Tensor loss_sum = Tensor::Zeros({1}, DType::kF64, rt_.allocator);
    for (double l : out_.losses) loss_sum.data<double>()[0] += l;
    if (setup.data !=
        nullptr) {  // sum over replicas, every gradient in name order on every replica
      const int64_t begin = NowNs();
      for (const auto& [name, g] : grads_.grads()) setup.data->AllReduceSum(g);
      setup.data->AllReduceSum(loss_sum);
      // Running statistics: the replicas' mean, the same bits on every replica.
      rt_.program->AverageBuffers([&](const Tensor& b) { setup.data->AllReduceSum(b); },
                                  setup.replicas);
      const int64_t end = NowNs();
      out_.comm_ns += end - begin;
      out_.data_allreduce_ns = end - begin;
      Span("ALLREDUCE_DP", a, begin, end);
    }
    std::map<std::string, Tensor> shares = ExchangeTiedShares(a);
    const int64_t n = static_cast<int64_t>(setup.model_params.size());
    // [n] sums of squares in model order, then the loss sum.
    Tensor sum_squares = Tensor::Zeros({n + 1}, DType::kF64, rt_.allocator);
    sum_squares.data<double>()[n] = loss_sum.data<double>()[0];
    Compute(a, "OPT", 3, [&] {
      const std::vector<double> mine =
          rt_.program->FinishGradients(grads_, rt_.M * setup.replicas, std::move(shares));
      for (size_t i = 0; i < mine.size(); ++i) {
        if (rt_.in_norm[i]) sum_squares.data<double>()[rt_.model_index[i]] = mine[i];
      }
    });
    if (interlocked_) {
      OptimizeInterlocked(a, std::move(sum_squares));
      return;
    }
    // Post-validation: the update first, assuming the reduction will not object; then the
    // reduction, and the validation that accepts the update or rolls it back (StageProgram).
    const bool eager = setup.post_validate;
    if (eager) Compute(a, "OPT", 4, [&] { rt_.program->UpdateEagerly(grads_, lr_, step_); });
    out_.allreduce_begin_ns = NowNs();
    comm_.AllReduceSum(sum_squares);
    out_.allreduce_end_ns = NowNs();
    out_.comm_ns += out_.allreduce_end_ns - out_.allreduce_begin_ns;
    Span("ALLREDUCE", a, out_.allreduce_begin_ns, out_.allreduce_end_ns);
    out_.grad_norm = GlobalNorm({sum_squares.data<double>(), sum_squares.data<double>() + n});
    const double all_losses = sum_squares.data<double>()[n];
    if (!eager) {
      Compute(a, "OPT", 4, [&] {
        out_.updated = rt_.program->UpdateIfFinite(grads_, out_.grad_norm, all_losses, lr_, step_);
      });
    } else {
      const int64_t begin = NowNs();
      const StageProgram::Validation v =
          rt_.program->ValidateEagerUpdate(out_.grad_norm, all_losses, lr_, step_);
      out_.busy_ns += NowNs() - begin;
      Span(v == StageProgram::Validation::kAccepted ? "VALIDATE" : "ROLLBACK", a, begin, NowNs());
      out_.updated = v != StageProgram::Validation::kSkipped;
      out_.rolled_back = v != StageProgram::Validation::kAccepted;
      out_.rollback_bytes = rt_.program->RollbackBytes();
    }
    // ZeRO stage 1: each replica updated its slice of every parameter; gather the slices. Every
    // replica saw the same loss and norm, so all of them updated (or none did).
    if (out_.updated && rt_.program->shards() > 1) {
      const int64_t begin = NowNs();
      rt_.program->GatherParams([&](const Tensor& p) { setup.data->AllReduceSum(p); });
      out_.comm_ns += NowNs() - begin;
      Span("ALLGATHER_PARAMS", a, begin, NowNs());
    }
  }

  // Interlocked post-validation's update point: validate the previous step (its reduction has
  // long completed: every rank posted it at the end of that step), then update this one eagerly
  // and post its reduction without waiting. A previous step that fails is restored and redone here
  // (or withheld) by every rank alike — each sees the same reduced figures at this same point of
  // its action list — and this step's run is discarded: its gradients are dropped and it runs
  // again from the corrected weights (StageStep::redo).
  void OptimizeInterlocked(const Action& a, Tensor sum_squares) {
    if (rt_.pending) {
      const int64_t begin = NowNs();
      const auto [norm, loss] = rt_.Reduced();
      const int64_t waited = NowNs();
      out_.comm_ns += waited - begin;
      Span("ALLREDUCE", a, begin, waited);
      const StageProgram::Validation v =
          rt_.program->ValidateEagerUpdate(norm, loss, rt_.pending->lr, rt_.pending->step);
      rt_.pending.reset();
      out_.busy_ns += NowNs() - waited;
      Span(v == StageProgram::Validation::kAccepted ? "VALIDATE" : "ROLLBACK", a, waited, NowNs());
      if (v != StageProgram::Validation::kAccepted) {
        grads_.Clear();
        rt_.program->RestoreBuffers();  // this run's forwards moved them
        out_.redo = true;
        return;
      }
    }
    Compute(a, "OPT", 4, [&] { rt_.program->UpdateEagerly(grads_, lr_, step_); });
    const double* x = sum_squares.data<double>();
    out_.norm_partials.assign(x, x + sum_squares.numel());
    out_.rollback_bytes = rt_.program->RollbackBytes();
    out_.allreduce_begin_ns = out_.allreduce_end_ns = NowNs();
    Request reduce = comm_.IallReduceSum(sum_squares);
    rt_.pending = StageRuntime::Impl::Pending{
        .step = step_, .lr = lr_, .sums = std::move(sum_squares), .reduce = std::move(reduce)};
  }

  // Tied parameters: sends this rank's shares of their gradients (summed over the replicas) to the
  // other ranks holding them, receives theirs, and waits for both — the sends too, since
  // FinishGradients then adds into the shares in place. Returns the shares received, by name.
  std::map<std::string, Tensor> ExchangeTiedShares(const Action& a) {
    std::map<std::string, Tensor> received;
    if (rt_.tied_messages.empty()) return received;
    const int64_t begin = NowNs();
    std::vector<Tensor> sent;  // kept alive until their sends complete
    std::vector<std::pair<std::string, Request>> pending;
    for (const StageRuntime::Impl::TiedMessage& msg : rt_.tied_messages) {
      if (msg.send) {
        auto it = grads_.grads().find(msg.grad);  // a share without a gradient sends zeros
        sent.push_back(it != grads_.grads().end()
                           ? it->second
                           : Tensor::Zeros(msg.shape, DType::kF32, rt_.allocator));
        pending.emplace_back("", comm_.Isend(sent.back(), msg.peer, msg.tag));
      } else {
        pending.emplace_back(msg.grad,
                             comm_.Irecv(msg.peer, msg.tag, DType::kF32, msg.shape, rt_.allocator));
      }
    }
    for (auto& [grad, request] : pending) {
      Tensor t = request.Wait();
      if (!grad.empty()) received.emplace(grad, std::move(t));
    }
    out_.comm_ns += NowNs() - begin;
    Span("ALLREDUCE_TIED", a, begin, NowNs());
    return received;
  }

  bool interlocked_;
  StageRuntime::Impl& rt_;
  const TrainConfig& cfg_;  // the run's (step/train_config.h)
  int64_t step_;
  int64_t first_batch_;  // the training batch of micro-batch 0
  double lr_;
  Communicator& comm_;
  bool trace_;
  std::vector<MicroBatch> mbs_;  // [V·M]
  std::vector<int> sending_;     // micro-batches (c·M + m) whose SEND_F has not been seen complete
  GradientAccumulator grads_;
  int inflight_ = 0, awaiting_ = 0;
  bool backward_seen_ = false;
  std::vector<int> inflight_chunk_;
  StageStep out_;
};

int64_t ThreadCoreWaitNs() {
#if defined(__linux__)
  // "run ns, wait ns, timeslices" of this thread (the kernel's sched_info, always kept when it was
  // built with CONFIG_SCHED_INFO, as distribution kernels are).
  std::FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
  if (f == nullptr) return -1;
  unsigned long long run = 0, wait = 0;  // NOLINT(google-runtime-int): fscanf's %llu
  const int read = std::fscanf(f, "%llu %llu", &run, &wait);
  std::fclose(f);
  return read == 2 ? static_cast<int64_t>(wait) : -1;
#else
  return -1;
#endif
}

int64_t StepSpanNs(const std::vector<StageStep>& steps) {
  if (steps.empty()) return 0;
  int64_t first = steps.front().begin_ns, last = first;
  for (const StageStep& s : steps) {
    first = std::min(first, s.begin_ns);
    last = std::max(last, s.begin_ns + s.wall_ns);
  }
  return last - first;
}

StageStep StageRuntime::RunStep(int64_t step, int64_t first_batch, double lr, Communicator& comm,
                                bool trace) {
  SLUICE_CHECK(!impl_->pending,
               "stage {}: step {} ran synchronously while step {} awaits its "
               "validation",
               impl_->rank, step + 1, impl_->pending ? impl_->pending->step + 1 : 0);
  return StepRun(*impl_, step, first_batch, lr, comm, trace).Run();
}

StageStep StageRuntime::RunStepInterlocked(int64_t step, int64_t first_batch, double lr,
                                           Communicator& comm, bool trace) {
  SLUICE_CHECK(impl_->setup.post_validate && impl_->setup.data == nullptr,
               "stage {}: interlocked steps need post-validation without data parallelism",
               impl_->rank);
  return StepRun(*impl_, step, first_batch, lr, comm, trace, /*interlocked=*/true).Run();
}

StageProgram::Validation StageRuntime::Settle() {
  Impl& rt = *impl_;
  if (!rt.pending) return StageProgram::Validation::kAccepted;
  const auto [norm, loss] = rt.ReducedAtChainEnd("validate");
  const StageProgram::Validation v =
      rt.program->ValidateEagerUpdate(norm, loss, rt.pending->lr, rt.pending->step);
  rt.pending.reset();
  return v;
}

void StageRuntime::DiscardPending() {
  Impl& rt = *impl_;
  if (!rt.pending) return;
  rt.ReducedAtChainEnd("undo");  // every rank posted it: the collective completes on every rank
  rt.program->DiscardEagerUpdate(rt.pending->step);
  rt.program->RestoreBuffers();  // as before the discarded step's forwards
  rt.pending.reset();
}

StepProgress::StepProgress(int ranks) : ranks_(ranks), begun_(static_cast<size_t>(ranks), -1) {}

bool StepProgress::Begin(int rank, int64_t step) {
  MutexLock lock(&mu_);
  begun_[static_cast<size_t>(rank)] = std::max(begun_[static_cast<size_t>(rank)], step);
  const auto previous = finished_.find(step - 1);
  const bool overlap = previous != finished_.end() && previous->second < ranks_;
  if (overlap) ++overlapped_;
  cv_.NotifyAll();
  return overlap;
}

void StepProgress::Finish(int rank, int64_t step) {
  MutexLock lock(&mu_);
  (void)rank;
  ++finished_[step];
  // A step two behind every rank's is done with: keep the map small.
  while (!finished_.empty() && finished_.begin()->first < step - 2)
    finished_.erase(finished_.begin());
}

bool StepProgress::WaitBegun(int rank, int64_t step, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (begun_[static_cast<size_t>(rank)] < step && cv_.WaitUntil(&mu_, deadline)) {
  }
  return begun_[static_cast<size_t>(rank)] >= step;
}

int64_t StepProgress::overlapped_starts() const {
  MutexLock lock(&mu_);
  return overlapped_;
}

}  // namespace sluice::pipeline
