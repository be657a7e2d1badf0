#include "sluice/pipeline/stage_runtime.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/exec/interpreter.h"
#include "sluice/nn/optimizer.h"

namespace sluice::pipeline {

namespace {

using Clock = std::chrono::steady_clock;
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// CPU time of the calling thread: what a compute used, without the time it waited for a core.
int64_t ThreadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

constexpr const char* kInput = "x";
constexpr const char* kOutput = "y";
constexpr const char* kOutputGrad = "y.grad";
constexpr const char* kInputGrad = "x.grad";

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Every input of `program` (not its parameters): what a backward run may free at last use.
std::vector<std::string> InputNames(const Program& program, const std::vector<std::string>& except = {}) {
  std::vector<std::string> names;
  for (ValueId v : program.inputs()) {
    const std::string& name = program.value(v).name;
    if (!Contains(except, name)) names.push_back(name);
  }
  return names;
}

// One virtual stage held by this rank.
struct Chunk {
  int virtual_stage = 0;
  bool first = false, last = false;
  Model model;
  Backward backward;
  SplitBackward split;  // when the schedule splits the backward
  std::vector<std::string> params;
  bool output_saved = false;  // backward reads "y": it is never released early
  std::unique_ptr<Executable> forward, backward_exe, b_exe, w_exe;
};

// The state of one chunk-micro-batch between its actions.
struct MicroBatch {
  Scope scope;
  Tensor output;      // "y" awaiting its send's completion (or B, when release is off)
  Tensor input_grad;  // "x.grad" awaiting SEND_B
  Request recv_f, recv_b, send_f, send_b;
  bool f_done = false, b_done = false;
};

}  // namespace

struct StageRuntime::Impl {
  const StageSetup& setup;
  int rank;
  int P, V, M;
  CachingAllocator allocator;
  std::vector<Chunk> chunks;  // [V]
  Scope state;                // parameters and optimizer state of every chunk
  std::vector<ParamSpec> params;
  std::unique_ptr<Executable> optimizer;
  Shape io_shape;  // [B, T, C]

  Impl(const StageSetup& s, int r);
  int Tag(int receiving_virtual_stage, int micro_batch, int direction) const {
    return ((receiving_virtual_stage * M + micro_batch) * 2 + direction) % (kMaxTag + 1);
  }
};

StageRuntime::Impl::Impl(const StageSetup& s, int r)
    : setup(s), rank(r), P(s.schedule.stages), V(s.schedule.chunks), M(s.schedule.micro_batches) {
  const TrainConfig& config = *s.config;
  io_shape = Shape{s.micro_batch, s.seq_len, s.gpt.dim};
  ExecutableOptions base{.allocator = &allocator, .mode = config.mode, .gc = config.gc, .threads = s.threads,
                         .reset_peak = false};
  chunks.resize(V);
  for (int c = 0; c < V; ++c) {
    Chunk& ch = chunks[c];
    ch.virtual_stage = s.schedule.VirtualStage(rank, c);
    ch.first = ch.virtual_stage == 0;
    ch.last = ch.virtual_stage == s.schedule.virtual_stages() - 1;
    ch.model = BuildGptSlice(s.gpt, s.micro_batch, GptOutput::kLoss, s.seq_len, s.slices[ch.virtual_stage]);
    std::vector<std::string> wrt;
    for (const ParamSpec& p : ch.model.params) {
      wrt.push_back(p.name);
      ch.params.push_back(p.name);
      params.push_back(p);
    }
    if (!ch.first) wrt.push_back(kInput);
    GradientSpec spec{.wrt = wrt, .recompute = config.recompute};
    if (ch.last) {
      spec.loss = ch.model.loss;
    } else {
      spec.seeds = {kOutput};
    }
    ch.backward = BuildBackward(ch.model.forward, spec);
    ch.output_saved = !ch.last && Contains(ch.backward.saved, kOutput);

    ExecutableOptions fwd = base;
    fwd.keep = ch.backward.saved;
    ch.forward = std::make_unique<Executable>(ch.model.forward, fwd);
    if (s.schedule.split_backward) {
      ch.split = SplitBW(ch.backward, ch.first ? std::vector<std::string>{} : std::vector<std::string>{kInput});
      ExecutableOptions b = base;
      b.donate = InputNames(ch.split.b, ch.split.w_saved);  // W still reads w_saved
      ch.b_exe = std::make_unique<Executable>(ch.split.b, b);
      ExecutableOptions w = base;
      w.donate = InputNames(ch.split.w);
      ch.w_exe = std::make_unique<Executable>(ch.split.w, w);
    } else {
      ExecutableOptions bwd = base;
      bwd.donate = InputNames(ch.backward.program);  // saved activations and "y.grad" die at last use
      ch.backward_exe = std::make_unique<Executable>(ch.backward.program, bwd);
    }
  }
  optimizer = std::make_unique<Executable>(BuildOptimizer(params, config.optimizer), base);
  for (auto& [name, t] : InitParams(params, config.seed, allocator)) state.Set(name, std::move(t));
  for (auto& [name, t] : InitOptimizerState(params, config.optimizer, allocator)) state.Set(name, std::move(t));
}

StageRuntime::StageRuntime(const StageSetup& setup, int rank) : impl_(std::make_unique<Impl>(setup, rank)) {}
StageRuntime::~StageRuntime() = default;

int StageRuntime::rank() const { return impl_->rank; }

std::map<std::string, Tensor> StageRuntime::State() const {
  const Impl& m = *impl_;
  std::map<std::string, Tensor> out;
  for (const ParamSpec& p : m.params) {
    out.emplace(p.name, m.state.Get(p.name));
    for (const std::string& s : OptimizerStateNames(p.name, m.setup.config->optimizer)) out.emplace(s, m.state.Get(s));
  }
  return out;
}

// Executes one step of one rank; lives for the duration of RunStep.
class StageRuntime::StepRun {
 public:
  StepRun(StageRuntime::Impl& rt, int64_t step, double lr, Communicator& comm, bool trace)
      : rt_(rt), cfg_(*rt.setup.config), step_(step), lr_(lr), comm_(comm), trace_(trace),
        mbs_(static_cast<size_t>(rt.V * rt.M)) {
    out_.inflight_peak_per_chunk.assign(rt.V, 0);
    inflight_chunk_.assign(rt.V, 0);
  }

  StageStep Run() {
    const auto& actions = rt_.setup.schedule.ranks[rt_.rank];
    rt_.allocator.ResetPeak();
    const int64_t t0 = NowNs();
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      try {
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
        const std::string what = fmt::format(
            "stage {} failed at step {}, action {} of {} ({}{}): {}", rt_.rank, step_ + 1, i + 1, actions.size(),
            ActionName(a, rt_.V),
            a.kind == ActionKind::kOptimizer ? "" : fmt::format(", chunk {}, micro-batch {}", a.chunk, a.micro_batch),
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
      const std::string what = fmt::format("stage {} failed at the end of step {}, waiting for its sends to complete: {}",
                                           rt_.rank, step_ + 1, e.what());
      comm_.Abort(what);
      throw StageError(what);
    }
    out_.wall_ns = NowNs() - t0;
    const MemoryStats stats = rt_.allocator.Stats();
    out_.peak_allocated_bytes = stats.peak_allocated_bytes;
    out_.peak_reserved_bytes = stats.peak_reserved_bytes;
    return std::move(out_);
  }

 private:
  MicroBatch& Mb(int chunk, int micro_batch) { return mbs_[chunk * rt_.M + micro_batch]; }
  int VirtualStage(int chunk) const { return rt_.chunks[chunk].virtual_stage; }

  bool Faulty(const Action& a) {
    const FaultInjection& f = rt_.setup.fault;
    if (f.mode == FaultInjection::Mode::kNone || f.rank != rt_.rank || f.kind != a.kind ||
        f.micro_batch != a.micro_batch || a.chunk != 0 || f.step != step_) {
      return false;
    }
    if (f.mode == FaultInjection::Mode::kThrow) throw Error("injected fault");
    return true;  // kSkip
  }

  // Times a compute action: busy time, and a span when tracing.
  template <typename F>
  void Compute(const Action& a, const char* name, F&& body) {
    const int64_t begin = NowNs(), cpu_begin = ThreadCpuNs();
    body();
    const int64_t end = NowNs();
    out_.busy_ns += end - begin;
    out_.busy_cpu_ns += ThreadCpuNs() - cpu_begin;
    Span(name, a, begin, end);
  }

  void Span(const char* name, const Action& a, int64_t begin, int64_t end) {
    if (trace_) out_.spans.push_back({name, a.chunk, a.micro_batch, begin, end});
  }

  // Times communication: posting, testing and waiting for messages, and the all-reduces.
  template <typename F>
  void Comm(F&& body) {
    const int64_t begin = NowNs();
    body();
    out_.comm_ns += NowNs() - begin;
  }

  // Waits for a receive, timing the wait as a span; then releases what completed meanwhile.
  Tensor Receive(Request& request, const Action& a, const char* name) {
    const int64_t begin = NowNs();
    Tensor t = request.Wait();
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
      if (rt_.setup.release_outputs && mb.output.defined() && !rt_.chunks[index / rt_.M].output_saved) {
        out_.released_output_bytes += mb.output.numel() * static_cast<int64_t>(SizeOf(mb.output.dtype()));
        mb.output = Tensor();
      }
      return true;
    });
  }

  void Execute(const Action& a) {
    Chunk& ch = rt_.chunks[a.chunk];
    MicroBatch& mb = Mb(a.chunk, a.micro_batch);
    switch (a.kind) {
      case ActionKind::kRecvF:
        mb.recv_f = comm_.Irecv(a.peer, rt_.Tag(VirtualStage(a.chunk), a.micro_batch, 0), DType::kF32, rt_.io_shape,
                                rt_.allocator);
        break;
      case ActionKind::kSendF:
        mb.send_f = comm_.Isend(mb.output, a.peer, rt_.Tag(VirtualStage(a.chunk) + 1, a.micro_batch, 0));
        sending_.push_back(a.chunk * rt_.M + a.micro_batch);
        Span("SEND_F", a, NowNs(), NowNs());
        break;
      case ActionKind::kRecvB:
        mb.recv_b = comm_.Irecv(a.peer, rt_.Tag(VirtualStage(a.chunk), a.micro_batch, 1), DType::kF32, rt_.io_shape,
                                rt_.allocator);
        break;
      case ActionKind::kSendB:
        mb.send_b = comm_.Isend(mb.input_grad, a.peer, rt_.Tag(VirtualStage(a.chunk) - 1, a.micro_batch, 1));
        mb.input_grad = Tensor();  // the send holds it until completion, then it is freed
        Span("SEND_B", a, NowNs(), NowNs());
        break;
      case ActionKind::kForward: Forward(a, ch, mb); break;
      case ActionKind::kBackward: Backward(a, ch, mb); break;
      case ActionKind::kWeight: Weight(a, ch, mb); break;
      case ActionKind::kOptimizer: Optimize(a); break;
    }
  }

  void BindParams(const Chunk& ch, Scope& scope) {
    for (const std::string& p : ch.params) scope.Set(p, rt_.state.Get(p));
  }

  void Forward(const Action& a, Chunk& ch, MicroBatch& mb) {
    Scope& scope = mb.scope;
    if (ch.first || ch.last) {  // only the ranks that need data read it
      const StageSetup& s = rt_.setup;
      Scope batch;
      s.task->BindBatch(batch, DataSplit::kTrain, step_ * rt_.M + a.micro_batch, s.micro_batch * s.replicas, cfg_.seed);
      auto rows = [&](const char* name) {  // this replica's share
        Tensor t = batch.Take(name);
        return s.replicas == 1 ? t : t.Slice(0, s.replica * s.micro_batch, (s.replica + 1) * s.micro_batch);
      };
      if (ch.first) scope.Set("ids", rows("ids"));
      if (ch.last) scope.Set("targets", rows("targets"));
    }
    if (!ch.first) {
      // The input comes from the previous virtual stage: a message, or this rank's own chunk (P = 1).
      if (mb.recv_f.valid()) {
        scope.Set(kInput, Receive(mb.recv_f, a, "RECV_F"));
        mb.recv_f = Request();
      } else {
        MicroBatch& prev = Mb(a.chunk - 1, a.micro_batch);
        scope.Set(kInput, std::move(prev.output));
        prev.output = Tensor();
      }
    }
    Compute(a, "F", [&] {
      BindParams(ch, scope);
      ch.forward->Run(scope);
    });
    if (ch.last) {
      out_.losses.resize(rt_.M);
      out_.losses[a.micro_batch] = scope.Get(ch.model.loss).FlatAt(0);
      scope.Erase(ch.model.loss);
    } else {
      mb.output = ch.output_saved ? scope.Get(kOutput) : scope.Take(kOutput);
    }
    // The hand-off: the scope keeps exactly what the backward reads.
    for (const std::string& name : scope.Names()) {
      if (!Contains(ch.backward.saved, name)) scope.Erase(name);
    }
    mb.f_done = true;
    ++inflight_;
    ++inflight_chunk_[a.chunk];
    out_.inflight_peak = std::max(out_.inflight_peak, inflight_);
    out_.inflight_peak_per_chunk[a.chunk] = std::max(out_.inflight_peak_per_chunk[a.chunk], inflight_chunk_[a.chunk]);
  }

  void Backward(const Action& a, Chunk& ch, MicroBatch& mb) {
    Scope& scope = mb.scope;
    if (!ch.last) {
      if (mb.recv_b.valid()) {
        scope.Set(kOutputGrad, Receive(mb.recv_b, a, "RECV_B"));
        mb.recv_b = Request();
      } else {
        MicroBatch& next = Mb(a.chunk + 1, a.micro_batch);
        scope.Set(kOutputGrad, std::move(next.input_grad));
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
    Compute(a, "B", [&] {
      BindParams(ch, scope);
      if (rt_.setup.schedule.split_backward) {
        ch.b_exe->Run(scope);
      } else {
        ch.backward_exe->Run(scope);
      }
      TakeGradients(ch, scope);
    });
    if (!ch.first) mb.input_grad = scope.Take(kInputGrad);
    mb.output = Tensor();  // release off: kept until now
    if (!rt_.setup.schedule.split_backward) scope.Clear();
    mb.b_done = true;
    --inflight_;
    --inflight_chunk_[a.chunk];
    if (rt_.setup.schedule.split_backward) out_.awaiting_weight_peak = std::max(out_.awaiting_weight_peak, ++awaiting_);
  }

  void Weight(const Action& a, Chunk& ch, MicroBatch& mb) {
    Compute(a, "W", [&] {
      BindParams(ch, mb.scope);
      ch.w_exe->Run(mb.scope);
      TakeGradients(ch, mb.scope);
    });
    mb.scope.Clear();
    --awaiting_;
  }

  // Parameter gradients a backward run left in the scope go to the accumulator, in micro-batch order.
  void TakeGradients(const Chunk& ch, Scope& scope) {
    for (const std::string& p : ch.params) {
      Tensor g = scope.Take(p + ".grad");
      if (g.defined()) grads_.Add(p + ".grad", std::move(g));
    }
  }

  void Optimize(const Action& a) {
    const StageSetup& setup = rt_.setup;
    if (setup.data != nullptr) {  // sum over replicas, every gradient in name order on every replica
      const int64_t begin = NowNs();
      for (const auto& [name, g] : grads_.grads()) setup.data->AllReduceSum(g);
      out_.comm_ns += NowNs() - begin;
      Span("ALLREDUCE_DP", a, begin, NowNs());
    }
    double sum_sq = 0;
    Compute(a, "OPT", [&] { sum_sq = grads_.MeanAndSumSquares(rt_.M * setup.replicas); });
    Tensor total = Tensor::Full({}, sum_sq, DType::kF64, rt_.allocator);
    const int64_t begin = NowNs();
    comm_.AllReduceSum(total);
    out_.comm_ns += NowNs() - begin;
    Span("ALLREDUCE", a, begin, NowNs());
    out_.grad_norm = std::sqrt(total.FlatAt(0));
    Compute(a, "OPT", [&] {
      grads_.Clip(out_.grad_norm, cfg_.optimizer.clip_norm);
      Scope& s = rt_.state;
      for (const auto& [name, g] : grads_.grads()) s.Set(name, g);
      grads_.Clear();
      s.Set("lr", Tensor::Full({}, lr_, DType::kF32, rt_.allocator));
      s.Set("step", Tensor::Full({}, static_cast<double>(step_ + 1), DType::kF32, rt_.allocator));
      rt_.optimizer->Run(s);
      for (const ParamSpec& p : rt_.params) s.Erase(p.name + ".grad");
      s.Erase("lr");
      s.Erase("step");
    });
  }

  StageRuntime::Impl& rt_;
  const TrainConfig& cfg_;
  int64_t step_;
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

StageStep StageRuntime::RunStep(int64_t step, double lr, Communicator& comm, bool trace) {
  return StepRun(*impl_, step, lr, comm, trace).Run();
}

}  // namespace sluice::pipeline
