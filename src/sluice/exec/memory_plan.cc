#include "sluice/exec/memory_plan.h"

#include <algorithm>
#include <limits>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "sluice/core/allocator.h"

namespace sluice {

namespace {

// A placed group: bytes [begin, end) of the arena during steps [def, last].
struct Placed {
  int64_t begin, end;
  int32_t def, last;
};

enum class Fit : uint8_t { kBest, kFirst };

// Places the groups in `order`, writing offset[g] for each; returns the arena's size. Each takes,
// among the gaps between the already placed groups alive at the same time, the smallest that
// holds it (kBest; the lowest on a tie) or the lowest (kFirst), else the first byte above them.
int64_t Place(const ExecutionPlan& plan, std::span<const int32_t> order, Fit fit,
              std::vector<int64_t>& offset) {
  std::vector<Placed> placed;  // by begin, ascending
  placed.reserve(order.size());
  int64_t arena_bytes = 0;
  for (int32_t g : order) {
    const StorageGroup& group = plan.groups[g];
    const int64_t size =
        static_cast<int64_t>(RoundUp(static_cast<size_t>(group.bytes), kAlignment));
    // Walk the placed groups alive at the same time, by address: a gap opens wherever one begins
    // above everything seen so far.
    int64_t cursor = 0;  // end of the highest block seen so far
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
    for (const Placed& p : placed) {
      if (p.last < group.def_step || p.def > group.last_step) continue;
      const int64_t gap = p.begin - cursor;
      if (gap >= size && gap < best_gap) {
        best = cursor;
        best_gap = gap;
        if (fit == Fit::kFirst) break;
      }
      cursor = std::max(cursor, p.end);
    }
    const int64_t begin = best >= 0 ? best : cursor;
    offset[g] = begin;
    arena_bytes = std::max(arena_bytes, begin + size);
    const Placed entry{begin, begin + size, group.def_step, group.last_step};
    placed.insert(
        std::upper_bound(placed.begin(), placed.end(), entry,
                         [](const Placed& a, const Placed& b) { return a.begin < b.begin; }),
        entry);
  }
  return arena_bytes;
}

// Greedy by breadth (Pisarchyk and Lee, 2020): the steps from the most live bytes down; at each,
// the groups alive there not yet ordered, largest first. `by_size` is the planned groups sorted
// largest first. Empty when the lists would be too long to build (Σ lifetimes above 2^22 steps).
std::vector<int32_t> BreadthOrder(const ExecutionPlan& plan, std::span<const int32_t> by_size) {
  const size_t steps = plan.num_steps();
  int64_t total = 0;
  for (int32_t g : by_size) total += plan.groups[g].last_step - plan.groups[g].def_step + 1;
  if (total > (int64_t{1} << 22)) return {};
  std::vector<int64_t> live(steps, 0);
  std::vector<std::pair<int32_t, int32_t>> alive;  // (step, group), groups largest first
  alive.reserve(static_cast<size_t>(total));
  for (int32_t g : by_size) {
    const StorageGroup& group = plan.groups[g];
    for (int32_t s = group.def_step; s <= group.last_step; ++s) {
      live[s] += group.bytes;
      alive.emplace_back(s, g);
    }
  }
  std::stable_sort(alive.begin(), alive.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int32_t> begin(steps + 1, 0);
  for (const auto& [s, g] : alive) ++begin[s + 1];
  for (size_t s = 0; s < steps; ++s) begin[s + 1] += begin[s];
  std::vector<int32_t> step_order(steps);
  for (size_t s = 0; s < steps; ++s) step_order[s] = static_cast<int32_t>(s);
  std::stable_sort(step_order.begin(), step_order.end(),
                   [&](int32_t a, int32_t b) { return live[a] > live[b]; });
  std::vector<char> taken(plan.groups.size(), 0);
  std::vector<int32_t> order;
  order.reserve(by_size.size());
  for (int32_t s : step_order) {
    if (live[s] == 0) break;
    for (int32_t k = begin[s]; k < begin[s + 1]; ++k) {
      const int32_t g = alive[static_cast<size_t>(k)].second;
      if (!taken[g]) {
        taken[g] = 1;
        order.push_back(g);
      }
    }
  }
  return order;
}

}  // namespace

std::string_view Name(MemoryPlanMode mode) { return EnumName(kMemoryPlanModeNames, mode); }

std::optional<MemoryPlanMode> ParseMemoryPlanMode(std::string_view name) {
  return ParseEnum(kMemoryPlanModeNames, name);
}

std::string ArenaPlan::Describe() const {
  const double ratio =
      planned_bound > 0 ? static_cast<double>(arena_bytes) / static_cast<double>(planned_bound) : 1;
  return fmt::format("arena {} for {} values (their liveness bound {}, {:.4f}×)",
                     FormatBytes(arena_bytes), num_planned, FormatBytes(planned_bound), ratio);
}

ArenaPlan PlanArena(const Program& program, const ExecutionPlan& plan) {
  const size_t num_groups = plan.groups.size();
  ArenaPlan arena;
  arena.offset.assign(num_groups, -1);
  std::vector<int32_t> planned;
  for (size_t g = 0; g < num_groups; ++g) {
    const StorageGroup& group = plan.groups[g];
    if (group.pinned || group.bytes <= 0 || group.def_step < 0 || group.last_step < 0) continue;
    if (program.value(group.root).kind != ValueKind::kIntermediate) continue;  // donated input
    planned.push_back(static_cast<int32_t>(g));
  }
  arena.num_planned = static_cast<int32_t>(planned.size());

  // The bound: Σ bytes alive per step, by a difference array over the steps.
  {
    std::vector<int64_t> delta(plan.num_steps() + 1, 0);
    for (int32_t g : planned) {
      const StorageGroup& group = plan.groups[g];
      delta[group.def_step] += group.bytes;
      delta[group.last_step + 1] -= group.bytes;
      arena.planned_bytes += group.bytes;
    }
    int64_t live = 0;
    for (size_t s = 0; s < plan.num_steps(); ++s) {
      live += delta[s];
      arena.planned_bound = std::max(arena.planned_bound, live);
    }
  }

  // Three orders of placement, each with best fit and first fit; the smallest arena wins.
  std::vector<std::vector<int32_t>> orders;
  std::sort(planned.begin(), planned.end(), [&](int32_t a, int32_t b) {
    const StorageGroup &ga = plan.groups[a], &gb = plan.groups[b];
    if (ga.bytes != gb.bytes) return ga.bytes > gb.bytes;
    if (ga.def_step != gb.def_step) return ga.def_step < gb.def_step;
    return a < b;
  });
  orders.push_back(planned);
  if (std::vector<int32_t> by_breadth = BreadthOrder(plan, planned); !by_breadth.empty()) {
    orders.push_back(std::move(by_breadth));
  }
  int64_t best_bytes = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> offset(num_groups, -1);
  for (const std::vector<int32_t>& order : orders) {
    for (Fit fit : {Fit::kBest, Fit::kFirst}) {
      const int64_t bytes = Place(plan, order, fit, offset);
      if (bytes < best_bytes) {
        best_bytes = bytes;
        arena.offset = offset;
      }
    }
  }
  arena.arena_bytes = planned.empty() ? 0 : best_bytes;
  return arena;
}

}  // namespace sluice
