#include "sluice/kernels/bf16_probe.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "sluice/kernels/bf16_products.h"

namespace sluice::kernels {

namespace {

constexpr int kChains = 12;  // independent accumulators: enough to hide either latency

bool Bit(unsigned reg, int bit) { return ((reg >> bit) & 1u) != 0; }

Bf16Products ReadFlags() {
  Bf16Products p;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return p;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  // The OS must save the zmm state too; GCC's check reads XCR0 as well as CPUID.
  p.avx512f = Bit(ebx, 16) && __builtin_cpu_supports("avx512f");
  p.avx512_vnni = p.avx512f && Bit(ecx, 11);
  p.avx512_fp16 = p.avx512f && Bit(edx, 23);
  p.amx_bf16 = Bit(edx, 22);
  p.amx_tile = Bit(edx, 24);
  const unsigned subleaves = eax;
  if (subleaves >= 1) {
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    p.avx512_bf16 = p.avx512f && Bit(eax, 5);
  }
  return p;
}

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Twelve accumulators written out (an array would live in memory at -O2, and the loop would
// time its loads and stores instead of the instruction), summed so that the loop is kept.
#define SLUICE_TWELVE(step) \
  step(a0);                 \
  step(a1);                 \
  step(a2);                 \
  step(a3);                 \
  step(a4);                 \
  step(a5);                 \
  step(a6);                 \
  step(a7);                 \
  step(a8);                 \
  step(a9);                 \
  step(a10);                \
  step(a11)

__attribute__((target("avx512f"))) float Sum(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4,
                                             __m512 a5, __m512 a6, __m512 a7, __m512 a8, __m512 a9,
                                             __m512 a10, __m512 a11) {
  const __m512 s =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                    _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx512f"))) float FmaLoop(int64_t iterations) {
  // Twelve different starting values, so that the compiler cannot merge the chains.
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
         a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
         a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
         a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0x1p-24f);
#define SLUICE_FMA(a) a = _mm512_fmadd_ps(a, x, y)
  for (int64_t i = 0; i < iterations; ++i) {
    SLUICE_TWELVE(SLUICE_FMA);
  }
#undef SLUICE_FMA
  return Sum(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
}

__attribute__((target("avx512f,avx512bf16"))) float DotLoop(int64_t iterations) {
  // Twelve different starting values, so that the compiler cannot merge the chains.
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
         a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
         a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
         a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
  // bf16 1.0 (0x3f80) and 2^-24 (0x3380) in every half of every lane.
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3380);
#define SLUICE_DOT(a) a = _mm512_dpbf16_ps(a, x, y)
  for (int64_t i = 0; i < iterations; ++i) {
    SLUICE_TWELVE(SLUICE_DOT);
  }
#undef SLUICE_DOT
  return Sum(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
}
#undef SLUICE_TWELVE

}  // namespace

std::string Bf16Products::Flags() const {
  std::vector<const char*> names;
  if (avx512f) names.push_back("avx512f");
  if (avx512_bf16) names.push_back("avx512_bf16");
  if (avx512_fp16) names.push_back("avx512_fp16");
  if (avx512_vnni) names.push_back("avx512_vnni");
  if (amx_bf16) names.push_back("amx_bf16");
  if (amx_tile) names.push_back("amx_tile");
  return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, " "));
}

double MeasureBf16DotVsFma(int rounds, int64_t iterations) {
  static const Bf16Products flags = ReadFlags();
  if (!flags.avx512_bf16 || rounds < 1 || iterations < 1) return 0;
  double fma = 1e300, dot = 1e300;
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {  // alternating, the fastest of each kept
    Clock::time_point t = Clock::now();
    sink = sink + FmaLoop(iterations);
    fma = std::min(fma, Seconds(t));
    t = Clock::now();
    sink = sink + DotLoop(iterations);
    dot = std::min(dot, Seconds(t));
  }
  // vdpbf16ps: 16 lanes × 2 products × 2 flops; vfmadd231ps: 16 lanes × 2 flops.
  return dot > 0 ? (64.0 / dot) / (32.0 / fma) : 0;
}

const Bf16Products& ProbeBf16Products() {
  static const Bf16Products probe = [] {
    Bf16Products p = ReadFlags();
    p.dot_vs_fma = MeasureBf16DotVsFma(5, 40000);
    return p;
  }();
  return probe;
}

std::string DescribeBf16Compute(const Bf16Products& p, bool bf16_compute) {
  const std::string measured =
      p.avx512_bf16 ? fmt::format("bf16 dot products {:.2f}x f32 FMA here", p.dot_vs_fma)
                    : std::string("no AVX512_BF16 here");
  return fmt::format("bf16: storage bf16, compute {} ({}{}; cpu: {})",
                     bf16_compute ? "bf16 (oneDNN)" : "f32", measured, p.amx_bf16 ? ", AMX" : "",
                     p.Flags());
}

std::string DescribeBf16Compute() {
  return DescribeBf16Compute(ProbeBf16Products(), std::string(Bf16GemmEngine()) == "onednn");
}

}  // namespace sluice::kernels
