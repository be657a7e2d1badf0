// Setup cost: what sluice does before the first instruction runs, as programs grow to a million
// instructions. Figures: docs/benchmarks.md, "Setup".
//
//   BM_AnalyzeSharedInput  N sgd_updates sharing one learning-rate input (the in-place-heavy
//                          program of an optimizer step over N parameters): Analyze alone.
//   BM_AnalyzeGpt          the training programs of a GPT of L layers (nn/gpt.h, tiny dimensions:
//                          the cost of setup depends on the instruction count, not on the sizes),
//                          forward and backward (autodiff/autodiff.h): Analyze of both.
//   BM_SetupSharedInput    the whole setup of the first program from its text: ParseProgram (which
//                          verifies), then the Executable (Verify, Analyze, the interpreter's slot
//                          vectors and GC batches).
//   BM_SetupGpt            the whole setup of the second: BuildGpt, BuildBackward, and an
//                          Executable for each program.
//   BM_BackwardGptBf16     BuildBackward alone, of the GPT under --precision bf16 (a cast of
//                          every block weight, whose gradient is the weight's).
//   BM_PlanBudget          `sluice plan --layers L --stages 4 --dim 16 --heads 2 --memory-budget
//                          200MiB`: ChoosePlan (plan/planner.h) of a GPT of L layers in 4 stages
//                          of 1F1B, 4 micro-batches — the job built, then every recompute policy's
//                          forecast replayed on its model of the caching allocator.
// Counters: instructions (all programs together), edges (dependency edges of the plans: linear,
// N − 1 for the updates' chain through %lr, where a pair per update sharing it was N·(N − 1)),
// peak_rss_mib (the process's peak resident set during the benchmark, the program itself and
// its construction included: the peak is reset before each benchmark) and, for the
// Analyze-only benchmarks, rss_before_mib (resident before Analyze, with the program built).
//
// Run: build/bench/setup_bench --benchmark_format=json (counters carry the figures); one
// benchmark at a time for clean peaks: --benchmark_filter='BM_SetupGpt/layers:1000$'.
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include <benchmark/benchmark.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/analysis.h"
#include "sluice/exec/interpreter.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/text_format.h"
#include "sluice/nn/gpt.h"
#include "sluice/plan/planner.h"

namespace sluice {
namespace {

// Resident set size now and its peak (VmRSS, VmHWM of /proc/self/status), in MiB.
double StatusMiB(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(prefix.size())) / 1024.0;
  }
  return 0;
}

// Returns freed heap to the system and restarts the peak (Linux: clear_refs 5), so that the next
// VmHWM reading is this benchmark's own peak.
void ResetPeakRss() {
  ::malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

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

// A GPT small enough in every dimension that only its depth costs.
GptConfig TinyGpt(int layers) {
  return {.vocab = 8, .seq = 4, .layers = layers, .heads = 1, .dim = 4};
}

Backward GptBackward(const Model& model) {
  GradientSpec spec{.loss = model.loss};
  for (const ParamSpec& p : model.params) spec.wrt.push_back(p.name);
  return BuildBackward(model.forward, spec);
}

void Report(benchmark::State& state, size_t instructions, size_t edges) {
  state.counters["instructions"] = static_cast<double>(instructions);
  state.counters["edges"] = static_cast<double>(edges);
  state.counters["peak_rss_mib"] = StatusMiB("VmHWM");
}

void BM_AnalyzeSharedInput(benchmark::State& state) {
  ResetPeakRss();
  const Program program = SharedInputUpdates(static_cast<int>(state.range(0)));
  state.counters["rss_before_mib"] = StatusMiB("VmRSS");
  ExecutionPlan plan;
  for (auto _ : state) {
    plan = Analyze(program, {.order = OrderPolicy::kBest});
    benchmark::DoNotOptimize(plan.order.data());
  }
  Report(state, program.instructions().size(), plan.successors.items.size());
}
BENCHMARK(BM_AnalyzeSharedInput)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->ArgName("updates")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AnalyzeGpt(benchmark::State& state) {
  ResetPeakRss();
  const Model model = BuildGpt(TinyGpt(static_cast<int>(state.range(0))), 1, GptOutput::kLoss);
  const Backward backward = GptBackward(model);
  state.counters["rss_before_mib"] = StatusMiB("VmRSS");
  ExecutionPlan forward_plan, backward_plan;
  for (auto _ : state) {
    forward_plan = Analyze(model.forward, {.order = OrderPolicy::kBest, .keep = backward.saved});
    backward_plan = Analyze(backward.program, {.order = OrderPolicy::kBest});
    benchmark::DoNotOptimize(forward_plan.order.data());
    benchmark::DoNotOptimize(backward_plan.order.data());
  }
  Report(state, model.forward.instructions().size() + backward.program.instructions().size(),
         forward_plan.successors.items.size() + backward_plan.successors.items.size());
}
// About 60 instructions per layer (forward and backward): 17,000 layers make a million.
BENCHMARK(BM_AnalyzeGpt)
    ->Arg(170)
    ->Arg(1'700)
    ->Arg(17'000)
    ->ArgName("layers")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_SetupSharedInput(benchmark::State& state) {
  const std::string text = PrintProgram(SharedInputUpdates(static_cast<int>(state.range(0))));
  ResetPeakRss();
  size_t instructions = 0, edges = 0;
  for (auto _ : state) {
    Executable exe(ParseProgram(text, "updates"), {});
    instructions = exe.program().instructions().size();
    edges = exe.plan().successors.items.size();
  }
  Report(state, instructions, edges);
}
BENCHMARK(BM_SetupSharedInput)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->ArgName("updates")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_SetupGpt(benchmark::State& state) {
  ResetPeakRss();
  size_t instructions = 0, edges = 0;
  for (auto _ : state) {
    Model model = BuildGpt(TinyGpt(static_cast<int>(state.range(0))), 1, GptOutput::kLoss);
    Backward backward = GptBackward(model);
    Executable forward(std::move(model.forward), {.keep = backward.saved});
    Executable backward_exe(std::move(backward.program), {});
    instructions =
        forward.program().instructions().size() + backward_exe.program().instructions().size();
    edges = forward.plan().successors.items.size() + backward_exe.plan().successors.items.size();
  }
  Report(state, instructions, edges);
}
BENCHMARK(BM_SetupGpt)
    ->Arg(170)
    ->Arg(1'700)
    ->Arg(17'000)
    ->ArgName("layers")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The backward of a bf16 GPT (the autocast pass's casts of every block weight): BuildBackward
// alone, where naming each parameter's gradient once looked through every forward instruction
// for that parameter's casts.
void BM_BackwardGptBf16(benchmark::State& state) {
  GptConfig config = TinyGpt(static_cast<int>(state.range(0)));
  config.precision = Precision::kBf16;
  const Model model = BuildGpt(config, 1, GptOutput::kLoss);
  ResetPeakRss();
  size_t instructions = 0;
  for (auto _ : state) {
    const Backward backward = GptBackward(model);
    instructions = model.forward.instructions().size() + backward.program.instructions().size();
  }
  state.counters["instructions"] = static_cast<double>(instructions);
  state.counters["peak_rss_mib"] = StatusMiB("VmHWM");
}
BENCHMARK(BM_BackwardGptBf16)
    ->Arg(170)
    ->Arg(1'700)
    ->Arg(5'000)
    ->ArgName("layers")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The budget's plan of a deep GPT: five forecasts of every stage (one per recompute policy), each
// a replay of the step on the stage's allocator model, whose headroom returns and backed-window
// searches once walked every live block (quadratic in the layers).
void BM_PlanBudget(benchmark::State& state) {
  TrainConfig config;
  config.gpt = {.vocab = 0, .seq = 0, .layers = state.range(0), .heads = 2, .dim = 16};
  config.microbatches = 4;
  config.threads = 1;
  const PlanRequest request{.config = config,
                            .pipeline = true,
                            .pipe = {.stages = 4},
                            .budget = ParseMemoryBudget("200MiB", 4),
                            .budget_text = "200MiB"};
  ResetPeakRss();
  bool fits = false;
  for (auto _ : state) fits = ChoosePlan(request).plan.fits;
  state.counters["fits"] = fits ? 1 : 0;
  state.counters["peak_rss_mib"] = StatusMiB("VmHWM");
}
BENCHMARK(BM_PlanBudget)
    ->Arg(500)
    ->Arg(1'000)
    ->Arg(2'000)
    ->Arg(4'000)
    ->ArgName("layers")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
