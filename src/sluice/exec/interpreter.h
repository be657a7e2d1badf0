// Executable: a program prepared to run many times — the interpreter at the heart of sluice.
//
// Construction verifies the program (VerifyOnce: not again when it passed Verify and nothing
// changed it since), analyses it once (exec/analysis.h: order, storage groups, free lists,
// dependency counts, liveness bound) and precomputes everything a run needs as slot vectors (value
// ids index a vector of tensor pointers; no name lookup per instruction; the inputs and parameters
// are read where the scope holds them, the other values have slots of their own). Run() then:
//   1. drops from the scope the previous run's outputs and kept values (they are about to be
//      replaced and would otherwise count towards this run's peak), binds the program's inputs and
//      parameters from the scope (ProgramError naming a missing or mistyped one), taking the
//      donated inputs out of it;
//   2. runs every instruction — in the plan's order on the calling thread (RunMode::kTrace), or on
//      a thread pool driven by dependency counts (RunMode::kParallel; the caller is member 0) —
//      allocating kCompute outputs from the executable's allocator and freeing storage groups at
//      their last use according to the GC mode (exec/garbage_collector.h; kAuto is resolved once,
//      at construction). An output the plan writes in place shares its dying input's storage
//      instead of being allocated; that input's release then only drops its handles. With the
//      static memory plan (exec/memory_plan.h) the planned
//      intermediates instead sit at fixed offsets of one arena, allocated once the inputs are
//      bound and freed when the run ends: no allocator call for them, and "freeing" one drops
//      its handles;
//   3. leaves the outputs and the `keep` values in the scope, waits for the async GC to drain, and
//      drops every other reference, so that when Run returns the allocator holds exactly the
//      outputs and kept values the run produced.
// Results are bitwise identical in every run mode × GC mode × memory plan (kernels are
// deterministic and each instruction sees the same inputs); the tests pin this.
//
// Ownership: the executable owns a copy of the program, its slots, its GC worker and thread pool.
// The allocator (options.allocator, DefaultAllocator() when null) must outlive the executable and
// every tensor a run leaves in a scope.
// Thread-safety: one Run at a time per executable (a concurrent Run throws InvalidArgument);
// distinct executables may run concurrently. The scope is used by the calling thread only.
// Failure modes: construction throws ProgramError for an invalid program, `keep` or `donate` name,
// and InvalidArgument for bad options (a static memory plan with RunMode::kParallel); Run throws
// ProgramError for missing or mistyped bindings and rethrows kernel errors (e.g. OutOfMemory) and
// async GC worker errors. After a failed run the executable has released everything it held and can
// run again.
//
// Example:
//   SystemAllocator alloc;
//   Executable exe(program, {.allocator = &alloc, .mode = RunMode::kTrace, .gc = GcMode::kAsync});
//   Scope scope;
//   scope.Set("x", x);  scope.Set("w", w);
//   RunStats stats = exe.Run(scope);     // scope now holds the outputs
//   fmt::print("{} of {} bound\n", stats.peak_allocated_bytes, stats.liveness_lower_bound_bytes);
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/core/enum_names.h"
#include "sluice/exec/analysis.h"
#include "sluice/exec/garbage_collector.h"
#include "sluice/exec/memory_plan.h"
#include "sluice/exec/run_stats.h"
#include "sluice/exec/run_trace.h"
#include "sluice/exec/scope.h"
#include "sluice/ir/program.h"

namespace sluice {

enum class RunMode : uint8_t { kTrace, kParallel };

inline constexpr EnumEntry<RunMode> kRunModeNames[] = {
    {RunMode::kTrace, "trace"},
    {RunMode::kParallel, "parallel"},
};
static_assert(IsCompleteEnumTable(kRunModeNames));

// The mode's name in kRunModeNames, and back (nullopt for any other text).
std::string_view Name(RunMode mode);
std::optional<RunMode> ParseRunMode(std::string_view name);

struct ExecutableOptions {
  Allocator* allocator = nullptr;  // intermediates and outputs; null: DefaultAllocator()
  RunMode mode = RunMode::kTrace;
  // kAuto (the default) resolves against the allocator: sync for a caching allocator (exec/
  // garbage_collector.h); gc_mode() says what it became.
  GcMode gc = GcMode::kAuto;
  int threads = 0;  // parallel runs: threads including the caller; 0: one per core
  OrderPolicy order = OrderPolicy::kBest;
  std::vector<std::string> keep;  // values left in the scope besides the outputs (never freed)
  // Inputs taken out of the scope and freed at their last use (exec/analysis.h). Lost if the run
  // fails. A backward program donates the forward's saved activations.
  std::vector<std::string> donate;
  // kStatic: the intermediates that die inside a run live in one arena per run, at offsets planned
  // at construction (exec/memory_plan.h). Trace runs only. Not the default: it holds the arena
  // for the whole run (figures: docs/executor.md, "Static memory plan").
  MemoryPlanMode memory_plan = MemoryPlanMode::kDynamic;
  // Write an elementwise output into the storage of an input that dies at its instruction
  // (exec/analysis.h, "Writing in place"): decided once at construction; in parallel runs only
  // for inputs the instruction alone reads; never under a static memory plan. Bitwise the same
  // results; false gives every output fresh storage.
  bool in_place = true;
  AsyncGcOptions async;  // queue size and pending-bytes budget of the async GC
  bool verbose = false;  // print the plan (order, free lists) to stderr; also SLUICE_VERBOSE=1
  // Time the GC work of executing threads (RunStats::gc_thread_ns): two CycleClock reads
  // (exec/cycle_clock.h) around one freeing instruction in 8, the first included, scaled to all
  // of them — an estimate, exact when a run frees after at most one instruction. Off,
  // gc_thread_ns is 0.
  bool measure_gc_time = true;
  // Restart the allocator's peak at the start of each run (RunStats then reports the run's own
  // peak). Off, the peak runs on across runs: a pipeline stage measures one peak over a whole step
  // of many forward and backward runs with micro-batches in flight between them.
  bool reset_peak = true;
};

class Executable {
 public:
  explicit Executable(Program program, ExecutableOptions options = {});
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Runs the program once on `scope` (see the top of this file). With `trace`, records every
  // instruction, GC span and memory sample of this run into it (replacing its contents).
  RunStats Run(Scope& scope, RunTrace* trace = nullptr);

  const Program& program() const;
  const ExecutionPlan& plan() const;
  // The placement of the intermediates: empty (no group planned) unless memory_plan is kStatic.
  const ArenaPlan& arena() const;
  const ExecutableOptions& options() const;
  // The GC mode runs use: options().gc, with kAuto resolved against the allocator (ResolveGcMode).
  GcMode gc_mode() const;
  // Threads that execute instructions (1 in trace mode).
  int num_executors() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
