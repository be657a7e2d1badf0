// Setup cost: what the interpreter's analysis (exec/analysis.h) costs before the first run, as
// programs grow. Figures: docs/benchmarks.md, "Setup".
//
//   BM_AnalyzeSharedInput  N sgd_updates sharing one learning-rate input (the in-place-heavy
//                          program of an optimizer step over N parameters): time of Analyze, the
//                          dependency edges it builds (linear: N − 1 for the chain through the
//                          updates; it was N·(N − 1) before the hazards were chained) and the
//                          process's peak RSS after the runs.
//   BM_AnalyzeTransformer  a GPT-like forward of L layers (about 17 instructions per layer): the
//                          same figures for a deep ordinary program.
//
// Run: build/bench/setup_bench --benchmark_format=json (counters carry the figures).
#include <sys/resource.h>

#include <string>

#include <benchmark/benchmark.h>

#include "sluice/exec/analysis.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"

namespace sluice {
namespace {

Program SharedInputUpdates(int n) {
  Builder b("updates");
  Var lr = b.Input("lr", DType::kF32, {});
  for (int i = 0; i < n; ++i) {
    const std::string k = std::to_string(i);
    SgdUpdate(b.Param("p" + k, DType::kF32, {4}), b.Input("g" + k, DType::kF32, {4}),
              b.Param("m" + k, DType::kF32, {4}), lr);
  }
  return b.Build();
}

Program TransformerForward(int layers) {
  constexpr int64_t B = 2, T = 8, C = 16, vocab = 32;
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
    Var probs = CausalSoftmax(Scale(MatMul(q, k, false, true), 0.25));
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

void Report(benchmark::State& state, const Program& program, const ExecutionPlan& plan) {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  state.counters["instructions"] = static_cast<double>(program.instructions().size());
  state.counters["edges"] = static_cast<double>(plan.successors.items.size());
  state.counters["peak_rss_mib"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void BM_AnalyzeSharedInput(benchmark::State& state) {
  const Program program = SharedInputUpdates(static_cast<int>(state.range(0)));
  ExecutionPlan plan;
  for (auto _ : state) {
    plan = Analyze(program, {.order = OrderPolicy::kBest});
    benchmark::DoNotOptimize(plan.order.data());
  }
  Report(state, program, plan);
}
BENCHMARK(BM_AnalyzeSharedInput)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->ArgName("updates")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AnalyzeTransformer(benchmark::State& state) {
  const Program program = TransformerForward(static_cast<int>(state.range(0)));
  ExecutionPlan plan;
  for (auto _ : state) {
    plan = Analyze(program, {.order = OrderPolicy::kBest});
    benchmark::DoNotOptimize(plan.order.data());
  }
  Report(state, program, plan);
}
BENCHMARK(BM_AnalyzeTransformer)
    ->Arg(100)
    ->Arg(1000)
    ->ArgName("layers")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
