// Interpreter benchmarks (issue 4). Figures and how to read them: docs/benchmarks.md, "Executor".
//
//   BM_Dispatch      a chain of 10,000 adds on 64-float tensors: ns per instruction of the whole
//                    interpreter (allocate, kernel, free) in trace and parallel mode, and with the
//                    static memory plan (`static:1`, trace only: no allocation). Compare with
//                    bench/torch_dispatch.py (PyTorch eager on the same loop).
//   BM_GcCriticalPath  instructions that free several 8 MiB buffers from a SystemAllocator (mmap
//   and
//                    munmap per buffer): nanoseconds the executing thread spends on GC work per
//                    instruction, sync vs async, and the wall time of a run.
//   BM_PeakMemory    a GPT-like forward + backward (autodiff) program: peak allocated bytes under
//                    GC none / sync / async next to the liveness lower bound.
//
// Run: build/bench/exec_bench --benchmark_format=json (counters carry the figures).
#include <benchmark/benchmark.h>

#include <ctime>
#include <string>
#include <vector>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/core/system_allocator.h"
#include "sluice/exec/interpreter.h"
#include "sluice/exec/random_inputs.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"

namespace sluice {
namespace {

// y_{k+1} = y_k + c, n instructions on [size] f32.
Program AddChain(int n, int64_t size) {
  Builder b("add_chain");
  Var x = b.Input("x", DType::kF32, {size});
  Var c = b.Param("c", DType::kF32, {size});
  Var y = x;
  for (int k = 0; k < n; ++k) y = y + c;
  b.Output(b.Name(y, "y"));
  return b.Build();
}

// Per layer: three 8 MiB temporaries from y, summed pairwise. The two sums each free two 8 MiB
// buffers (p1 and p2, then s and p3); p3 frees y.
Program BigBuffers(int layers) {
  constexpr int64_t kFloats = int64_t{2} << 20;  // 8 MiB of f32
  Builder b("big_buffers");
  Var x = b.Input("x", DType::kF32, {kFloats});
  Var y = x;
  for (int k = 0; k < layers; ++k) {
    Var p1 = y + x, p2 = y + x, p3 = y + x;
    y = (p1 + p2) + p3;
  }
  b.Output(b.Name(y, "y"));
  return b.Build();
}

// A GPT-like block stack written with the basic ops: token embedding, per layer pre-LayerNorm
// causal self-attention (one head) and a GELU MLP, then logits and a cross-entropy loss.
//   ids [B, T] → x [B, T, C] → logits [B, T, vocab]
Program Transformer(int64_t B, int64_t T, int64_t C, int64_t vocab, int layers) {
  Builder b("transformer");
  Var ids = b.Input("ids", DType::kI64, {B, T});
  Var targets = b.Input("targets", DType::kI64, {B, T});
  Var x = Embedding(ids, b.Param("wte", DType::kF32, {vocab, C}));
  for (int l = 0; l < layers; ++l) {
    Builder::NameScope scope(b, "h" + std::to_string(l));
    Var ln1 = LayerNorm(x, b.Param(b.Prefixed("ln1.w"), DType::kF32, {C}),
                        b.Param(b.Prefixed("ln1.b"), DType::kF32, {C}));
    Var q = MatMul(ln1, b.Param(b.Prefixed("wq"), DType::kF32, {C, C}));
    Var k = MatMul(ln1, b.Param(b.Prefixed("wk"), DType::kF32, {C, C}));
    Var v = MatMul(ln1, b.Param(b.Prefixed("wv"), DType::kF32, {C, C}));
    Var probs = CausalSoftmax(Scale(MatMul(q, k, false, true), 1.0 / 8));
    x = x + MatMul(MatMul(probs, v), b.Param(b.Prefixed("wo"), DType::kF32, {C, C}));
    Var ln2 = LayerNorm(x, b.Param(b.Prefixed("ln2.w"), DType::kF32, {C}),
                        b.Param(b.Prefixed("ln2.b"), DType::kF32, {C}));
    Var h = Gelu(MatMul(ln2, b.Param(b.Prefixed("fc"), DType::kF32, {C, 4 * C})));
    x = x + MatMul(h, b.Param(b.Prefixed("proj"), DType::kF32, {4 * C, C}));
  }
  Var logits = MatMul(x, b.Param("lm_head", DType::kF32, {C, vocab}));
  b.Output(b.Name(CrossEntropy(logits, targets), "loss"));
  return b.Build();
}

const GcMode kGcModes[] = {GcMode::kNone, GcMode::kSync, GcMode::kAsync};

void BM_Dispatch(benchmark::State& state) {
  constexpr int kInstructions = 10'000;
  const RunMode mode = state.range(0) == 0 ? RunMode::kTrace : RunMode::kParallel;
  const GcMode gc = kGcModes[state.range(1)];
  const bool timed = state.range(2) != 0;
  const MemoryPlanMode plan =
      state.range(3) != 0 ? MemoryPlanMode::kStatic : MemoryPlanMode::kDynamic;
  static const Program program = AddChain(kInstructions, 64);
  CachingAllocator alloc;
  Executable exe(program, {.allocator = &alloc,
                           .mode = mode,
                           .gc = gc,
                           .threads = 2,
                           .memory_plan = plan,
                           .measure_gc_time = timed});
  Scope scope;
  BindRandomInputs(program, 0, scope);
  exe.Run(scope);  // warm the allocator's cache
  int64_t wall = 0, gc_ns = 0, runs = 0;
  const std::clock_t cpu_start = std::clock();
  for (auto _ : state) {
    RunStats s = exe.Run(scope);
    wall += s.wall_ns;
    gc_ns += s.gc_thread_ns;
    ++runs;
  }
  // Process CPU time: all threads (in parallel mode idle members sleep and cost nothing).
  const double cpu_ns = static_cast<double>(std::clock() - cpu_start) * 1e9 / CLOCKS_PER_SEC;
  state.SetLabel(
      fmt::format("{}/{}/{}{}", Name(mode), Name(gc), Name(plan), timed ? "" : "/untimed"));
  state.counters["ns_per_instruction"] =
      static_cast<double>(wall) / static_cast<double>(runs * kInstructions);
  state.counters["cpu_ns_per_instruction"] = cpu_ns / static_cast<double>(runs * kInstructions);
  state.counters["gc_ns_per_instruction"] =
      static_cast<double>(gc_ns) / static_cast<double>(runs * kInstructions);
}
BENCHMARK(BM_Dispatch)
    ->ArgsProduct({{0, 1}, {0, 1, 2}, {1, 0}, {0}})
    ->ArgsProduct({{0}, {0, 1, 2}, {1, 0}, {1}})
    ->ArgNames({"parallel", "gc", "timed", "static"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_GcCriticalPath(benchmark::State& state) {
  const GcMode gc = kGcModes[state.range(0)];
  static const Program program = BigBuffers(4);
  SystemAllocator alloc;
  Executable exe(program, {.allocator = &alloc, .gc = gc});
  Scope scope;
  BindRandomInputs(program, 0, scope);
  int64_t wall = 0, gc_ns = 0, drain = 0, runs = 0, frees = 0, pending = 0, fallbacks = 0;
  for (auto _ : state) {
    RunStats s = exe.Run(scope);
    wall += s.wall_ns;
    gc_ns += s.gc_thread_ns;
    drain += s.drain_wait_ns;
    frees += s.frees;
    fallbacks += s.sync_fallbacks;
    pending = std::max(pending, s.async_pending_peak_bytes);
    ++runs;
  }
  const double n = static_cast<double>(runs * static_cast<int64_t>(program.instructions().size()));
  state.SetLabel(std::string(Name(gc)));
  state.counters["wall_ns_per_run"] = static_cast<double>(wall) / static_cast<double>(runs);
  state.counters["gc_thread_ns_per_instruction"] = static_cast<double>(gc_ns) / n;
  state.counters["gc_thread_ns_per_free"] =
      frees > 0 ? static_cast<double>(gc_ns) / static_cast<double>(frees) : 0.0;
  state.counters["drain_wait_ns_per_run"] = static_cast<double>(drain) / static_cast<double>(runs);
  state.counters["frees_per_run"] = static_cast<double>(frees) / static_cast<double>(runs);
  state.counters["sync_fallbacks_per_run"] =
      static_cast<double>(fallbacks) / static_cast<double>(runs);
  state.counters["async_pending_peak_bytes"] = static_cast<double>(pending);
}
// Each run maps and first-touches 160 MiB (slow in a VM: see the allocator figures), so few
// iterations.
BENCHMARK(BM_GcCriticalPath)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("gc")
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Forward (keeping what backward reads) then backward, both on one allocator. The pair's peak is
// the larger run peak; its bound is max(forward bound, saved bytes + backward bound).
void BM_PeakMemory(benchmark::State& state) {
  const GcMode gc = kGcModes[state.range(0)];
  static const Program forward = Transformer(8, 64, 128, 256, 4);
  static const Backward backward = [] {
    std::vector<std::string> wrt;
    for (ValueId p : forward.params()) wrt.push_back(forward.value(p).name);
    return BuildBackward(forward, {.loss = "loss", .wrt = wrt});
  }();
  CachingAllocator alloc;
  Executable fwd(forward, {.allocator = &alloc, .gc = gc, .keep = backward.saved});
  Executable bwd(backward.program, {.allocator = &alloc, .gc = gc});
  Scope scope;
  BindRandomInputs(forward, 0, scope);
  int64_t peak = 0, bound = 0, pending = 0;
  for (auto _ : state) {
    RunStats f = fwd.Run(scope);
    RunStats b = bwd.Run(scope);
    peak = std::max({peak, f.peak_allocated_bytes, b.peak_allocated_bytes});
    bound = std::max(
        {f.liveness_lower_bound_bytes, b.baseline_allocated_bytes + b.liveness_lower_bound_bytes});
    pending = std::max({pending, f.async_pending_peak_bytes, b.async_pending_peak_bytes});
  }
  state.SetLabel(std::string(Name(gc)));
  state.counters["instructions"] =
      static_cast<double>(forward.instructions().size() + backward.program.instructions().size());
  state.counters["peak_allocated_bytes"] = static_cast<double>(peak);
  state.counters["liveness_lower_bound_bytes"] = static_cast<double>(bound);
  state.counters["peak_over_bound"] = static_cast<double>(peak) / static_cast<double>(bound);
  state.counters["async_pending_peak_bytes"] = static_cast<double>(pending);
}
BENCHMARK(BM_PeakMemory)
    ->DenseRange(0, 2)
    ->ArgName("gc")
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
