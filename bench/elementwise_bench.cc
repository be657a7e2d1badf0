// Elementwise kernel throughput next to std::memcpy of the same bytes (issue 3).
//
//   Memcpy/bytes:N                 copy N bytes (N read + N written)
//   Gelu{Fast,Reference}/bytes:N   y = gelu(x), x and y f32 of N bytes each
//   GeluGrad{Fast,Reference}/...   dx = dy · gelu'(x): 2N read, N written
//   Exp{Fast,Reference}/bytes:N    y = e^x
//   Relu/bytes:N                   y = max(x, 0)
//   Add{Fast,Reference}/bytes:N    out = a + b, equal shapes: 2N read, N written
//   AddRow{Fast,Reference}/bytes:N out[r, :] = a[r, :] + bias, a [N/4/1024, 1024] f32 (a bias add)
//   Dropout{Fast,Reference}/bytes:N y = dropout(x) at p = 0.1, x [16, N/4/16] f32 under 16 keys
//                                  (a batch's examples): the mask drawn (Philox-4x32-10) and
//                                  applied in one pass, N read, N written
//   DropoutDraws{Fast,Reference}/bytes:N  the N/4 draws alone (Philox-4x32-10 words), N written
//   ToBF16{Fast,Reference}/bytes:N y = x rounded to bf16 (kernels/bf16_convert.h; the onednn
//                                  engine's rounding of a linear's f32 weight): N read, N/2 written
//   FromBF16{Fast,Reference}/bytes:N y = x widened to f32: N/2 read, N written
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
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/binary.h"
#include "sluice/kernels/dropout.h"
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

template <bool kFast>
void Dropout(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor x = Random(bytes), y = Random(bytes);
  std::vector<int64_t> keys(16);
  for (size_t b = 0; b < keys.size(); ++b) keys[b] = static_cast<int64_t>(b) * 7919 + 1;
  for (auto _ : state) {
    (kFast ? kernels::DropoutFast<float>
           : kernels::DropoutReference<float>)(x.data<float>(), y.data<float>(), x.numel(), keys,
                                               /*stream=*/3, /*p=*/0.1);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

template <bool kFast>
void DropoutDraws(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<uint32_t> draws(static_cast<size_t>(bytes / 4));
  for (auto _ : state) {
    (kFast ? kernels::DropoutDrawsFast : kernels::DropoutDrawsReference)(
        /*key=*/12345, /*stream=*/3, /*first=*/0, bytes / 16, draws.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

template <void (*kKernel)(const float*, BFloat16*, int64_t)>
void ToBF16(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor x = Random(bytes);
  std::vector<BFloat16> y(static_cast<size_t>(x.numel()));
  for (auto _ : state) {
    kKernel(x.data<float>(), y.data(), x.numel());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (bytes + bytes / 2));
}

template <void (*kKernel)(const BFloat16*, float*, int64_t)>
void FromBF16(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Tensor y = Random(bytes);
  std::vector<BFloat16> x(static_cast<size_t>(y.numel()));
  kernels::ToBF16Fast(y.data<float>(), x.data(), y.numel());
  for (auto _ : state) {
    kKernel(x.data(), y.data<float>(), y.numel());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (bytes + bytes / 2));
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
BENCHMARK(Dropout<true>)->Name("DropoutFast")->Apply(Sizes);
BENCHMARK(Dropout<false>)->Name("DropoutReference")->Apply(Sizes);
BENCHMARK(DropoutDraws<true>)->Name("DropoutDrawsFast")->Apply(Sizes);
BENCHMARK(DropoutDraws<false>)->Name("DropoutDrawsReference")->Apply(Sizes);
BENCHMARK(ToBF16<kernels::ToBF16Fast>)->Name("ToBF16Fast")->Apply(Sizes);
BENCHMARK(ToBF16<kernels::ToBF16Reference>)->Name("ToBF16Reference")->Apply(Sizes);
BENCHMARK(FromBF16<kernels::FromBF16Fast>)->Name("FromBF16Fast")->Apply(Sizes);
BENCHMARK(FromBF16<kernels::FromBF16Reference>)->Name("FromBF16Reference")->Apply(Sizes);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
