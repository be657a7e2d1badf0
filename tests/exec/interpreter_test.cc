// The interpreter end to end: every run mode × GC mode gives the reference's bits; sync trace runs
// reach the liveness bound exactly; none ≥ sync; async ≤ sync + pending; nothing leaks over 1,000
// runs; a backward program reads what the forward left; errors leave the executable usable.
#include "sluice/exec/interpreter.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/core/system_allocator.h"
#include "sluice/exec/reference_runner.h"
#include "test_programs.h"

namespace sluice {
namespace {

using testing::AddChainProgram;
using testing::BranchyProgram;
using ::testing::HasSubstr;
using testing::MlpProgram;
using testing::RandomScope;

struct Config {
  RunMode mode;
  GcMode gc;
  OrderPolicy order = OrderPolicy::kBest;
  MemoryPlanMode plan = MemoryPlanMode::kDynamic;
  // measure_gc_time: off, a sync trace run takes the interpreter's untimed path (the benchmarks').
  bool timed = true;
};

std::string ToString(const Config& c) {
  return fmt::format("{}/{}/{}/{}{}", Name(c.mode), Name(c.gc), Name(c.order), Name(c.plan),
                     c.timed ? "" : "/untimed");
}

bool Dynamic(const Config& c) { return c.plan == MemoryPlanMode::kDynamic; }

std::vector<Config> AllConfigs() {
  std::vector<Config> configs;
  for (RunMode mode : {RunMode::kTrace, RunMode::kParallel}) {
    for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) configs.push_back({mode, gc});
  }
  configs.push_back({RunMode::kTrace, GcMode::kSync, OrderPolicy::kProgram});
  configs.push_back({RunMode::kTrace, GcMode::kAsync, OrderPolicy::kGreedy});
  for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
    configs.push_back({RunMode::kTrace, gc, OrderPolicy::kBest, MemoryPlanMode::kStatic});
  }
  configs.push_back(
      {RunMode::kTrace, GcMode::kSync, OrderPolicy::kProgram, MemoryPlanMode::kStatic});
  for (MemoryPlanMode plan : {MemoryPlanMode::kDynamic, MemoryPlanMode::kStatic}) {
    configs.push_back({RunMode::kTrace, GcMode::kSync, OrderPolicy::kBest, plan, /*timed=*/false});
  }
  configs.push_back({RunMode::kParallel, GcMode::kSync, OrderPolicy::kBest,
                     MemoryPlanMode::kDynamic, /*timed=*/false});
  return configs;
}

// Async GC hands over every batch (min_batch_bytes = 0), so that the tests exercise the worker
// even on small programs.
ExecutableOptions Options(const Config& c, Allocator* allocator) {
  return {.allocator = allocator,
          .mode = c.mode,
          .gc = c.gc,
          .threads = 3,
          .order = c.order,
          .memory_plan = c.plan,
          .async = {.min_batch_bytes = 0},
          .measure_gc_time = c.timed};
}

// A deep copy, so that in-place updates of one run do not leak into the next.
Scope Clone(const Scope& scope) {
  Scope copy;
  for (const std::string& name : scope.Names()) copy.Set(name, scope.Get(name).Clone());
  return copy;
}

void ExpectSameBits(const Scope& expected, const Scope& actual,
                    const std::vector<std::string>& names, const std::string& label) {
  for (const std::string& name : names) {
    ASSERT_TRUE(actual.Has(name)) << label << ": missing %" << name;
    EXPECT_TRUE(BitwiseEqual(expected.Get(name), actual.Get(name)))
        << label << ": %" << name << " differs\n expected " << expected.Get(name).ToString(8)
        << "\n actual   " << actual.Get(name).ToString(8);
  }
}

std::vector<std::string> OutputNames(const Program& p) {
  std::vector<std::string> names;
  for (ValueId v : p.outputs()) names.push_back(p.value(v).name);
  return names;
}

// `program` also returning `names` (so that RunReference leaves saved activations in the scope).
Program WithOutputs(Program program, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const ValueId v = program.Get(name);
    const auto& outs = program.outputs();
    if (std::find(outs.begin(), outs.end(), v) == outs.end()) program.AddOutput(v);
  }
  return program;
}

// One SGD step reading the parameter before and after the in-place update.
Program SgdProgram() {
  Builder b("sgd");
  Var param = b.Param("p", DType::kF32, {64});
  Var grad = b.Input("g", DType::kF32, {64});
  Var buf = b.Param("m", DType::kF32, {64});
  Var lr = b.Input("lr", DType::kF32, {});
  b.Output(b.Name(Copy(param), "before"));
  SgdUpdate(param, grad, buf, lr, {.momentum = 0.9});
  b.Output(b.Name(Copy(param) + grad, "after"));
  return b.Build();
}

std::vector<Program> Programs() {
  std::vector<Program> programs;
  programs.push_back(BranchyProgram(DType::kF32));
  programs.push_back(BranchyProgram(DType::kF64, 5, 7, 9));
  programs.push_back(MlpProgram());
  programs.push_back(AddChainProgram(40));
  programs.push_back(SgdProgram());
  programs.push_back(testing::TinyTransformerProgram());
  Program transformer = testing::TinyTransformerProgram();
  std::vector<std::string> params;
  for (ValueId p : transformer.params()) params.push_back(transformer.value(p).name);
  programs.push_back(BuildBackward(transformer, {.loss = "loss", .wrt = params}).program);
  return programs;
}

TEST(Interpreter, EveryModeGivesTheReferenceBits) {
  for (const Program& program : Programs()) {
    const Scope inputs = RandomScope(program, 11);
    Scope expected = Clone(inputs);
    RunReference(program, expected);
    for (const Config& c : AllConfigs()) {
      CachingAllocator alloc;
      Executable exe(program, Options(c, &alloc));
      for (int run = 0; run < 2; ++run) {
        Scope scope = Clone(inputs);
        exe.Run(scope);
        ExpectSameBits(expected, scope, OutputNames(program),
                       fmt::format("{} {} run {}", program.name(), ToString(c), run));
      }
    }
  }
}

// Forward then backward through one scope: the forward keeps what the backward reads.
TEST(Interpreter, BackwardReadsWhatTheForwardKept) {
  for (const Program& forward : {MlpProgram(DType::kF64), testing::TinyTransformerProgram()}) {
    std::vector<std::string> wrt;
    for (ValueId p : forward.params()) wrt.push_back(forward.value(p).name);
    Backward bwd = BuildBackward(forward, {.loss = "loss", .wrt = wrt});
    const Scope inputs = RandomScope(forward, 3);
    Scope expected = Clone(inputs);
    RunReference(WithOutputs(forward, bwd.saved), expected);
    RunReference(bwd.program, expected);
    for (const Config& c : AllConfigs()) {
      const std::string label = fmt::format("{} {}", forward.name(), ToString(c));
      CachingAllocator alloc;
      ExecutableOptions fo = Options(c, &alloc);
      fo.keep = bwd.saved;
      Executable fwd_exe(forward, fo);
      Executable bwd_exe(bwd.program, Options(c, &alloc));
      for (int step = 0; step < 2; ++step) {
        Scope scope = Clone(inputs);
        fwd_exe.Run(scope);
        for (const std::string& name : bwd.saved) {
          EXPECT_TRUE(scope.Has(name)) << label << " " << name;
        }
        bwd_exe.Run(scope);
        ExpectSameBits(expected, scope, bwd.grads, label);
        ExpectSameBits(expected, scope, {"loss"}, label);
      }
    }
  }
}

// A backward run that takes the forward's saved activations over frees each at its last use: the
// same gradients, the saved values gone from the scope, and only outputs left in the allocator.
TEST(Interpreter, DonatedSavedValuesAreFreedByTheBackward) {
  Program forward = testing::TinyTransformerProgram();
  std::vector<std::string> wrt;
  for (ValueId p : forward.params()) wrt.push_back(forward.value(p).name);
  Backward bwd = BuildBackward(forward, {.loss = "loss", .wrt = wrt});
  const Scope inputs = RandomScope(forward, 13);
  Scope expected = Clone(inputs);
  RunReference(WithOutputs(forward, bwd.saved), expected);
  RunReference(bwd.program, expected);
  std::vector<std::string> activations;  // saved values the forward computed (not its inputs)
  for (const std::string& name : bwd.saved) {
    if (forward.value(forward.Get(name)).kind == ValueKind::kIntermediate)
      activations.push_back(name);
  }
  ASSERT_FALSE(activations.empty());
  int64_t output_bytes = static_cast<int64_t>(forward.Bytes(forward.Get("loss")));
  for (const std::string& g : bwd.grads)
    output_bytes += static_cast<int64_t>(bwd.program.Bytes(bwd.program.Get(g)));
  for (const Config& c : AllConfigs()) {
    CachingAllocator alloc;
    ExecutableOptions fo = Options(c, &alloc), bo = Options(c, &alloc);
    fo.keep = bwd.saved;
    bo.donate = activations;
    Executable fwd_exe(forward, fo);
    Executable bwd_exe(bwd.program, bo);
    Scope scope = Clone(inputs);
    fwd_exe.Run(scope);
    RunStats s = bwd_exe.Run(scope);
    ExpectSameBits(expected, scope, bwd.grads, ToString(c));
    for (const std::string& name : activations) EXPECT_FALSE(scope.Has(name)) << name;
    EXPECT_EQ(alloc.Stats().allocated_bytes, output_bytes) << ToString(c);
    if (c.mode == RunMode::kTrace && c.gc == GcMode::kSync && Dynamic(c)) {
      // The run starts holding the loss and the donated activations; the bound counts the latter.
      EXPECT_EQ(s.peak_allocated_bytes, static_cast<int64_t>(forward.Bytes(forward.Get("loss"))) +
                                            s.liveness_lower_bound_bytes)
          << ToString(c);
    }
  }
}

// The bytes of every group the interpreter allocates (what GC none holds at the end).
int64_t AllIntermediateBytes(const ExecutionPlan& plan) {
  int64_t total = 0;
  for (const StorageGroup& g : plan.groups) total += g.bytes;
  return total;
}

TEST(Interpreter, SyncTracePeakEqualsTheLivenessBound) {
  for (const Program& program : Programs()) {
    for (auto [order, timed] : {std::pair{OrderPolicy::kProgram, true},
                                {OrderPolicy::kGreedy, true},
                                {OrderPolicy::kBest, false}}) {
      Config c{RunMode::kTrace, GcMode::kSync, order, MemoryPlanMode::kDynamic, timed};
      const std::string label = fmt::format("{} {}", program.name(), ToString(c));
      {
        CachingAllocator caching;
        Executable exe(program, Options(c, &caching));
        for (int run = 0; run < 3; ++run) {
          Scope scope = RandomScope(program, 1);
          RunStats s = exe.Run(scope);
          EXPECT_EQ(s.baseline_allocated_bytes, 0) << label;
          EXPECT_EQ(s.peak_allocated_bytes, s.liveness_lower_bound_bytes)
              << label << " caching run " << run;
          EXPECT_EQ(s.liveness_lower_bound_bytes, exe.plan().liveness_bound);
        }
      }
      SystemAllocator system;
      Executable exe(program, Options(c, &system));
      Scope scope = RandomScope(program, 1);
      RunStats s = exe.Run(scope);
      EXPECT_EQ(s.peak_allocated_bytes, s.liveness_lower_bound_bytes) << label << " system";
    }
  }
}

TEST(Interpreter, NoneHoldsEverythingAndFreesMatch) {
  for (const Program& program : Programs()) {
    for (RunMode mode : {RunMode::kTrace, RunMode::kParallel}) {
      std::map<GcMode, RunStats> stats;
      int64_t in_place_bytes = 0;  // outputs sharing a dying input's storage: never allocated
      for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
        CachingAllocator alloc;
        Executable exe(program, Options({mode, gc}, &alloc));
        Scope scope = RandomScope(program, 2);
        stats[gc] = exe.Run(scope);
        in_place_bytes = exe.plan().in_place_bytes;
      }
      const std::string label = fmt::format("{} {}", program.name(), Name(mode));
      const ExecutionPlan plan = Analyze(program);
      EXPECT_EQ(stats[GcMode::kNone].peak_allocated_bytes,
                AllIntermediateBytes(plan) - in_place_bytes)
          << label;
      EXPECT_GE(stats[GcMode::kNone].peak_allocated_bytes,
                stats[GcMode::kSync].peak_allocated_bytes)
          << label;
      for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
        EXPECT_EQ(stats[gc].frees, plan.NumFreeable()) << label << " " << Name(gc);
      }
      CachingAllocator alloc;
      Executable untimed(program, Options({mode, GcMode::kSync, OrderPolicy::kBest,
                                           MemoryPlanMode::kDynamic, /*timed=*/false},
                                          &alloc));
      Scope scope = RandomScope(program, 2);
      const RunStats s = untimed.Run(scope);
      EXPECT_EQ(s.frees, plan.NumFreeable()) << label << " sync untimed";
      if (mode == RunMode::kTrace) {  // a parallel run's peak depends on the scheduling
        EXPECT_EQ(s.peak_allocated_bytes, stats[GcMode::kSync].peak_allocated_bytes) << label;
      }
    }
  }
}

// x [4096] f32 → a = exp(x) → b = relu(a) → y = b + b: a dies at the relu and b at the add, so
// each output takes over its input's storage — one 16 KiB buffer where out of place there are two.
// `through_reshape`: the relu reads a viewed as [64, 64] (as an imported linear's [B·T, n]
// product is read as [B, T, n]), which is still the whole of a's storage, laid out as a is.
Program InPlaceChain(bool through_reshape = false) {
  Builder b("in_place_chain");
  Var x = b.Input("x", DType::kF32, {4096});
  Var a = b.Name(Exp(x), "a");
  Var r = b.Name(Relu(through_reshape ? Reshape(a, {64, 64}) : a), "r");
  b.Output(b.Name(r + r, "y"));
  return b.Build();
}

// The peak drops by exactly the bytes written in place, in every mode, with the same bits; under
// async GC the dying input's hand-off never frees the storage its successor now owns.
TEST(Interpreter, WritingInPlaceLowersThePeakByTheReusedBytesAndKeepsTheBits) {
  for (bool through_reshape : {false, true}) {
    const Program program = InPlaceChain(through_reshape);
    const Scope inputs = RandomScope(program, 5);
    Scope expected = Clone(inputs);
    RunReference(program, expected);
    for (const Config& c : AllConfigs()) {
      const std::string label = ToString(c) + (through_reshape ? ", through a reshape" : "");
      CachingAllocator on_alloc, off_alloc;
      ExecutableOptions on = Options(c, &on_alloc), off = Options(c, &off_alloc);
      off.in_place = false;
      Executable on_exe(program, on), off_exe(program, off);
      for (int run = 0; run < 3; ++run) {
        Scope on_scope = Clone(inputs), off_scope = Clone(inputs);
        const RunStats s_on = on_exe.Run(on_scope), s_off = off_exe.Run(off_scope);
        ExpectSameBits(expected, on_scope, {"y"}, label);
        ExpectSameBits(expected, off_scope, {"y"}, label);
        if (!Dynamic(c)) {  // a static plan writes nothing in place
          EXPECT_EQ(on_exe.plan().num_in_place, 0) << label;
          EXPECT_EQ(s_on.peak_allocated_bytes, s_off.peak_allocated_bytes) << label;
          continue;
        }
        // Nothing is freed during the run: one buffer in every GC mode. Out of place, none holds
        // a, r and y; sync two at a time; async at least that.
        if (c.gc == GcMode::kNone) EXPECT_EQ(s_off.peak_allocated_bytes, 3 * 16384) << label;
        if (c.gc == GcMode::kSync) EXPECT_EQ(s_off.peak_allocated_bytes, 2 * 16384) << label;
        EXPECT_GE(s_off.peak_allocated_bytes, 2 * 16384) << label;
        // a → r (the relu, a's only reader) and r → y (the add, r's only reader) in any mode.
        EXPECT_EQ(on_exe.plan().num_in_place, 2) << label;
        EXPECT_EQ(s_on.peak_allocated_bytes, 16384) << label << " run " << run;
        EXPECT_EQ(on_exe.plan().liveness_bound, 16384) << label;
        EXPECT_EQ(off_exe.plan().liveness_bound, 2 * 16384) << label;
      }
    }
  }
}

// Two readers of one value: in a trace run the later reader may write over it, in a parallel run
// (no fixed order) neither may; a view of the value read beside it keeps it whole (writing row 0
// of y over a's row 0 would change what the broadcast row reads for row 1). Bits as the reference.
TEST(Interpreter, InPlaceNeverWritesOverAValueStillRead) {
  Builder b("still_read");
  Var x = b.Input("x", DType::kF32, {2, 64});
  Var a = b.Name(Exp(x), "a");
  Var row0 = b.Name(Slice(a, 0, 0, 1), "row0");  // a view
  Var y = b.Name(a + row0, "y");                 // reads a and a view of it
  Var t = b.Name(Exp(y), "t");
  Var u = b.Name(Neg(t), "u");  // t is read again below
  b.Output(b.Name(u + t, "z"));
  const Program program = b.Build();
  const Scope inputs = RandomScope(program, 6);
  Scope expected = Clone(inputs);
  RunReference(program, expected);
  for (const Config& c : AllConfigs()) {
    CachingAllocator alloc;
    Executable exe(program, Options(c, &alloc));
    const ExecutionPlan& plan = exe.plan();
    const auto source = [&](Var v) { return plan.groups[plan.group_of[v.id()]].in_place_of; };
    EXPECT_EQ(source(y), -1) << ToString(c);
    EXPECT_EQ(source(u), -1) << ToString(c);
    Scope scope = Clone(inputs);
    exe.Run(scope);
    ExpectSameBits(expected, scope, {"z"}, ToString(c));
  }
}

// async peak ≤ sync peak + the bytes pending in the queue ≤ sync peak + max_pending_bytes.
TEST(Interpreter, AsyncPeakIsWithinTheQueueBound) {
  Program forward = MlpProgram(DType::kF32, 64, 128, 256);
  Backward bwd = BuildBackward(forward, {.loss = "loss", .wrt = {"w1", "b1", "w2"}});
  for (const Program* program : {&forward, &bwd.program}) {
    Scope inputs = RandomScope(forward, 4);
    if (program == &bwd.program) RunReference(WithOutputs(forward, bwd.saved), inputs);
    CachingAllocator sync_alloc;
    Executable sync_exe(*program, Options({RunMode::kTrace, GcMode::kSync}, &sync_alloc));
    Scope s0 = Clone(inputs);
    const int64_t sync_peak = sync_exe.Run(s0).peak_allocated_bytes;
    for (int64_t budget : {int64_t{0}, int64_t{4096}, int64_t{64} << 10, int64_t{1} << 30}) {
      CachingAllocator alloc;
      ExecutableOptions o = Options({RunMode::kTrace, GcMode::kAsync}, &alloc);
      o.async.max_pending_bytes = budget;
      Executable exe(*program, o);
      for (int run = 0; run < 5; ++run) {
        Scope scope = Clone(inputs);
        RunStats s = exe.Run(scope);
        const std::string label = fmt::format("{} budget {} run {}", program->name(), budget, run);
        EXPECT_LE(s.async_pending_peak_bytes, budget) << label;
        EXPECT_LE(s.peak_allocated_bytes, sync_peak + s.async_pending_peak_bytes) << label;
        EXPECT_GE(s.peak_allocated_bytes, sync_peak) << label;
        if (budget == 0) {
          EXPECT_EQ(s.peak_allocated_bytes, sync_peak) << label;  // every free was synchronous
          EXPECT_GT(s.sync_fallbacks, 0) << label;
        }
      }
    }
  }
}

TEST(Interpreter, ThousandRunsReturnToTheSameBaseline) {
  Program program = BranchyProgram();
  const Scope inputs = RandomScope(program, 5);
  int64_t output_bytes = 0;
  for (ValueId v : program.outputs()) output_bytes += static_cast<int64_t>(program.Bytes(v));
  for (const Config& c : AllConfigs()) {
    CachingAllocator alloc;
    Executable exe(program, Options(c, &alloc));
    Scope scope = Clone(inputs);
    for (int run = 0; run < 1000; ++run) {
      RunStats s = exe.Run(scope);
      ASSERT_EQ(alloc.Stats().allocated_bytes, output_bytes) << ToString(c) << " run " << run;
      ASSERT_EQ(s.baseline_allocated_bytes, 0) << ToString(c) << " run " << run;
    }
    scope.Clear();
    EXPECT_EQ(alloc.Stats().allocated_bytes, 0) << ToString(c);
    alloc.CheckInvariants();
  }
}

// Regression: the base of a view chain must survive until the views' last use, in every mode.
TEST(Interpreter, ViewsKeepTheirBaseAlive) {
  Builder b("views");
  Var x = b.Input("x", DType::kF32, {64, 64});
  Var a = b.Name(x + x, "a");
  Var v = b.Name(Reshape(a, {4096}), "v");
  b.Output(b.Name(Copy(a), "b"));       // a's last direct use
  Var big = b.Name(Copy(x), "filler");  // allocations that could reuse a's block
  Var w = b.Name(Reshape(v, {64, 64}), "w");
  b.Output(b.Name(w + big, "c"));  // the views' last use
  Program program = b.Build();
  const Scope inputs = RandomScope(program, 6);
  Scope expected = Clone(inputs);
  RunReference(program, expected);
  for (const Config& c : AllConfigs()) {
    SystemAllocator alloc;
    Executable exe(program, Options(c, &alloc));
    Scope scope = Clone(inputs);
    RunStats s = exe.Run(scope);
    ExpectSameBits(expected, scope, {"b", "c"}, ToString(c));
    if (c.mode == RunMode::kTrace && c.gc == GcMode::kSync) {
      // a, b, filler, c: a is alive at the end (dynamic: c is written over filler)
      EXPECT_EQ(s.peak_allocated_bytes, (Dynamic(c) ? 3 : 4) * 16384) << ToString(c);
    }
  }
}

TEST(Interpreter, MissingAndMistypedBindingsAreNamed) {
  Program program = BranchyProgram();
  Executable exe(program);
  Scope scope = RandomScope(program, 7);
  scope.Erase("w2");
  try {
    exe.Run(scope);
    FAIL() << "expected ProgramError";
  } catch (const ProgramError& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter %w2 (f32[16, 32]) is not bound"));
    EXPECT_THAT(e.what(), HasSubstr("'branchy'"));
  }
  scope.Set("w2", Tensor::Zeros({3}, DType::kF32));
  try {
    exe.Run(scope);
    FAIL() << "expected ProgramError";
  } catch (const ProgramError& e) {
    EXPECT_THAT(e.what(), HasSubstr("%w2 must be f32[16, 32]"));
  }
  EXPECT_THROW(Executable(program, {.threads = -1}), InvalidArgument);
  EXPECT_THROW(Executable(program, {.keep = {"nope"}}), ProgramError);
}

// A kernel error (an id out of range) mid-run: the error reaches the caller, everything the run
// held is released, and the next run works.
TEST(Interpreter, KernelErrorsLeaveTheExecutableUsable) {
  Builder b("lookup");
  Var ids = b.Input("ids", DType::kI64, {2, 3});
  Var table = b.Param("table", DType::kF32, {5, 4});
  Var e = Embedding(ids, table);
  b.Output(b.Name(e + e, "y"));
  Program program = b.Build();
  for (const Config& c : AllConfigs()) {
    CachingAllocator alloc;
    Executable exe(program, Options(c, &alloc));
    Scope scope = RandomScope(program, 8);
    scope.Set("ids", Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 9}));
    // The kernel's complaint keeps its type and says which instruction raised it.
    try {
      exe.Run(scope);
      ADD_FAILURE() << "id 9 of a 5-row table ran: " << ToString(c);
    } catch (const InvalidArgument& err) {
      EXPECT_THAT(err.what(), HasSubstr("program 'lookup', instruction 0 (embedding %"))
          << ToString(c);
      EXPECT_THAT(err.what(), HasSubstr("9")) << ToString(c);
    }
    EXPECT_EQ(alloc.Stats().allocated_bytes, 0) << ToString(c);
    scope.Set("ids", Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 4}));
    exe.Run(scope);
    EXPECT_EQ(scope.Get("y").shape(), (Shape{2, 3, 4})) << ToString(c);
  }
}

// Runs read inputs and parameters where the scope holds them (a trace run moves them out for the
// kernel and back): a kernel that fails must leave every binding in the scope as it was.
TEST(Interpreter, AFailedRunLeavesTheBindingsInTheScope) {
  Builder b("lookup");
  Var ids = b.Input("ids", DType::kI64, {2, 3});
  Var table = b.Param("table", DType::kF32, {5, 4});
  b.Output(b.Name(Embedding(ids, table), "y"));
  Program program = b.Build();
  for (const Config& c : AllConfigs()) {
    CachingAllocator alloc;
    Executable exe(program, Options(c, &alloc));
    Scope scope = RandomScope(program, 8);
    const Tensor bad_ids = Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 9});
    scope.Set("ids", bad_ids);
    const Scope before = Clone(scope);
    EXPECT_THROW(exe.Run(scope), InvalidArgument) << ToString(c);
    ASSERT_EQ(scope.size(), 2u) << ToString(c);
    ExpectSameBits(before, scope, {"ids", "table"}, ToString(c));
    EXPECT_EQ(scope.Get("ids").storage(), bad_ids.storage()) << ToString(c);
  }
}

TEST(Interpreter, TraceRecordsInstructionsFreesAndMemory) {
  Program program = BranchyProgram();
  for (const Config& c : AllConfigs()) {
    CachingAllocator alloc;
    Executable exe(program, Options(c, &alloc));
    Scope scope = RandomScope(program, 9);
    RunTrace trace;
    RunStats s = exe.Run(scope, &trace);
    const bool async = c.gc == GcMode::kAsync;
    ASSERT_EQ(trace.threads.size(), static_cast<size_t>(exe.num_executors() + (async ? 1 : 0)));
    size_t spans = 0, samples = 0;
    int64_t freed_on_executors = 0;
    for (int k = 0; k < exe.num_executors(); ++k) {
      for (const InstructionSpan& span : trace.threads[k].instructions) {
        EXPECT_LE(span.begin_ns, span.end_ns);
      }
      spans += trace.threads[k].instructions.size();
      samples += trace.threads[k].memory.size();
      for (const GcSpan& g : trace.threads[k].gc) freed_on_executors += g.storages;
    }
    EXPECT_EQ(spans, program.instructions().size()) << ToString(c);
    EXPECT_GT(samples, 0u) << ToString(c);
    if (c.gc != GcMode::kNone) {
      EXPECT_EQ(freed_on_executors, s.frees) << ToString(c);
    }
    if (async) {
      EXPECT_EQ(trace.threads.back().name, "gc worker");
      int64_t destroyed = 0;
      for (const GcSpan& g : trace.threads.back().gc) destroyed += g.storages;
      EXPECT_LE(destroyed, s.frees) << ToString(c);
      if (s.sync_fallbacks == 0 && Dynamic(c)) {  // planned values are not handed over
        // nor are groups whose storage an output written in place took over
        EXPECT_EQ(destroyed + exe.plan().num_in_place, s.frees) << ToString(c);
      }
      EXPECT_TRUE(trace.threads.back().gc_worker);
    }
  }
}

TEST(Interpreter, StatsDescribeTheRun) {
  Program program = AddChainProgram(100);
  CachingAllocator alloc;
  Executable exe(program, {.allocator = &alloc, .gc = GcMode::kSync});
  Scope scope = RandomScope(program, 10);
  RunStats s = exe.Run(scope);
  EXPECT_EQ(s.instructions, 100);
  EXPECT_EQ(s.frees, 99);  // every sum but the output
  // Each sum is written over the one before: one buffer (2 without writing in place).
  EXPECT_EQ(s.liveness_lower_bound_bytes, 64 * 4);
  EXPECT_GT(s.wall_ns, 0);
  EXPECT_GT(s.gc_thread_ns, 0);
  EXPECT_EQ(s.async_pending_peak_bytes, 0);
  EXPECT_EQ(exe.num_executors(), 1);
}

// By default small batches are freed in place: no hand-over, no worker span, nothing pending.
TEST(Interpreter, AsyncFreesSmallBatchesInPlace) {
  Program program = BranchyProgram();  // buffers of at most 2 KiB
  CachingAllocator alloc;
  Executable exe(program, {.allocator = &alloc, .gc = GcMode::kAsync});
  Scope scope = RandomScope(program, 12);
  RunTrace trace;
  RunStats s = exe.Run(scope, &trace);
  EXPECT_EQ(s.frees, exe.plan().NumFreeable());
  EXPECT_EQ(s.async_pending_peak_bytes, 0);
  EXPECT_EQ(s.sync_fallbacks, 0);
  EXPECT_TRUE(trace.threads.back().gc_worker);
  EXPECT_TRUE(trace.threads.back().gc.empty());
  EXPECT_EQ(s.peak_allocated_bytes, s.liveness_lower_bound_bytes);
}

// The default GC (auto) frees in place on a caching allocator — its peaks, allocated and reserved,
// are exactly sync's whatever the machine — and hands frees to the worker on a SystemAllocator,
// whose free of a large block is a munmap. The bits are the same either way.
TEST(Interpreter, DefaultGcIsSyncOnACachingAllocatorAndAsyncOnASystemOne) {
  EXPECT_EQ(ExecutableOptions{}.gc, GcMode::kAuto);
  Program forward = MlpProgram(DType::kF32, 64, 128, 256);  // frees of 64–128 KiB
  Backward bwd = BuildBackward(forward, {.loss = "loss", .wrt = {"w1", "b1", "w2"}});
  for (const Program* program : {&forward, &bwd.program}) {
    Scope inputs = RandomScope(forward, 4);
    if (program == &bwd.program) RunReference(WithOutputs(forward, bwd.saved), inputs);
    Scope expected = Clone(inputs);
    RunReference(*program, expected);
    const std::vector<std::string> outputs = OutputNames(*program);

    CachingAllocator sync_alloc, auto_alloc;
    Executable sync_exe(*program, {.allocator = &sync_alloc, .gc = GcMode::kSync});
    Executable auto_exe(*program, {.allocator = &auto_alloc});
    EXPECT_EQ(auto_exe.gc_mode(), GcMode::kSync);
    for (int run = 0; run < 3; ++run) {
      Scope s0 = Clone(inputs), s1 = Clone(inputs);
      const RunStats sync = sync_exe.Run(s0);
      const RunStats by_default = auto_exe.Run(s1);
      const std::string label = fmt::format("{} run {}", program->name(), run);
      EXPECT_EQ(by_default.peak_allocated_bytes, sync.peak_allocated_bytes) << label;
      EXPECT_EQ(by_default.peak_reserved_bytes, sync.peak_reserved_bytes) << label;
      EXPECT_EQ(by_default.async_pending_peak_bytes, 0) << label;
      ExpectSameBits(expected, s1, outputs, label);
    }

    SystemAllocator system;
    Executable system_exe(*program, {.allocator = &system});
    EXPECT_EQ(system_exe.gc_mode(), GcMode::kAsync);
    Scope s2 = Clone(inputs);
    RunTrace trace;
    const RunStats s = system_exe.Run(s2, &trace);
    EXPECT_TRUE(trace.threads.back().gc_worker) << program->name();
    EXPECT_EQ(s.frees, system_exe.plan().NumFreeable()) << program->name();
    ExpectSameBits(expected, s2, outputs, program->name() + " system");
  }
}

TEST(RunSummary, MediansAndMaxima) {
  std::vector<RunStats> runs(3);
  runs[0].wall_ns = 30;
  runs[1].wall_ns = 10;
  runs[2].wall_ns = 20;
  runs[1].peak_allocated_bytes = 7;
  RunSummary s = Summarize(runs);
  EXPECT_EQ(s.runs, 3);
  EXPECT_EQ(s.wall_ns_median, 20);
  EXPECT_EQ(s.wall_ns_min, 10);
  EXPECT_EQ(s.peak_allocated_bytes, 7);
  EXPECT_THROW(Summarize({}), InvalidArgument);
}

TEST(RunMode, NamesRoundTrip) {
  EXPECT_EQ(ParseRunMode("trace"), RunMode::kTrace);
  EXPECT_EQ(ParseRunMode("parallel"), RunMode::kParallel);
  EXPECT_EQ(ParseRunMode("async"), std::nullopt);
}

}  // namespace
}  // namespace sluice
