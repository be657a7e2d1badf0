// Elementwise kernel throughput next to std::memcpy of the same bytes (issue 3).
//
//   Memcpy/bytes:N                 copy N bytes (N read + N written)
//   Gelu{Fast,Reference}/bytes:N   y = gelu(x), x and y f32 of N bytes each
//   GeluGrad{Fast,Reference}/...   dx = dy · gelu'(x): 2N read, N written
//   Exp{Fast,Reference}/bytes:N    y = e^x
//   Relu/bytes:N                   y = max(x, 0)
//   Add{Fast,Reference}/bytes:N    out = a + b, equal shapes: 2N read, N written
//   AddRow{Fast,Reference}/bytes:N out[r, :] = a[r, :] + bias, a [N/4/1024, 1024] f32 (a bias add)
//
// bytes_per_second counts every byte read and written once, so a kernel that keeps up with memory
// matches Memcpy at the same N. N is the size of one f32 operand: 64 KiB (in L2), 4 MiB and
// 64 MiB (from memory). Results are recorded in docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "sluice/core/tensor.h"
#include "sluice/kernels/binary.h"
#include "sluice/kernels/unary.h"

namespace sluice {
namespace {

void Sizes(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes");
  for (int64_t bytes : {int64_t{64} << 10, int64_t{4} << 20, int64_t{64} << 20}) b->Arg(bytes);
}

// A f32 tensor of `bytes` bytes filled with values in [-4, 4] (GELU's interesting range).
Tensor Random(int64_t bytes, const Shape& shape = {}) {
  const Shape s = shape.rank() > 0 ? shape : Shape{bytes / 4};
  Tensor t = Tensor::Empty(s, DType::kF32);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

void Memcpy(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor src = Random(bytes), dst = Random(bytes);
  for (auto _ : state) {
    std::memcpy(dst.raw_data(), src.raw_data(), static_cast<size_t>(bytes));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

template <void (*kKernel)(const float*, float*, int64_t)>
void Unary(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor x = Random(bytes), y = Random(bytes);
  for (auto _ : state) {
    kKernel(x.data<float>(), y.data<float>(), x.numel());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

template <void (*kKernel)(const float*, const float*, float*, int64_t)>
void UnaryGrad(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor dy = Random(bytes), x = Random(bytes), dx = Random(bytes);
  for (auto _ : state) {
    kKernel(dy.data<float>(), x.data<float>(), dx.data<float>(), x.numel());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * bytes);
}

template <bool kFast>
void Add(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor a = Random(bytes), b = Random(bytes), out = Random(bytes);
  for (auto _ : state) {
    if constexpr (kFast) {
      kernels::BinaryFast<float>(a, b, out, std::plus<>());
    } else {
      kernels::BinaryReference<float>(a, b, out, std::plus<>());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * bytes);
}

template <bool kFast>
void AddRow(benchmark::State& state) {
  const int64_t bytes = state.range(0), cols = 1024, rows = bytes / 4 / cols;
  Tensor a = Random(bytes, Shape{rows, cols}), out = Random(bytes, Shape{rows, cols});
  Tensor bias = Random(cols * 4);
  for (auto _ : state) {
    if constexpr (kFast) {
      kernels::BinaryFast<float>(a, bias, out, std::plus<>());
    } else {
      kernels::BinaryReference<float>(a, bias, out, std::plus<>());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

BENCHMARK(Memcpy)->Apply(Sizes);
BENCHMARK(Unary<kernels::GeluFast<float>>)->Name("GeluFast")->Apply(Sizes);
BENCHMARK(Unary<kernels::GeluReference<float>>)->Name("GeluReference")->Apply(Sizes);
BENCHMARK(UnaryGrad<kernels::GeluGradFast<float>>)->Name("GeluGradFast")->Apply(Sizes);
BENCHMARK(UnaryGrad<kernels::GeluGradReference<float>>)->Name("GeluGradReference")->Apply(Sizes);
BENCHMARK(Unary<kernels::ExpFast<float>>)->Name("ExpFast")->Apply(Sizes);
BENCHMARK(Unary<kernels::ExpReference<float>>)->Name("ExpReference")->Apply(Sizes);
BENCHMARK(Unary<kernels::Relu<float>>)->Name("Relu")->Apply(Sizes);
BENCHMARK(Add<true>)->Name("AddFast")->Apply(Sizes);
BENCHMARK(Add<false>)->Name("AddReference")->Apply(Sizes);
BENCHMARK(AddRow<true>)->Name("AddRowFast")->Apply(Sizes);
BENCHMARK(AddRow<false>)->Name("AddRowReference")->Apply(Sizes);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
