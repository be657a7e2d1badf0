// The packed bf16 GEMM (kernels/bf16_gemm.h) against a double triple loop over the same bf16
// numbers, on every Highway target, for every transpose, accumulate, row strides, shapes with
// partial register tiles and more than one block of m, k and n; and bitwise the same at 1 and 2
// intra-op threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/core/error.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_gemm.h"
#include "sluice/kernels/bf16_products.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

#include "bf16_test_data.h"

namespace sluice::kernels {
namespace {

using testing_support::RoundToBF16;
using testing_support::Uniform;

// The overloads over bf16 b.
constexpr auto* kPacked =
    static_cast<void (*)(const OneDnnGemmShape&, const BFloat16*, const BFloat16*, float*, float*)>(
        &PackedBf16Gemm);
constexpr auto* kWidened = &WidenedBf16Gemm;

struct Case {
  int64_t m, n, k;
  int64_t lda_extra, ldb_extra, ldc_extra;  // row strides past the packed ones
};

OneDnnGemmShape ShapeOf(const Case& t, bool ta, bool tb, int64_t lda, int64_t ldb, int64_t ldc,
                        bool accumulate) {
  return {.dtype = DType::kBF16,
          .transpose_a = ta,
          .transpose_b = tb,
          .m = t.m,
          .n = t.n,
          .k = t.k,
          .lda = lda,
          .ldb = ldb,
          .ldc = ldc,
          .accumulate = accumulate};
}

// c = op(a)·op(b) (+ c) computed by `gemm` from bf16-rounded operands, compared with a double
// triple loop over the same numbers; returns c.
template <typename Gemm, typename Scratch>
std::vector<float> CheckProduct(const Case& t, bool ta, bool tb, bool accumulate, Gemm gemm,
                                Scratch scratch_floats, const std::string& what) {
  const int64_t a_rows = ta ? t.k : t.m, a_cols = ta ? t.m : t.k;
  const int64_t b_rows = tb ? t.n : t.k, b_cols = tb ? t.k : t.n;
  const int64_t lda = a_cols + t.lda_extra, ldb = b_cols + t.ldb_extra, ldc = t.n + t.ldc_extra;
  std::vector<float> a = Uniform(a_rows * lda, 21), b = Uniform(b_rows * ldb, 22);
  const std::vector<BFloat16> a16 = RoundToBF16(a), b16 = RoundToBF16(b);
  std::vector<float> c(static_cast<size_t>(t.m * ldc), 0.25f);
  const OneDnnGemmShape shape = ShapeOf(t, ta, tb, lda, ldb, ldc, accumulate);
  std::vector<float> scratch(static_cast<size_t>(scratch_floats(shape)));
  gemm(shape, a16.data(), b16.data(), c.data(), scratch.data());
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= t.n) {
        EXPECT_EQ(got, 0.25f) << what << ": wrote outside c at " << i << "," << j;
        continue;
      }
      double want = accumulate ? 0.25 : 0.0;
      for (int64_t p = 0; p < t.k; ++p) {
        want += static_cast<double>(ta ? a[p * lda + i] : a[i * lda + p]) *
                static_cast<double>(tb ? b[j * ldb + p] : b[p * ldb + j]);
      }
      // f32 sums of k exact products of numbers in [-1, 1]: within k·ε·k.
      if (std::fabs(got - want) > 1e-7 * static_cast<double>(t.k * t.k) + 1e-6) {
        ADD_FAILURE() << what << " m " << t.m << " n " << t.n << " k " << t.k << " ta " << ta
                      << " tb " << tb << " accumulate " << accumulate << " at " << i << "," << j
                      << ": " << got << " want " << want;
        return c;
      }
    }
  }
  return c;
}

const Case kCases[] = {
    {1, 1, 1, 0, 0, 0},
    {13, 33, 129, 3, 5, 2},                // a partial tile of rows and of columns, two blocks of k
    {221, 70, 2 * 128 + 5, 0, 0, 0},       // 19 tiles of m, KC 256: blocks of 256 and 5
    {5, 600, 2 * 128 + 5, 2, 0, 0},        // two blocks of n, three of k (KC 128)
    {600, 8, 300, 0, 2, 0},                // KC 256: blocks of 256 and 44
    {1000, 8, 800, 1, 0, 0},               // KC 384, a partial last tile
    {7, kPackedGemmNC + 40, 20, 1, 0, 3},  // two blocks of n; b [n, k]: 16 × 16 blocks and 4 k left
};

TEST(PackedBf16Gemm, BlocksOfKAreAsLargeAsTheScratchAllows) {
  EXPECT_EQ(PackedBf16GemmBlockK({.m = 600, .n = 8, .k = 300}), 256);
  EXPECT_EQ(PackedBf16GemmBlockK({.m = 1000, .n = 8, .k = 800}), 384);
  EXPECT_EQ(PackedBf16GemmBlockK({.m = 221, .n = 70, .k = 261}), 256);
  EXPECT_EQ(PackedBf16GemmBlockK({.m = 5, .n = 600, .k = 261}), 128);
}

TEST(PackedBf16Gemm, MatchesTheTripleLoopOnEveryTarget) {
  for (const std::string& target : SimdTargets()) {
    ForceSimdTarget(target);
    for (const Case& t : kCases) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          for (bool accumulate : {false, true}) {
            CheckProduct(t, ta, tb, accumulate, kPacked, PackedBf16GemmScratchFloats,
                         "packed on " + target);
          }
        }
      }
    }
  }
  ForceSimdTarget("");
}

// The rounded product (a linear stored bf16) is bitwise the product added to c = bias, then
// rounded: full and partial tiles, one and several panels, on every target and at 2 threads.
TEST(PackedBf16Gemm, RoundedIsTheProductPlusBiasRounded) {
  for (const std::string& target : SimdTargets()) {
    ForceSimdTarget(target);
    for (const int threads : {1, 2}) {
      SetIntraOpThreads(threads);
      for (const Case& t : {Case{13, 33, 100, 3, 0, 2}, Case{221, kPackedGemmNC + 40, 128, 0, 0, 0},
                            Case{400, 64, 384, 0, 0, 0}}) {
        const int64_t lda = t.k + t.lda_extra, ldc = t.n + t.ldc_extra;
        std::vector<float> a = Uniform(t.m * lda, 31), b = Uniform(t.k * t.n, 32),
                           bias = Uniform(t.n, 33);
        const std::vector<BFloat16> a16 = RoundToBF16(a), b16 = RoundToBF16(b);
        const OneDnnGemmShape shape{
            .dtype = DType::kBF16, .m = t.m, .n = t.n, .k = t.k, .lda = lda, .ldc = ldc};
        ASSERT_TRUE(PackedBf16GemmRoundsInOnePass(shape)) << t.k;
        std::vector<float> scratch(static_cast<size_t>(PackedBf16GemmScratchFloats(shape)));
        std::vector<float> c(static_cast<size_t>(t.m * ldc));
        for (int64_t i = 0; i < t.m; ++i) std::copy_n(bias.data(), t.n, c.data() + i * ldc);
        OneDnnGemmShape accumulate = shape;
        accumulate.accumulate = true;
        PackedBf16Gemm(accumulate, a16.data(), b16.data(), c.data(), scratch.data());
        std::vector<BFloat16> y(c.size(), BFloat16{0x1234});
        PackedBf16GemmRounded(shape, a16.data(), b16.data(), bias.data(), y.data(), scratch.data());
        for (int64_t i = 0; i < t.m; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const BFloat16 want = j < t.n ? FloatToBF16(c[i * ldc + j]) : BFloat16{0x1234};
            ASSERT_EQ(y[i * ldc + j].bits, want.bits)
                << target << " threads " << threads << " m " << t.m << " n " << t.n << " k " << t.k
                << " at " << i << "," << j;
          }
        }
      }
    }
  }
  SetIntraOpThreads(1);
  ForceSimdTarget("");
  // k past one block: the sums are not final at the tile.
  const OneDnnGemmShape two_blocks{.dtype = DType::kBF16, .m = 5, .n = 600, .k = 261};
  EXPECT_FALSE(PackedBf16GemmRoundsInOnePass(two_blocks));
  EXPECT_THROW(PackedBf16GemmRounded(two_blocks, nullptr, static_cast<const BFloat16*>(nullptr),
                                     nullptr, nullptr, nullptr),
               InternalError);
}

// b f32 rounded as it is packed: bitwise the product of b cast to bf16 first, for every transpose
// and row stride, on every target, plain, accumulated and rounded (ties to even and a value
// rounding to infinity among b's elements).
TEST(PackedBf16Gemm, AnF32BRoundedOnLoadGivesTheBitsOfItsCast) {
  for (const std::string& target : SimdTargets()) {
    ForceSimdTarget(target);
    for (const Case& t : kCases) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const int64_t lda = (ta ? t.m : t.k) + t.lda_extra, ldb = (tb ? t.k : t.n) + t.ldb_extra,
                        ldc = t.n + t.ldc_extra;
          std::vector<float> a = Uniform((ta ? t.k : t.m) * lda, 41);
          const std::vector<BFloat16> a16 = RoundToBF16(a);
          std::vector<float> b = Uniform((tb ? t.n : t.k) * ldb, 42);
          b[0] = 1.0f + 0x1p-8f;                                        // a tie: to 1 (even)
          if (b.size() > 2) b[1] = 1.0f + 3 * 0x1p-8f, b[2] = 3.3e38f;  // a tie up; to infinity
          std::vector<BFloat16> b16(b.size());
          ToBF16Reference(b.data(), b16.data(), static_cast<int64_t>(b.size()));
          const OneDnnGemmShape shape = ShapeOf(t, ta, tb, lda, ldb, ldc, false);
          std::vector<float> scratch(static_cast<size_t>(PackedBf16GemmScratchFloats(shape)));
          std::vector<float> want(static_cast<size_t>(t.m * ldc), 0.25f), got = want;
          PackedBf16Gemm(shape, a16.data(), b16.data(), want.data(), scratch.data());
          PackedBf16Gemm(shape, a16.data(), b.data(), got.data(), scratch.data());
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
              << target << " m " << t.m << " n " << t.n << " k " << t.k << " ta " << ta << " tb "
              << tb;
          if (ta || !PackedBf16GemmRoundsInOnePass(shape)) continue;
          const std::vector<float> bias = Uniform(t.n, 43);
          std::vector<BFloat16> y_want(want.size()), y_got(want.size());
          PackedBf16GemmRounded(shape, a16.data(), b16.data(), bias.data(), y_want.data(),
                                scratch.data());
          PackedBf16GemmRounded(shape, a16.data(), b.data(), bias.data(), y_got.data(),
                                scratch.data());
          ASSERT_EQ(std::memcmp(y_want.data(), y_got.data(), y_want.size() * 2), 0)
              << target << " rounded m " << t.m << " n " << t.n << " k " << t.k << " tb " << tb;
        }
      }
    }
  }
  ForceSimdTarget("");
}

TEST(PackedBf16Gemm, WidenedEngineMatchesTheTripleLoopToo) {
  for (const Case& t : kCases) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CheckProduct(t, ta, tb, true, kWidened, WidenedBf16GemmScratchFloats, "widened");
      }
    }
  }
}

TEST(PackedBf16Gemm, GivesTheSameBitsAtOneAndTwoThreads) {
  const Case t{221, kPackedGemmNC + 40, 131, 0, 0, 0};
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SetIntraOpThreads(1);
      const std::vector<float> one =
          CheckProduct(t, ta, tb, false, kPacked, PackedBf16GemmScratchFloats, "1 thread");
      SetIntraOpThreads(2);
      const std::vector<float> two =
          CheckProduct(t, ta, tb, false, kPacked, PackedBf16GemmScratchFloats, "2 threads");
      SetIntraOpThreads(1);
      ASSERT_EQ(one.size(), two.size());
      EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0)
          << "ta " << ta << " tb " << tb;
    }
  }
}

TEST(PackedBf16Gemm, ScratchIsAtMostTheWidenedEngines) {
  // The GPT's products: the packed engine's blocks never take more than the widened blocks did.
  for (int64_t c : {128, 384}) {
    for (int64_t rows : {1024, 2048}) {
      const OneDnnGemmShape shapes[] = {
          {.dtype = DType::kBF16, .m = rows, .n = 3 * c, .k = c},
          {.dtype = DType::kBF16, .m = rows, .n = c, .k = 4 * c},
          {.dtype = DType::kBF16, .transpose_a = true, .m = c, .n = 4 * c, .k = rows}};
      for (const OneDnnGemmShape& s : shapes) {
        EXPECT_LE(PackedBf16GemmScratchFloats(s), WidenedBf16GemmScratchFloats(s))
            << "m " << s.m << " n " << s.n << " k " << s.k;
      }
    }
  }
}

}  // namespace
}  // namespace sluice::kernels
