#include "sluice/pipeline/step_simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

#include "sluice/core/files.h"
#include "sluice/pipeline/validator.h"

namespace sluice::pipeline {

namespace {

constexpr double kNone = -1;  // no message for this slot: nothing to wait for
constexpr double kPending = std::numeric_limits<double>::infinity();  // posted, not yet matched
constexpr const char* kFormat = "sluice-step-costs/1";
// The most one cost may be, in ms (11.6 days): a replay sums millions of them.
constexpr double kMaxCostMs = 1e9;

double Median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = static_cast<double>(v[mid]);
  if (v.size() % 2 == 0) {
    m = (m + static_cast<double>(
                 *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)))) /
        2;
  }
  return m;
}

template <typename T>
double Mean(const std::vector<T>& v) {
  double sum = 0;
  for (T x : v) sum += static_cast<double>(x);
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double MedianD(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

}  // namespace

StepCosts UnitCosts(const Schedule& schedule) {
  StepCosts c;
  c.stages = schedule.stages;
  c.chunks = schedule.chunks;
  c.split_backward = true;
  c.ranks.assign(schedule.stages, RankCosts{});
  // A chunk holds 1/V of the stage's layers: its F, B and W cost 1/V.
  const double unit = 1.0 / schedule.chunks;
  for (RankCosts& r : c.ranks) {
    r.chunks.assign(schedule.chunks, ChunkCosts{.forward_ms = unit,
                                                .backward_ms = unit,
                                                .weight_ms = unit,
                                                .forward_cpu_ms = unit,
                                                .backward_cpu_ms = unit,
                                                .weight_cpu_ms = unit});
  }
  return c;
}

void CheckCostsCover(const StepCosts& costs, const Schedule& schedule) {
  if (costs.stages != schedule.stages) {
    throw InvalidArgument(fmt::format(
        "{}: measured on {} stages, but {} has {}: profile a run with --stages {}", costs.source,
        costs.stages, schedule.Describe(), schedule.stages, schedule.stages));
  }
  if (costs.chunks != schedule.chunks) {
    throw InvalidArgument(fmt::format(
        "{}: measured with {} chunk(s) per stage, but {} runs {}: profile a run of a schedule "
        "with {} chunk(s) per stage",
        costs.source, costs.chunks, schedule.Describe(), schedule.chunks, schedule.chunks));
  }
  if (schedule.split_backward && !costs.split_backward) {
    throw InvalidArgument(fmt::format(
        "{}: measured with the backward whole, but {} splits it into B and W: profile a run of "
        "a split-backward schedule (zb-h1) to cover it",
        costs.source, schedule.Describe()));
  }
}

void CheckCostsJob(const StepCosts& costs, const nlohmann::json& job) {
  for (const auto& [key, value] : costs.job.items()) {
    if (!job.contains(key)) continue;
    if (job[key] != value) {
      throw InvalidArgument(
          fmt::format("{}: measured on another job: {} is {} there, {} here (profile this job "
                      "with sluice train ... --profile-out)",
                      costs.source, key, value.dump(), job[key].dump()));
    }
  }
}

namespace {

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
  if (!ok(c.post_ms) || !ok(c.copy_ms) || !ok(c.wake_ms) || !ok(c.allreduce_ms)) return false;
  for (const RankCosts& r : c.ranks) {
    if (!ok(r.optimizer_ms) || !ok(r.update_ms) || !ok(r.overhead_ms)) return false;
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
RankTimes ReplayInEventOrder(const Schedule& schedule, const StepCosts& costs, int cores_given) {
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
  // Rank r posts its side of message `a` with its peer; the later post copies.
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
    const double t = clock[r];
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
      } else {  // OPT: its first half, then the all-reduce's barrier
        compute(r, costs.ranks[r].optimizer_ms);
        at_barrier[r] = true;
        if (++barrier_count == P) {
          const double all = *std::ranges::max_element(clock) + costs.allreduce_ms;
          for (int q = 0; q < P; ++q) {
            at_barrier[q] = false;
            clock[q] = all;
            compute(q, costs.ranks[q].update_ms);
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
RankTimes ReplayByRank(const Schedule& schedule, const StepCosts& costs) {
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
      const Chunk& ch = mine[a.chunk];
      const ptrdiff_t m = 2 * static_cast<ptrdiff_t>(a.micro_batch);
      switch (a.kind) {
        case ActionKind::kForward:
          if (ch.in_f != nullptr && !wait_for(ch.in_f[m])) return me.next != from;
          me.clock += ch.cost.forward;
          me.clock += overhead;
          me.busy += ch.cost.forward;
          break;
        case ActionKind::kBackward:
          if (ch.in_b != nullptr && !wait_for(ch.in_b[m + 1])) return me.next != from;
          if (ch.sends_f && !wait_for(ch.out[m])) return me.next != from;
          me.clock += ch.cost.backward;
          me.clock += overhead;
          me.busy += ch.cost.backward;
          break;
        case ActionKind::kWeight:
          me.clock += ch.cost.weight;
          me.clock += overhead;
          me.busy += ch.cost.weight;
          break;
        case ActionKind::kOptimizer:  // its first half, then the all-reduce's barrier
          me.clock += costs.ranks[r].optimizer_ms;
          me.busy += costs.ranks[r].optimizer_ms;
          me.runnable = false;
          if (++at_barrier == P) {
            double all = 0;
            for (const Rank& q : ranks) all = std::max(all, q.clock);
            all += costs.allreduce_ms;
            for (int q = 0; q < P; ++q) {
              ranks[q].clock = all + costs.ranks[q].update_ms;
              ranks[q].busy += costs.ranks[q].update_ms;
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
          const double t = copies ? me.clock : std::max(earlier, me.clock);
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

}  // namespace

StepPrediction SimulateStep(const Schedule& schedule, const StepCosts& costs,
                            const SimulateOptions& options) {
  if (!options.validated) ValidateSchedule(schedule);
  CheckCostsCover(costs, schedule);
  const RankTimes times = options.cores > 0 || options.in_event_order || !NoNegativeCosts(costs)
                              ? ReplayInEventOrder(schedule, costs, options.cores)
                              : ReplayByRank(schedule, costs);
  const int P = schedule.stages;
  StepPrediction p;
  p.ranks.resize(P);
  for (int r = 0; r < P; ++r) {
    p.ranks[r].end_ms = times.end[r];
    p.ranks[r].busy_ms = times.busy[r];
    p.makespan_ms = std::max(p.makespan_ms, times.end[r]);
  }
  double idle = 0;
  for (RankPrediction& rank : p.ranks) {
    rank.idle_ms = p.makespan_ms - rank.busy_ms;
    rank.bubble = p.makespan_ms > 0 ? rank.idle_ms / p.makespan_ms : 0;
    idle += rank.idle_ms;
  }
  p.bubble = p.makespan_ms > 0 ? idle / (P * p.makespan_ms) : 0;
  p.step_ms = p.makespan_ms + costs.step_overhead_ms;
  return p;
}

nlohmann::json ProfileJob(const StageSetup& setup, const std::string& layout) {
  std::string recompute;
  for (int r = 0; r < setup.schedule.stages; ++r) {
    recompute += fmt::format("{}{}", r ? "," : "",
                             Name(RecomputeForStage(*setup.config, r, setup.schedule.stages)));
  }
  return {{"model", "gpt"},
          {"vocab", setup.gpt.vocab},
          {"seq", setup.seq_len},
          {"layers", setup.gpt.layers},
          {"heads", setup.gpt.heads},
          {"dim", setup.gpt.dim},
          {"attention", std::string(Name(setup.gpt.attention))},
          {"micro_batch_size", setup.micro_batch_size},
          {"layout", layout},
          {"recompute", recompute},
          {"threads", setup.config->threads}};
}

nlohmann::ordered_json CostsToJson(const StepCosts& c) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["job"] = c.job;
  j["stages"] = c.stages;
  j["chunks"] = c.chunks;
  j["split_backward"] = c.split_backward;
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const ChunkCosts& ch : c.ranks[r].chunks) {
      chunks.push_back({{"forward_ms", ch.forward_ms},
                        {"backward_ms", ch.backward_ms},
                        {"weight_ms", ch.weight_ms},
                        {"forward_cpu_ms", ch.forward_cpu_ms},
                        {"backward_cpu_ms", ch.backward_cpu_ms},
                        {"weight_cpu_ms", ch.weight_cpu_ms}});
    }
    ranks.push_back({{"stage", r},
                     {"chunks", chunks},
                     {"optimizer_ms", c.ranks[r].optimizer_ms},
                     {"update_ms", c.ranks[r].update_ms},
                     {"overhead_ms", c.ranks[r].overhead_ms}});
  }
  j["ranks"] = ranks;
  j["messages"] = {{"bytes", c.message_bytes},
                   {"post_ms", c.post_ms},
                   {"copy_ms", c.copy_ms},
                   {"copy_ms_per_byte",
                    c.message_bytes > 0 ? c.copy_ms / static_cast<double>(c.message_bytes) : 0.0},
                   {"wake_ms", c.wake_ms}};
  j["allreduce_ms"] = c.allreduce_ms;
  j["step_overhead_ms"] = c.step_overhead_ms;
  j["measured"] = c.measured;
  return j;
}

StepCosts CostsFromJson(const nlohmann::json& j, const std::string& source) {
  auto bad = [&](const std::string& where, const std::string& what) {
    return InvalidArgument(fmt::format("{}: {} {}", source, where, what));
  };
  if (!j.is_object()) throw bad("the file", "is not a JSON object (a costs file of --profile-out)");
  if (!j.contains("format") || !j["format"].is_string() ||
      j["format"].get_ref<const std::string&>() != kFormat) {
    throw bad("\"format\"", fmt::format("must be \"{}\" (a file written by sluice train "
                                        "--profile-out)",
                                        kFormat));
  }
  auto number = [&](const nlohmann::json& obj, const char* key, const std::string& where) {
    if (!obj.contains(key)) throw bad(where, fmt::format("has no \"{}\"", key));
    const nlohmann::json& v = obj[key];
    if (!v.is_number()) throw bad(where, fmt::format("\"{}\" is not a number", key));
    const double d = v.get<double>();
    // Bounded so that the replay's sums of millions of them stay finite.
    if (!(d >= 0 && d <= kMaxCostMs)) {
      throw bad(where, fmt::format("\"{}\" is {}: it must be a number from 0 to {:g}", key,
                                   v.dump(), kMaxCostMs));
    }
    return d;
  };
  // Entries a file written before they were measured lacks: absent, they cost nothing.
  auto optional = [&](const nlohmann::json& obj, const char* key, const std::string& where) {
    return obj.contains(key) ? number(obj, key, where) : 0.0;
  };
  auto integer = [&](const nlohmann::json& obj, const char* key, const std::string& where,
                     int64_t least, int64_t most) {
    if (!obj.contains(key)) throw bad(where, fmt::format("has no \"{}\"", key));
    const nlohmann::json& v = obj[key];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(most)) ||
        v.get<int64_t>() < least || v.get<int64_t>() > most) {
      throw bad(where, fmt::format("\"{}\" is {}: it must be an integer from {} to {}", key,
                                   v.dump(), least, most));
    }
    return v.get<int64_t>();
  };
  StepCosts c;
  c.source = source;
  c.stages = static_cast<int>(integer(j, "stages", "the file", 1, kMaxStages));
  c.chunks = static_cast<int>(integer(j, "chunks", "the file", 1, kMaxChunks));
  if (!j.contains("split_backward") || !j["split_backward"].is_boolean()) {
    throw bad("the file", "has no boolean \"split_backward\"");
  }
  c.split_backward = j["split_backward"].get<bool>();
  if (j.contains("job")) {
    if (!j["job"].is_object()) throw bad("\"job\"", "is not an object");
    c.job = j["job"];
  }
  if (!j.contains("ranks") || !j["ranks"].is_array() ||
      j["ranks"].size() != static_cast<size_t>(c.stages)) {
    throw bad("\"ranks\"", fmt::format("must be an array of one entry per stage ({})", c.stages));
  }
  for (int r = 0; r < c.stages; ++r) {
    const nlohmann::json& rank = j["ranks"][r];
    const std::string where = fmt::format("stage {}", r);
    if (!rank.is_object()) throw bad(where, "is not an object");
    RankCosts rc;
    rc.optimizer_ms = number(rank, "optimizer_ms", where);
    rc.update_ms = number(rank, "update_ms", where);
    rc.overhead_ms = optional(rank, "overhead_ms", where);
    if (!rank.contains("chunks") || !rank["chunks"].is_array() ||
        rank["chunks"].size() != static_cast<size_t>(c.chunks)) {
      throw bad(where, fmt::format("must have \"chunks\": one entry per chunk ({})", c.chunks));
    }
    for (int v = 0; v < c.chunks; ++v) {
      const nlohmann::json& ch = rank["chunks"][v];
      const std::string w = fmt::format("stage {} chunk {}", r, v);
      if (!ch.is_object()) throw bad(w, "is not an object");
      ChunkCosts cc;
      cc.forward_ms = number(ch, "forward_ms", w);
      cc.backward_ms = number(ch, "backward_ms", w);
      cc.weight_ms = number(ch, "weight_ms", w);
      // CPU times are optional (a hand-written file); absent, they are the wall times.
      for (auto [key, field, wall] :
           {std::tuple{"forward_cpu_ms", &cc.forward_cpu_ms, cc.forward_ms},
            {"backward_cpu_ms", &cc.backward_cpu_ms, cc.backward_ms},
            {"weight_cpu_ms", &cc.weight_cpu_ms, cc.weight_ms}}) {
        *field = ch.contains(key) ? number(ch, key, w) : wall;
      }
      rc.chunks.push_back(cc);
    }
    c.ranks.push_back(std::move(rc));
  }
  if (!j.contains("messages") || !j["messages"].is_object()) {
    throw bad("the file", "has no \"messages\" object");
  }
  c.message_bytes = integer(j["messages"], "bytes", "\"messages\"", 0, int64_t{1} << 53);
  c.post_ms = number(j["messages"], "post_ms", "\"messages\"");
  c.copy_ms = number(j["messages"], "copy_ms", "\"messages\"");
  c.wake_ms = optional(j["messages"], "wake_ms", "\"messages\"");
  c.allreduce_ms = optional(j, "allreduce_ms", "the file");
  c.step_overhead_ms = number(j, "step_overhead_ms", "the file");
  if (j.contains("measured")) c.measured = j["measured"];
  return c;
}

StepCosts ReadCostsFile(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(ReadWholeFile("--costs file", path), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidArgument(fmt::format("--costs {}: not valid JSON", path));
  return CostsFromJson(j, path);
}

CostProfiler::CostProfiler(const Schedule& schedule, nlohmann::json job)
    : schedule_(schedule), job_(std::move(job)) {
  const size_t P = static_cast<size_t>(schedule.stages), V = static_cast<size_t>(schedule.chunks);
  wall_.assign(
      P, std::vector<std::vector<std::vector<int64_t>>>(5, std::vector<std::vector<int64_t>>(V)));
  cpu_ = wall_;
  bubble_.assign(P, {});
  overhead_per_compute_.assign(P, {});
}

void CostProfiler::Add(const std::vector<StageStep>& steps, int64_t step_wall_ns) {
  const int64_t span = StepSpanNs(steps);
  for (size_t r = 0; r < steps.size(); ++r) AddRank(static_cast<int>(r), steps[r], span);
  AddStep(step_wall_ns, span);
  // Wake-ups: a receive blocked on a message resumes this long after the Isend that copied it.
  std::unordered_map<int64_t, int64_t> arrived;  // message → end of the Isend that copied it
  for (const StageStep& s : steps) {
    for (const StageStep::MessageEvent& e : s.copied_sends) arrived[e.message] = e.end_ns;
  }
  for (const StageStep& s : steps) {
    for (const StageStep::MessageEvent& e : s.blocked_receives) {
      auto it = arrived.find(e.message);
      if (it != arrived.end() && it->second >= e.begin_ns) {
        wake_.push_back(std::max<int64_t>(0, e.end_ns - it->second));
      }
    }
  }
  // The all-reduce as the last rank to reach it sees it (the others' also holds their wait).
  const StageStep* last = nullptr;
  for (const StageStep& s : steps) {
    if (s.allreduce_end_ns > 0 &&
        (last == nullptr || s.allreduce_begin_ns > last->allreduce_begin_ns))
      last = &s;
  }
  if (last != nullptr) allreduce_.push_back(last->allreduce_end_ns - last->allreduce_begin_ns);
}

void CostProfiler::AddRank(int r, const StageStep& s, int64_t span_ns) {
  for (int kind = 0; kind < 5; ++kind) {
    // OPT's two halves are one sample each per step, recorded under chunk 0.
    for (const StageStep::Sample& x : s.computes[kind]) {
      wall_[r][kind][kind >= 3 ? 0 : x.chunk].push_back(x.wall_ns);
      cpu_[r][kind][kind >= 3 ? 0 : x.chunk].push_back(x.cpu_ns);
    }
  }
  post_.insert(post_.end(), s.post_ns.begin(), s.post_ns.end());
  copy_.insert(copy_.end(), s.post_copy_ns.begin(), s.post_copy_ns.end());
  message_bytes_ = std::max(message_bytes_, s.message_bytes);
  bubble_[r].push_back(
      span_ns > 0 ? static_cast<double>(span_ns - s.busy_ns) / static_cast<double>(span_ns) : 0);
  // Bookkeeping: the rank's time neither computing nor inside the communicator, per compute.
  const size_t computes = s.computes[0].size() + s.computes[1].size() + s.computes[2].size();
  if (computes > 0) {
    overhead_per_compute_[r].push_back(
        static_cast<double>(std::max<int64_t>(0, s.wall_ns - s.busy_ns - s.comm_ns)) /
        static_cast<double>(computes));
  }
}

void CostProfiler::AddStep(int64_t step_wall_ns, int64_t span_ns) {
  overhead_.push_back(std::max<int64_t>(0, step_wall_ns - span_ns));
  step_wall_.push_back(step_wall_ns);
}

StepCosts CostProfiler::Costs() const {
  StepCosts c;
  c.source = "profile";
  c.stages = schedule_.stages;
  c.chunks = schedule_.chunks;
  c.split_backward = schedule_.split_backward;
  c.job = job_;
  auto ms = [](double ns) { return ns / 1e6; };
  for (size_t r = 0; r < wall_.size(); ++r) {
    RankCosts rc;
    for (int v = 0; v < c.chunks; ++v) {
      ChunkCosts ch;
      ch.forward_ms = ms(Median(wall_[r][0][v]));
      ch.backward_ms = ms(Median(wall_[r][1][v]));
      ch.weight_ms = ms(Median(wall_[r][2][v]));
      ch.forward_cpu_ms = ms(Median(cpu_[r][0][v]));
      ch.backward_cpu_ms = ms(Median(cpu_[r][1][v]));
      ch.weight_cpu_ms = ms(Median(cpu_[r][2][v]));
      rc.chunks.push_back(ch);
    }
    rc.optimizer_ms = ms(Median(wall_[r][3][0]));
    rc.update_ms = ms(Median(wall_[r][4][0]));
    rc.overhead_ms = ms(Mean(overhead_per_compute_[r]));
    c.ranks.push_back(std::move(rc));
  }
  c.message_bytes = message_bytes_;
  c.post_ms = ms(Median(post_));
  c.copy_ms = std::max(0.0, ms(Median(copy_)) - c.post_ms);
  // Means, not medians: what these waits add to a step is their sum, and their rare long ones (a
  // thread waiting for a core to wake on) are much of it.
  c.wake_ms = ms(Mean(wake_));
  c.allreduce_ms = ms(Mean(allreduce_));
  c.step_overhead_ms = ms(Median(overhead_));
  nlohmann::json bubbles = nlohmann::json::array();
  for (const std::vector<double>& b : bubble_) bubbles.push_back(MedianD(b));
  c.measured = {
      {"steps", step_wall_.size()}, {"step_ms", ms(Median(step_wall_))}, {"stage_bubble", bubbles}};
  return c;
}

}  // namespace sluice::pipeline
