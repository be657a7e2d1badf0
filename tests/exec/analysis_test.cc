// Analysis: storage groups, free lists, pinning, dependency edges, orders and the liveness bound,
// on programs small enough to check by hand.
#include "sluice/exec/analysis.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <span>

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
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram, .in_place = InPlace::kOff});
  // live: a | a b | a b c | c d | c e   (x is the caller's)
  EXPECT_THAT(plan.live_bytes, ElementsAre(16, 32, 48, 32, 32));
  EXPECT_EQ(plan.liveness_bound, 48);
  EXPECT_EQ(plan.peak_step, 2);
}

TEST(Analysis, KeepAndOutputsArePinned) {
  Program p = Chain();
  ExecutionPlan plan =
      Analyze(p, {.order = OrderPolicy::kProgram, .in_place = InPlace::kOff, .keep = {"b"}});
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

// The worked example written in place: c = add(a, b) is the last user of a and of b, so c takes
// over a's storage (the first input its op lists) and step 2 holds 16 bytes fewer; b's later
// reader at step 1 (c) keeps b = add(a, x) off a.
TEST(Analysis, AnOutputTakesOverTheStorageOfAnInputDyingAtIt) {
  Program p = Chain();
  ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kProgram});
  const auto group = [&](const char* name) { return plan.group_of[p.Get(name)]; };
  EXPECT_EQ(plan.groups[group("c")].in_place_of, group("a"));
  EXPECT_EQ(plan.groups[group("a")].handed_to, group("c"));
  EXPECT_EQ(plan.groups[group("b")].in_place_of, -1);  // a is read again by c
  EXPECT_EQ(plan.groups[group("e")].in_place_of, -1);  // copy is not written in place
  EXPECT_EQ(plan.num_in_place, 1);
  EXPECT_EQ(plan.in_place_bytes, 16);
  EXPECT_THAT(plan.live_bytes, ElementsAre(16, 32, 32, 32, 32));
  EXPECT_EQ(plan.liveness_bound, 32);
  EXPECT_THAT(Freed(plan, p, 2), ElementsAre("a", "b"));  // a's handles only: c holds it
  const std::string text = plan.Describe(p);
  EXPECT_THAT(text, HasSubstr("%c = add(%a, %b) [in place of %a]"));
  EXPECT_THAT(text, HasSubstr("%a (handed to %c)"));
  EXPECT_THAT(text, HasSubstr("written in place: 1 outputs, 16 B"));
}

// What must not be written over: a kept value, a program input or parameter, a donated input, a
// value read again later, a value read through a view by the same instruction, a value of
// another element width, and, for runs in any order, a value with other readers.
TEST(Analysis, InPlaceSparesWhatIsStillReadOrNotTheRunsToReuse) {
  Builder b("spared");
  Var x = b.Input("x", DType::kF32, {2, 4});
  Var d = b.Input("d", DType::kF32, {2, 4});
  Var w = b.Param("w", DType::kF32, {2, 4});
  Var kept = b.Name(Relu(x), "kept");
  Var from_kept = b.Name(Exp(kept), "from_kept");     // kept is pinned: fresh storage
  Var xw = b.Name(x + w, "xw");                       // an input and a parameter: fresh storage
  Var from_input = b.Name(Relu(xw), "from_input");    // over xw
  Var from_donated = b.Name(Neg(d), "from_donated");  // d is donated: another may share it
  Var a = b.Name(Copy(from_kept), "a");
  Var row0 = b.Name(Slice(a, 0, 0, 1), "row0");   // a view of a's first row
  Var mixed = b.Name(a + row0, "mixed");          // reads a through a view: fresh storage
  Var later = b.Name(Relu(from_input), "later");  // from_input is read again below
  Var sum = b.Name(later + from_input, "sum");    // both die here: over later
  Var wide = b.Name(Cast(from_donated, DType::kF64), "wide");  // not an in-place op anyway
  b.Output(b.Name(mixed + sum, "y"));
  b.Output(wide);
  const Program p = b.Build();
  const ExecutionPlan plan =
      Analyze(p, {.order = OrderPolicy::kProgram, .keep = {"kept"}, .donate = {"d"}});
  const auto source = [&](Var v) {
    const int32_t g = plan.groups[plan.group_of[v.id()]].in_place_of;
    return g < 0 ? std::string("-") : p.value(plan.groups[g].root).name;
  };
  EXPECT_EQ(source(from_kept), "-");
  EXPECT_EQ(source(kept), "-");
  EXPECT_EQ(source(xw), "-");
  EXPECT_EQ(source(from_input), "xw");
  EXPECT_EQ(source(from_donated), "-");
  EXPECT_EQ(source(mixed), "-");
  EXPECT_EQ(source(later), "-");
  EXPECT_EQ(source(sum), "later");
  EXPECT_EQ(source(wide), "-");
  // The output y: mixed + sum, both dying there: over mixed.
  EXPECT_EQ(plan.groups[plan.group_of[p.Get("y")]].in_place_of, plan.group_of[mixed.id()]);

  // In any order only a group whose one reader is the instruction: sum reads later (read only by
  // sum) and from_input (read by later and sum).
  const ExecutionPlan any = Analyze(p, {.in_place = InPlace::kAnyOrder, .keep = {"kept"}});
  EXPECT_EQ(any.groups[any.group_of[sum.id()]].in_place_of, any.group_of[later.id()]);
  EXPECT_EQ(any.groups[any.group_of[later.id()]].in_place_of, -1);
  const ExecutionPlan off = Analyze(p, {.in_place = InPlace::kOff, .keep = {"kept"}});
  EXPECT_EQ(off.num_in_place, 0);
  EXPECT_EQ(plan.num_in_place, 3);  // from_input, sum and y
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

// Random programs over [4] and [R, 4] values: copies, adds, broadcasts up and reductions down
// (so that orders differ in live bytes), reshapes (views) and sgd_updates (in-place hazards on a
// parameter, on the values they read and on the shared %lr), some values made outputs. Only
// programs the verifier accepts: an update's gradient never shares the parameter's storage, and a
// view of a parameter taken before its update is not read after it, nor output (ir/verifier.h).
Program RandomProgram(uint32_t seed, int instructions) {
  std::mt19937 rng(seed);
  // A value, and the parameter whose storage it is or views (-1: a storage of its own).
  struct Item {
    Var var;
    int param = -1;
    bool view = false;
  };
  auto pick = [&](const std::vector<Item>& pool) -> const Item& {
    return pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
  };
  auto chance = [&](int percent) {
    return std::uniform_int_distribution<int>(0, 99)(rng) < percent;
  };
  Builder b("random");
  Var lr = b.Input("lr", DType::kF32, {});
  std::vector<Var> params, buffers;
  for (int k = 0; k < 3; ++k) {
    params.push_back(b.Param("p" + std::to_string(k), DType::kF32, {4}));
    buffers.push_back(b.Param("m" + std::to_string(k), DType::kF32, {4}));
  }
  std::vector<Item> small = {
      {b.Input("x", DType::kF32, {4})}, {params[0], 0}, {params[1], 1}, {params[2], 2}};
  std::vector<Item> big;
  for (int i = 0; i < instructions; ++i) {
    Item made{small[0].var};
    switch (std::uniform_int_distribution<int>(0, 6)(rng)) {
      case 0:
        made = {Copy(pick(small).var)};
        break;
      case 1:
        made = {pick(small).var + pick(small).var};
        break;
      case 2:
        made = {BroadcastTo(pick(small).var, Shape{8 << (i % 3), 4})};
        break;
      case 3:
        made = {big.empty() ? Copy(pick(small).var) : SumTo(pick(big).var, Shape{4})};
        break;
      case 4: {
        const Item& from = big.empty() ? pick(small) : pick(big);
        made = {big.empty() ? Reshape(from.var, {4}) : Reshape(from.var, {-1, 4}), from.param,
                true};
        break;
      }
      case 5:
        made = {big.empty() ? Copy(pick(small).var) : Copy(pick(big).var)};
        break;
      default: {
        const int k = std::uniform_int_distribution<int>(0, 2)(rng);
        std::vector<Item> grads;
        for (const Item& item : small) {
          if (item.param != k) grads.push_back(item);
        }
        SgdUpdate(params[k], pick(grads).var, buffers[k], lr);
        // Views of p_k taken before the update are read no more; p_k itself reads the new values.
        for (std::vector<Item>* pool : {&small, &big}) {
          std::erase_if(*pool, [&](const Item& item) { return item.view && item.param == k; });
        }
        continue;
      }
    }
    (made.var.type().shape.rank() == 1 ? small : big).push_back(made);
    if (chance(5) && !(made.view && made.param >= 0)) b.Output(made.var);
  }
  return b.Build();
}

// The greedy order as first written: a scan of every ready instruction at each step (quadratic
// when many are ready), from the plan's dependency graph and groups.
std::vector<int32_t> ReferenceGreedyOrder(const Program& p, const ExecutionPlan& plan) {
  const auto& instrs = p.instructions();
  const int32_t n = static_cast<int32_t>(instrs.size());
  std::vector<std::vector<int32_t>> reads(n);
  for (int32_t i = 0; i < n; ++i) {
    for (ValueId v : instrs[i].inputs) {
      const int32_t g = plan.group_of[v];
      if (std::find(reads[i].begin(), reads[i].end(), g) == reads[i].end()) reads[i].push_back(g);
    }
  }
  std::vector<int32_t> remaining_users(plan.groups.size());
  for (size_t g = 0; g < plan.groups.size(); ++g) remaining_users[g] = plan.groups[g].num_users;
  std::vector<int32_t> pending = plan.num_predecessors;
  std::vector<int32_t> ready, order;
  for (int32_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  while (!ready.empty()) {
    size_t best = 0;
    int64_t best_growth = std::numeric_limits<int64_t>::max();
    for (size_t k = 0; k < ready.size(); ++k) {
      const int32_t i = ready[k];
      int64_t growth = 0;
      if (instrs[i].op->kind == OpKind::kCompute) {
        for (ValueId out : instrs[i].outputs) {
          const StorageGroup& g = plan.groups[plan.group_of[out]];
          growth += (!g.pinned && g.num_users == 0) ? 0 : g.bytes;
        }
      }
      for (int32_t g : reads[i]) {
        if (!plan.groups[g].pinned && remaining_users[g] == 1) growth -= plan.groups[g].bytes;
      }
      if (growth < best_growth || (growth == best_growth && i < ready[best])) {
        best = k;
        best_growth = growth;
      }
    }
    const int32_t i = ready[best];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(best));
    order.push_back(i);
    for (int32_t g : reads[i]) --remaining_users[g];
    for (int32_t s : plan.successors[i]) {
      if (--pending[s] == 0) ready.push_back(s);
    }
  }
  return order;
}

// reach[i][j]: instruction j must run after instruction i (transitive closure of `edges`).
std::vector<std::vector<bool>> Closure(int32_t n,
                                       const std::function<std::vector<int32_t>(int32_t)>& edges) {
  std::vector<std::vector<bool>> reach(n, std::vector<bool>(n, false));
  for (int32_t i = n - 1; i >= 0; --i) {  // edges go forward in program order
    for (int32_t j : edges(i)) {
      reach[i][j] = true;
      for (int32_t k = 0; k < n; ++k) {
        if (reach[j][k]) reach[i][k] = true;
      }
    }
  }
  return reach;
}

// The heap-driven greedy order is exactly the scan's, and the chained hazards give exactly the
// partial order of an edge per (user, in-place user) pair sharing a group.
TEST(Analysis, RandomProgramsMatchTheReferenceOrderAndHazards) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Program p = RandomProgram(seed, 120);
    ExecutionPlan plan = Analyze(p, {.order = OrderPolicy::kGreedy});
    ASSERT_EQ(plan.order, ReferenceGreedyOrder(p, plan));

    const auto& instrs = p.instructions();
    const int32_t n = static_cast<int32_t>(instrs.size());
    std::vector<std::vector<int32_t>> users(plan.groups.size());
    for (int32_t i = 0; i < n; ++i) {
      for (ValueId v : instrs[i].inputs) users[plan.group_of[v]].push_back(i);
    }
    auto pairwise = [&](int32_t i) {
      std::vector<int32_t> out;
      for (int32_t j = i + 1; j < n; ++j) {
        for (ValueId v : instrs[j].inputs) {
          const bool data = p.value(v).producer == i;
          const std::vector<int32_t>& u = users[plan.group_of[v]];
          const bool shared = std::find(u.begin(), u.end(), i) != u.end();
          const bool in_place =
              instrs[i].op->kind == OpKind::kInPlace || instrs[j].op->kind == OpKind::kInPlace;
          if (data || (shared && in_place)) out.push_back(j);
        }
      }
      return out;
    };
    auto chained = [&](int32_t i) {
      std::span<const int32_t> s = plan.successors[i];
      return std::vector<int32_t>(s.begin(), s.end());
    };
    ASSERT_EQ(Closure(n, chained), Closure(n, pairwise));
  }
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
