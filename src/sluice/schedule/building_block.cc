#include "sluice/schedule/building_block.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <tuple>

#include <fmt/format.h>

namespace sluice::pipeline {

namespace {

constexpr int kInterval = 6;  // slots per block: F, B and W of two chunks

// A rank's computes in the order one micro-batch visits the rank, then its W (of either chunk).
enum Lane : int8_t { kF0, kF1, kB1, kB0, kW };
constexpr int kLanes = 5;
constexpr int8_t kFree = -1;

// One rank's timeline: slot[lane][k] is where the k-th compute of the lane runs — micro-batch
// k's, except in kW, which lists the rank's W in slot order whatever their chunk. Within a lane
// slots grow with k.
struct RankSlots {
  std::array<std::vector<int64_t>, kLanes> slot;
};
using Timeline = std::vector<RankSlots>;  // [rank]

int64_t SlotsUsed(const RankSlots& r) {
  int64_t end = 0;
  for (const std::vector<int64_t>& lane : r.slot) {
    if (!lane.empty()) end = std::max(end, lane.back() + 1);
  }
  return end;
}

// The lane at every slot of the rank (lanes below `lanes` only), kFree where there is none.
std::vector<int8_t> Cells(const RankSlots& r, int lanes) {
  std::vector<int8_t> cells(SlotsUsed(r), kFree);
  for (int lane = 0; lane < lanes; ++lane) {
    for (int64_t t : r.slot[lane]) {
      SLUICE_CHECK(cells[t] == kFree, "building block: two computes in slot {}", t);
      cells[t] = static_cast<int8_t>(lane);
    }
  }
  return cells;
}

// Puts each W of the rank in the first free slot after its B, the earliest B's first.
void PlaceWeights(RankSlots& r) {
  const std::vector<int8_t> cells = Cells(r, kW);
  std::vector<int64_t>& w = r.slot[kW];
  w.clear();
  int waiting = 0;
  for (int64_t t = 0; t < static_cast<int64_t>(cells.size()) || waiting > 0; ++t) {
    const int8_t cell = t < static_cast<int64_t>(cells.size()) ? cells[t] : kFree;
    if (cell == kB1 || cell == kB0) {
      ++waiting;
    } else if (cell == kFree && waiting > 0) {
      w.push_back(t);
      --waiting;
    }
  }
}

// One rank's activation count slot by slot, as the squeeze measures it: a chunk-micro-batch
// counts from its F to its W. With implicit W the rank's W are not placed: each free slot runs
// one if a B has left one waiting (where PlaceWeights would put it).
class SlotMemory {
 public:
  SlotMemory(std::vector<int8_t> cells, bool implicit_weights)
      : cells_(std::move(cells)), implicit_(implicit_weights), after_(cells_.size()) {
    State s;
    for (size_t t = 0; t < cells_.size(); ++t) {
      s = Step(s, cells_[t]);
      after_[t] = s;
      peak_ = std::max(peak_, s.count);
    }
  }

  int peak() const { return peak_; }

  // Whether moving the compute in slot `from` to the free slot `to` < `from` keeps the count at
  // or below `bound` in every slot. Only slots from `to` on change, and only until the count
  // and the W waiting agree again with the unmoved timeline past `from`.
  bool Fits(int64_t from, int64_t to, int bound) const {
    State s = to > 0 ? after_[to - 1] : State{};
    for (int64_t t = to; t < static_cast<int64_t>(cells_.size()); ++t) {
      s = Step(s, t == to ? cells_[from] : t == from ? kFree : cells_[t]);
      if (s.count > bound) return false;
      if (t >= from && s == after_[t]) return true;
    }
    return true;  // past the last compute the count only falls
  }

  void Move(int64_t from, int64_t to) {
    SLUICE_CHECK(cells_[to] == kFree && cells_[from] != kFree, "building block: bad move {} → {}",
                 from, to);
    cells_[to] = cells_[from];
    cells_[from] = kFree;
    State s = to > 0 ? after_[to - 1] : State{};
    for (int64_t t = to; t < static_cast<int64_t>(cells_.size()); ++t) {
      s = Step(s, cells_[t]);
      if (t >= from && s == after_[t]) break;
      after_[t] = s;
    }
  }

 private:
  struct State {
    int count = 0;    // chunk-micro-batches between F and W
    int waiting = 0;  // implicit W: B run, W not yet
    bool operator==(const State&) const = default;
  };

  State Step(State s, int8_t cell) const {
    if (cell == kF0 || cell == kF1) {
      ++s.count;
    } else if (cell == kW) {
      --s.count;
    } else if (cell == kB1 || cell == kB0) {
      if (implicit_) ++s.waiting;
    } else if (implicit_ && s.waiting > 0) {
      --s.waiting;
      --s.count;
    }
    return s;
  }

  std::vector<int8_t> cells_;
  bool implicit_;
  std::vector<State> after_;  // [slot]: the state once that slot has run
  int peak_ = 0;              // of the timeline as constructed
};

// The k-th smallest slot of two ascending lanes.
int64_t KthOfTwo(const std::vector<int64_t>& a, const std::vector<int64_t>& b, int k) {
  size_t i = 0, j = 0;
  for (int n = 0;; ++n) {
    const bool from_a = j == b.size() || (i < a.size() && a[i] < b[j]);
    const int64_t t = from_a ? a[i++] : b[j++];
    if (n == k) return t;
  }
}

// The first slot the k-th compute of `lane` on `rank` may take: after its inputs — the same
// compute of the neighbouring virtual stage, the rank's previous compute of the micro-batch (W:
// the rank's k-th B) — and after the lane's previous one.
int64_t EarliestSlot(const Timeline& tl, int rank, int lane, int k) {
  const int P = static_cast<int>(tl.size());
  const RankSlots& r = tl[rank];
  int64_t after = -1;
  auto follow = [&](int64_t slot) { after = std::max(after, slot); };
  if ((lane == kF0 || lane == kB1) && rank > 0) follow(tl[rank - 1].slot[lane][k]);
  if ((lane == kF1 || lane == kB0) && rank + 1 < P) follow(tl[rank + 1].slot[lane][k]);
  if (lane == kF1 || lane == kB1 || lane == kB0) follow(r.slot[lane - 1][k]);
  if (lane == kW) follow(KthOfTwo(r.slot[kB1], r.slot[kB0], k));
  if (k > 0) follow(r.slot[lane][k - 1]);
  return after + 1;
}

// Squeezes the warm-up (when the W are explicit, in kW) and the cool-down: in slot order (rank,
// lane and micro-batch breaking ties), each compute moves to the earliest free slot after its
// inputs at which its rank's count stays within the highest rank's peak before the squeeze.
// The warm-up ends where rank 0 runs its first chunk-0 backward, the cool-down starts after
// the last micro-batch's first chunk-0 forward (both stay put); slots between are the steady
// state.
void Squeeze(Timeline& tl, int M, bool explicit_weights) {
  const int P = static_cast<int>(tl.size());
  const int lanes = explicit_weights ? kLanes : kW;
  std::vector<SlotMemory> memory;
  int bound = 0;
  for (const RankSlots& r : tl) {
    memory.emplace_back(Cells(r, lanes), !explicit_weights);
    bound = std::max(bound, memory.back().peak());
  }
  using Key = std::tuple<int64_t, int, int, int>;  // slot, rank, lane, k
  const Key steady_from{tl[0].slot[kB0][0], 0, kB0, 0};
  // The steady state ends at the first last-micro-batch forward of chunk 0 after it begins —
  // rank 0's unless that came before (few micro-batches); with none, it lasts to the end.
  std::optional<Key> steady_to;
  for (int r = 0; r < P && !steady_to; ++r) {
    const Key key{tl[r].slot[kF0][M - 1], r, kF0, M - 1};
    if (key > steady_from) steady_to = key;
  }
  auto squeezed = [&](const Key& key) {
    if (key < steady_from) return explicit_weights;
    return steady_to && key > *steady_to;
  };
  std::vector<Key> moving;
  for (int r = 0; r < P; ++r) {
    for (int lane = 0; lane < lanes; ++lane) {
      for (int k = 0; k < static_cast<int>(tl[r].slot[lane].size()); ++k) {
        const Key key{tl[r].slot[lane][k], r, lane, k};
        if (squeezed(key)) moving.push_back(key);
      }
    }
  }
  std::ranges::sort(moving);
  // [rank][slot]: taken by a compute that has had its turn or stays put. A compute never moves
  // past one yet to have its turn: those all sit at or after the slot of the one moving.
  std::vector<std::vector<bool>> taken(P);
  for (int r = 0; r < P; ++r) {
    taken[r].assign(SlotsUsed(tl[r]), false);
    for (int lane = 0; lane < lanes; ++lane) {
      for (int k = 0; k < static_cast<int>(tl[r].slot[lane].size()); ++k) {
        if (!squeezed({tl[r].slot[lane][k], r, lane, k})) taken[r][tl[r].slot[lane][k]] = true;
      }
    }
  }
  for (const auto& [from, r, lane, k] : moving) {
    int64_t& slot = tl[r].slot[lane][k];
    for (int64_t t = EarliestSlot(tl, r, lane, k); t < from; ++t) {
      if (taken[r][t] || !memory[r].Fits(from, t, bound)) continue;
      memory[r].Move(from, t);
      slot = t;
      break;
    }
    taken[r][slot] = true;
  }
}

// Runs every rank's computes in slot order, each once its inputs have run and its rank is free
// (one slot each; messages take none), and returns the timeline of the slots they start in.
Timeline RunEagerly(const Timeline& tl) {
  const int P = static_cast<int>(tl.size());
  std::vector<std::vector<std::pair<int, int>>> order(P);  // [rank]: (lane, k) in slot order
  Timeline out = tl;
  std::vector<std::array<std::vector<int64_t>, kLanes>> end(P);  // -1 until run
  for (int r = 0; r < P; ++r) {
    std::vector<std::tuple<int64_t, int, int>> items;
    for (int lane = 0; lane < kLanes; ++lane) {
      end[r][lane].assign(tl[r].slot[lane].size(), -1);
      for (int k = 0; k < static_cast<int>(tl[r].slot[lane].size()); ++k) {
        items.emplace_back(tl[r].slot[lane][k], lane, k);
      }
    }
    std::ranges::sort(items);
    for (const auto& [slot, lane, k] : items) order[r].emplace_back(lane, k);
  }
  std::vector<int64_t> clock(P, 0);
  std::vector<size_t> next(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      for (; next[r] < order[r].size(); ++next[r]) {
        // Not a structured binding: the lambda below reads k, which clang before 16 cannot capture.
        const int lane = order[r][next[r]].first;
        const int k = order[r][next[r]].second;
        int64_t start = clock[r];
        auto input = [&](int rank, int input_lane) {
          const int64_t e = end[rank][input_lane][k];
          start = e < 0 ? -1 : start < 0 ? -1 : std::max(start, e);
        };
        if (lane == kF0 && r > 0) input(r - 1, kF0);
        if (lane == kF1) input(r + 1 < P ? r + 1 : r, r + 1 < P ? kF1 : kF0);
        if (lane == kB1) input(r > 0 ? r - 1 : r, r > 0 ? kB1 : kF1);
        if (lane == kB0) input(r + 1 < P ? r + 1 : r, r + 1 < P ? kB0 : kB1);
        if (start < 0) break;
        out[r].slot[lane][k] = start;
        clock[r] = end[r][lane][k] = start + 1;
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    SLUICE_CHECK(next[r] == order[r].size(), "building block: rank {} stalls at its compute {}", r,
                 next[r]);
  }
  return out;
}

// The compute order of every rank: F and B in slot order, each W in the first free slot after
// its B — chunk 1's before chunk 0's when both wait.
std::vector<std::vector<Action>> ComputeOrder(const Timeline& tl) {
  std::vector<std::vector<Action>> order(tl.size());
  for (size_t r = 0; r < tl.size(); ++r) {
    std::vector<std::pair<int8_t, int>> cells(SlotsUsed(tl[r]), {kFree, 0});  // (lane, k)
    for (int lane = 0; lane < kW; ++lane) {
      for (int k = 0; k < static_cast<int>(tl[r].slot[lane].size()); ++k) {
        cells[tl[r].slot[lane][k]] = {static_cast<int8_t>(lane), k};
      }
    }
    std::deque<int> waiting[2];  // [chunk]: micro-batches whose W is due
    auto emit = [&](ActionKind kind, int chunk, int m) {
      order[r].push_back({.kind = kind, .chunk = static_cast<int8_t>(chunk), .micro_batch = m});
    };
    for (size_t t = 0; t < cells.size() || !waiting[0].empty() || !waiting[1].empty(); ++t) {
      const auto [lane, k] = t < cells.size() ? cells[t] : std::pair<int8_t, int>{kFree, 0};
      if (lane == kF0 || lane == kF1) {
        emit(ActionKind::kForward, lane == kF0 ? 0 : 1, k);
      } else if (lane == kB1 || lane == kB0) {
        const int chunk = lane == kB0 ? 0 : 1;
        emit(ActionKind::kBackward, chunk, k);
        waiting[chunk].push_back(k);
      } else {
        const int chunk = waiting[1].empty() ? 0 : 1;
        if (waiting[chunk].empty()) continue;
        emit(ActionKind::kWeight, chunk, waiting[chunk].front());
        waiting[chunk].pop_front();
      }
    }
  }
  return order;
}

}  // namespace

BlockOffsets BuildingBlockOffsets(BuildingBlock block, int P, int r) {
  if (block == BuildingBlock::kVMin) {
    const int g = P % 3 == 0 ? 2 : 0;
    return {.forward0 = r,
            .forward1 = 2 * P - 1 - r,
            .backward1 = 2 * P + g + r,
            .backward0 = 4 * P + g - 1 - r};
  }
  const int g = P % 2 == 0 ? 3 : 0;
  return {.forward0 = 2 * r,
          .forward1 = 3 * P - 2 - r,
          .backward1 = 3 * P + g - 1 + 2 * r,
          .backward0 = 6 * P + g - 2 - r};
}

int BuildingBlockPeakActivations(BuildingBlock block, int P) {
  return block == BuildingBlock::kVMin ? 2 * ((P + 4) / 3) : 2 * ((P + 2) / 2);
}

std::vector<std::vector<Action>> BuildingBlockOrder(BuildingBlock block, int P, int M) {
  if (P < 1 || M < 1) {
    throw InvalidArgument(fmt::format(
        "building block: needs at least 1 stage and 1 micro-batch (got P={}, M={})", P, M));
  }
  Timeline tl(P);
  for (int r = 0; r < P; ++r) {
    const BlockOffsets o = BuildingBlockOffsets(block, P, r);
    const int first[kW] = {o.forward0, o.forward1, o.backward1, o.backward0};
    for (int lane = 0; lane < kW; ++lane) {
      for (int m = 0; m < M; ++m) {
        tl[r].slot[lane].push_back(first[lane] + static_cast<int64_t>(kInterval) * m);
      }
    }
    PlaceWeights(tl[r]);
  }
  Squeeze(tl, M, /*explicit_weights=*/true);
  tl = RunEagerly(tl);
  for (RankSlots& r : tl) r.slot[kW].clear();
  Squeeze(tl, M, /*explicit_weights=*/false);
  for (RankSlots& r : tl) PlaceWeights(r);
  return ComputeOrder(RunEagerly(tl));
}

}  // namespace sluice::pipeline
