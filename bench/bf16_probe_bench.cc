// Whether bf16 products pay on this CPU (issue 35): the probe behind the `bf16: storage bf16,
// compute ...` line of `sluice train` and `sluice plan` (kernels/bf16_probe.h), run longer.
//
//   Bf16Probe/dot_vs_fma  counter dot_vs_fma: flops of vdpbf16ps (AVX512_BF16) per flop of
//                         vfmadd231ps, 12 independent zmm accumulators each, the best of 5
//                         alternating rounds of 200,000 iterations per iteration of the benchmark;
//                         label: the CPU's bf16-related flags. 0 without AVX512_BF16.
//
// Run: build/bench/bf16_probe_bench --benchmark_repetitions=5 (JSON with
// --benchmark_format=json); figures and flags: docs/benchmarks.md, "Mixed precision (issue 35)".
#include <benchmark/benchmark.h>

#include "sluice/kernels/bf16_probe.h"

namespace sluice {
namespace {

void BM_Bf16DotVsFma(benchmark::State& state) {
  double ratio = 0;
  for (auto _ : state) {
    ratio = kernels::MeasureBf16DotVsFma(5, 200000);
    benchmark::DoNotOptimize(ratio);
  }
  state.counters["dot_vs_fma"] = ratio;
  state.SetLabel(kernels::ProbeBf16Products().Flags());
}
BENCHMARK(BM_Bf16DotVsFma)->Name("Bf16Probe/dot_vs_fma")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
