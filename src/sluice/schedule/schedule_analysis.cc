#include "sluice/schedule/schedule_analysis.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <utility>

#include "sluice/schedule/bubble.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {

namespace {

// A queue per ordered pair of ranks that exchange messages — neighbours, at most 2V per rank —
// so that memory grows with the messages, not with P².
template <typename T>
class PeerQueues {
 public:
  explicit PeerQueues(int ranks) : from_(ranks) {}
  std::deque<T>& operator()(int from, int to) {
    for (auto& [peer, queue] : from_[from]) {
      if (peer == to) return queue;
    }
    return from_[from].emplace_back(to, std::deque<T>()).second;
  }

 private:
  std::vector<std::vector<std::pair<int, std::deque<T>>>> from_;  // [from] → (to, queue)
};

}  // namespace

std::vector<InFlight> InFlightPeaks(const Schedule& schedule, bool validated) {
  if (!validated) ValidateSchedule(schedule);
  std::vector<InFlight> peaks(schedule.stages);
  for (int r = 0; r < schedule.stages; ++r) {
    InFlight& peak = peaks[r];
    peak.peak_per_chunk.assign(schedule.chunks, 0);
    std::vector<int> per_chunk(schedule.chunks, 0);
    int total = 0, awaiting_weight = 0;
    for (const Action& a : schedule.ranks[r]) {
      if (a.kind == ActionKind::kForward) {
        ++total;
        peak.peak = std::max(peak.peak, total);
        ++per_chunk[a.chunk];
        peak.peak_per_chunk[a.chunk] = std::max(peak.peak_per_chunk[a.chunk], per_chunk[a.chunk]);
      } else if (a.kind == ActionKind::kBackward) {
        --total;
        --per_chunk[a.chunk];
        if (schedule.split_backward) {
          peak.peak_awaiting_weight = std::max(peak.peak_awaiting_weight, ++awaiting_weight);
        }
      } else if (a.kind == ActionKind::kWeight) {
        --awaiting_weight;
      }
      peak.peak_until_weight = std::max(peak.peak_until_weight, total + awaiting_weight);
    }
  }
  return peaks;
}

Simulation Simulate(const Schedule& schedule, const CostModel& costs, CommMode mode,
                    bool keep_action_times, bool validated) {
  if (!validated) ValidateSchedule(schedule);
  const int P = schedule.stages, V = schedule.chunks, M = schedule.micro_batches;
  auto cost = [&](ActionKind kind) {
    switch (kind) {
      case ActionKind::kForward:
        return costs.forward;
      case ActionKind::kBackward:
        return costs.backward + (schedule.split_backward ? 0 : costs.weight);
      case ActionKind::kWeight:
        return costs.weight;
      default:
        return 0.0;
    }
  };
  Simulation sim;
  sim.ranks.resize(P);
  // kRendezvousPosted reads the times of posted receives back.
  const bool times = keep_action_times || mode == CommMode::kRendezvousPosted;
  if (times) {
    for (int r = 0; r < P; ++r) sim.ranks[r].actions.resize(schedule.ranks[r].size());
  }
  std::vector<double> clock(P, 0);
  std::vector<size_t> next(P, 0);
  PeerQueues<double> sent(P);  // (from, to): send instants not yet received
  // kRendezvousPosted: [from·P + to] → the receiver's steps of receives posted, not yet matched.
  PeerQueues<size_t> posted(P);
  const bool posting = mode == CommMode::kAsync || mode == CommMode::kRendezvousPosted;
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  // kAsync: [rank][F or B][chunk][micro-batch] → when the message that compute reads arrived.
  std::vector<std::vector<double>> arrived(P, std::vector<double>(2 * V * M, 0));
  auto arrival = [&](int r, const Action& a) -> double& {
    const bool forward = a.kind == ActionKind::kForward || a.kind == ActionKind::kRecvF;
    return arrived[r][((forward ? 0 : 1) * V + a.chunk) * M + a.micro_batch];
  };
  auto finish = [&](int r, double start, double end) {
    if (times) sim.ranks[r].actions[next[r]] = {start, end};
    if (!posting || !IsRecv(schedule.ranks[r][next[r]].kind)) clock[r] = end;
    ++next[r];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < schedule.ranks[r].size()) {
        const Action& a = schedule.ranks[r][next[r]];
        if (IsSend(a.kind) && mode == CommMode::kRendezvous) {
          const int q = a.peer;
          const Action* b =
              next[q] < schedule.ranks[q].size() ? &schedule.ranks[q][next[q]] : nullptr;
          if (b == nullptr || !IsRecv(b->kind) || b->peer != r) break;
          const double t = std::max(clock[r], clock[q]);
          finish(q, t, t);
          finish(r, t, t);
        } else if (IsSend(a.kind) && mode == CommMode::kRendezvousPosted) {
          std::deque<size_t>& receives = posted(r, a.peer);
          if (receives.empty()) break;
          const size_t step = receives.front();
          receives.pop_front();
          ActionTime& receive = sim.ranks[a.peer].actions[step];
          const double t = std::max(clock[r], receive.start);
          receive.end = arrival(a.peer, schedule.ranks[a.peer][step]) = t;
          finish(r, t, t);
        } else if (IsSend(a.kind)) {
          sent(r, a.peer).push_back(clock[r]);
          finish(r, clock[r], clock[r]);
        } else if (IsRecv(a.kind) && mode == CommMode::kRendezvousPosted) {
          posted(a.peer, r).push_back(next[r]);
          arrival(r, a) = kNotYet;  // until its send is made
          finish(r, clock[r], kNotYet);
        } else if (IsRecv(a.kind)) {
          // Waits here, in the order the simulation visits ranks, until the peer has sent.
          std::deque<double>& channel = sent(a.peer, r);
          if (mode == CommMode::kRendezvous || channel.empty()) break;
          const double t = std::max(clock[r], channel.front());
          channel.pop_front();
          arrival(r, a) = t;
          finish(r, clock[r], t);
        } else {
          const bool reads =
              posting && a.kind != ActionKind::kWeight && a.kind != ActionKind::kOptimizer;
          if (reads && arrival(r, a) == kNotYet) break;  // its message is not sent yet
          const double start = reads ? std::max(clock[r], arrival(r, a)) : clock[r];
          const double c = cost(a.kind);
          sim.ranks[r].busy += c;
          finish(r, start, start + c);
        }
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    SLUICE_CHECK(next[r] == schedule.ranks[r].size(),
                 "{}: a validated schedule stalls on rank {} at step {}", schedule.Describe(), r,
                 next[r]);
  }
  if (!keep_action_times) {
    for (RankTime& rank : sim.ranks) rank.actions = {};
  }
  std::vector<double> busy(P);
  for (int r = 0; r < P; ++r) busy[r] = sim.ranks[r].busy;
  const Bubble bubble = BubbleOf(clock, busy);
  sim.makespan = bubble.makespan;
  for (int r = 0; r < P; ++r) {
    sim.ranks[r].idle = bubble.idle[r];
    sim.ranks[r].bubble = bubble.share[r];
  }
  sim.bubble = bubble.total;
  return sim;
}

}  // namespace sluice::pipeline
