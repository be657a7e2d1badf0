#include "sluice/schedule/step_simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>

#include <fmt/format.h>

#include "sluice/schedule/bubble.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {

namespace {

constexpr double kNone = -1;  // no message for this slot: nothing to wait for
constexpr double kPending = std::numeric_limits<double>::infinity();  // posted, not yet matched

// The costs of one draw (SimulateOptions::draws): every compute of every rank by its index in
// the rank's action list — F, B (with W when not split) or W, and OPT's first half — and OPT's
// second half.
struct DrawnCosts {
  std::vector<std::vector<double>> action;  // [P][action index]; 0 for posts
  std::vector<double> update;               // [P]
};

// What a replay gives per rank: when its step ends and how long it computed.
struct RankTimes {
  std::vector<double> end, busy;  // [P]
};

// F, B (with W when the backward is not split) and W of chunk `chunk` of rank r: wall time, or
// the CPU time a compute holds a core for when the cores are shared.
struct ComputeCosts {
  double forward, backward, weight;
};
ComputeCosts CostsOf(const Schedule& s, const StepCosts& costs, int r, int chunk, bool cpu) {
  const ChunkCosts& c = costs.ranks[r].chunks[chunk];
  const double f = cpu ? c.forward_cpu_ms : c.forward_ms;
  const double b = cpu ? c.backward_cpu_ms : c.backward_ms;
  const double w = cpu ? c.weight_cpu_ms : c.weight_ms;
  return {.forward = f, .backward = b + (s.split_backward ? 0 : w), .weight = w};
}

// Every cost the rank-by-rank replay adds is ≥ 0 (so no clock runs backwards): its condition for
// being exact. A costs file guarantees it (CostsFromJson); costs made in code may not.
bool NoNegativeCosts(const StepCosts& c) {
  auto ok = [](double x) { return x >= 0; };  // false for NaN too
  if (!ok(c.post_ms) || !ok(c.copy_ms) || !ok(c.wake_ms) || !ok(c.allreduce_ms) ||
      !ok(TransitMs(c)))
    return false;
  for (const RankCosts& r : c.ranks) {
    if (!ok(r.optimizer_ms) || !ok(r.update_ms) || !ok(r.overhead_ms) || !ok(r.data_allreduce_ms))
      return false;
    for (const ChunkCosts& ch : r.chunks) {
      if (!ok(ch.forward_ms) || !ok(ch.backward_ms) || !ok(ch.weight_ms)) return false;
    }
  }
  return true;
}

// The reference replay: one action at a time, always of the rank whose clock is earliest (then
// the lowest rank), so every post and every compute happens in the global order of its start
// time. With shared cores that order decides which compute gets a free core first, so this is
// the replay of --cores; without, ReplayByRank gives the same times bit for bit, faster.
RankTimes ReplayInEventOrder(const Schedule& schedule, const StepCosts& costs, int cores_given,
                             const DrawnCosts* drawn) {
  const int P = schedule.stages, V = schedule.chunks, M = schedule.micro_batches;
  const size_t per_chunk = static_cast<size_t>(V) * M;  // [chunk][micro-batch]
  auto index = [&](const Action& a) { return static_cast<size_t>(a.chunk) * M + a.micro_batch; };
  // Per rank and chunk-micro-batch: when the message its F reads arrived, when the one its B reads
  // arrived, and when the send of F's output completed (B waits for it) — side by side, as the
  // actions of one micro-batch read them. A send of B's input gradient only matters to the
  // rank's end: its latest completion, and how many are pending.
  struct Slot {
    double arrived_f = kNone, arrived_b = kNone, completed_f = kNone;
  };
  std::vector<std::vector<Slot>> slots(P, std::vector<Slot>(per_chunk));
  std::vector<double> completed_b(P, kNone);
  std::vector<int64_t> pending_b(P, 0);
  // The time a post fills in when matched: a receive's arrival, a forward send's completion, or
  // (when null) a backward send's, which only counts towards its rank's end.
  struct Post {
    int rank;
    double* when;
  };
  struct Channel {
    int to;
    std::deque<Post> sends, recvs;  // posted, unmatched, in list order
  };
  // [from]: its channels to its peers (neighbours: at most 2V).
  std::vector<std::vector<Channel>> channels(P);
  auto channel = [&](int from, int to) -> Channel& {
    for (Channel& c : channels[from]) {
      if (c.to == to) return c;
    }
    return channels[from].emplace_back(Channel{.to = to});
  };

  std::vector<double> clock(P, 0), busy(P, 0);
  std::vector<size_t> next(P, 0);
  std::vector<double*> waiting(P, nullptr);  // the slot time a blocked rank waits for
  std::vector<bool> at_barrier(P, false);
  int barrier_count = 0;
  using Entry = std::pair<double, int>;  // (clock, rank): earliest first, then lowest rank
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (int r = 0; r < P; ++r) ready.push({0, r});

  auto wake = [&](int r, double* t) {
    if (waiting[r] == t) {
      waiting[r] = nullptr;
      ready.push({clock[r], r});
    }
  };
  // With shared cores a compute holds a core for its CPU time (its wall time, measured with the
  // threads competing, already holds the waits this model adds).
  const bool shared = cores_given > 0;
  auto cost = [&](int r, const Action& a) {
    if (drawn != nullptr) return drawn->action[r][next[r]];
    const ComputeCosts c = CostsOf(schedule, costs, r, a.chunk, shared);
    switch (a.kind) {
      case ActionKind::kForward:
        return c.forward;
      case ActionKind::kBackward:
        return c.backward;
      default:
        return c.weight;
    }
  };
  // When each core is next free (min-heap); empty without shared cores.
  std::priority_queue<double, std::vector<double>, std::greater<>> cores;
  for (int i = 0; i < cores_given; ++i) cores.push(0);
  // Rank r runs a compute of cost c from its clock, or from when a core is free; then its
  // bookkeeping `after` (holding no core).
  auto compute = [&](int r, double c, double after = 0) {
    double start = clock[r];
    if (shared) {
      start = std::max(start, cores.top());
      cores.pop();
      cores.push(start + c);
    }
    clock[r] = start + c + after;
    busy[r] += c;
  };
  // The time rank r's side of message `a` fills in (null: a backward send's completion).
  auto time_of = [&](int r, const Action& a) -> double* {
    switch (a.kind) {
      case ActionKind::kRecvF:
        return &slots[r][index(a)].arrived_f;
      case ActionKind::kRecvB:
        return &slots[r][index(a)].arrived_b;
      case ActionKind::kSendF:
        return &slots[r][index(a)].completed_f;
      default:
        return nullptr;  // kSendB
    }
  };
  auto fill = [&](int r, double* when, double t) {
    if (when != nullptr) {
      *when = t;
      return;
    }
    completed_b[r] = std::max(completed_b[r], t);
    --pending_b[r];
  };
  // Rank r posts its side of message `a` with its peer; the later post copies, and the message
  // arrives (its send completes) `transit` after it.
  const double transit = TransitMs(costs);
  auto post = [&](int r, const Action& a) {
    clock[r] += costs.post_ms;
    const bool send = IsSend(a.kind);
    Channel& ch = send ? channel(r, a.peer) : channel(a.peer, r);
    std::deque<Post>& mine = send ? ch.sends : ch.recvs;
    std::deque<Post>& theirs = send ? ch.recvs : ch.sends;
    double* when = time_of(r, a);
    if (when != nullptr) {
      *when = kPending;
    } else {
      ++pending_b[r];
    }
    if (theirs.empty()) {
      mine.push_back({r, when});
      return;
    }
    const Post other = theirs.front();
    theirs.pop_front();
    clock[r] += costs.copy_ms;
    const double t = clock[r] + transit;
    fill(r, when, t);
    fill(other.rank, other.when, t);
    if (other.when != nullptr) wake(other.rank, other.when);
  };

  while (!ready.empty()) {
    const int r = ready.top().second;
    const bool stale = ready.top().first != clock[r];
    ready.pop();
    if (stale || waiting[r] != nullptr || at_barrier[r]) continue;
    const std::vector<Action>& actions = schedule.ranks[r];
    // Rank r runs on while it stays the earliest ready rank (what the queue would pop next).
    while (next[r] < actions.size()) {
      const Action& a = actions[next[r]];
      // A compute waits for what it reads; a blocked rank resumes when that time is known.
      auto wait_for = [&](double& when) {
        if (when == kPending) {
          waiting[r] = &when;
          return false;
        }
        if (when != kNone && when > clock[r]) clock[r] = when + costs.wake_ms;
        return true;
      };
      const double overhead = costs.ranks[r].overhead_ms;
      if (IsSend(a.kind) || IsRecv(a.kind)) {
        post(r, a);
      } else if (a.kind == ActionKind::kForward) {
        if (!wait_for(slots[r][index(a)].arrived_f)) break;
        compute(r, cost(r, a), overhead);
      } else if (a.kind == ActionKind::kBackward) {
        Slot& slot = slots[r][index(a)];
        if (!wait_for(slot.arrived_b)) break;
        if (!wait_for(slot.completed_f)) break;
        compute(r, cost(r, a), overhead);
      } else if (a.kind == ActionKind::kWeight) {
        compute(r, cost(r, a), overhead);
      } else {  // OPT: the replicas' gradient all-reduce, its first half, then the barrier
        clock[r] += costs.ranks[r].data_allreduce_ms;
        compute(r, drawn != nullptr ? drawn->action[r][next[r]] : costs.ranks[r].optimizer_ms);
        at_barrier[r] = true;
        if (++barrier_count == P) {
          const double all = *std::ranges::max_element(clock) + costs.allreduce_ms;
          for (int q = 0; q < P; ++q) {
            at_barrier[q] = false;
            clock[q] = all;
            compute(q, drawn != nullptr ? drawn->update[q] : costs.ranks[q].update_ms);
            ++next[q];
            ready.push({clock[q], q});
          }
        }
        break;
      }
      ++next[r];
      if (next[r] == actions.size()) break;
      if (!ready.empty() && !(Entry{clock[r], r} < ready.top())) {
        ready.push({clock[r], r});
        break;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    SLUICE_CHECK(next[r] == schedule.ranks[r].size(),
                 "{}: the simulation of a validated schedule stalls on rank {} at step {}",
                 schedule.Describe(), r, next[r]);
  }
  RankTimes out{.end = std::vector<double>(P), .busy = busy};
  for (int r = 0; r < P; ++r) {
    double end = std::max(clock[r], completed_b[r]);
    bool pending = pending_b[r] != 0;
    for (const Slot& slot : slots[r]) {
      pending = pending || slot.completed_f == kPending;
      end = std::max(end, slot.completed_f);
    }
    SLUICE_CHECK(!pending, "{}: a send of rank {} never completes", schedule.Describe(), r);
    out.end[r] = end;
  }
  return out;
}

// The replay rank by rank: each rank runs down its list as far as it can — until a compute needs
// a message not yet matched — and the ranks take turns in sweeps (down the pipeline, then up),
// so long stretches of one rank's list run back to back and no queue orders the actions.
//
// It gives ReplayInEventOrder's times bit for bit, because the model's times do not depend on
// the order in which ranks act, with one exception: which of a message's two posts copies (the
// later; of equal clocks, the higher rank's). When copying costs nothing, the message's time is
// the later post's clock whoever comes second here. When it costs something, a rank posts first
// only once it is certain to be first: its peer's clock is already past its own (clocks never
// run backwards), or no rank can move otherwise — then the earliest of the ranks waiting to post
// is first, since every other post still owed depends on a message that will match later than
// its clock. Computes never compete (each rank has its core), and the all-reduce waits for all.
//
// Memory: a double per message (2·P·V·M) where the reference keeps three per rank and
// chunk-micro-batch, plus a queue per channel.
RankTimes ReplayByRank(const Schedule& schedule, const StepCosts& costs, const DrawnCosts* drawn) {
  const int P = schedule.stages, V = schedule.chunks, M = schedule.micro_batches;
  const int VS = schedule.virtual_stages();
  // A message's time, in the F and B messages sent by virtual stage u, micro-batch m, at
  // 2·(u·M + m) and 2·(u·M + m) + 1: kUnposted, −(the post's clock) once one side has posted
  // (the sign bit marks it, −0 included), the time it arrived and completed once both have.
  // A virtual stage's row is padded by a cache line: rows 2^k bytes apart would put every rank's
  // messages of one micro-batch in the same few cache sets.
  constexpr double kUnposted = -std::numeric_limits<double>::infinity();
  const ptrdiff_t row = 2 * static_cast<ptrdiff_t>(M) + 8;
  std::vector<double> messages(static_cast<size_t>(VS) * row, kUnposted);
  // Per rank and chunk: where its messages are and what its computes cost.
  struct Chunk {
    double* in_f = nullptr;  // F messages it receives (null: the input is made on this rank)
    double* out = nullptr;   // F messages it sends, B messages it sends at +1
    double* in_b = nullptr;  // B messages it receives (null: made here, or the last stage)
    bool sends_f = false;    // its F's output goes to another rank (B waits for that send)
    ComputeCosts cost;
  };
  std::vector<Chunk> chunks(static_cast<size_t>(P) * V);
  for (int r = 0; r < P; ++r) {
    for (int c = 0; c < V; ++c) {
      const int vs = schedule.VirtualStage(r, c);
      Chunk& ch = chunks[static_cast<size_t>(r) * V + c];
      ch.out = messages.data() + vs * row;
      if (vs > 0 && schedule.RankOf(vs - 1) != r) ch.in_f = ch.out - row;
      if (vs + 1 < VS && schedule.RankOf(vs + 1) != r) {
        ch.in_b = ch.out + row;
        ch.sends_f = true;
      }
      ch.cost = CostsOf(schedule, costs, r, c, /*cpu=*/false);
    }
  }
  struct Rank {
    const Action* next;
    const Action* end;
    double clock = 0, busy = 0;
    double sent = kNone;            // the latest completion of its sends
    const double* waits = nullptr;  // the message time a blocked compute waits for
    bool runnable = true;
    bool first = false;  // its next post may go first (no rank could move)
  };
  std::vector<Rank> ranks(P);
  for (int r = 0; r < P; ++r) {
    ranks[r].next = schedule.ranks[r].data();
    ranks[r].end = schedule.ranks[r].data() + schedule.ranks[r].size();
  }
  const bool copies = costs.copy_ms > 0;
  const double transit = TransitMs(costs);
  int at_barrier = 0, finished = 0;
  int64_t unmatched = 0;
  // Rank r is certainly the first to post a message with `peer`, which has not posted it yet.
  auto certainly_first = [&](int r, int peer) {
    const double mine = ranks[r].clock, theirs = ranks[peer].clock;
    return theirs > mine || (theirs == mine && peer > r);
  };
  // Runs rank r until it blocks or ends; true when it ran at least one action.
  auto run = [&](int r) {
    Rank& me = ranks[r];
    const Action* const from = me.next;
    const Chunk* const mine = chunks.data() + static_cast<size_t>(r) * V;
    // A compute waits for a message's time; false (the rank blocks) while it is not matched.
    auto wait_for = [&](const double& when) {
      if (std::signbit(when)) {
        me.waits = &when;
        me.runnable = false;
        return false;
      }
      if (when > me.clock) me.clock = when + costs.wake_ms;
      return true;
    };
    const double overhead = costs.ranks[r].overhead_ms;
    for (; me.next != me.end; ++me.next) {
      const Action a = *me.next;
      // This compute's cost: the draw's, or the medians' `median`.
      auto cost = [&](double median) {
        return drawn != nullptr ? drawn->action[r][me.next - schedule.ranks[r].data()] : median;
      };
      const Chunk& ch = mine[a.chunk];
      const ptrdiff_t m = 2 * static_cast<ptrdiff_t>(a.micro_batch);
      switch (a.kind) {
        case ActionKind::kForward:
          if (ch.in_f != nullptr && !wait_for(ch.in_f[m])) return me.next != from;
          me.clock += cost(ch.cost.forward);
          me.clock += overhead;
          me.busy += cost(ch.cost.forward);
          break;
        case ActionKind::kBackward:
          if (ch.in_b != nullptr && !wait_for(ch.in_b[m + 1])) return me.next != from;
          if (ch.sends_f && !wait_for(ch.out[m])) return me.next != from;
          me.clock += cost(ch.cost.backward);
          me.clock += overhead;
          me.busy += cost(ch.cost.backward);
          break;
        case ActionKind::kWeight:
          me.clock += cost(ch.cost.weight);
          me.clock += overhead;
          me.busy += cost(ch.cost.weight);
          break;
        case ActionKind::kOptimizer:  // the replicas' all-reduce, its first half, the barrier
          me.clock += costs.ranks[r].data_allreduce_ms;
          me.clock += cost(costs.ranks[r].optimizer_ms);
          me.busy += cost(costs.ranks[r].optimizer_ms);
          me.runnable = false;
          if (++at_barrier == P) {
            double all = 0;
            for (const Rank& q : ranks) all = std::max(all, q.clock);
            all += costs.allreduce_ms;
            for (int q = 0; q < P; ++q) {
              const double update = drawn != nullptr ? drawn->update[q] : costs.ranks[q].update_ms;
              ranks[q].clock = all + update;
              ranks[q].busy += update;
              ++ranks[q].next;
            }
            finished = P;
          }
          return true;
        default: {  // a send or a receive
          double* when;
          switch (a.kind) {
            case ActionKind::kSendF:
              when = &ch.out[m];
              break;
            case ActionKind::kSendB:
              when = &ch.out[m + 1];
              break;
            case ActionKind::kRecvF:
              when = &ch.in_f[m];
              break;
            default:  // kRecvB
              when = &ch.in_b[m + 1];
              break;
          }
          if (*when == kUnposted) {
            if (copies && !me.first && !certainly_first(r, a.peer)) return me.next != from;
            me.first = false;
            me.clock += costs.post_ms;
            *when = -me.clock;
            ++unmatched;
            break;
          }
          const double earlier = -*when;  // the peer's clock after its post
          me.clock += costs.post_ms;
          me.clock += costs.copy_ms;
          // Copying costs something: the peer posted first (above). Nothing: the later clock.
          const double t = (copies ? me.clock : std::max(earlier, me.clock)) + transit;
          *when = t;
          --unmatched;
          Rank& sender = IsSend(a.kind) ? me : ranks[a.peer];
          sender.sent = std::max(sender.sent, t);
          Rank& peer = ranks[a.peer];
          if (peer.waits == when) {
            peer.waits = nullptr;
            peer.runnable = true;
          }
          break;
        }
      }
    }
    return me.next != from;
  };
  // Sweeps down and up the pipeline until every rank has ended.
  for (bool down = true; finished < P; down = !down) {
    bool moved = false;
    for (int i = 0; i < P; ++i) {
      const int r = down ? i : P - 1 - i;
      if (ranks[r].runnable) moved = run(r) || moved;
    }
    if (moved || finished == P) continue;
    // No rank can move: the earliest rank waiting to post goes first (only when copying costs).
    int earliest = -1;
    for (int r = 0; r < P; ++r) {
      const Rank& q = ranks[r];
      if (q.runnable && q.next != q.end && (earliest < 0 || q.clock < ranks[earliest].clock)) {
        earliest = r;
      }
    }
    if (earliest < 0) {
      int r = 0;
      while (ranks[r].next == ranks[r].end) ++r;
      SLUICE_CHECK(false, "{}: the simulation of a validated schedule stalls on rank {} at step {}",
                   schedule.Describe(), r, ranks[r].next - schedule.ranks[r].data());
    }
    ranks[earliest].first = true;
  }
  SLUICE_CHECK(unmatched == 0, "{}: a send never completes", schedule.Describe());
  RankTimes out;
  for (const Rank& r : ranks) {
    out.end.push_back(std::max(r.clock, r.sent));
    out.busy.push_back(r.busy);
  }
  return out;
}

// splitmix64: a portable generator, so that a seed gives the same draws everywhere.
uint64_t NextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Draw `d` of the recorded steps' costs for every compute of `schedule` (see DrawMode). A
// schedule of more micro-batches than were recorded takes micro-batch m's from m mod M.
DrawnCosts Draw(const Schedule& schedule, const StepCosts& costs, int d, DrawMode mode,
                uint64_t seed, const std::vector<size_t>& pool) {
  const size_t S = costs.recorded.size(), M = static_cast<size_t>(costs.micro_batches);
  uint64_t state = seed + 0x632be59bd9b4e019ULL * static_cast<uint64_t>(d);
  auto pick = [&](size_t n) { return static_cast<size_t>(NextRandom(state) % n); };
  DrawnCosts out;
  out.action.resize(schedule.stages);
  out.update.resize(schedule.stages);
  for (int r = 0; r < schedule.stages; ++r) {
    const std::vector<Action>& actions = schedule.ranks[r];
    std::vector<double>& cost = out.action[r];
    cost.assign(actions.size(), 0);
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      const bool steps = mode == DrawMode::kSteps;
      const RecordedStep& step =
          costs.recorded[steps ? static_cast<size_t>(d) % S : pool[pick(pool.size())]];
      const RecordedStep::Rank& rank = step.ranks[r];
      if (a.kind == ActionKind::kOptimizer) {
        cost[i] = rank.optimizer_ms;
        out.update[r] = rank.update_ms;
        continue;
      }
      if (!IsCompute(a.kind)) continue;
      const RecordedStep::Chunk& ch = rank.chunks[a.chunk];
      const size_t m = steps ? static_cast<size_t>(a.micro_batch) % M : pick(M);
      switch (a.kind) {
        case ActionKind::kForward:
          cost[i] = ch.forward_ms[m];
          break;
        case ActionKind::kBackward:
          cost[i] = ch.backward_ms[m] + (schedule.split_backward ? 0 : ch.weight_ms[m]);
          break;
        default:
          cost[i] = ch.weight_ms[m];
          break;
      }
    }
  }
  return out;
}

// The prediction of one replay.
StepPrediction Predict(const RankTimes& times, const StepCosts& costs) {
  const int P = static_cast<int>(times.end.size());
  const Bubble bubble = BubbleOf(times.end, times.busy);
  StepPrediction p;
  p.ranks.resize(P);
  p.makespan_ms = bubble.makespan;
  for (int r = 0; r < P; ++r) {
    p.ranks[r].end_ms = times.end[r];
    p.ranks[r].busy_ms = times.busy[r];
    p.ranks[r].idle_ms = bubble.idle[r];
    p.ranks[r].bubble = bubble.share[r];
  }
  p.bubble = bubble.total;
  p.step_ms = p.makespan_ms + costs.step_overhead_ms;
  return p;
}

}  // namespace

std::vector<size_t> DrawnSteps(const StepCosts& costs) {
  std::vector<size_t> own_cores, all;
  for (size_t k = 0; k < costs.recorded.size(); ++k) {
    const RecordedStep& step = costs.recorded[k];
    all.push_back(k);
    const bool waited = std::ranges::any_of(step.ranks, [&](const RecordedStep::Rank& r) {
      return r.core_wait_ms > 0 && r.core_wait_ms >= kCoreWaitShareNoted * step.span_ms;
    });
    if (!waited) own_cores.push_back(k);
  }
  return !own_cores.empty() && 2 * own_cores.size() >= all.size() ? own_cores : all;
}

StepPrediction SimulateStep(const Schedule& schedule, const StepCosts& costs,
                            const SimulateOptions& options) {
  if (!options.validated) ValidateSchedule(schedule);
  CheckCostsCover(costs, schedule);
  const bool in_event_order =
      options.cores > 0 || options.in_event_order || !NoNegativeCosts(costs);
  auto replay = [&](const DrawnCosts* drawn) {
    return Predict(in_event_order ? ReplayInEventOrder(schedule, costs, options.cores, drawn)
                                  : ReplayByRank(schedule, costs, drawn),
                   costs);
  };
  if (options.draws <= 0) return replay(nullptr);
  if (options.cores > 0) {
    throw InvalidArgument(
        "draws of recorded costs model a core per stage: with shared cores the replay uses the "
        "medians' CPU times (leave out the draws)");
  }
  if (costs.recorded.empty() || costs.micro_batches <= 0) {
    throw InvalidArgument(fmt::format(
        "{}: no recorded steps to draw costs from: profile the job again with sluice train "
        "--profile-out (a costs file written before they were recorded, or under --comm mpi, "
        "has medians only)",
        costs.source));
  }
  // The mean of every figure over the draws (idle stays makespan minus busy).
  const int P = schedule.stages;
  StepPrediction mean;
  mean.ranks.resize(P);
  const double n = options.draws;
  const std::vector<size_t> pool = DrawnSteps(costs);
  for (int d = 0; d < options.draws; ++d) {
    const DrawnCosts drawn = Draw(schedule, costs, d, options.draw_mode, options.seed, pool);
    const StepPrediction p = replay(&drawn);
    DrawPrediction& draw =
        mean.draws.emplace_back(DrawPrediction{.makespan_ms = p.makespan_ms, .step_ms = p.step_ms});
    mean.makespan_ms += p.makespan_ms / n;
    mean.step_ms += p.step_ms / n;
    mean.bubble += p.bubble / n;
    for (int r = 0; r < P; ++r) {
      draw.stage_bubble.push_back(p.ranks[r].bubble);
      mean.ranks[r].busy_ms += p.ranks[r].busy_ms / n;
      mean.ranks[r].idle_ms += p.ranks[r].idle_ms / n;
      mean.ranks[r].bubble += p.ranks[r].bubble / n;
      mean.ranks[r].end_ms += p.ranks[r].end_ms / n;
    }
  }
  return mean;
}

}  // namespace sluice::pipeline
