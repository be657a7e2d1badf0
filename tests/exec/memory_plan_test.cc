// The static memory plan: no two values alive at the same step share a byte of the arena; the
// arena is at least the planned values' liveness bound; a run makes one allocator call for all of
// its intermediates (and no heap allocation per planned value: heap_allocation_test.cc); outputs,
// kept values and donated inputs stay outside the arena; parallel runs refuse it. (Bitwise equality
// with dynamic runs: interpreter_test.cc runs every test over both plans; training:
// tests/pipeline.)
#include "sluice/exec/memory_plan.h"

#include <gtest/gtest.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/core/system_allocator.h"
#include "sluice/exec/interpreter.h"
#include "test_programs.h"

namespace sluice {
namespace {

using testing::AddChainProgram;
using testing::BranchyProgram;
using testing::RandomScope;

std::vector<std::string> ParamNames(const Program& p) {
  std::vector<std::string> names;
  for (ValueId v : p.params()) names.push_back(p.value(v).name);
  return names;
}

// A forward program with what its backward reads kept, and the backward donating it: the pair a
// training step runs.
struct Pair {
  Program forward, backward;
  std::vector<std::string> saved, activations;
};

Pair TransformerPair() {
  Pair p{testing::TinyTransformerProgram(4, 16, 32, 19), Program(), {}, {}};
  Backward bwd = BuildBackward(p.forward, {.loss = "loss", .wrt = ParamNames(p.forward)});
  p.backward = bwd.program;
  p.saved = bwd.saved;
  for (const std::string& name : bwd.saved) {
    if (p.forward.value(p.forward.Get(name)).kind == ValueKind::kIntermediate)
      p.activations.push_back(name);
  }
  return p;
}

// Every pair of planned groups alive at a common step occupies disjoint bytes; every group fits.
void ExpectValidPlacement(const Program& program, const ExecutionPlan& plan, const ArenaPlan& arena,
                          const std::string& label) {
  std::vector<int32_t> planned;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    if (arena.planned(static_cast<int32_t>(g))) planned.push_back(static_cast<int32_t>(g));
  }
  EXPECT_EQ(static_cast<int32_t>(planned.size()), arena.num_planned) << label;
  for (int32_t g : planned) {
    const StorageGroup& a = plan.groups[g];
    EXPECT_FALSE(a.pinned) << label;
    EXPECT_EQ(program.value(a.root).kind, ValueKind::kIntermediate) << label;
    EXPECT_EQ(arena.offset[g] % static_cast<int64_t>(kAlignment), 0) << label;
    EXPECT_LE(arena.offset[g] + a.bytes, arena.arena_bytes) << label;
    for (int32_t h : planned) {
      if (h <= g) continue;
      const StorageGroup& b = plan.groups[h];
      const bool together = a.def_step <= b.last_step && b.def_step <= a.last_step;
      const bool apart = arena.offset[g] + a.bytes <= arena.offset[h] ||
                         arena.offset[h] + b.bytes <= arena.offset[g];
      EXPECT_TRUE(!together || apart)
          << label << ": %" << program.value(a.root).name << " and %" << program.value(b.root).name
          << " overlap in time and in the arena";
    }
  }
  EXPECT_GE(arena.arena_bytes, arena.planned_bound) << label;
}

TEST(MemoryPlan, NoTwoLiveValuesShareBytes) {
  const Pair pair = TransformerPair();
  struct Case {
    std::string label;
    const Program* program;
    AnalysisOptions options;
  };
  const Program branchy = BranchyProgram(), chain = AddChainProgram(30),
                mlp = testing::MlpProgram();
  const std::vector<Case> cases = {
      {"branchy", &branchy, {}},
      {"chain", &chain, {}},
      {"mlp", &mlp, {}},
      {"forward", &pair.forward, {.keep = pair.saved}},
      {"backward", &pair.backward, {.donate = pair.activations}},
      {"backward, program order",
       &pair.backward,
       {.order = OrderPolicy::kProgram, .donate = pair.activations}},
  };
  for (const Case& c : cases) {
    const ExecutionPlan plan = Analyze(*c.program, c.options);
    const ArenaPlan arena = PlanArena(*c.program, plan);
    EXPECT_GT(arena.num_planned, 0) << c.label;
    ExpectValidPlacement(*c.program, plan, arena, c.label);
  }
}

// A chain's values live two steps each: two slots of the arena suffice, whatever its length.
TEST(MemoryPlan, AChainNeedsTwoSlots) {
  const Program chain = AddChainProgram(100, 64);
  const ExecutionPlan plan = Analyze(chain);
  const ArenaPlan arena = PlanArena(chain, plan);
  EXPECT_EQ(arena.num_planned, 99);  // the last sum is the output
  EXPECT_EQ(arena.planned_bound, 2 * 256);
  EXPECT_EQ(arena.arena_bytes, 2 * 256);
  EXPECT_EQ(arena.planned_bytes, 99 * 256);
}

// Outputs, kept values (and the groups of views that are) and donated inputs are never planned.
TEST(MemoryPlan, WhatLeavesTheRunIsNotPlanned) {
  const Pair pair = TransformerPair();
  const ExecutionPlan fwd = Analyze(pair.forward, {.keep = pair.saved});
  const ArenaPlan fwd_arena = PlanArena(pair.forward, fwd);
  for (const std::string& name : pair.saved) {
    EXPECT_FALSE(fwd_arena.planned(fwd.group_of[pair.forward.Get(name)])) << name;
  }
  EXPECT_FALSE(fwd_arena.planned(fwd.group_of[pair.forward.Get("loss")]));
  const ExecutionPlan bwd = Analyze(pair.backward, {.donate = pair.activations});
  const ArenaPlan bwd_arena = PlanArena(pair.backward, bwd);
  for (const std::string& name : pair.activations) {
    EXPECT_FALSE(bwd_arena.planned(bwd.group_of[pair.backward.Get(name)])) << name;
  }
  Builder b("view_out");  // an output that views an intermediate: the base is not planned
  Var x = b.Input("x", DType::kF32, {8, 8});
  Var sum = b.Name(x + x, "sum");
  Var twice = b.Name(sum + x, "twice");  // planned
  b.Output(b.Name(Reshape(twice * sum, {64}), "flat"));
  const Program program = b.Build();
  const ExecutionPlan plan = Analyze(program);
  const ArenaPlan arena = PlanArena(program, plan);
  EXPECT_TRUE(arena.planned(plan.group_of[program.Get("sum")]));
  EXPECT_TRUE(arena.planned(plan.group_of[program.Get("twice")]));
  EXPECT_FALSE(arena.planned(plan.group_of[program.Get("flat")]));
  EXPECT_EQ(arena.num_planned, 2);
}

// A static run asks its allocator once for every planned value (the arena) and once per value
// that leaves the run; a dynamic run once per value. Results are bitwise the same.
TEST(MemoryPlan, OneAllocatorCallForAllIntermediates) {
  const Pair pair = TransformerPair();
  for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
    CachingAllocator dynamic_alloc, static_alloc;
    ExecutableOptions fo{.allocator = &dynamic_alloc, .gc = gc, .keep = pair.saved};
    ExecutableOptions bo{.allocator = &dynamic_alloc, .gc = gc, .donate = pair.activations};
    Executable fwd_dynamic(pair.forward, fo), bwd_dynamic(pair.backward, bo);
    fo.allocator = bo.allocator = &static_alloc;
    fo.memory_plan = bo.memory_plan = MemoryPlanMode::kStatic;
    Executable fwd_static(pair.forward, fo), bwd_static(pair.backward, bo);
    for (int step = 0; step < 2; ++step) {
      Scope d = RandomScope(pair.forward, 5), s = RandomScope(pair.forward, 5);
      fwd_dynamic.Run(d);
      bwd_dynamic.Run(d);
      const int64_t allocs_before = static_alloc.Stats().num_allocs;
      int64_t unplanned = 0;  // kCompute groups not in the arena, over both programs
      for (const Executable* exe : {&fwd_static, &bwd_static}) {
        const ExecutionPlan& plan = exe->plan();
        for (size_t g = 0; g < plan.groups.size(); ++g) {
          const bool computed =
              exe->program().value(plan.groups[g].root).kind == ValueKind::kIntermediate;
          if (computed && plan.groups[g].bytes > 0 && !exe->arena().planned(static_cast<int>(g)))
            ++unplanned;
        }
      }
      const RunStats fs = fwd_static.Run(s);
      const RunStats bs = bwd_static.Run(s);
      EXPECT_EQ(static_alloc.Stats().num_allocs - allocs_before, 2 + unplanned) << Name(gc);
      EXPECT_EQ(fs.arena_bytes, fwd_static.arena().arena_bytes);
      EXPECT_GT(bs.arena_bytes, 0);
      EXPECT_EQ(bs.frees, bwd_static.plan().NumFreeable()) << "a planned value counts as a free";
      for (const std::string& name : d.Names()) {
        EXPECT_TRUE(BitwiseEqual(d.Get(name), s.Get(name))) << Name(gc) << " %" << name;
      }
      EXPECT_EQ(d.Names(), s.Names());
    }
    // Between runs the arena is gone: the allocators hold the same (outputs only).
    EXPECT_EQ(static_alloc.Stats().allocated_bytes, dynamic_alloc.Stats().allocated_bytes);
  }
}

TEST(MemoryPlan, ParallelRunsRefuseIt) {
  try {
    Executable exe(BranchyProgram(),
                   {.mode = RunMode::kParallel, .memory_plan = MemoryPlanMode::kStatic});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("memory plan static needs run mode trace"),
              std::string::npos)
        << e.what();
  }
}

// A failing kernel mid-run: the arena is released with everything else, and the next run works.
TEST(MemoryPlan, AFailedRunReleasesTheArena) {
  Builder b("lookup");
  Var ids = b.Input("ids", DType::kI64, {2, 3});
  Var table = b.Param("table", DType::kF32, {5, 4});
  Var e = Embedding(ids, table);
  Var twice = e + e;
  b.Output(b.Name(twice * twice, "y"));
  const Program program = b.Build();
  CachingAllocator alloc;
  Executable exe(program, {.allocator = &alloc, .memory_plan = MemoryPlanMode::kStatic});
  ASSERT_GT(exe.arena().arena_bytes, 0);
  Scope scope = RandomScope(program, 8);
  scope.Set("ids", Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 9}));
  EXPECT_THROW(exe.Run(scope), InvalidArgument);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  scope.Set("ids", Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 4}));
  exe.Run(scope);
  EXPECT_EQ(scope.Get("y").shape(), (Shape{2, 3, 4}));
}

TEST(MemoryPlan, NamesRoundTrip) {
  for (const auto& [mode, name] : kMemoryPlanModeNames) {
    EXPECT_EQ(Name(mode), name);
    EXPECT_EQ(ParseMemoryPlanMode(name), mode);
  }
  EXPECT_EQ(ParseMemoryPlanMode("arena"), std::nullopt);
}

}  // namespace
}  // namespace sluice
