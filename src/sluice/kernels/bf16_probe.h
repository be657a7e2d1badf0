// Whether bf16 products pay on this CPU: the bf16-related CPU flags (CPUID) and a measured
// throughput ratio, for the run summary, `sluice train`'s and `sluice plan`'s text under
// `--precision bf16`, and bench/bf16_probe_bench.cc.
//
//   dot_vs_fma  flops of `vdpbf16ps` (AVX512_BF16: 16 lanes, each two bf16 products added into an
//               f32 accumulator) per flop of `vfmadd231ps` (16 f32 lanes), both as 12 independent
//               chains of zmm accumulators in registers — the instructions' throughput, no memory.
//               Above 1, a bf16 GEMM can beat an f32 one; this Xeon measures ~0.5 (the
//               instruction runs at a quarter of the FMA's rate), Zen 4 ~2. 0 when the CPU has no
//               AVX512_BF16 (nothing to measure).
//
// The probe does not choose the engine: kernels/bf16_products.h's rule (oneDNN where it sees
// AMX, else f32 compute on widened operands) is static, so that a run's numerics do not depend
// on a timing. The figure only says, beside that choice, what the CPU offers.
//
// Cost: ProbeBf16Products() runs once per process (the first call, ~3 ms: five alternating
// rounds of 40,000 iterations per instruction, the fastest round of each kept, so a busy machine
// moves it little); later calls return the cached result. MeasureBf16DotVsFma(rounds, iterations)
// runs the measurement afresh (the benchmark).
//
// Thread-safety: ProbeBf16Products may be called from any thread (a function-local static).
//
// Example:
//   const kernels::Bf16Products& p = kernels::ProbeBf16Products();
//   fmt::print("{}\n", kernels::DescribeBf16Compute(p, /*bf16_compute=*/false));
//   // bf16: storage bf16, compute f32 (bf16 dot products 0.49x f32 FMA here; cpu: avx512f
//   // avx512_bf16 avx512_fp16 avx512_vnni, no amx)
#pragma once

#include <cstdint>
#include <string>

namespace sluice::kernels {

struct Bf16Products {
  bool avx512f = false, avx512_bf16 = false, avx512_fp16 = false, avx512_vnni = false;
  bool amx_bf16 = false, amx_tile = false;
  double dot_vs_fma = 0;  // 0: not measured (no AVX512_BF16)
  // The flags above that the CPU has, space-separated, /proc/cpuinfo's spelling ("none").
  std::string Flags() const;
  // Whether bf16 products beat f32 ones here: AMX, or dot_vs_fma above 1.
  bool Pay() const { return amx_bf16 || dot_vs_fma > 1.0; }
};

const Bf16Products& ProbeBf16Products();

// The best of `rounds` timings of `iterations` iterations of each loop (12 instructions an
// iteration), as dot_vs_fma above; 0 without AVX512_BF16.
double MeasureBf16DotVsFma(int rounds, int64_t iterations);

// One line for the summaries: "bf16: storage bf16, compute f32 (bf16 dot products 0.49x f32 FMA
// here; cpu: <flags>)"; compute "bf16" when the products run on bf16 instructions (oneDNN).
std::string DescribeBf16Compute(const Bf16Products& p, bool bf16_compute);
// That line for this process: ProbeBf16Products() and the engine kernels/bf16_products.h chose.
std::string DescribeBf16Compute();

}  // namespace sluice::kernels
