#include "sluice/pipeline/memory_forecast.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "sluice/core/caching_allocator.h"

namespace sluice::pipeline {

namespace {

using Id = MemoryLedger::Id;
constexpr Id kNone = -2;

// What each rank knows of the others: the vector clock of every action. clock[r][i][q] is the
// index of the last action of rank q that happens before action i of rank r runs (−1: none) —
// through rank order and messages: a compute that reads a message (F after RECV_F, B after RECV_B)
// runs after the send, and B(c, m) after the receiver of its output posted the receive (B waits
// for that send). A send has certainly completed by action i of its rank when the matching
// receive was posted before i in this order; the forecast assumes nothing earlier.
struct Causality {
  std::vector<std::vector<std::vector<int>>> clock;          // [rank][action][rank]
  std::vector<std::vector<std::pair<int, int>>> receive_of;  // [rank][send action] → (q, k)
};

Causality Order(const Schedule& schedule) {
  const int P = schedule.stages;
  const auto& ranks = schedule.ranks;
  Causality out;
  out.receive_of.resize(P);
  // The k-th send from r to q pairs with the k-th receive of q from r (validator.h).
  std::map<std::pair<int, int>, std::vector<int>> sends, receives;
  for (int r = 0; r < P; ++r) {
    out.receive_of[r].assign(ranks[r].size(), {-1, -1});
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const Action& a = ranks[r][i];
      if (IsSend(a.kind)) sends[{r, a.peer}].push_back(static_cast<int>(i));
      if (IsRecv(a.kind)) receives[{a.peer, r}].push_back(static_cast<int>(i));
    }
  }
  // waits[r][i]: the (rank, action) pairs action i of rank r waits for.
  std::vector<std::vector<std::vector<std::pair<int, int>>>> waits(P);
  for (int r = 0; r < P; ++r) waits[r].resize(ranks[r].size());
  auto find = [&](int r, ActionKind kind, const Action& like) {
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const Action& a = ranks[r][i];
      if (a.kind == kind && a.chunk == like.chunk && a.micro_batch == like.micro_batch) {
        return static_cast<int>(i);
      }
    }
    return -1;
  };
  for (const auto& [channel, list] : sends) {
    const auto& [r, q] = channel;
    const std::vector<int>& posts = receives.at(channel);
    for (size_t k = 0; k < list.size(); ++k) {
      const int send = list[k], receive = posts.at(k);
      out.receive_of[r][send] = {q, receive};
      const Action& recv = ranks[q][receive];
      const int reader = find(
          q, recv.kind == ActionKind::kRecvF ? ActionKind::kForward : ActionKind::kBackward, recv);
      if (reader >= 0) waits[q][reader].push_back({r, send});
      if (ranks[r][send].kind == ActionKind::kSendF) {
        const int backward = find(r, ActionKind::kBackward, ranks[r][send]);
        if (backward >= 0) waits[r][backward].push_back({q, receive});
      }
    }
  }
  out.clock.resize(P);
  std::vector<size_t> next(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < ranks[r].size()) {
        const size_t i = next[r];
        bool ready = true;
        for (const auto& [q, j] : waits[r][i]) ready = ready && next[q] > static_cast<size_t>(j);
        if (!ready) break;
        std::vector<int> clock = i > 0 ? out.clock[r][i - 1] : std::vector<int>(P, -1);
        for (const auto& [q, j] : waits[r][i]) {
          for (int p = 0; p < P; ++p) clock[p] = std::max(clock[p], out.clock[q][j][p]);
        }
        clock[r] = static_cast<int>(i);
        out.clock[r].push_back(std::move(clock));
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    SLUICE_CHECK(next[r] == ranks[r].size(), "{}: rank {} cannot pass action {}",
                 schedule.Describe(), r, next[r]);
  }
  return out;
}

// The state of one chunk-micro-batch between its actions, as StageRuntime keeps it.
struct MicroBatch {
  explicit MicroBatch(MemoryLedger& ledger) : scope(ledger, MemoryUse::kActivations) {}
  SymbolicScope scope;
  Id output = kNone;      // "y" awaiting its send (or B)
  Id input_grad = kNone;  // "x.grad" awaiting SEND_B
  Id recv_f = kNone, recv_b = kNone;
  bool sending = false;  // SEND_F made, not yet seen complete
};

class RankReplay {
 public:
  // `prompt`: every send completes as soon as it is made (its receive was posted before), the
  // least memory any timing gives; otherwise only once its receive was certainly posted.
  // `explain_at`: the peak this same replay found, to list what it holds; -1 not to.
  RankReplay(const StageSetup& setup, int rank, const Causality& causality, bool prompt,
             ReplayFrees frees, int64_t explain_at = -1)
      : setup_(setup),
        rank_(rank),
        causality_(causality),
        prompt_(prompt),
        program_(BuildStageProgram(setup, rank, unused_, /*plan_only=*/true)),
        ledger_(MakeLedger(frees, setup.config->reserved_headroom, explain_at)),
        stage_(*program_, ledger_),
        grads_(ledger_) {
    const int V = setup.schedule.chunks, M = setup.schedule.micro_batches;
    mbs_.reserve(static_cast<size_t>(V * M));
    for (int k = 0; k < V * M; ++k) {
      mbs_.emplace_back(std::make_unique<MicroBatch>(ledger_));
      mbs_.back()->scope.HoldFor(k % M, V > 1 ? k / M : -1);
    }
  }

  StageMemoryForecast Run() {
    StageMemoryForecast out;
    out.stage = rank_;
    // Parameters and optimizer state are laid out before the first step, in this order, and never
    // move: the pages they lie on are the reserved bytes now, not a page span each.
    const int64_t laid_out = ledger_.reserved();
    ledger_.ResetPeak();
    const int64_t laid_out_spans = ledger_.peak_page_spans();
    if (setup_.post_validate) {  // allocated at the first step's OPT, then held for the run
      out.rollback_bytes = RollbackBytes(program_->params(), setup_.config->optimizer);
      ledger_.Allocate(out.rollback_bytes, MemoryUse::kOptimizerState);
      // Interlocked steps: the previous step's gradients, kept for its redo, and its norm
      // partials (the pending reduction's operand: one f64 per model parameter and the loss sum),
      // through this step.
      out.interlock_bytes = static_cast<int64_t>((setup_.model_params.size() + 1) * sizeof(double));
      for (const ParamSpec& p : program_->params()) {
        if (!p.constant)
          out.interlock_bytes += p.shape.numel() * static_cast<int64_t>(sizeof(float));
      }
      ledger_.Allocate(out.interlock_bytes, MemoryUse::kGradients);
    }
    out.persistent_bytes = ledger_.allocated();
    ledger_.ResetPeak();
    const auto& actions = setup_.schedule.ranks[rank_];
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      ledger_.SetPhase(Phase(a, i, actions.size()));
      Poll(i);
      Execute(a, i);
    }
    out.peak_allocated_bytes = ledger_.peak();
    // Thread timing orders the frees, so the holes of this replay's order are not the run's: the
    // pages of what the rank holds bound its reserved bytes under a budget of that much — the
    // parameters' and state's pages as laid out, a page span for everything else.
    out.peak_reserved_bytes =
        std::min(ledger_.peak_page_spans(), ledger_.peak_page_spans() - laid_out_spans + laid_out);
    out.work = stage_.work();
    out.at_peak = ledger_.at_peak();
    out.peak_phase = ledger_.peak_phase();
    out.peak_instruction = ledger_.peak_instruction();
    out.live_at_peak = ledger_.LiveAtPeak();
    return out;
  }

 private:
  static MemoryLedger MakeLedger(ReplayFrees frees, double reserved_headroom, int64_t explain_at) {
    MemoryLedger ledger(frees, reserved_headroom);
    if (explain_at >= 0) ledger.ExplainAt(explain_at);
    return ledger;
  }

  // Names a received buffer `name` (of the type of the chunk's `like`, which its gradient has
  // too) and says why it is held (when explaining).
  void NoteMessage(Id id, const Chunk& ch, const char* name, const char* like, const Action& a,
                   std::string detail) {
    if (!ledger_.explaining()) return;
    ledger_.Made(id, name, ChunkMessageType(ch.model.forward, like).ToString(),
                 fmt::format("{} from stage {}", ActionKindName(a.kind), a.peer));
    ledger_.Note(id, MemoryUse::kMessages, LiveReason::kMessage, std::move(detail), a.micro_batch,
                 setup_.schedule.chunks > 1 ? a.chunk : -1);
  }

  struct Pending {
    int mb;
    bool forward;  // SEND_F (the output is released) or SEND_B (the send held "x.grad")
    Id id;         // SEND_B: the storage the send holds
    int send;      // the send's action index
  };

  std::string Phase(const Action& a, size_t i, size_t n) const {
    if (a.kind == ActionKind::kOptimizer) return fmt::format("OPT (action {} of {})", i + 1, n);
    return fmt::format(
        "{} of micro-batch {}{} (action {} of {})", ActionKindName(a.kind), a.micro_batch,
        setup_.schedule.chunks > 1 ? fmt::format(", chunk {}", a.chunk) : "", i + 1, n);
  }

  MicroBatch& Mb(int chunk, int micro_batch) {
    return *mbs_[static_cast<size_t>(chunk * setup_.schedule.micro_batches + micro_batch)];
  }

  void ReleaseOutput(MicroBatch& mb, int chunk) {
    if (mb.output == kNone || !setup_.release_outputs || program_->chunk(chunk).output_saved) {
      return;
    }
    ledger_.Release(mb.output, MemoryUse::kMessages);
    mb.output = kNone;
  }

  void Complete(const Pending& p) {
    const int M = setup_.schedule.micro_batches;
    MicroBatch& mb = *mbs_[static_cast<size_t>(p.mb)];
    if (p.forward) {
      mb.sending = false;
      ReleaseOutput(mb, p.mb / M);
    } else {
      ledger_.Release(p.id, MemoryUse::kMessages);
    }
  }

  // StageRuntime's PollSends before action i (and the communicator dropping "x.grad" once
  // matched): every send whose receive was certainly posted by then has completed. `everyone`:
  // after OPT's all-reduce, when every rank has posted all its receives.
  void Poll(size_t i, bool everyone = false) {
    const std::vector<int>& known = causality_.clock[rank_][i];
    std::erase_if(pending_, [&](const Pending& p) {
      const auto [q, k] = causality_.receive_of[rank_][static_cast<size_t>(p.send)];
      if (!everyone && !prompt_ && known[static_cast<size_t>(q)] < k) return false;
      Complete(p);
      return true;
    });
  }

  void Execute(const Action& a, size_t i) {
    const Chunk& ch = program_->chunk(a.chunk);
    MicroBatch& mb = Mb(a.chunk, a.micro_batch);
    const int M = setup_.schedule.micro_batches;
    const int index = a.chunk * M + a.micro_batch;
    switch (a.kind) {
      case ActionKind::kRecvF:
        mb.recv_f = ledger_.Allocate(MessageBytes(ch, kChunkInput), MemoryUse::kMessages);
        NoteMessage(mb.recv_f, ch, kChunkInput, kChunkInput, a,
                    fmt::format("received from stage {}", a.peer));
        break;
      case ActionKind::kRecvB:
        mb.recv_b = ledger_.Allocate(MessageBytes(ch, kChunkOutput), MemoryUse::kMessages);
        NoteMessage(mb.recv_b, ch, kChunkOutputGrad, kChunkOutput, a,
                    fmt::format("received from stage {}", a.peer));
        break;
      case ActionKind::kSendF:
        Sent(mb.output, a);
        mb.sending = true;
        pending_.push_back({index, true, kNone, static_cast<int>(i)});
        break;
      case ActionKind::kSendB:
        Sent(mb.input_grad, a);
        pending_.push_back({index, false, mb.input_grad, static_cast<int>(i)});
        mb.input_grad = kNone;  // the send holds it until it completes
        break;
      case ActionKind::kForward:
        Forward(a, ch, mb, i);
        break;
      case ActionKind::kBackward:
        Backward(a, ch, mb, index, i);
        break;
      case ActionKind::kWeight:
        stage_.Weight(a.chunk, mb.scope, grads_);
        mb.scope.Clear();
        break;
      case ActionKind::kOptimizer: {
        stage_.ReceiveTiedShares(grads_);  // the shares of tied parameters other ranks hold
        const Id sum_squares = ledger_.Allocate(
            static_cast<int64_t>(setup_.model_params.size() * sizeof(double)), MemoryUse::kWorking);
        ledger_.Made(sum_squares, "clip.sum_squares",
                     fmt::format("f64[{}]", setup_.model_params.size()), "clipping");
        Poll(i, /*everyone=*/true);  // the norm's all-reduce: every rank has reached OPT
        stage_.Update(grads_);
        ledger_.Release(sum_squares, MemoryUse::kWorking);
        break;
      }
    }
  }

  // The bytes of a message: a chunk's input "x" or output "y", or its gradient (the same).
  static int64_t MessageBytes(const Chunk& ch, const char* name) {
    return ChunkMessageBytes(ch.model.forward, name);
  }

  // Binds an input that arrived in `*held` (a receive's buffer or a local hand-off).
  void Bind(SymbolicScope& scope, const char* name, Id& held) {
    scope.Set(name, held);
    ledger_.Release(held, MemoryUse::kMessages);
    held = kNone;
  }

  void Forward(const Action& a, const Chunk& ch, MicroBatch& mb, size_t i) {
    SymbolicScope& scope = mb.scope;
    for (ValueId v : ch.model.forward.inputs()) {  // the batch: another allocator's
      const std::string& name = ch.model.forward.value(v).name;
      if (ch.first || name != kChunkInput) scope.Set(name, MemoryLedger::kExternal);
    }
    if (!ch.first) {
      if (mb.recv_f != kNone) {
        Bind(scope, kChunkInput, mb.recv_f);
        Poll(i);
      } else {
        Bind(scope, kChunkInput, Mb(a.chunk - 1, a.micro_batch).output);
      }
    }
    stage_.Forward(a.chunk, scope);
    if (ch.last) {
      scope.Erase(ch.model.loss);
    } else if (ch.output_saved) {
      mb.output = scope.Get(kChunkOutput);
      ledger_.Retain(mb.output, MemoryUse::kMessages);
    } else {
      mb.output = scope.Take(kChunkOutput, MemoryUse::kMessages);
    }
    if (!ch.last) {
      ledger_.Note(mb.output, MemoryUse::kMessages, LiveReason::kMessage, "output to send",
                   a.micro_batch, setup_.schedule.chunks > 1 ? a.chunk : -1);
    }
  }

  // A send reads `id` now; until it completes the message is in flight.
  void Sent(Id id, const Action& a) {
    if (!ledger_.explaining() || id == kNone) return;
    const std::string send = fmt::format("{} to stage {}", ActionKindName(a.kind), a.peer);
    ledger_.ReadBy(id, send);
    ledger_.Note(id, MemoryUse::kMessages, LiveReason::kInFlight, send, a.micro_batch,
                 setup_.schedule.chunks > 1 ? a.chunk : -1);
  }

  void Backward(const Action& a, const Chunk& ch, MicroBatch& mb, int index, size_t i) {
    SymbolicScope& scope = mb.scope;
    if (!ch.last) {
      if (mb.recv_b != kNone) {
        Bind(scope, kChunkOutputGrad, mb.recv_b);
        Poll(i);
      } else {
        Bind(scope, kChunkOutputGrad, Mb(a.chunk + 1, a.micro_batch).input_grad);
      }
    }
    if (mb.sending) {  // B waits for its output's send, which has completed by now
      std::erase_if(pending_, [&](const Pending& p) {
        if (!p.forward || p.mb != index) return false;
        Complete(p);
        return true;
      });
    }
    stage_.Backward(a.chunk, scope, grads_);
    if (!ch.first) {
      mb.input_grad = scope.Take(kChunkInputGrad, MemoryUse::kMessages);
      ledger_.Note(mb.input_grad, MemoryUse::kMessages, LiveReason::kMessage,
                   "input gradient to send", a.micro_batch,
                   setup_.schedule.chunks > 1 ? a.chunk : -1);
    }
    if (mb.output != kNone) {  // release off (or a saved output): kept until now
      ledger_.Release(mb.output, MemoryUse::kMessages);
      mb.output = kNone;
    }
    if (!setup_.schedule.split_backward) scope.Clear();
  }

  const StageSetup& setup_;
  int rank_;
  const Causality& causality_;
  bool prompt_;
  CachingAllocator unused_;  // a plan-only program allocates nothing
  std::unique_ptr<StageProgram> program_;
  MemoryLedger ledger_;
  StageReplay stage_;
  SymbolicGradients grads_;
  std::vector<std::unique_ptr<MicroBatch>> mbs_;  // [V·M]
  std::vector<Pending> pending_;
};

}  // namespace

std::optional<std::string> ForecastRefusal(const Schedule& schedule) {
  int64_t actions = 0;
  for (const std::vector<Action>& rank : schedule.ranks) actions += std::ssize(rank);
  if (actions <= kForecastActionLimit) return std::nullopt;
  return fmt::format(
      "memory not forecast: {} actions, over the forecast's {} (it replays every action's "
      "programs); use fewer micro-batches or stages to see it",
      actions, kForecastActionLimit);
}

std::vector<StageMemoryForecast> ForecastStages(const StageSetup& setup, bool explain) {
  if (std::optional<std::string> why = ForecastRefusal(setup.schedule)) throw InvalidArgument(*why);
  // The programs are built as trace mode with sync GC plans them; the frees follow the run's own
  // --gc and --mode (memory_replay.h ReplayFreesFor).
  const ReplayFrees frees = ReplayFreesFor(*setup.config);
  TrainConfig replayed = *setup.config;
  replayed.gc = GcMode::kSync;
  replayed.mode = RunMode::kTrace;
  StageSetup s = setup;
  s.config = &replayed;
  s.threads = 1;
  const Causality causality = Order(s.schedule);
  std::vector<StageMemoryForecast> out;
  for (int r = 0; r < s.schedule.stages; ++r) {
    StageMemoryForecast f = RankReplay(s, r, causality, /*prompt=*/false, frees).Run();
    f.least_peak_allocated_bytes =
        RankReplay(s, r, causality, /*prompt=*/true, frees).Run().peak_allocated_bytes;
    if (explain) {  // the same replay again, listing what its peak holds
      f.live_at_peak = RankReplay(s, r, causality, /*prompt=*/false, frees, f.peak_allocated_bytes)
                           .Run()
                           .live_at_peak;
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<StageMemoryForecast> ForecastPipeline(const EngineContext& context,
                                                  const PipelineOptions& options, int replicas,
                                                  bool explain) {
  return ForecastStages(LayOutPipeline(context, options, replicas).setup, explain);
}

}  // namespace sluice::pipeline
