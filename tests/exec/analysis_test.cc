// Analysis: storage groups, free lists, pinning, dependency edges, orders and the liveness bound,
// on programs small enough to check by hand.
#include "sluice/exec/analysis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Names of the roots of the groups freed after `step`.
std::vector<std::string> Freed(const ExecutionPlan& plan, const Program& p, int32_t step) {
  std::vector<std::string> names;
  for (int32_t g : plan.FreeList(step)) names.push_back(p.value(plan.groups[g].root).name);
  return names;
}

// x [4] f32 (16 bytes per value):
//   0: a = copy(x)   1: b = add(a, x)   2: c = add(a, b)   3: d = copy(x) (unused)   4: e = copy(c)
Program Chain() {
  Builder b("chain");
  Var x = b.Input("x", DType::kF32, {4});
  Var a = b.Name(Copy(x), "a");
  Var bb = b.Name(a + x, "b");
  Var c = b.Name(a + bb, "c");
  b.Name(Copy(x), "d");
  b.Output(b.Name(Copy(c), "e"));
  return b.Build();
}

TEST(Analysis, FreeListsFollowLastUse) {
  Program p = Chain();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram});
  EXPECT_THAT(plan.order, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(Freed(plan, p, 0), IsEmpty());
  EXPECT_THAT(Freed(plan, p, 1), IsEmpty());  // a is read again by c
  EXPECT_THAT(Freed(plan, p, 2), ElementsAre("a", "b"));
  EXPECT_THAT(Freed(plan, p, 3), ElementsAre("d"));  // nobody reads d: freed after its producer
  EXPECT_THAT(Freed(plan, p, 4), ElementsAre("c"));  // e is an output: never freed
  EXPECT_EQ(plan.NumFreeable(), 4);
  EXPECT_EQ(plan.groups[plan.group_of[p.Get("a")]].num_users, 2);
}

TEST(Analysis, LivenessBoundCountsIntermediatesOnly) {
  Program p = Chain();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram});
  // live: a | a b | a b c | c d | c e   (x is the caller's)
  EXPECT_THAT(plan.live_bytes, ElementsAre(16, 32, 48, 32, 32));
  EXPECT_EQ(plan.liveness_bound, 48);
  EXPECT_EQ(plan.peak_step, 2);
}

TEST(Analysis, KeepAndOutputsArePinned) {
  Program p = Chain();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram, .keep = {"b"}});
  EXPECT_THAT(Freed(plan, p, 2), ElementsAre("a"));
  EXPECT_TRUE(plan.groups[plan.group_of[p.Get("b")]].pinned);
  EXPECT_TRUE(plan.groups[plan.group_of[p.Get("e")]].pinned);
  EXPECT_TRUE(plan.groups[plan.group_of[p.Get("x")]].pinned);
  EXPECT_EQ(plan.liveness_bound, 48);
  EXPECT_THAT(plan.live_bytes, ElementsAre(16, 32, 48, 48, 48));  // b stays to the end
}

TEST(Analysis, UnknownKeepNameIsAnError) {
  try {
    Analyze(Chain(), {.keep = {"nope"}});
    FAIL() << "expected ProgramError";
  } catch (const ProgramError& e) {
    EXPECT_THAT(e.what(), HasSubstr("%nope"));
    EXPECT_THAT(e.what(), HasSubstr("chain"));
  }
}

// Regression: a base must outlive its views. a's last *direct* use is step 2, but the view v (and
// the view of the view w) is read at step 4, so a's storage may only go after step 4.
//   0: a = copy(x) [2, 2]   1: v = reshape(a, [4])   2: b = copy(a)   3: w = reshape(v, [2, 2])
//   4: c = copy(w)          outputs b, c
Program ViewOfBase() {
  Builder b("views");
  Var x = b.Input("x", DType::kF32, {2, 2});
  Var a = b.Name(Copy(x), "a");
  Var v = b.Name(Reshape(a, {4}), "v");
  b.Output(b.Name(Copy(a), "b"));
  Var w = b.Name(Reshape(v, {2, 2}), "w");
  b.Output(b.Name(Copy(w), "c"));
  return b.Build();
}

TEST(Analysis, ViewsKeepTheirBaseAlive) {
  Program p = ViewOfBase();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram});
  const int32_t g = plan.group_of[p.Get("a")];
  EXPECT_EQ(plan.group_of[p.Get("v")], g);
  EXPECT_EQ(plan.group_of[p.Get("w")], g);  // transitively
  EXPECT_EQ(plan.groups[g].last_step, 4);
  EXPECT_THAT(Freed(plan, p, 2), IsEmpty());
  EXPECT_THAT(Freed(plan, p, 4), ElementsAre("a"));
  EXPECT_THAT(plan.live_bytes, ElementsAre(16, 16, 32, 32, 48));  // views cost nothing
  EXPECT_EQ(plan.liveness_bound, 48);
}

TEST(Analysis, ViewOfAnOutputPinsTheBase) {
  Builder b("pinned_view");
  Var x = b.Input("x", DType::kF32, {2, 2});
  Var a = b.Name(Copy(x), "a");
  b.Output(b.Name(Reshape(a, {4}), "v"));
  Program p = b.Build();
  ExecutionPlan plan = Analyze(p);
  EXPECT_TRUE(plan.groups[plan.group_of[p.Get("a")]].pinned);
  EXPECT_EQ(plan.NumFreeable(), 0);
}

// An in-place update orders the readers of its operands: r1 reads p before the update, r2 after.
TEST(Analysis, InPlaceUpdateOrdersReaders) {
  Builder b("sgd");
  Var param = b.Param("p", DType::kF32, {4});
  Var grad = b.Input("g", DType::kF32, {4});
  Var buf = b.Param("m", DType::kF32, {4});
  Var lr = b.Input("lr", DType::kF32, {});
  b.Output(b.Name(Copy(param), "r1"));
  SgdUpdate(param, grad, buf, lr);
  b.Output(b.Name(Copy(param), "r2"));
  Program p = b.Build();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kGreedy});
  EXPECT_THAT(plan.successors[0], ElementsAre(1));
  EXPECT_THAT(plan.successors[1], ElementsAre(2));
  EXPECT_THAT(plan.num_predecessors, ElementsAre(0, 1, 1));
  EXPECT_THAT(plan.order, ElementsAre(0, 1, 2));
}

// Regression: every in-place update sharing an input (the learning rate) got a hazard edge to every
// other — 20,000 sgd_updates made 200 million edges (20 s and 3 GB of setup). The hazards are now
// a chain through the updates: linear in the reads, with the same partial order.
TEST(Analysis, UpdatesSharingAnInputAreChainedNotPaired) {
  constexpr int kUpdates = 20000;
  Builder b("many_updates");
  Var lr = b.Input("lr", DType::kF32, {});
  for (int i = 0; i < kUpdates; ++i) {
    const std::string k = std::to_string(i);
    SgdUpdate(b.Param("p" + k, DType::kF32, {2}), b.Input("g" + k, DType::kF32, {2}),
              b.Param("m" + k, DType::kF32, {2}), lr);
  }
  Program p = b.Build();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kBest});
  EXPECT_EQ(plan.successors.items.size(), static_cast<size_t>(kUpdates - 1));
  for (int i = 0; i + 1 < kUpdates; ++i) {
    ASSERT_THAT(plan.successors[i], ElementsAre(i + 1)) << "update " << i;
  }
  EXPECT_EQ(plan.order.front(), 0);
  EXPECT_EQ(plan.order.back(), kUpdates - 1);
}

// Readers on both sides of two updates: each reader is ordered against the nearest update on
// either side, and (transitively) against every update, as program order has it.
TEST(Analysis, ReadersBetweenUpdatesStayBetweenThem) {
  Builder b("sgd2");
  Var param = b.Param("p", DType::kF32, {4});
  Var grad = b.Input("g", DType::kF32, {4});
  Var buf = b.Param("m", DType::kF32, {4});
  Var lr = b.Input("lr", DType::kF32, {});
  b.Output(b.Name(Copy(param), "r0"));  // 0
  SgdUpdate(param, grad, buf, lr);      // 1
  b.Output(b.Name(Copy(param), "r2"));  // 2
  b.Output(b.Name(Copy(param), "r3"));  // 3
  SgdUpdate(param, grad, buf, lr);      // 4
  b.Output(b.Name(Copy(param), "r5"));  // 5
  Program p = b.Build();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kGreedy});
  EXPECT_THAT(plan.successors[0], ElementsAre(1));
  EXPECT_THAT(plan.successors[1], ElementsAre(2, 3, 4));
  EXPECT_THAT(plan.successors[2], ElementsAre(4));
  EXPECT_THAT(plan.successors[3], ElementsAre(4));
  EXPECT_THAT(plan.successors[4], ElementsAre(5));
  EXPECT_THAT(plan.order, ElementsAre(0, 1, 2, 3, 4, 5));
}

// Two expansions of x reduced back: program order keeps both 2 KiB expansions alive at once; the
// greedy order reduces the first before expanding the second.
Program TwoExpansions() {
  Builder b("expansions");
  Var x = b.Input("x", DType::kF32, {1, 8});
  Var big_a = b.Name(BroadcastTo(x, Shape{64, 8}), "big_a");
  Var big_b = b.Name(BroadcastTo(x, Shape{64, 8}), "big_b");
  Var small_a = b.Name(SumTo(big_a, Shape{1, 8}), "small_a");
  Var small_b = b.Name(SumTo(big_b, Shape{1, 8}), "small_b");
  b.Output(b.Name(small_a + small_b, "out"));
  return b.Build();
}

TEST(Analysis, GreedyOrderLowersTheBound) {
  Program p = TwoExpansions();
  ExecutionPlan by_program = Analyze(p, {.order = OrderPolicy::kProgram});
  EXPECT_EQ(by_program.liveness_bound, 2048 + 2048 + 32);
  ExecutionPlan greedy = Analyze(p, {.order = OrderPolicy::kGreedy});
  EXPECT_THAT(greedy.order, ElementsAre(0, 2, 1, 3, 4));
  EXPECT_EQ(greedy.liveness_bound, 2048 + 32 + 32);
  ExecutionPlan best = Analyze(p);
  EXPECT_EQ(best.chosen, OrderPolicy::kGreedy);
  EXPECT_EQ(best.order, greedy.order);
  EXPECT_EQ(best.program_order_bound, by_program.liveness_bound);
  EXPECT_EQ(best.greedy_order_bound, greedy.liveness_bound);
}

TEST(Analysis, BestKeepsProgramOrderOnATie) {
  Program p = Chain();
  ExecutionPlan best = Analyze(p);
  EXPECT_EQ(best.chosen, OrderPolicy::kProgram);
  EXPECT_THAT(best.order, ElementsAre(0, 1, 2, 3, 4));
}

TEST(Analysis, ReleasesCoverEveryFreeableGroupOnce) {
  Program p = Chain();
  ExecutionPlan plan = Analyze(p);
  // Each unpinned group is finished by each of its users (or by its producer when unread).
  std::vector<int32_t> finishes(plan.groups.size(), 0);
  for (size_t i = 0; i < plan.releases.size(); ++i) {
    for (int32_t g : plan.releases[i]) ++finishes[g];
  }
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const StorageGroup& group = plan.groups[g];
    EXPECT_EQ(finishes[g], group.pinned ? 0 : std::max(group.num_users, 1))
        << p.value(group.root).name;
  }
}

TEST(Analysis, DescribeNamesValuesAndFrees) {
  Program p = ViewOfBase();
  std::string text = Analyze(p).Describe(p);
  EXPECT_THAT(text, HasSubstr("%v = reshape(%a)"));
  EXPECT_THAT(text, HasSubstr("→  %a, %v, %w (16 B)"));
  EXPECT_THAT(text, HasSubstr("liveness lower bound: 48 B"));
}

// A donated input is freed at its last use and counts from step 0.
//   s [4] donated, u [4] donated but unread, x [4] kept by the caller
//   0: a = add(s, x)   1: b = copy(a)   output b
TEST(Analysis, DonatedInputsAreFreedAtLastUse) {
  Builder b("donated");
  Var s = b.Input("s", DType::kF32, {4});
  b.Input("u", DType::kF32, {4});
  Var x = b.Input("x", DType::kF32, {4});
  Var a = b.Name(s + x, "a");
  b.Output(b.Name(Copy(a), "b"));
  Program p = b.Build();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram, .donate = {"s", "u"}});
  EXPECT_THAT(Freed(plan, p, 0), ElementsAre("s", "u"));
  EXPECT_THAT(Freed(plan, p, 1), ElementsAre("a"));
  EXPECT_THAT(plan.live_bytes, ElementsAre(16 + 16 + 16, 16 + 16));  // s u a | a b
  EXPECT_EQ(plan.groups[plan.group_of[p.Get("s")]].def_step, 0);
  EXPECT_TRUE(plan.groups[plan.group_of[p.Get("x")]].pinned);
  EXPECT_THAT(plan.releases[0], ElementsAre(plan.group_of[p.Get("s")], plan.group_of[p.Get("u")]));

  EXPECT_THROW(Analyze(p, {.donate = {"a"}}), ProgramError);  // not an input
  EXPECT_THROW(Analyze(p, {.donate = {"nope"}}), ProgramError);
  ExecutionPlan kept = Analyze(p, {.keep = {"s"}, .donate = {"s"}});
  EXPECT_TRUE(kept.groups[kept.group_of[p.Get("s")]].pinned);  // keep wins
}

TEST(Analysis, EmptyProgram) {
  Builder b("empty");
  b.Output(b.Input("x", DType::kF32, {2}));
  ExecutionPlan plan = Analyze(b.Build());
  EXPECT_EQ(plan.num_steps(), 0u);
  EXPECT_EQ(plan.liveness_bound, 0);
  EXPECT_EQ(plan.peak_step, -1);
}

TEST(Analysis, PolicyNamesRoundTrip) {
  for (OrderPolicy o : {OrderPolicy::kProgram, OrderPolicy::kGreedy, OrderPolicy::kBest}) {
    EXPECT_EQ(ParseOrderPolicy(Name(o)), o);
  }
  EXPECT_EQ(ParseOrderPolicy("fastest"), std::nullopt);
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3 << 20), "3.0 MiB");
}

}  // namespace
}  // namespace sluice
