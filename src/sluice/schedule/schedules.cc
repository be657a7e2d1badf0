#include "sluice/schedule/schedules.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sluice/schedule/bubble.h"
#include "sluice/schedule/building_block.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {

namespace {

// The most actions a schedule may hold: 8 GB of action lists. Every rank's list stays indexable
// by an int (validator.h reports steps as ints), and a request no memory could hold is an error
// naming the limit, not an allocation failure halfway through.
constexpr int64_t kMaxActions = 1'000'000'000;

// One compute of a rank's order, 8 bytes like an Action (an order of P = 1024, M = 8192 holds
// 8.4 M of them).
struct Compute {
  Compute(ActionKind kind, int chunk, int micro_batch)
      : kind(kind), chunk(static_cast<int8_t>(chunk)), micro_batch(micro_batch) {}
  ActionKind kind;
  int8_t chunk;
  int micro_batch;
};
using ComputeOrder = std::vector<std::vector<Compute>>;  // [rank][compute actions in order]

// ---- compute orders ---------------------------------------------------------------------------

ComputeOrder GPipeOrder(int P, int M) {
  ComputeOrder order(P);
  for (int s = 0; s < P; ++s) {
    for (int m = 0; m < M; ++m) order[s].push_back({ActionKind::kForward, 0, m});
    for (int m = 0; m < M; ++m) order[s].push_back({ActionKind::kBackward, 0, m});
  }
  return order;
}

// Warm-up forwards, steady (F, B) pairs, cool-down backwards over `count` forward/backward
// slots; forward(k) and backward(k) name the k-th of each on this rank.
template <typename Forward, typename Backward>
std::vector<Compute> OneFOneB(int count, int warmup, Forward forward, Backward backward) {
  std::vector<Compute> list;
  list.reserve(2 * static_cast<size_t>(count));
  for (int k = 0; k < warmup; ++k) list.push_back(forward(k));
  for (int k = 0; k < count - warmup; ++k) {
    list.push_back(forward(k + warmup));
    list.push_back(backward(k));
  }
  for (int k = count - warmup; k < count; ++k) list.push_back(backward(k));
  return list;
}

ComputeOrder OneFOneBOrder(int P, int M) {
  ComputeOrder order(P);
  for (int s = 0; s < P; ++s) {
    order[s] = OneFOneB(
        M, std::min(P - 1 - s, M),
        [](int k) {
          return Compute{ActionKind::kForward, 0, k};
        },
        [](int k) {
          return Compute{ActionKind::kBackward, 0, k};
        });
  }
  return order;
}

ComputeOrder InterleavedOrder(int P, int M, int V) {
  // Micro-batches go in groups of P: P forwards of chunk 0, P of chunk 1, …, then the next group.
  auto micro_batch = [=](int k) { return (k / (P * V)) * P + k % P; };
  ComputeOrder order(P);
  for (int s = 0; s < P; ++s) {
    const int warmup = std::min((V - 1) * P + 2 * (P - 1 - s), V * M);
    order[s] = OneFOneB(
        V * M, warmup,
        [=](int k) {
          return Compute{ActionKind::kForward, (k / P) % V, micro_batch(k)};
        },
        [=](int k) {
          return Compute{ActionKind::kBackward, V - 1 - (k / P) % V, micro_batch(k)};
        });
  }
  return order;
}

ComputeOrder ZeroBubbleH1Order(int P, int M) {
  ComputeOrder order(P);
  for (int s = 0; s < P; ++s) {
    std::vector<Compute>& list = order[s];
    int f = 0, b = 0, w = 0;
    auto F = [&] { list.push_back({ActionKind::kForward, 0, f++}); };
    auto B = [&] { list.push_back({ActionKind::kBackward, 0, b++}); };
    auto W = [&] { list.push_back({ActionKind::kWeight, 0, w++}); };
    for (int k = 0; k < P - s; ++k) F();
    for (int k = 0; k < s; ++k) B(), F();
    for (int k = 0; k < M - P; ++k) B(), W(), F();
    for (int k = 0; k < P - s; ++k) B(), W();
    for (int k = 0; k < s; ++k) W();
  }
  return order;
}

// The unit-time list scheduler of zb-h2 (schedules.h): at every step each stage takes the first
// of B, F, W that can run then — B once the next stage's B of that micro-batch has ended, F once
// the previous stage's F has ended and the in-flight limits allow it, W whenever a B awaits one.
ComputeOrder ZeroBubbleH2Order(int P, int M) {
  ComputeOrder order(P);
  // Step at whose start the F / B of [stage][micro-batch] has ended; kNever while it has not run.
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> f_end(P, std::vector<int64_t>(M, kNever)), b_end = f_end;
  std::vector<int> f(P, 0), b(P, 0), w(P, 0);  // next F, B, W of each stage
  int done = 0;
  for (int64_t t = 0; done < P; ++t) {
    done = 0;
    for (int s = 0; s < P; ++s) {
      const int until_b = std::min(2 * (P - s) - 1, M), until_w = std::min(2 * P - 1, M);
      if (b[s] < f[s] && (s == P - 1 || b_end[s + 1][b[s]] <= t)) {
        order[s].push_back({ActionKind::kBackward, 0, b[s]});
        b_end[s][b[s]++] = t + 1;
      } else if (f[s] < M && f[s] - b[s] < until_b && f[s] - w[s] < until_w &&
                 (s == 0 || f_end[s - 1][f[s]] <= t)) {
        order[s].push_back({ActionKind::kForward, 0, f[s]});
        f_end[s][f[s]++] = t + 1;
      } else if (w[s] < b[s]) {
        order[s].push_back({ActionKind::kWeight, 0, w[s]++});
      }
      if (w[s] == M) ++done;
    }
    SLUICE_CHECK(t < 3 * static_cast<int64_t>(M) * P + P, "zb-h2 (P={}, M={}) stalls at step {}", P,
                 M, t);
  }
  return order;
}

// ZB-V (schedules.h): rank r holds chunk 0 (virtual stage r, on the way down) and chunk 1
// (virtual stage 2P − 1 − r, on the way back up).
ComputeOrder ZeroBubbleVOrder(int P, int M) {
  ComputeOrder order(P);
  for (int r = 0; r < P; ++r) {
    std::vector<Compute>& list = order[r];
    int f[2] = {}, b[2] = {}, w[2] = {};  // [chunk]: the next micro-batch of F, B, W
    auto F = [&](int c) { list.push_back({ActionKind::kForward, c, f[c]++}); };
    auto B = [&](int c) { list.push_back({ActionKind::kBackward, c, b[c]++}); };
    auto W = [&](int c) { list.push_back({ActionKind::kWeight, c, w[c]++}); };
    for (int k = 0; k < 2 * (P - r) - 1; ++k) F(0);
    for (int k = 0; k < r; ++k) F(1), F(0);
    for (int k = 0; k < P - r; ++k) F(1), B(1), W(1);
    while (f[1] < f[0] || f[0] < M) {
      if (f[0] < M) F(0);
      B(0), W(0), F(1), B(1), W(1);
    }
    for (int k = 0; k < r; ++k) B(0), B(1);
    for (int k = 0; k < P - r; ++k) B(0), W(0);
    while (w[1] < M) W(1);
    while (w[0] < M) W(0);
  }
  return order;
}

// V-Half and V-Min (schedules.h): the building block's order (building_block.h).
ComputeOrder BuildingBlockComputeOrder(BuildingBlock block, int P, int M) {
  ComputeOrder order(P);
  const std::vector<std::vector<Action>> actions = BuildingBlockOrder(block, P, M);
  for (int r = 0; r < P; ++r) {
    for (const Action& a : actions[r])
      order[r].emplace_back(a.kind, a.chunk, static_cast<int>(a.micro_batch));
  }
  return order;
}

// ---- timing and message placement -------------------------------------------------------------

// The timing messages are placed by: CostModel{} of schedule_analysis.h, in whole steps — F, B
// and W take 1 each, except that an unsplit backward (B with W inside) takes 2.
int64_t PlacementCost(const Schedule& s, ActionKind kind) {
  return kind == ActionKind::kBackward && !s.split_backward ? 2 : 1;
}

// The as-soon-as-possible timing of every compute at placement cost. Times are whole steps.
struct Timing {
  std::vector<std::vector<int64_t>> start;  // [rank][index in its order]
  // end[F or B][virtual stage][micro-batch]: when that forward or backward ends. A row (one
  // kind and virtual stage) is padded by a cache line: rows 2^k bytes apart would put every
  // rank's entries of one micro-batch into the same few cache sets.
  std::vector<int64_t> end;
  int virtual_stages = 0;
  size_t row = 0;  // micro-batches + 8

  int64_t& End(ActionKind kind, int vs, int m) {
    return end[(static_cast<size_t>(kind) * virtual_stages + vs) * row + m];
  }
  int64_t End(ActionKind kind, int vs, int m) const {
    return end[(static_cast<size_t>(kind) * virtual_stages + vs) * row + m];
  }
};

Timing TimeOrder(const Schedule& s, const ComputeOrder& order) {
  const int P = s.stages, M = s.micro_batches, VP = s.virtual_stages();
  const size_t row = static_cast<size_t>(M) + 8;
  Timing timing{.start = std::vector<std::vector<int64_t>>(P),
                .end = std::vector<int64_t>(2 * VP * row, -1),  // -1: not run
                .virtual_stages = VP,
                .row = row};
  // W ends nowhere in the table: nothing waits for it. Its inputs are B's.
  // Each rank runs until a compute's input has not ended; the rank ending that input wakes it.
  // The times do not depend on which rank runs first. What a switch to a rank touches first
  // lies in one cache line.
  constexpr int64_t kNotWaiting = -1;
  struct Rank {
    const Compute* next;
    const Compute* end;
    int64_t* start;  // where the next start goes
    int64_t clock = 0;
    int64_t waits = kNotWaiting;  // the index in timing.end a blocked rank waits for
  };
  std::vector<Rank> ranks;
  for (int r = 0; r < P; ++r) {
    timing.start[r].resize(order[r].size());
    ranks.push_back({.next = order[r].data(),
                     .end = order[r].data() + order[r].size(),
                     .start = timing.start[r].data()});
  }
  std::vector<int> work;
  for (int r = P - 1; r >= 0; --r) work.push_back(r);
  int64_t* const ends = timing.end.data();
  auto index = [&](ActionKind kind, int vs, int m) {
    return static_cast<int64_t>((static_cast<size_t>(kind) * VP + vs) * row + m);
  };
  const int64_t backward_cost = PlacementCost(s, ActionKind::kBackward);
  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    Rank& me = ranks[r];
    me.waits = kNotWaiting;
    for (; me.next != me.end; ++me.next) {
      const Compute& c = *me.next;
      const int vs = s.VirtualStage(r, c.chunk);
      int64_t ready = 0;     // the latest input's end
      int64_t missing = -1;  // the first input that has not ended
      auto input = [&](ActionKind kind, int v) {
        const int64_t i = index(kind, v, c.micro_batch);
        const int64_t end = ends[i];
        if (end < 0 && missing < 0) missing = i;
        ready = std::max(ready, end);
      };
      if (c.kind == ActionKind::kForward && vs > 0) input(ActionKind::kForward, vs - 1);
      if (c.kind == ActionKind::kBackward) {
        input(ActionKind::kForward, vs);
        if (vs + 1 < VP) input(ActionKind::kBackward, vs + 1);
      }
      if (c.kind == ActionKind::kWeight) input(ActionKind::kBackward, vs);
      if (missing >= 0) {
        me.waits = missing;
        break;
      }
      const int64_t t = std::max(me.clock, ready);
      me.clock = t + (c.kind == ActionKind::kBackward ? backward_cost : 1);
      *me.start++ = t;
      if (c.kind == ActionKind::kWeight) continue;
      const int64_t produced = index(c.kind, vs, c.micro_batch);
      ends[produced] = me.clock;
      // The consumer on another rank: F of the next virtual stage, B of the previous.
      const int to = c.kind == ActionKind::kForward ? vs + 1 : vs - 1;
      if (to < 0 || to >= VP) continue;
      const int q = s.RankOf(to);
      if (q != r && ranks[q].waits == produced) {
        ranks[q].waits = kNotWaiting;
        work.push_back(q);
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    SLUICE_CHECK(ranks[r].next == ranks[r].end,
                 "{}: the compute order of rank {} stalls at its step {}", s.Describe(), r,
                 ranks[r].next - order[r].data());
  }
  return timing;
}

// One rank's computes in time: start[i] to start[i] + cost of order[i]. Messages are placed
// in the order of their producers, so the instants asked about mostly grow: `hint`, the first
// compute starting at or after the last instant asked about, saves a search.
struct RankSpans {
  const Schedule* s;
  const std::vector<Compute>* order;
  const std::vector<int64_t>* start;
  size_t hint = 0;

  int64_t End(size_t i) const { return (*start)[i] + PlacementCost(*s, (*order)[i].kind); }
  // Moves hint to the first compute starting at or after t.
  void Seek(int64_t t) {
    const std::vector<int64_t>& st = *start;
    while (hint > 0 && st[hint - 1] >= t) --hint;
    while (hint < st.size() && st[hint] < t) ++hint;
  }
  // The end of the compute that runs across instant t, or t when none does.
  int64_t FreeFrom(int64_t t) {
    Seek(t);
    if (hint == 0) return t;
    const int64_t end = End(hint - 1);
    return end <= t ? t : end;
  }
};

// The first instant in [from, until] at which neither rank is inside a compute, or `from` if
// there is none. A message placed there passes without either rank waiting for the other.
int64_t CommonPause(RankSpans& a, RankSpans& b, int64_t from, int64_t until) {
  for (int64_t t = from; t <= until;) {
    const int64_t next = std::max(a.FreeFrom(t), b.FreeFrom(t));
    if (next == t) return t;
    t = next;
  }
  return from;
}

// One entry of the global order all ranks' lists are projections of, 24 bytes: the order is
// (time, order), `order` packing what ranks the entries of one instant (MessageOrder).
struct Event {
  int64_t time;
  uint64_t order;
  Action action;

  auto Key() const { return std::pair(time, order); }
};

// Of one instant, messages before computes (there is at most one compute); of messages, forward
// ones first, then within a direction the one further along (a higher producing virtual stage
// forward, a lower one backward), then the lower micro-batch — as bits: 63 compute, 62 backward,
// 61–32 the producing stage (forward: 2^30 − 1 − vs), 31–0 the micro-batch.
constexpr uint64_t kComputeOrder = uint64_t{1} << 63;
uint64_t MessageOrder(bool forward, int producer_vs, int micro_batch) {
  const uint64_t vs = forward ? (uint64_t{1} << 30) - 1 - static_cast<uint64_t>(producer_vs)
                              : static_cast<uint64_t>(producer_vs);
  return (uint64_t{forward ? 0u : 1u} << 62) | (vs << 32) | static_cast<uint32_t>(micro_batch);
}

// Sorts one rank's events by Key(): by time with a counting sort (times are whole steps, a few per
// event), then each instant's few events by `order`. Every key of a rank is distinct (one
// compute starts at an instant; a message's order names it), so the order is the one sort.
// `scratch` and `bucket` are buffers kept between calls.
void SortEvents(std::vector<Event>& events, std::vector<Event>& scratch,
                std::vector<size_t>& bucket) {
  if (events.empty()) return;
  auto [lo, hi] = std::ranges::minmax(events, {}, &Event::time);
  const int64_t t0 = lo.time, span = hi.time - lo.time + 1;
  if (span > 4 * static_cast<int64_t>(events.size()) + 64) {  // sparse in time: a plain sort
    std::ranges::sort(events, {}, &Event::Key);
    return;
  }
  // bucket[t]: first the end of instant t0 + t's events in the sorted order, then, once they
  // are placed from the back, their start.
  bucket.assign(static_cast<size_t>(span), 0);
  for (const Event& e : events) ++bucket[static_cast<size_t>(e.time - t0)];
  for (size_t t = 1; t < bucket.size(); ++t) bucket[t] += bucket[t - 1];
  scratch.resize(events.size());
  for (size_t i = events.size(); i-- > 0;) {
    scratch[--bucket[static_cast<size_t>(events[i].time - t0)]] = events[i];
  }
  for (size_t t = 0; t < bucket.size(); ++t) {
    const size_t begin = bucket[t], end = t + 1 < bucket.size() ? bucket[t + 1] : events.size();
    if (end - begin <= 16) {  // an insertion sort of the instant's few events
      for (size_t i = begin + 1; i < end; ++i) {
        const Event e = scratch[i];
        size_t j = i;
        for (; j > begin && scratch[j - 1].order > e.order; --j) scratch[j] = scratch[j - 1];
        scratch[j] = e;
      }
    } else {
      std::sort(scratch.begin() + static_cast<std::ptrdiff_t>(begin),
                scratch.begin() + static_cast<std::ptrdiff_t>(end),
                [](const Event& x, const Event& y) { return x.order < y.order; });
    }
  }
  events.swap(scratch);
}

// Receives posted ahead: each RECV moves up past the computes before it, to just after the
// rank's previous send or receive. Every rank keeps its sends and receives in the same order, so
// the schedule stays deadlock-free under rendezvous; a receive listed earlier is posted (and its
// buffer allocated) earlier, so a send whose receiver is inside a compute need not wait it out.
void PostReceivesAhead(std::vector<Action>& list) {
  size_t first = 0;  // where the next receive may go
  for (size_t i = 0; i < list.size(); ++i) {
    if (IsRecv(list[i].kind)) {
      std::rotate(list.begin() + first, list.begin() + i, list.begin() + i + 1);
      ++first;
    } else if (IsSend(list[i].kind)) {
      first = i + 1;
    }
  }
}

// Lists every rank's actions one rank at a time: its computes, the sends they make and the
// receives its peers' computes make for it, in the global order. Each message's instant is placed
// once, beside the timing; the timing's table of ends goes before the lists grow.
Schedule Assemble(Schedule s, const ComputeOrder& order, bool post_ahead) {
  Timing timing = TimeOrder(s, order);
  const int P = s.stages, M = s.micro_batches, VP = s.virtual_stages();
  std::vector<RankSpans> spans;
  for (int r = 0; r < P; ++r) spans.push_back({&s, &order[r], &timing.start[r]});
  // The instant of every message, [F or B][producing virtual stage][micro-batch]; kNoMessage
  // where its producer does not run. An int holds every instant: a schedule's makespan at
  // placement costs is at most twice its computes, and they are at most kMaxActions.
  static_assert(2 * kMaxActions < std::numeric_limits<int32_t>::max());
  constexpr int32_t kNoMessage = -1;
  std::vector<int32_t> instants(2 * static_cast<size_t>(VP) * M, kNoMessage);
  auto instant = [&](bool forward, int vs, int m) -> int32_t& {
    return instants[(static_cast<size_t>(forward ? 0 : 1) * VP + vs) * M + m];
  };
  for (int from = 0; from < P; ++from) {
    RankSpans& sender = spans[from];
    for (size_t i = 0; i < order[from].size(); ++i) {
      const Compute& c = order[from][i];
      if (c.kind == ActionKind::kWeight) continue;
      // A forward's output goes to the next virtual stage, a backward's input gradient to the
      // previous.
      const bool forward = c.kind == ActionKind::kForward;
      const int vs = s.VirtualStage(from, c.chunk);
      const int to = forward ? vs + 1 : vs - 1;
      if (to < 0 || to >= VP || s.RankOf(to) == from) continue;
      // The consumer (F of the next virtual stage, B of the previous) starts its cost before
      // its end.
      const ActionKind consumer_kind = forward ? ActionKind::kForward : ActionKind::kBackward;
      const int64_t consumer =
          timing.End(consumer_kind, to, c.micro_batch) - PlacementCost(s, consumer_kind);
      instant(forward, vs, c.micro_batch) =
          static_cast<int32_t>(CommonPause(sender, spans[s.RankOf(to)], sender.End(i), consumer));
    }
  }
  std::vector<int64_t>().swap(timing.end);

  s.ranks.assign(P, {});
  std::vector<Event> events, scratch;
  std::vector<size_t> buckets;
  for (int r = 0; r < P; ++r) {
    events.clear();
    const std::vector<Compute>& computes = order[r];
    for (size_t i = 0; i < computes.size(); ++i) {
      const Compute& c = computes[i];
      events.push_back({timing.start[r][i],
                        kComputeOrder,
                        {.kind = c.kind, .chunk = c.chunk, .micro_batch = c.micro_batch}});
    }
    // Its sends: messages of one instant go forward ones first, then within a direction the one
    // further along (MessageOrder), so that a rank's sends of one direction come before its
    // receives.
    for (const Compute& c : computes) {
      if (c.kind == ActionKind::kWeight) continue;
      const bool forward = c.kind == ActionKind::kForward;
      const int vs = s.VirtualStage(r, c.chunk);
      const int to = forward ? vs + 1 : vs - 1;
      if (to < 0 || to >= VP || s.RankOf(to) == r) continue;
      events.push_back({instant(forward, vs, c.micro_batch),
                        MessageOrder(forward, vs, c.micro_batch),
                        {.kind = forward ? ActionKind::kSendF : ActionKind::kSendB,
                         .chunk = c.chunk,
                         .micro_batch = c.micro_batch,
                         .peer = s.RankOf(to)}});
    }
    // Its receives: the messages of the neighbouring virtual stages on other ranks.
    for (int c = 0; c < s.chunks; ++c) {
      const int vs = s.VirtualStage(r, c);
      for (const bool forward : {true, false}) {
        const int from = forward ? vs - 1 : vs + 1;
        if (from < 0 || from >= VP || s.RankOf(from) == r) continue;
        for (int m = 0; m < M; ++m) {
          const int32_t t = instant(forward, from, m);
          if (t == kNoMessage) continue;
          events.push_back({t,
                            MessageOrder(forward, from, m),
                            {.kind = forward ? ActionKind::kRecvF : ActionKind::kRecvB,
                             .chunk = static_cast<int8_t>(c),
                             .micro_batch = m,
                             .peer = s.RankOf(from)}});
        }
      }
    }
    SortEvents(events, scratch, buckets);
    std::vector<Action>& list = s.ranks[r];
    list.reserve(events.size() + 1);
    for (const Event& e : events) list.push_back(e.action);
    if (post_ahead) PostReceivesAhead(list);
    list.push_back({.kind = ActionKind::kOptimizer});
  }
  return s;
}

// ---- requests ---------------------------------------------------------------------------------

// Whether the schedule splits the backward into B and W.
bool SplitsBackward(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleH1 || kind == ScheduleKind::kZeroBubbleH2 ||
         IsVShaped(kind);
}

// How many actions the schedule holds: per rank, 2 or 3 computes per chunk-micro-batch, a send and
// a receive per micro-batch for each neighbouring virtual stage on another rank, and OPT.
int64_t ActionCount(ScheduleKind kind, int P, int M, int V) {
  const bool split = SplitsBackward(kind);
  const Schedule shape{.stages = P, .chunks = V, .v_shape = IsVShaped(kind)};
  int64_t per_micro_batch = 0;  // over all ranks
  for (int vs = 0; vs < shape.virtual_stages(); ++vs) {
    per_micro_batch += split ? 3 : 2;
    // A message to the next virtual stage: a send and a receive each way (F and B).
    if (vs + 1 < shape.virtual_stages() && shape.RankOf(vs + 1) != shape.RankOf(vs))
      per_micro_batch += 4;
  }
  return per_micro_batch * M + P;
}

void CheckRequest(const ScheduleOptions& o, int V) {
  const std::string_view name = ScheduleKindName(o.kind);
  const int P = o.stages, M = o.micro_batches;
  if (P < 1) throw InvalidArgument(fmt::format("{}: needs at least 1 stage (got {})", name, P));
  if (M < 1)
    throw InvalidArgument(fmt::format("{}: needs at least 1 micro-batch (got {})", name, M));
  if (IsVShaped(o.kind)) {
    if (V != 2) {
      throw InvalidArgument(fmt::format(
          "{}: runs exactly 2 chunks per rank, V-shaped (got {} chunks): give --chunks 2 or "
          "leave it out",
          name, V));
    }
    if (o.kind == ScheduleKind::kZeroBubbleV && M < 2 * P - 1) {
      throw InvalidArgument(fmt::format(
          "zb-v: needs at least 2P − 1 micro-batches (M={} < {} for P={}): use {} or more "
          "micro-batches, or zb-h1",
          M, 2 * P - 1, P, 2 * P - 1));
    }
  } else if (o.kind == ScheduleKind::kInterleaved) {
    if (V < 2) {
      throw InvalidArgument(
          fmt::format("interleaved: needs at least 2 chunks per rank (got {}); for one chunk "
                      "per rank use 1f1b",
                      V));
    }
    if (M % P != 0) {
      const int below = M / P * P, above = below + P;
      throw InvalidArgument(fmt::format(
          "interleaved: the micro-batch count must be a multiple of the stage count "
          "(M={}, P={}): use {} micro-batches",
          M, P, below > 0 ? fmt::format("{} or {}", below, above) : fmt::format("{}", above)));
    }
  } else if (V != 1) {
    throw InvalidArgument(
        fmt::format("{}: runs 1 chunk per rank (got {} chunks); chunks apply to interleaved, "
                    "zb-v, v-half and v-min only",
                    name, V));
  }
  if ((o.kind == ScheduleKind::kOneFOneB || o.kind == ScheduleKind::kZeroBubbleH1 ||
       o.kind == ScheduleKind::kZeroBubbleH2) &&
      M < P) {
    throw InvalidArgument(
        fmt::format("{}: needs at least as many micro-batches as stages (M={} < P={}): use "
                    "{} or more micro-batches, or gpipe",
                    name, M, P, P));
  }
  if (P > kMaxStages) {
    throw InvalidArgument(fmt::format("{}: at most {} stages (got {})", name, kMaxStages, P));
  }
  if (V > kMaxChunks) {
    throw InvalidArgument(
        fmt::format("{}: at most {} chunks per rank (got {})", name, kMaxChunks, V));
  }
  const int64_t actions = ActionCount(o.kind, P, M, V);
  if (actions > kMaxActions) {
    throw InvalidArgument(
        fmt::format("{}: P={}, M={}, V={} makes a schedule of {} actions, over the {} a schedule "
                    "may hold; use fewer stages, micro-batches or chunks",
                    name, P, M, V, actions, kMaxActions));
  }
}

}  // namespace

std::string_view ScheduleKindName(ScheduleKind kind) { return EnumName(kScheduleKindNames, kind); }

std::optional<ScheduleKind> ParseScheduleKind(std::string_view name) {
  return ParseEnum(kScheduleKindNames, name);
}

bool IsVShaped(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kVHalf ||
         kind == ScheduleKind::kVMin;
}

int ChunksOf(const ScheduleOptions& o) {
  if (o.chunks != 0) return o.chunks;
  return o.kind == ScheduleKind::kInterleaved || IsVShaped(o.kind) ? 2 : 1;
}

bool PostsReceivesAhead(const ScheduleOptions& options) {
  // Off by default: sluice's runtimes post receives and never block in a send, so listing them
  // early gains them no time and holds receive buffers longer (docs/pipeline.md).
  return options.post_receives_ahead.value_or(false);
}

std::optional<int> DefaultMicroBatches(const ScheduleOptions& options, int64_t batch) {
  std::vector<int64_t> divisors;  // of batch, ascending, from P on
  for (int64_t d = 1; d <= batch / d; ++d) {
    if (batch % d != 0) continue;
    for (int64_t x : {d, batch / d}) {
      if (x >= options.stages && x <= std::numeric_limits<int>::max()) divisors.push_back(x);
      if (d == batch / d) break;
    }
  }
  std::ranges::sort(divisors);
  const int V = ChunksOf(options);
  for (int64_t m : divisors) {
    ScheduleOptions o = options;
    o.micro_batches = static_cast<int>(m);
    try {
      CheckRequest(o, V);
      return o.micro_batches;
    } catch (const InvalidArgument&) {
      // the schedule does not run with m: try the next divisor
    }
  }
  return std::nullopt;
}

Schedule MakeSchedule(const ScheduleOptions& options) {
  const int V = ChunksOf(options);
  CheckRequest(options, V);
  const int P = options.stages, M = options.micro_batches;
  const bool ahead = PostsReceivesAhead(options);
  Schedule s{.name = std::string(ScheduleKindName(options.kind)),
             .stages = P,
             .micro_batches = M,
             .chunks = V,
             .split_backward = SplitsBackward(options.kind),
             .v_shape = IsVShaped(options.kind)};
  switch (options.kind) {
    case ScheduleKind::kGPipe:
      s = Assemble(std::move(s), GPipeOrder(P, M), ahead);
      break;
    case ScheduleKind::kOneFOneB:
      s = Assemble(std::move(s), OneFOneBOrder(P, M), ahead);
      break;
    case ScheduleKind::kInterleaved:
      s = Assemble(std::move(s), InterleavedOrder(P, M, V), ahead);
      break;
    case ScheduleKind::kZeroBubbleH1:
      s = Assemble(std::move(s), ZeroBubbleH1Order(P, M), ahead);
      break;
    case ScheduleKind::kZeroBubbleH2:
      s = Assemble(std::move(s), ZeroBubbleH2Order(P, M), ahead);
      break;
    case ScheduleKind::kZeroBubbleV:
      s = Assemble(std::move(s), ZeroBubbleVOrder(P, M), ahead);
      break;
    case ScheduleKind::kVHalf:
      s = Assemble(std::move(s), BuildingBlockComputeOrder(BuildingBlock::kVHalf, P, M), ahead);
      break;
    case ScheduleKind::kVMin:
      s = Assemble(std::move(s), BuildingBlockComputeOrder(BuildingBlock::kVMin, P, M), ahead);
      break;
  }
  ValidateSchedule(s);
  return s;
}

int TheoreticalInFlight(const ScheduleOptions& o, int rank) {
  const int P = o.stages, M = o.micro_batches;
  switch (o.kind) {
    case ScheduleKind::kGPipe:
      return M;
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1:
      return std::min(P - rank, M);
    case ScheduleKind::kZeroBubbleH2:
      return std::min(2 * (P - rank) - 1, M);
    case ScheduleKind::kInterleaved: {
      const int V = ChunksOf(o);
      return std::min(V * P + P - 1 - 2 * rank, V * M);
    }
    case ScheduleKind::kZeroBubbleV:
      return 2 * P;
    case ScheduleKind::kVHalf:
    case ScheduleKind::kVMin:
      return InFlightPeaks(MakeSchedule(o), /*validated=*/true).at(rank).peak;
  }
  SLUICE_CHECK(false, "unknown schedule kind {}", static_cast<int>(o.kind));
}

double TheoreticalBubble(const ScheduleOptions& o) {
  // One rank's step in units of a forward (the closed forms of docs/pipeline.md): its compute
  // and the idle time before and after it, so that the step ends at busy + idle.
  const double P = o.stages, M = o.micro_batches;
  auto busy_and_idle = [&]() -> std::pair<double, double> {
    switch (o.kind) {
      case ScheduleKind::kGPipe:
      case ScheduleKind::kOneFOneB:
        return {M, P - 1};
      case ScheduleKind::kInterleaved:
        return {ChunksOf(o) * M, P - 1};
      case ScheduleKind::kZeroBubbleV:
        return {6 * M, P - 1};
      case ScheduleKind::kZeroBubbleH1:
      case ScheduleKind::kZeroBubbleH2:
        return {3 * M, P - 1};
      case ScheduleKind::kVHalf:
      case ScheduleKind::kVMin: {
        // The idle steps of every rank (docs/pipeline.md, measured for P ≤ 8).
        const int p = o.stages;
        int idle = 0;
        if (p > 1 && o.kind == ScheduleKind::kVMin) idle = 4 * p - 5 - (p % 3 == 0 ? 2 : 0);
        if (p > 1 && o.kind == ScheduleKind::kVHalf) idle = p == 2 ? 1 : 6 * ((p - 1) / 2) - 1;
        return {6 * M, idle};
      }
    }
    SLUICE_CHECK(false, "unknown schedule kind {}", static_cast<int>(o.kind));
  };
  const auto [busy, idle] = busy_and_idle();
  const double end = busy + idle;
  return BubbleOf(std::span(&end, 1), std::span(&busy, 1)).total;
}

}  // namespace sluice::pipeline
