// oneDNN's matmul with its epilogue fused (kernels/onednn_matmul.h): a bias row and the tanh GELU
// after the product, f32 and bf16 operands, against the triple loop in double and the project's
// GeluReference; the bias and accumulate checks; the empty sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/core/error.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_products.h"
#include "sluice/kernels/onednn_matmul.h"
#include "sluice/kernels/unary.h"

#include "bf16_test_data.h"

namespace sluice::kernels {
namespace {

using testing_support::RoundToBF16;
using testing_support::Uniform;

// gelu(op(a)·op(b) + bias) in double (gelu only when asked).
std::vector<double> Want(const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<float>& bias, bool ta, bool tb, bool gelu, int64_t m,
                         int64_t n, int64_t k) {
  std::vector<double> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias.empty() ? 0.0 : bias[j];
      for (int64_t p = 0; p < k; ++p) {
        acc += double(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      }
      out[i * n + j] = acc;
    }
  }
  if (gelu) GeluReference<double>(out.data(), out.data(), m * n);
  return out;
}

TEST(OneDnnEpilogue, BiasAndGeluMatchTheTripleLoopForEveryTransposeAndDtype) {
  const int64_t m = 37, n = 29, k = 70;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (bool bias_on : {false, true}) {
          for (bool gelu : {false, true}) {
            if (!bias_on && !gelu) continue;  // the plain product: bf16_test.cc
            std::vector<float> a = Uniform(m * k, 1), b = Uniform(k * n, 2);
            std::vector<float> bias = bias_on ? Uniform(n, 3, 2.0f) : std::vector<float>();
            std::vector<BFloat16> a16, b16;
            if (dtype == DType::kBF16) {
              a16 = RoundToBF16(a);  // the exact operands oneDNN multiplies
              b16 = RoundToBF16(b);
            }
            std::vector<float> c(static_cast<size_t>(m * n), 99.0f);
            const void* pa =
                dtype == DType::kBF16 ? static_cast<const void*>(a16.data()) : a.data();
            const void* pb =
                dtype == DType::kBF16 ? static_cast<const void*>(b16.data()) : b.data();
            OneDnnGemm({.dtype = dtype,
                        .transpose_a = ta,
                        .transpose_b = tb,
                        .m = m,
                        .n = n,
                        .k = k,
                        .bias = bias_on,
                        .gelu = gelu},
                       pa, pb, c.data(), bias_on ? bias.data() : nullptr);
            const std::vector<double> want = Want(a, b, bias, ta, tb, gelu, m, n, k);
            for (int64_t i = 0; i < m * n; ++i) {
              // f32 accumulation of k exact products (bf16_test.cc's bound); GELU's slope is
              // below 1.13, so it keeps the bound.
              ASSERT_NEAR(c[i], want[i], 3e-4)
                  << Name(dtype) << " ta " << ta << " tb " << tb << " bias " << bias_on << " gelu "
                  << gelu << " at " << i;
            }
          }
        }
      }
    }
  }
}

// The fused GELU against the project's: gelu applied by oneDNN to the product + bias against
// GeluReference<float> of the same product + bias computed by oneDNN without the GELU. Inputs
// spread over [-8, 8], where the tanh saturates and where it does not.
TEST(OneDnnEpilogue, FusedGeluIsTheProjectsTanhGeluWithinItsStatedTolerance) {
  const int64_t m = 64, n = 256, k = 32;
  const std::vector<float> a = Uniform(m * k, 4), b = Uniform(k * n, 5, 0.5f),
                           bias = Uniform(n, 6, 2.0f);
  std::vector<float> pre(static_cast<size_t>(m * n)), fused(pre.size()), want(pre.size());
  OneDnnGemm({.m = m, .n = n, .k = k, .bias = true}, a.data(), b.data(), pre.data(), bias.data());
  OneDnnGemm({.m = m, .n = n, .k = k, .bias = true, .gelu = true}, a.data(), b.data(), fused.data(),
             bias.data());
  GeluReference<float>(pre.data(), want.data(), m * n);
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    lo = std::min(lo, pre[i]);
    hi = std::max(hi, pre[i]);
    ASSERT_NEAR(fused[i], want[i], kOneDnnGeluTolerance * (1.0f + std::fabs(want[i])))
        << "pre-activation " << pre[i] << " at " << i;
  }
  EXPECT_LT(lo, -3.0f);  // the inputs reached both tails
  EXPECT_GT(hi, 3.0f);
}

TEST(OneDnnEpilogue, AnEmptySumIsTheBiasThroughTheGelu) {
  const std::vector<float> bias = {-1.0f, 0.0f, 0.5f, 3.0f};
  std::vector<float> c(3 * 4, 7.0f), want(4);
  GeluReference<float>(bias.data(), want.data(), 4);
  OneDnnGemm({.m = 3, .n = 4, .k = 0, .bias = true, .gelu = true}, nullptr, nullptr, c.data(),
             bias.data());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(c[i], want[i % 4]) << i;
  OneDnnGemm({.m = 3, .n = 4, .k = 0, .bias = true}, nullptr, nullptr, c.data(), bias.data());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(c[i], bias[i % 4]) << i;
}

TEST(OneDnnEpilogue, AMissingBiasOrAnEpilogueBesideAccumulateIsAnInternalError) {
  std::vector<float> a = Uniform(4, 7), b = Uniform(4, 8), c(4), bias(2);
  EXPECT_THROW(OneDnnGemm({.m = 2, .n = 2, .k = 2, .bias = true}, a.data(), b.data(), c.data()),
               InternalError);
  EXPECT_THROW(OneDnnGemm({.m = 2, .n = 2, .k = 2}, a.data(), b.data(), c.data(), bias.data()),
               InternalError);
  EXPECT_THROW(OneDnnGemm({.m = 2, .n = 2, .k = 2, .accumulate = true, .gelu = true}, a.data(),
                          b.data(), c.data()),
               InternalError);
}

// Pipeline stages run one cached primitive from several threads at once. Each run must be the
// single-threaded result, bit for bit: with oneDNN's library scratchpad (one per process), an AMX
// product running on two threads at once gave other bits, or NaN.
TEST(OneDnnMatmul, OnePrimitiveOnManyThreadsAtOnceGivesTheOneThreadResult) {
  const int64_t m = 512, n = 384, k = 128;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<float> a = Uniform(m * k, 11), b = Uniform(k * n, 12);
    const std::vector<BFloat16> a16 = RoundToBF16(a), b16 = RoundToBF16(b);
    const void* pa = dtype == DType::kBF16 ? static_cast<const void*>(a16.data()) : a.data();
    const void* pb = dtype == DType::kBF16 ? static_cast<const void*>(b16.data()) : b.data();
    for (const bool tb : {false, true}) {
      const OneDnnGemmShape shape{.dtype = dtype, .transpose_b = tb, .m = m, .n = n, .k = k};
      std::vector<float> want(m * n);
      OneDnnGemm(shape, pa, pb, want.data());
      constexpr int kThreads = 4, kRuns = 16;
      std::vector<int> mismatches(kThreads, 0);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          std::vector<float> c(m * n);
          for (int r = 0; r < kRuns; ++r) {
            OneDnnGemm(shape, pa, pb, c.data());
            if (std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) != 0) ++mismatches[t];
          }
        });
      }
      for (std::thread& t : threads) t.join();
      for (int t = 0; t < kThreads; ++t) {
        EXPECT_EQ(mismatches[t], 0)
            << Name(dtype) << (tb ? " b transposed" : "") << ", thread " << t << " of " << kThreads;
      }
    }
  }
}

// The bf16 products on the onednn engine take oneDNN's scratchpad from their caller (the ops, from
// the executor's allocator, so that the memory forecast counts it): the scratch they ask for holds
// the primitive's scratchpad, and a product run with a caller's poisoned scratchpad on several
// threads at once gives the one-thread result.
TEST(OneDnnMatmul, Bf16ProductsTakeTheScratchpadFromTheirCaller) {
  if (std::string(Bf16GemmEngine()) != "onednn") GTEST_SKIP() << "bf16 products not on oneDNN here";
  // The small GPT's linears (B·T = 1024 rows, C = 128): qkv, the MLP's up and down projections.
  const struct {
    int64_t m, k, n;
  } products[] = {{1024, 128, 384}, {1024, 128, 512}, {1024, 512, 128}};
  for (const auto& p : products) {
    const OneDnnGemmShape shape{.dtype = DType::kBF16, .m = p.m, .n = p.n, .k = p.k};
    const int64_t bytes = OneDnnScratchpadBytes(shape);
    EXPECT_GE(4 * LinearBF16ScratchFloats(p.m, p.k, p.n), bytes) << p.m << "x" << p.k << "x" << p.n;
    std::vector<float> a32 = Uniform(p.m * p.k, 21), b32 = Uniform(p.k * p.n, 22);
    const std::vector<BFloat16> a = RoundToBF16(a32), b = RoundToBF16(b32);
    std::vector<float> want(p.m * p.n);
    OneDnnGemm(shape, a.data(), b.data(), want.data());  // the thread's own scratchpad
    constexpr int kThreads = 3, kRuns = 8;
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<float> scratch(LinearBF16ScratchFloats(p.m, p.k, p.n) + 16);
        auto* aligned = reinterpret_cast<float*>(
            (reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
        std::vector<float> c(p.m * p.n);
        for (int r = 0; r < kRuns; ++r) {
          std::fill(scratch.begin(), scratch.end(), std::nanf(""));
          Bf16Gemm(shape, a.data(), b.data(), c.data(), aligned);
          if (std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) != 0) ++mismatches[t];
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

}  // namespace
}  // namespace sluice::kernels
