// Kernel benchmarks for the linear algebra and row-wise neural-network kernels (issue 3).
//
//   Gemm/<layer>/<impl>/C:c  GFLOP/s (counter GFLOPs, 2·M·N·K per call) of the products a GPT with
//                         C = 128, 256, 512, 768 runs over B·T = 1024 rows:
//                           qkv   x [1024, C] · W_qkv [C, 3C]
//                           fc    x [1024, C] · W_fc [C, 4C]
//                           proj  h [1024, 4C] · W_proj [4C, C]
//                         through kernels::MatMulBlas and kernels::LinearBlas (GEMM + bias) next to
//                         cblas_sgemm called directly on the same buffers (the ceiling; target
//                         ratio ≥ 0.95).
//   Scores/<impl>/T:t     attention scores q · kᵀ for C = 768 (H = 12 heads of D = 64) and
//                         B = 1024 / T: B·H batched [T, D] · [D, T] products, through MatMulBlas
//                         (transpose_b) and through a plain loop of cblas_sgemm calls.
//   Attention/<dir>/T:t/D:d  fused causal attention (kernels/attention.h), forward or backward,
//                         on a GPT's packed projections: B·T = 2048 positions, C = 384 (H = C / D
//                         heads), T = 64 or 256; GFLOPs counts the GEMMs of the visible (causal)
//                         half, 2·T²·D per head and product (forward 2 products, backward 4).
//   Row/<kernel>/...      bytes_per_second (bytes read + written) of layer norm, RMS norm, softmax
//                         and causal softmax forward, fast and reference kernels, next to a memcpy
//                         of the same bytes (the memory-bandwidth ceiling).
//
// Rates are per CPU second of the benchmark thread, so run GEMMs single-threaded for a fair
// ratio on a shared machine: OPENBLAS_NUM_THREADS=1 build/bench/kernels_bench
//   --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
// (results and the exact command: docs/benchmarks.md, "GEMM and fused kernels (issue 3)").
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "sluice/core/tensor.h"
#include "sluice/kernels/attention.h"
#include "sluice/kernels/blas.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/linear.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/rms_norm.h"
#include "sluice/kernels/softmax.h"

namespace sluice {
namespace {

constexpr int64_t kRows = 1024;  // B·T

Tensor Random(const Shape& shape, float lo = -1, float hi = 1) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

enum class Impl { kCblas, kMatMul, kLinear };

void SetFlops(benchmark::State& state, double flops_per_call) {
  state.counters["GFLOPs"] = benchmark::Counter(
      flops_per_call * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// out [1024, n] = x [1024, k] · w [k, n] (+ b [n] for kLinear).
void BM_Gemm(benchmark::State& state, Impl impl, int64_t k, int64_t n) {
  Tensor x = Random({kRows, k}), w = Random({k, n}), b = Random({n}),
         out = Tensor::Empty({kRows, n}, DType::kF32);
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* po = out.data<float>();
  for (auto _ : state) {
    switch (impl) {
      case Impl::kCblas:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(kRows),
                    static_cast<int>(n), static_cast<int>(k), 1.0f, px, static_cast<int>(k), pw,
                    static_cast<int>(n), 0.0f, po, static_cast<int>(n));
        break;
      case Impl::kMatMul:
        kernels::MatMulBlas<float>(x, w, out, false, false);
        break;
      case Impl::kLinear:
        kernels::LinearBlas<float>(px, pw, b.data<float>(), po, kRows, k, n);
        break;
    }
    benchmark::DoNotOptimize(po);
    benchmark::ClobberMemory();
  }
  SetFlops(state, 2.0 * kRows * static_cast<double>(k) * static_cast<double>(n));
}

// q, k [B·H, T, D] -> scores [B·H, T, T] = q · kᵀ, C = 768 = 12 heads of D = 64, B = 1024 / T.
void BM_Scores(benchmark::State& state, Impl impl, int64_t t) {
  const int64_t d = 64, batch = (kRows / t) * 12;
  Tensor q = Random({batch, t, d}), k = Random({batch, t, d}),
         s = Tensor::Empty({batch, t, t}, DType::kF32);
  for (auto _ : state) {
    if (impl == Impl::kCblas) {
      for (int64_t i = 0; i < batch; ++i) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t),
                    static_cast<int>(t), static_cast<int>(d), 1.0f, q.data<float>() + i * t * d,
                    static_cast<int>(d), k.data<float>() + i * t * d, static_cast<int>(d), 0.0f,
                    s.data<float>() + i * t * t, static_cast<int>(t));
      }
    } else {
      kernels::MatMulBlas<float>(q, k, s, false, true);
    }
    benchmark::DoNotOptimize(s.data<float>());
    benchmark::ClobberMemory();
  }
  SetFlops(state, 2.0 * static_cast<double>(batch * t * t * d));
}

void RegisterGemms() {
  struct Layer {
    const char* name;
    int64_t k_per_c, n_per_c;  // weight [k_per_c·C, n_per_c·C]
  };
  const Layer layers[] = {{"qkv", 1, 3}, {"fc", 1, 4}, {"proj", 4, 1}};
  const std::pair<const char*, Impl> impls[] = {
      {"cblas", Impl::kCblas}, {"matmul", Impl::kMatMul}, {"linear", Impl::kLinear}};
  for (const Layer& layer : layers) {
    for (int64_t c : {128, 256, 512, 768}) {
      for (const auto& [impl_name, impl] : impls) {
        benchmark::RegisterBenchmark(
            fmt::format("Gemm/{}/{}/C:{}", layer.name, impl_name, c).c_str(), BM_Gemm, impl,
            layer.k_per_c * c, layer.n_per_c * c);
      }
    }
  }
  for (int64_t t : {64, 128, 256}) {
    benchmark::RegisterBenchmark(fmt::format("Scores/cblas/T:{}", t).c_str(), BM_Scores,
                                 Impl::kCblas, t);
    benchmark::RegisterBenchmark(fmt::format("Scores/matmul/T:{}", t).c_str(), BM_Scores,
                                 Impl::kMatMul, t);
  }
}

// Row kernels: state.range(0) rows of state.range(1) columns; bytes = x read + y written.
void SetBytes(benchmark::State& state, int64_t elements) {
  state.SetBytesProcessed(state.iterations() * elements * 2 * static_cast<int64_t>(sizeof(float)));
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(1);
  Tensor x = Random({n}), y = Tensor::Empty({n}, DType::kF32);
  for (auto _ : state) {
    std::memcpy(y.data<float>(), x.data<float>(), static_cast<size_t>(n) * sizeof(float));
    benchmark::DoNotOptimize(y.data<float>());
    benchmark::ClobberMemory();
  }
  SetBytes(state, n);
}

template <bool kFast>
void BM_LayerNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), c = state.range(1);
  Tensor x = Random({rows, c}), w = Random({c}), b = Random({c}),
         y = Tensor::Empty({rows, c}, DType::kF32);
  for (auto _ : state) {
    if constexpr (kFast) {
      kernels::LayerNormFast<float>(x.data<float>(), w.data<float>(), b.data<float>(),
                                    y.data<float>(), rows, c, 1e-5f);
    } else {
      kernels::LayerNormReference<float>(x.data<float>(), w.data<float>(), b.data<float>(),
                                         y.data<float>(), rows, c, 1e-5f);
    }
    benchmark::DoNotOptimize(y.data<float>());
    benchmark::ClobberMemory();
  }
  SetBytes(state, rows * c);
}

template <bool kFast>
void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), c = state.range(1);
  Tensor x = Random({rows, c}), w = Random({c}), y = Tensor::Empty({rows, c}, DType::kF32);
  for (auto _ : state) {
    if constexpr (kFast) {
      kernels::RmsNormFast<float>(x.data<float>(), w.data<float>(), y.data<float>(), rows, c,
                                  1e-6f);
    } else {
      kernels::RmsNormReference<float>(x.data<float>(), w.data<float>(), y.data<float>(), rows, c,
                                       1e-6f);
    }
    benchmark::DoNotOptimize(y.data<float>());
    benchmark::ClobberMemory();
  }
  SetBytes(state, rows * c);
}

template <bool kFast>
void BM_Softmax(benchmark::State& state) {
  const int64_t rows = state.range(0), c = state.range(1);
  Tensor x = Random({rows, c}, -8, 8), y = Tensor::Empty({rows, c}, DType::kF32);
  for (auto _ : state) {
    if constexpr (kFast) {
      kernels::SoftmaxFast<float>(x.data<float>(), y.data<float>(), rows, c);
    } else {
      kernels::SoftmaxReference<float>(x.data<float>(), y.data<float>(), rows, c);
    }
    benchmark::DoNotOptimize(y.data<float>());
    benchmark::ClobberMemory();
  }
  SetBytes(state, rows * c);
}

// rows = B·H·T rows of T: scores [B·H, T, T].
template <bool kFast>
void BM_CausalSoftmax(benchmark::State& state) {
  const int64_t rows = state.range(0), t = state.range(1);
  Tensor x = Random({rows, t}, -8, 8), y = Tensor::Empty({rows, t}, DType::kF32);
  for (auto _ : state) {
    if constexpr (kFast) {
      kernels::CausalSoftmaxFast<float>(x.data<float>(), y.data<float>(), rows / t, t);
    } else {
      kernels::CausalSoftmaxReference<float>(x.data<float>(), y.data<float>(), rows / t, t);
    }
    benchmark::DoNotOptimize(y.data<float>());
    benchmark::ClobberMemory();
  }
  SetBytes(state, rows * t);
}

// Causal attention over qkv [B, T, 3C] into y [B, T, C] (the GPT builder's layout), B·T = 2048.
template <bool kBackward>
void BM_Attention(benchmark::State& state) {
  const int64_t t = state.range(0), d = state.range(1), c = 384, h = c / d, b = 2048 / t;
  Tensor qkv = Random({b, t, 3 * c}), y = Tensor::Empty({b, t, c}, DType::kF32),
         lse = Tensor::Empty({b * h, t}, DType::kF32), dy = Random({b, t, c}),
         dqkv = Tensor::Empty({b, t, 3 * c}, DType::kF32);
  const auto in = kernels::AttentionLayout::Packed(h, t, c, 3 * c);
  const auto out = kernels::AttentionLayout::Packed(h, t, c, c);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* q = qkv.data<float>();
  kernels::AttentionFast<float>(q, q + c, q + 2 * c, y.data<float>(), lse.data<float>(), b * h, t,
                                d, scale, {in, in, out});
  for (auto _ : state) {
    if constexpr (kBackward) {
      float* dq = dqkv.data<float>();
      kernels::AttentionGradFast<float>(dy.data<float>(), nullptr, q, q + c, q + 2 * c,
                                        y.data<float>(), lse.data<float>(), dq, dq + c, dq + 2 * c,
                                        b * h, t, d, scale, {in, in, out});
      benchmark::DoNotOptimize(dqkv.data<float>());
    } else {
      kernels::AttentionFast<float>(q, q + c, q + 2 * c, y.data<float>(), lse.data<float>(), b * h,
                                    t, d, scale, {in, in, out});
      benchmark::DoNotOptimize(y.data<float>());
    }
    benchmark::ClobberMemory();
  }
  // The visible half of the [T, T] products: T·(T + 1)/2 dot products of D per head and product.
  SetFlops(state, (kBackward ? 4.0 : 2.0) * static_cast<double>(b * h) * static_cast<double>(t) *
                      static_cast<double>(t + 1) * static_cast<double>(d));
}

// Layer and RMS norm over [B·T, C]; softmax over attention rows [B·H·T, T] (C = 768, H = 12,
// B = 1024/T) and over a vocabulary-sized row block [64, 50304].
void LayerNormShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "C"})->Args({kRows, 128})->Args({kRows, 768});
}
void SoftmaxShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "C"})->Args({12 * kRows, 64})->Args({12 * kRows, 256})->Args({64, 50304});
}
void CausalShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "T"})->Args({12 * kRows, 64})->Args({12 * kRows, 256});
}

BENCHMARK_TEMPLATE(BM_Attention, false)
    ->Name("Attention/forward")
    ->ArgNames({"T", "D"})
    ->Args({64, 32})
    ->Args({256, 64});
BENCHMARK_TEMPLATE(BM_Attention, true)
    ->Name("Attention/backward")
    ->ArgNames({"T", "D"})
    ->Args({64, 32})
    ->Args({256, 64});
BENCHMARK(BM_Memcpy)->Name("Row/memcpy")->Apply(LayerNormShapes)->Apply(SoftmaxShapes);
BENCHMARK_TEMPLATE(BM_LayerNorm, true)->Name("Row/layer_norm_fast")->Apply(LayerNormShapes);
BENCHMARK_TEMPLATE(BM_LayerNorm, false)->Name("Row/layer_norm_reference")->Apply(LayerNormShapes);
BENCHMARK_TEMPLATE(BM_RmsNorm, true)->Name("Row/rms_norm_fast")->Apply(LayerNormShapes);
BENCHMARK_TEMPLATE(BM_RmsNorm, false)->Name("Row/rms_norm_reference")->Apply(LayerNormShapes);
BENCHMARK_TEMPLATE(BM_Softmax, true)->Name("Row/softmax_fast")->Apply(SoftmaxShapes);
BENCHMARK_TEMPLATE(BM_Softmax, false)->Name("Row/softmax_reference")->Apply(SoftmaxShapes);
BENCHMARK_TEMPLATE(BM_CausalSoftmax, true)->Name("Row/causal_softmax_fast")->Apply(CausalShapes);
BENCHMARK_TEMPLATE(BM_CausalSoftmax, false)
    ->Name("Row/causal_softmax_reference")
    ->Apply(CausalShapes);

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  // The GEMM kernels every variant runs, "cblas" included (kernels/blas.h); OPENBLAS_CORETYPE
  // chooses others.
  const sluice::kernels::BlasKernels& blas = sluice::kernels::EnsureBlasKernels();
  benchmark::AddCustomContext("blas", blas.core);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  sluice::RegisterGemms();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
