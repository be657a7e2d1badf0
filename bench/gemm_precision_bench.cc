// GEMM engines and precisions side by side on the products of the built-in GPT (issue 35): what
// decides which engine runs fp32 GEMMs (kernels.gemm in the training summary) and what bf16 buys.
//
//   GemmPrecision/<model>/<product>/<impl>  GFLOP/s (counter GFLOPs, 2·M·N·K per call)
//     model    small  (C = 128, B·T = 16·64 = 1024 rows: `sluice train` defaults)
//              medium (C = 384, B·T = 8·256 = 2048 rows: docs/benchmarks.md's medium GPT)
//     product  the linear layers' forward products and their two backward ones:
//                qkv, fc, proj        x [rows, k] · W [k, n]     (forward)
//                fc_dx                dy [rows, 4C] · W_fcᵀ       (input gradient, b transposed)
//                fc_dw                xᵀ · dy, x [rows, C]        (weight gradient, a transposed)
//                attn_proj            x [rows, C] · W [C, C]      (the attention's projection)
//                qkv_dx               dy [rows, 3C] · W_attnᵀ     (input gradient, b transposed)
//                proj_dx              dy [rows, C] · W_projᵀ      (the MLP's c_proj, b transposed)
//                proj_dw              hᵀ · dy, h [rows, 4C]       (weight gradient, a transposed)
//     impl     openblas_f32  cblas_sgemm (kernels::Gemm)
//              onednn_f32    oneDNN f32 matmul (kernels::OneDnnGemm)
//              onednn_bf16   oneDNN bf16 operands, f32 accumulation and result
//              sluice_bf16   kernels::Bf16Gemm, the engine --precision bf16 uses (its label:
//                            "openblas" — bf16 operands widened to f32 — or "onednn")
//
// Epilogues (issue 35: bias and GELU fused into the product where oneDNN offers it):
//   LinearGelu/<model>/<threads>t/<impl>  the MLP's first layer, h = gelu(x·W_fc + b), x [rows, C],
//                                         W_fc [C, 4C]; GFLOP/s of the product (2·rows·4C·C), the
//                                         same count for every impl so the rates compare as times
//     openblas_unfused  kernels::LinearBlas (b copied into each row, sgemm with beta 1) into fc,
//     then
//                       kernels::GeluFast into h: what the fp32 `linear` and `gelu` ops run today
//     onednn_bias       oneDNN f32 matmul with b as its bias input into fc, then GeluFast into h
//     onednn_fused      oneDNN f32 matmul, bias and eltwise_gelu_tanh post-op: h only, no fc
//     sluice_bf16       --precision bf16 today: kernels::LinearBF16 into fc, rounded to bf16, then
//                       kernels::GeluBF16Fast into a bf16 h
//     onednn_bf16_fused oneDNN bf16 operands, bias and GELU fused, f32 h rounded to bf16
//   LinearBias/<model>/<product>/<threads>t/<impl>  y = x·W + b alone, impl openblas (LinearBlas)
//   or
//                                         onednn (bias input): the bias half of the epilogue
//   <threads>: 1 or 2; OpenBLAS, oneDNN and the intra-op pool all get that many threads. Rates are
//   per wall-clock second (UseRealTime): with 2 threads CPU time would count one of them.
//
// The label of each onednn row names the implementation oneDNN chose ("brg:avx512_core_bf16"...).
// Rates are per CPU second of the benchmark thread; run single-threaded for a fair ratio on a
// shared machine: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 build/bench/gemm_precision_bench
//   --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true
// (results, the CPU's flags and the command: docs/benchmarks.md, "Mixed precision (issue 35)").
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <random>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/kernels/bf16_activations.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_gemm.h"
#include "sluice/kernels/bf16_products.h"
#include "sluice/kernels/linear.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_matmul.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/unary.h"

namespace sluice {
namespace {

enum class Impl { kOpenBlasF32, kOneDnnF32, kOneDnnBf16, kSluiceBf16, kWidenedBf16, kPackedBf16 };

struct Product {
  const char* name;
  bool transpose_a, transpose_b;
  int64_t m, n, k;
};

std::vector<float> Random(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float& x : v) x = dist(rng);
  return v;
}

void BM_GemmPrecision(benchmark::State& state, Impl impl, Product p) {
  const std::vector<float> a = Random(p.m * p.k), b = Random(p.k * p.n);
  std::vector<BFloat16> a16(a.size()), b16(b.size());
  kernels::ToBF16Fast(a.data(), a16.data(), static_cast<int64_t>(a.size()));
  kernels::ToBF16Fast(b.data(), b16.data(), static_cast<int64_t>(b.size()));
  std::vector<float> c(static_cast<size_t>(p.m * p.n));
  const kernels::OneDnnGemmShape shape{
      .dtype = impl == Impl::kOpenBlasF32 || impl == Impl::kOneDnnF32 ? DType::kF32 : DType::kBF16,
      .transpose_a = p.transpose_a,
      .transpose_b = p.transpose_b,
      .m = p.m,
      .n = p.n,
      .k = p.k};
  int64_t scratch_floats = 0;
  if (impl == Impl::kSluiceBf16) scratch_floats = kernels::Bf16GemmScratchFloats(shape);
  if (impl == Impl::kWidenedBf16) scratch_floats = kernels::WidenedBf16GemmScratchFloats(shape);
  if (impl == Impl::kPackedBf16) scratch_floats = kernels::PackedBf16GemmScratchFloats(shape);
  std::vector<float> scratch(static_cast<size_t>(scratch_floats));
  if (impl == Impl::kSluiceBf16) {
    state.SetLabel(kernels::Bf16GemmEngine());
  } else if (impl == Impl::kOneDnnF32 || impl == Impl::kOneDnnBf16) {
    state.SetLabel(kernels::OneDnnImplementation(shape.dtype, p.m, p.n, p.k));
  }
  for (auto _ : state) {
    switch (impl) {
      case Impl::kOpenBlasF32:
        kernels::Gemm(p.transpose_a, p.transpose_b, p.m, p.n, p.k, 1.0f, a.data(), b.data(), 0.0f,
                      c.data());
        break;
      case Impl::kOneDnnF32:
        kernels::OneDnnGemm(shape, a.data(), b.data(), c.data());
        break;
      case Impl::kOneDnnBf16:
        kernels::OneDnnGemm(shape, a16.data(), b16.data(), c.data());
        break;
      case Impl::kSluiceBf16:
        kernels::Bf16Gemm(shape, a16.data(), b16.data(), c.data(), scratch.data());
        break;
      case Impl::kWidenedBf16:
        kernels::WidenedBf16Gemm(shape, a16.data(), b16.data(), c.data(), scratch.data());
        break;
      case Impl::kPackedBf16:
        kernels::PackedBf16Gemm(shape, a16.data(), b16.data(), c.data(), scratch.data());
        break;
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(p.m * p.n * p.k) * static_cast<double>(state.iterations()) * 1e-9,
      benchmark::Counter::kIsRate);
}

void SetThreads(int threads) {
  kernels::SetBlasThreads(threads);
  kernels::SetOneDnnThreads(threads);
  kernels::SetIntraOpThreads(threads);
}

enum class Epilogue { kOpenBlasUnfused, kOneDnnBias, kOneDnnFused, kSluiceBf16, kOneDnnBf16Fused };

// h = gelu(x·W + b), x [rows, k], W [k, n].
void BM_LinearGelu(benchmark::State& state, Epilogue impl, int64_t rows, int64_t k, int64_t n,
                   int threads) {
  SetThreads(threads);
  const std::vector<float> x = Random(rows * k), w = Random(k * n), bias = Random(n);
  std::vector<BFloat16> x16(x.size()), w16(w.size()), fc16(static_cast<size_t>(rows * n)),
      h16(fc16.size());
  kernels::ToBF16Fast(x.data(), x16.data(), static_cast<int64_t>(x.size()));
  kernels::ToBF16Fast(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  std::vector<float> fc(static_cast<size_t>(rows * n)), h(fc.size()),
      scratch(static_cast<size_t>(kernels::LinearBF16ScratchFloats(rows, k, n)));
  const int64_t elements = rows * n;
  kernels::OneDnnGemmShape shape{.m = rows, .n = n, .k = k, .bias = true};
  if (impl == Epilogue::kOneDnnFused || impl == Epilogue::kOneDnnBf16Fused) shape.gelu = true;
  if (impl == Epilogue::kOneDnnBf16Fused) shape.dtype = DType::kBF16;
  if (impl == Epilogue::kSluiceBf16) state.SetLabel(kernels::Bf16GemmEngine());
  if (impl != Epilogue::kOpenBlasUnfused && impl != Epilogue::kSluiceBf16) {
    state.SetLabel(kernels::OneDnnImplementation(shape));
  }
  for (auto _ : state) {
    switch (impl) {
      case Epilogue::kOpenBlasUnfused:
        kernels::LinearBlas<float>(x.data(), w.data(), bias.data(), fc.data(), rows, k, n);
        kernels::GeluFast<float>(fc.data(), h.data(), elements);
        break;
      case Epilogue::kOneDnnBias:
        kernels::OneDnnGemm(shape, x.data(), w.data(), fc.data(), bias.data());
        kernels::GeluFast<float>(fc.data(), h.data(), elements);
        break;
      case Epilogue::kOneDnnFused:
        kernels::OneDnnGemm(shape, x.data(), w.data(), h.data(), bias.data());
        break;
      case Epilogue::kSluiceBf16:
        kernels::LinearBF16(x16.data(), w16.data(), bias.data(), fc.data(), rows, k, n,
                            scratch.data());
        kernels::ToBF16Fast(fc.data(), fc16.data(), elements);
        kernels::GeluBF16Fast(fc16.data(), h16.data(), elements);
        break;
      case Epilogue::kOneDnnBf16Fused:
        kernels::OneDnnGemm(shape, x16.data(), w16.data(), h.data(), bias.data());
        kernels::ToBF16Fast(h.data(), h16.data(), elements);
        break;
    }
    benchmark::DoNotOptimize(h.data());
    benchmark::DoNotOptimize(h16.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(rows * n * k) * static_cast<double>(state.iterations()) * 1e-9,
      benchmark::Counter::kIsRate);
  SetThreads(1);
}

// y = x·W + b, x [rows, k], W [k, n]: OpenBLAS with the bias copied first, or oneDNN's bias input.
void BM_LinearBias(benchmark::State& state, bool onednn, int64_t rows, int64_t k, int64_t n,
                   int threads) {
  SetThreads(threads);
  const std::vector<float> x = Random(rows * k), w = Random(k * n), bias = Random(n);
  std::vector<float> y(static_cast<size_t>(rows * n));
  const kernels::OneDnnGemmShape shape{.m = rows, .n = n, .k = k, .bias = true};
  if (onednn) state.SetLabel(kernels::OneDnnImplementation(shape));
  for (auto _ : state) {
    if (onednn) {
      kernels::OneDnnGemm(shape, x.data(), w.data(), y.data(), bias.data());
    } else {
      kernels::LinearBlas<float>(x.data(), w.data(), bias.data(), y.data(), rows, k, n);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(rows * n * k) * static_cast<double>(state.iterations()) * 1e-9,
      benchmark::Counter::kIsRate);
  SetThreads(1);
}

void RegisterEpilogues() {
  struct Model {
    const char* name;
    int64_t c, rows;
  };
  const Model models[] = {{"small", 128, 1024}, {"medium", 384, 2048}};
  const std::pair<const char*, Epilogue> impls[] = {
      {"openblas_unfused", Epilogue::kOpenBlasUnfused},
      {"onednn_bias", Epilogue::kOneDnnBias},
      {"onednn_fused", Epilogue::kOneDnnFused},
      {"sluice_bf16", Epilogue::kSluiceBf16},
      {"onednn_bf16_fused", Epilogue::kOneDnnBf16Fused}};
  for (const Model& m : models) {
    const int64_t C = m.c, R = m.rows;
    for (int threads : {1, 2}) {
      for (const auto& [impl_name, impl] : impls) {
        benchmark::RegisterBenchmark(
            fmt::format("LinearGelu/{}/{}t/{}", m.name, threads, impl_name).c_str(), BM_LinearGelu,
            impl, R, C, 4 * C, threads)
            ->UseRealTime();
      }
      const Product products[] = {{"qkv", false, false, R, 3 * C, C},
                                  {"proj", false, false, R, C, C},
                                  {"fc", false, false, R, 4 * C, C},
                                  {"fc_proj", false, false, R, C, 4 * C}};
      for (const Product& p : products) {
        for (bool onednn : {false, true}) {
          benchmark::RegisterBenchmark(fmt::format("LinearBias/{}/{}/{}t/{}", m.name, p.name,
                                                   threads, onednn ? "onednn" : "openblas")
                                           .c_str(),
                                       BM_LinearBias, onednn, p.m, p.k, p.n, threads)
              ->UseRealTime();
        }
      }
    }
  }
}

void Register() {
  RegisterEpilogues();
  struct Model {
    const char* name;
    int64_t c, rows;
  };
  const Model models[] = {{"small", 128, 1024}, {"medium", 384, 2048}};
  const std::pair<const char*, Impl> impls[] = {
      {"openblas_f32", Impl::kOpenBlasF32}, {"onednn_f32", Impl::kOneDnnF32},
      {"onednn_bf16", Impl::kOneDnnBf16},   {"sluice_bf16", Impl::kSluiceBf16},
      {"widened_bf16", Impl::kWidenedBf16}, {"packed_bf16", Impl::kPackedBf16}};
  for (const Model& m : models) {
    const int64_t C = m.c, R = m.rows;
    const Product products[] = {
        {"qkv", false, false, R, 3 * C, C},   {"fc", false, false, R, 4 * C, C},
        {"proj", false, false, R, C, 4 * C},  {"fc_dx", false, true, R, C, 4 * C},
        {"fc_dw", true, false, C, 4 * C, R},  {"attn_proj", false, false, R, C, C},
        {"qkv_dx", false, true, R, C, 3 * C}, {"proj_dx", false, true, R, 4 * C, C},
        {"proj_dw", true, false, 4 * C, C, R}};
    for (const Product& p : products) {
      for (const auto& [impl_name, impl] : impls) {
        benchmark::RegisterBenchmark(
            fmt::format("GemmPrecision/{}/{}/{}", m.name, p.name, impl_name).c_str(),
            BM_GemmPrecision, impl, p);
      }
    }
  }
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  sluice::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
