// bf16 conversions (kernels/bf16_convert.h) and oneDNN's matmul (kernels/onednn_matmul.h): the
// scalar rounding against known bit patterns and an independent double-based rounding, the SIMD
// kernels bitwise against the reference on every Highway target, and oneDNN's f32 and bf16
// products against the plain triple loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_products.h"
#include "sluice/kernels/onednn_matmul.h"
#include "sluice/kernels/simd_kernels.h"

#include "bf16_test_data.h"

namespace sluice::kernels {
namespace {

using testing_support::RoundToBF16;
using testing_support::Uniform;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounding to nearest even by arithmetic, not bit tricks: the two bf16 neighbours of x (its
// truncation and the next one up in magnitude), the nearer one, the one with an even last bit on
// a tie.
float RoundedIndependently(float x) {
  const float down = FromBits(Bits(x) & 0xffff0000u);
  const float up = FromBits((Bits(x) & 0xffff0000u) + 0x10000u);
  const double dd = std::fabs(static_cast<double>(x) - down);
  const double du = std::fabs(static_cast<double>(up) - x);
  if (dd < du) return down;
  if (du < dd) return up;
  return ((Bits(down) >> 16) & 1u) == 0 ? down : up;
}

TEST(BF16, RoundsToNearestEvenAtKnownBitPatterns) {
  EXPECT_EQ(FloatToBF16(1.0f).bits, 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f).bits, 0xc000);
  EXPECT_EQ(FloatToBF16(FromBits(0x3f808000u)).bits, 0x3f80);  // tie, 0x3f80 even: down
  EXPECT_EQ(FloatToBF16(FromBits(0x3f818000u)).bits, 0x3f82);  // tie, 0x3f81 odd: up
  EXPECT_EQ(FloatToBF16(FromBits(0x3f808001u)).bits, 0x3f81);  // past the tie: up
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds past max
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(FromBits(0x7f800001u)))));  // low-bit NaN
  EXPECT_EQ(BF16ToFloat(BFloat16{0x3fc0}), 1.5f);
}

TEST(BF16, ScalarRoundingMatchesArithmeticRounding) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = FromBits(bits(rng));
    if (!std::isfinite(x) || std::fabs(x) > 3e38f) continue;
    ASSERT_EQ(BF16ToFloat(FloatToBF16(x)), RoundedIndependently(x)) << "x bits " << Bits(x);
  }
}

// Every length up to a few vectors (tails), specials mixed in.
std::vector<float> Inputs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x(static_cast<size_t>(n));
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::nanf(""),
                            FromBits(0xffc00001u),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            FromBits(0x3f808000u)};
  for (int64_t i = 0; i < n; ++i) {
    x[i] = i % 5 == 0 ? specials[(i / 5) % std::size(specials)] : FromBits(bits(rng));
  }
  return x;
}

TEST(BF16, FastConversionsAreBitwiseTheReferenceOnEveryTarget) {
  for (const std::string& target : SimdTargets()) {
    ForceSimdTarget(target);
    for (int64_t n : {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 1000}) {
      const std::vector<float> x = Inputs(n, static_cast<uint32_t>(n));
      std::vector<BFloat16> fast(x.size()), ref(x.size());
      ToBF16Fast(x.data(), fast.data(), n);
      ToBF16Reference(x.data(), ref.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(fast[i].bits, ref[i].bits) << target << " n " << n << " i " << i;
      }
      std::vector<float> back_fast(x.size()), back_ref(x.size());
      FromBF16Fast(ref.data(), back_fast.data(), n);
      FromBF16Reference(ref.data(), back_ref.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(back_fast[i]), Bits(back_ref[i])) << target << " n " << n << " i " << i;
        ASSERT_EQ(Bits(back_ref[i]), static_cast<uint32_t>(ref[i].bits) << 16);
      }
    }
  }
  ForceSimdTarget("");
}

// c = op(a)·op(b) by a double triple loop over the same (f32 or bf16-rounded) numbers.
std::vector<double> Product(const std::vector<float>& a, const std::vector<float>& b, bool ta,
                            bool tb, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) *
               static_cast<double>(tb ? b[j * k + p] : b[p * n + j]);
      }
      c[i * n + j] = acc;
    }
  }
  return c;
}

TEST(OneDnnGemm, MatchesTheTripleLoopForEveryTransposeDtypeAndAccumulate) {
  const int64_t m = 37, n = 29, k = 70;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (bool accumulate : {false, true}) {
          std::vector<float> a = Uniform(m * k, 1), b = Uniform(k * n, 2);
          // The exact operands oneDNN multiplies: a and b rounded to bf16.
          const std::vector<BFloat16> a16 = RoundToBF16(a), b16 = RoundToBF16(b);
          if (dtype == DType::kF32) {
            a = Uniform(m * k, 1);
            b = Uniform(k * n, 2);
          }
          std::vector<float> c(static_cast<size_t>(m * n), 0.5f);
          const void* pa = dtype == DType::kBF16 ? static_cast<const void*>(a16.data()) : a.data();
          const void* pb = dtype == DType::kBF16 ? static_cast<const void*>(b16.data()) : b.data();
          OneDnnGemm({.dtype = dtype,
                      .transpose_a = ta,
                      .transpose_b = tb,
                      .m = m,
                      .n = n,
                      .k = k,
                      .accumulate = accumulate},
                     pa, pb, c.data());
          const std::vector<double> want = Product(a, b, ta, tb, m, n, k);
          for (int64_t i = 0; i < m * n; ++i) {
            // f32 accumulation of k exact products: within k·ε·Σ|a·b| ≤ 70 · 6e-8 · 70.
            ASSERT_NEAR(c[i], want[i] + (accumulate ? 0.5 : 0.0), 3e-4)
                << Name(dtype) << " ta " << ta << " tb " << tb << " accumulate " << accumulate
                << " at " << i;
          }
        }
      }
    }
  }
}

// The product --precision bf16 runs (either engine), over several widening blocks of k.
TEST(Bf16Gemm, MatchesTheTripleLoopOverSeveralBlocksOfK) {
  const int64_t m = 9, n = 7, k = 2 * kWidenBlock + 37;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool accumulate : {false, true}) {
        std::vector<float> a = Uniform(m * k, 11), b = Uniform(k * n, 12);
        const std::vector<BFloat16> a16 = RoundToBF16(a), b16 = RoundToBF16(b);
        std::vector<float> c(static_cast<size_t>(m * n), 0.25f);
        const OneDnnGemmShape shape{.dtype = DType::kBF16,
                                    .transpose_a = ta,
                                    .transpose_b = tb,
                                    .m = m,
                                    .n = n,
                                    .k = k,
                                    .accumulate = accumulate};
        std::vector<float> scratch(static_cast<size_t>(Bf16GemmScratchFloats(shape)));
        Bf16Gemm(shape, a16.data(), b16.data(), c.data(), scratch.data());
        const std::vector<double> want = Product(a, b, ta, tb, m, n, k);
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_NEAR(c[i], want[i] + (accumulate ? 0.25 : 0.0), 1e-3)
              << Bf16GemmEngine() << " ta " << ta << " tb " << tb << " accumulate " << accumulate
              << " at " << i;
        }
      }
    }
  }
}

TEST(OneDnnGemm, HonoursRowStridesOfMatricesInsideLargerOnes) {
  // a is the left 5 columns of a [4, 9] buffer, c the right 3 columns of a [4, 6] one.
  const int64_t m = 4, n = 3, k = 5;
  std::vector<float> big_a = Uniform(4 * 9, 3), b = Uniform(k * n, 4);
  std::vector<float> c(4 * 6, -7.0f);
  OneDnnGemm({.m = m, .n = n, .k = k, .lda = 9, .ldc = 6}, big_a.data(), b.data(), c.data() + 3);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      if (j < 3) {
        EXPECT_EQ(c[i * 6 + j], -7.0f) << "wrote outside c at " << i << "," << j;
        continue;
      }
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += double(big_a[i * 9 + p]) * b[p * n + (j - 3)];
      EXPECT_NEAR(c[i * 6 + j], want, 1e-5);
    }
  }
}

TEST(OneDnnGemm, MakesEachPrimitiveOnceAndZeroesAnEmptySum) {
  std::vector<float> a = Uniform(6 * 4, 5), b = Uniform(4 * 2, 6), c(6 * 2);
  OneDnnGemm({.m = 6, .n = 2, .k = 4}, a.data(), b.data(), c.data());
  const int64_t made = OneDnnCachedPrimitives();
  for (int i = 0; i < 3; ++i) OneDnnGemm({.m = 6, .n = 2, .k = 4}, a.data(), b.data(), c.data());
  EXPECT_EQ(OneDnnCachedPrimitives(), made);
  OneDnnGemm({.m = 6, .n = 2, .k = 4, .accumulate = true}, a.data(), b.data(), c.data());
  EXPECT_EQ(OneDnnCachedPrimitives(), made + 1);  // another key: another primitive
  OneDnnGemm({.m = 6, .n = 2, .k = 0}, a.data(), b.data(), c.data());
  for (float x : c) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace sluice::kernels
