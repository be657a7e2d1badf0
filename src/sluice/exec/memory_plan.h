// Static memory plan: every intermediate of a program gets an offset in one arena, fixed before the
// first run, so that a run makes one allocator call for all of them instead of one per value.
//
// Memory plan modes (MemoryPlanMode, ExecutableOptions::memory_plan, `--memory-plan`):
//   dynamic  (default) every kCompute output is allocated from the executable's allocator before
//            its instruction and freed at its last use (exec/garbage_collector.h decides where).
//   static   the *planned* groups live in one arena, allocated from the allocator when a run
//            starts (after the inputs are bound) and freed when it ends; everything else is
//            allocated as in dynamic mode. Trace runs only: the plan follows the trace order.
//
// What is planned. A storage group (exec/analysis.h) is planned when it is unpinned, holds bytes
// and is rooted at a kCompute output: an intermediate that dies inside the run. Never planned:
//   - program outputs and `keep` values (and the groups their views alias): they leave the run in
//     the scope, and the arena is reused by the next run;
//   - inputs and parameters: the caller's; donated inputs (saved activations handed to a
//     backward run) were allocated by another run and are freed at their last use as before;
//   - scratch memory kernels take from ctx.allocator.
// A planned group's memory is reused once its last user has run, so a pipeline stage's outputs
// (what it sends) and the saved activations are never in an arena: they are outputs or kept.
//
// Placement. A planned group g lives during steps def(g)..last(g) of the trace order (its
// producer's step through its last user's; an output and an input of one instruction overlap at
// that step, so a kernel never writes where it reads). Groups are placed one at a time; each takes
// a gap, among the already placed groups whose lifetimes overlap its own, that holds it — the
// smallest (best fit; the lowest on a tie) or the lowest (first fit) — or else the first offset
// above all of them. Two orders of placement:
//   by size     largest first (ties: earlier def, lower index), as TFLite's ArenaPlanner does;
//   by breadth  the steps from the most live bytes down, at each the groups alive there not yet
//               placed, largest first (Pisarchyk and Lee 2020, "greedy by breadth"); skipped
//               when the groups' lifetimes add up to more than 2^22 steps.
// All (order, fit) pairs are tried and the smallest arena kept: on the GPT programs one of them
// reaches the bound where another misses it (docs/benchmarks.md, "Figures once in headers").
// Sizes and offsets are rounded up to kAlignment (64 B).
//
//   planned_bound = max over steps s of Σ bytes(g) over planned groups alive at s
// is the least any placement could use (the liveness bound of the planned groups alone, in
// requested bytes); arena_bytes ≥ planned_bound, and the tests pin arena_bytes ≤ 1.05 ×
// planned_bound on GPT forward and backward programs (docs/executor.md, "Static memory plan").
//
// Cost: O(G²) in the planned groups G (each placement walks the placed ones), four placements,
// once per executable. Thread-safety: PlanArena is a pure function.
//
// Example:
//   ExecutionPlan plan = Analyze(program);
//   ArenaPlan arena = PlanArena(program, plan);
//   // group g lives at [arena.offset[g], arena.offset[g] + plan.groups[g].bytes) when planned
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/enum_names.h"
#include "sluice/exec/analysis.h"
#include "sluice/ir/program.h"

namespace sluice {

enum class MemoryPlanMode : uint8_t { kDynamic, kStatic };

inline constexpr EnumEntry<MemoryPlanMode> kMemoryPlanModeNames[] = {
    {MemoryPlanMode::kDynamic, "dynamic"},
    {MemoryPlanMode::kStatic, "static"},
};
static_assert(IsCompleteEnumTable(kMemoryPlanModeNames));

// The mode's name in kMemoryPlanModeNames, and back (nullopt for any other text).
std::string_view Name(MemoryPlanMode mode);
std::optional<MemoryPlanMode> ParseMemoryPlanMode(std::string_view name);

struct ArenaPlan {
  std::vector<int64_t> offset;  // group -> byte offset in the arena; -1 when not planned
  int64_t arena_bytes = 0;      // bytes the arena spans (0: nothing planned)
  int64_t planned_bound = 0;    // liveness bound of the planned groups (see the top)
  int32_t num_planned = 0;      // planned groups
  int64_t planned_bytes = 0;    // Σ bytes of the planned groups (what dynamic mode allocates)

  bool planned(int32_t group) const { return offset[static_cast<size_t>(group)] >= 0; }
  // "arena 1.2 MiB for 40 values (bound 1.2 MiB, 1.000×)".
  std::string Describe() const;
};

// Places the planned groups of `plan` (computed from `program`). See the top of this file.
ArenaPlan PlanArena(const Program& program, const ExecutionPlan& plan);

}  // namespace sluice
