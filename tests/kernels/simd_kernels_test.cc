// The runtime-dispatched SIMD kernels (kernels/simd_kernels.h) on every target this machine runs:
// each test forces each available target in turn (Highway's SetSupportedTargetsForTest, through
// ForceSimdTarget) and checks the fast kernels against the reference kernels within the bounds the
// header documents.
#include "sluice/kernels/simd_kernels.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "for_each_target.h"
#include "sluice/core/error.h"
#include "sluice/kernels/cross_entropy.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/optimizer.h"
#include "sluice/kernels/rms_norm.h"
#include "sluice/kernels/softmax.h"
#include "sluice/kernels/unary.h"

namespace sluice::kernels {
namespace {

template <typename T>
std::vector<T> Random(int64_t n, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(u(rng));
  return v;
}

// Distance in units in the last place between two finite values of the same sign (or zeros).
template <typename T>
int64_t UlpDistance(T a, T b) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  if (a == b) return 0;
  I ia, ib;
  std::memcpy(&ia, &a, sizeof(T));
  std::memcpy(&ib, &b, sizeof(T));
  if ((ia < 0) != (ib < 0)) return std::numeric_limits<int64_t>::max();
  return ia > ib ? static_cast<int64_t>(ia) - ib : static_cast<int64_t>(ib) - ia;
}

template <typename T>
class SimdKernels : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SimdKernels, FloatTypes);

// Lengths around every vector width (4 to 16 lanes) and odd tails.
constexpr int64_t kLengths[] = {1, 3, 4, 7, 8, 15, 16, 17, 33, 100, 1031};

TYPED_TEST(SimdKernels, ExpIsWithinTwoUlpOfStdExp) {
  using T = TypeParam;
  // The whole finite range of results, down into the subnormals (where ulps are absolute).
  const double lo = sizeof(T) == 4 ? -87.0 : -708.0, hi = sizeof(T) == 4 ? 88.7 : 709.7;
  const std::vector<T> x = Random<T>(4099, 7, lo, hi);
  ForEachTarget([&] {
    std::vector<T> y(x.size());
    ExpFast<T>(x.data(), y.data(), static_cast<int64_t>(x.size()));
    int64_t worst = 0;
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, UlpDistance(y[i], std::exp(x[i])));
    EXPECT_LE(worst, 2);
  });
}

TYPED_TEST(SimdKernels, ExpKeepsSpecialValues) {
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity();
  const std::vector<T> x = {-inf, T(-1e6), T(0), T(1e6), inf, std::numeric_limits<T>::quiet_NaN()};
  ForEachTarget([&] {
    std::vector<T> y(x.size());
    ExpFast<T>(x.data(), y.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(y[0], T(0));
    EXPECT_EQ(y[1], T(0));
    EXPECT_EQ(y[2], T(1));
    EXPECT_EQ(y[3], inf);
    EXPECT_EQ(y[4], inf);
    EXPECT_TRUE(std::isnan(y[5]));
  });
}

TYPED_TEST(SimdKernels, TanhIsWithinFiveUlpOfStdTanh) {
  using T = TypeParam;
  const std::vector<T> x = Random<T>(4099, 8, -12.0, 12.0);
  ForEachTarget([&] {
    std::vector<T> y(x.size());
    TanhFast<T>(x.data(), y.data(), static_cast<int64_t>(x.size()));
    int64_t worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, UlpDistance(y[i], std::tanh(x[i])));
    }
    EXPECT_LE(worst, 5);
  });
}

// GELU and its derivative over ±12 (down to where gelu underflows) against the same function in
// long double: within 2e-6 (f32) / 1e-14 (f64), absolute below 1 and relative above.
TYPED_TEST(SimdKernels, GeluAndItsGradientAreCloseToTheExactValues) {
  using T = TypeParam;
  using L = long double;
  std::vector<T> x = Random<T>(4099, 9, -12.0, 12.0);
  x.insert(x.end(), {T(0), T(-0.0), T(1e-30), T(-1e-30), T(-0.7518), T(30), T(-30)});
  const std::vector<T> dy(x.size(), T(1));
  const double tol = sizeof(T) == 4 ? 2e-6 : 1e-14;
  ForEachTarget([&] {
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<T> y(x.size()), dx(x.size());
    GeluFast<T>(x.data(), y.data(), n);
    GeluGradFast<T>(dy.data(), x.data(), dx.data(), n);
    for (size_t i = 0; i < x.size(); ++i) {
      const L v = x[i], beta = std::sqrt(L(2) / std::acos(L(-1))), kappa = L(0.044715);
      const L u = beta * (v + kappa * v * v * v), s = 1 / (1 + std::exp(-2 * u));
      const L gelu = v * s, grad = s + v * s * (1 - s) * 2 * beta * (1 + 3 * kappa * v * v);
      EXPECT_NEAR(y[i], static_cast<double>(gelu), tol * std::max(1.0, std::abs(double(gelu))))
          << "gelu(" << x[i] << ")";
      EXPECT_NEAR(dx[i], static_cast<double>(grad), tol * std::max(1.0, std::abs(double(grad))))
          << "gelu'(" << x[i] << ")";
    }
  });
}

// Relative error of a against the reference b, with an absolute floor for values near 0.
template <typename T>
void ExpectClose(const std::vector<T>& a, const std::vector<T>& b, double rel, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(1.0, std::abs(static_cast<double>(b[i])));
    ASSERT_NEAR(a[i], b[i], rel * scale) << what << " at " << i;
  }
}

template <typename T>
double Tolerance() {
  return sizeof(T) == 4 ? 2e-6 : 1e-14;
}

TYPED_TEST(SimdKernels, RowKernelsMatchTheReferences) {
  using T = TypeParam;
  ForEachTarget([&] {
    for (int64_t cols : kLengths) {
      const int64_t rows = 3, n = rows * cols;
      const std::vector<T> x = Random<T>(n, 1, -6, 6), dy = Random<T>(n, 2);
      const std::vector<T> w = Random<T>(cols, 3), b = Random<T>(cols, 4);
      std::vector<T> fast(n), ref(n);

      GeluFast<T>(x.data(), fast.data(), n);
      GeluReference<T>(x.data(), ref.data(), n);
      ExpectClose(fast, ref, Tolerance<T>(), "gelu");
      GeluGradFast<T>(dy.data(), x.data(), fast.data(), n);
      GeluGradReference<T>(dy.data(), x.data(), ref.data(), n);
      // 1 ± tanh cancels for large |x|: one ulp of tanh near ∓1 moves gelu' by ~1e-6 in f32.
      ExpectClose(fast, ref, 8 * Tolerance<T>(), "gelu_grad");

      SoftmaxFast<T>(x.data(), fast.data(), rows, cols);
      SoftmaxReference<T>(x.data(), ref.data(), rows, cols);
      ExpectClose(fast, ref, Tolerance<T>(), "softmax");
      const std::vector<T> y = ref;
      SoftmaxGradFast<T>(dy.data(), y.data(), fast.data(), rows, cols);
      SoftmaxGradReference<T>(dy.data(), y.data(), ref.data(), rows, cols);
      ExpectClose(fast, ref, Tolerance<T>(), "softmax_grad");

      LayerNormFast<T>(x.data(), w.data(), b.data(), fast.data(), rows, cols, T(1e-5));
      LayerNormReference<T>(x.data(), w.data(), b.data(), ref.data(), rows, cols, T(1e-5));
      ExpectClose(fast, ref, 4 * Tolerance<T>(), "layer_norm");
      if (cols > 1) {  // one channel: x̂ = 0 and dx is 0 up to rounding in both
        LayerNormGradXFast<T>(dy.data(), x.data(), w.data(), fast.data(), rows, cols, T(1e-5));
        LayerNormGradXReference<T>(dy.data(), x.data(), w.data(), ref.data(), rows, cols, T(1e-5));
        ExpectClose(fast, ref, 16 * Tolerance<T>(), "layer_norm_grad_x");
      }
      std::vector<T> dw(cols), db(cols), dw_ref(cols), db_ref(cols);
      LayerNormGradParamsFast<T>(dy.data(), x.data(), dw.data(), db.data(), rows, cols, T(1e-5));
      LayerNormGradParamsReference<T>(dy.data(), x.data(), dw_ref.data(), db_ref.data(), rows, cols,
                                      T(1e-5));
      ExpectClose(dw, dw_ref, 4 * Tolerance<T>(), "layer_norm dweight");
      ExpectClose(db, db_ref, Tolerance<T>(), "layer_norm dbias");

      RmsNormFast<T>(x.data(), w.data(), fast.data(), rows, cols, T(1e-6));
      RmsNormReference<T>(x.data(), w.data(), ref.data(), rows, cols, T(1e-6));
      ExpectClose(fast, ref, 4 * Tolerance<T>(), "rms_norm");
      if (cols > 1) {  // one channel: x̂ = ±1 and dx is 0 up to rounding in both
        RmsNormGradXFast<T>(dy.data(), x.data(), w.data(), fast.data(), rows, cols, T(1e-6));
        RmsNormGradXReference<T>(dy.data(), x.data(), w.data(), ref.data(), rows, cols, T(1e-6));
        ExpectClose(fast, ref, 16 * Tolerance<T>(), "rms_norm_grad_x");
      }
      RmsNormGradWeightFast<T>(dy.data(), x.data(), dw.data(), rows, cols, T(1e-6));
      RmsNormGradWeightReference<T>(dy.data(), x.data(), dw_ref.data(), rows, cols, T(1e-6));
      ExpectClose(dw, dw_ref, 4 * Tolerance<T>(), "rms_norm dweight");
    }
  });
}

TYPED_TEST(SimdKernels, SumSquaresIsTheDoubleLoopUpToOrder) {
  using T = TypeParam;
  ForEachTarget([&] {
    for (int64_t n :
         {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1031}, int64_t{100003}}) {
      const std::vector<T> x = Random<T>(n, 5, -3, 3);
      double exact = 0;
      for (T v : x) exact += static_cast<double>(v) * static_cast<double>(v);
      const double fast = Simd<T>().sum_squares(x.data(), n);
      EXPECT_NEAR(fast, exact, 1e-13 * exact) << "n = " << n;
    }
    // Squares of f32 values past √FLT_MAX stay finite: they are squared as doubles.
    const std::vector<T> big(33, T(1e20));
    EXPECT_NEAR(Simd<T>().sum_squares(big.data(), 33), 33 * 1e40, 1e-6 * 33 * 1e40);
  });
}

// Batch norm's blocked sums against double loops: within the rounding of 32 f32 additions a
// block (relative 1e-6 of the sum of magnitudes in f32; 1e-13 in f64), a long run (100,003 values,
// 196 blocks) as close as a short one; values offset far from 0 keep Σ (x − shift)² exact enough.
TYPED_TEST(SimdKernels, BlockedSumsAreTheDoubleLoopsWithinRounding) {
  using T = TypeParam;
  const double rel = sizeof(T) == 4 ? 1e-6 : 1e-13;
  ForEachTarget([&] {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{513}, int64_t{100003}}) {
      SCOPED_TRACE("n = " + std::to_string(n));
      const std::vector<T> x = Random<T>(n, 7, 3, 5), g = Random<T>(n, 8);
      const T shift = T(4.1);
      double sum = 0, abs_sum = 0, squares = 0, dy = 0, dy_abs = 0, dot = 0, dot_abs = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i], c = v - static_cast<double>(shift), w = g[i];
        sum += v;
        abs_sum += std::abs(v);
        squares += c * c;
        dy += w;
        dy_abs += std::abs(w);
        dot += w * c;
        dot_abs += std::abs(w * c);
      }
      EXPECT_NEAR(Simd<T>().blocked_sum(x.data(), n), sum, rel * abs_sum);
      EXPECT_NEAR(Simd<T>().centered_squares(x.data(), shift, n), squares, rel * squares);
      double fast_dy = -1, fast_dot = -1;
      Simd<T>().centered_dot(g.data(), x.data(), shift, n, &fast_dy, &fast_dot);
      EXPECT_NEAR(fast_dy, dy, rel * dy_abs);
      EXPECT_NEAR(fast_dot, dot, rel * dot_abs);
    }
  });
}

TYPED_TEST(SimdKernels, BatchNormRowsAreTheirFormulas) {
  using T = TypeParam;
  const double tol = sizeof(T) == 4 ? 1e-6 : 1e-14;
  ForEachTarget([&] {
    for (int64_t n : kLengths) {
      SCOPED_TRACE("n = " + std::to_string(n));
      const std::vector<T> x = Random<T>(n, 9), g = Random<T>(n, 10);
      std::vector<T> y(n + 1, T(7)), dx(n + 1, T(7));
      Simd<T>().affine(x.data(), T(1.5), T(-0.25), y.data(), n);
      Simd<T>().batch_norm_grad_row(g.data(), x.data(), T(0.1), T(0.7), T(0.2), T(1.3), dx.data(),
                                    n);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(y[i], x[i] * 1.5 - 0.25, tol * 4);
        EXPECT_NEAR(dx[i], (g[i] - 0.2 - (x[i] - 0.1) * 0.7) * 1.3, tol * 8);
      }
      EXPECT_EQ(y[n], T(7)) << "nothing past the row is written";
      EXPECT_EQ(dx[n], T(7));
    }
  });
}

// Every register-tile shape (rows 1–4 left over, columns in 4, 2, 1 vectors and a scalar tail),
// A read as itself and as a transpose, beta 0 over a C full of NaN and beta ≠ 0 adding to it.
TYPED_TEST(SimdKernels, SmallGemmIsTheProduct) {
  using T = TypeParam;
  ForEachTarget([&] {
    for (int64_t m : {1, 3, 4, 7, 64}) {
      for (int64_t n : {1, 5, 16, 37, 64, 100}) {
        for (int64_t k : {1, 9, 64}) {
          for (bool transposed : {false, true}) {
            for (T beta : {T(0), T(0.5)}) {
              const std::vector<T> a = Random<T>(m * k, 11), b = Random<T>(k * (n + 3), 12);
              const int64_t ldb = n + 3, ldc = n + 2;
              // A [m, k] row-major, or stored as Aᵀ [k, m].
              const int64_t a_row = transposed ? 1 : k, a_col = transposed ? m : 1;
              std::vector<T> c = Random<T>(m * ldc, 13), want = c;
              if (beta == T(0)) std::fill(c.begin(), c.end(), std::numeric_limits<T>::quiet_NaN());
              for (int64_t i = 0; i < m; ++i) {
                for (int64_t j = 0; j < n; ++j) {
                  double sum = 0;
                  for (int64_t p = 0; p < k; ++p) {
                    sum += static_cast<double>(a[i * a_row + p * a_col]) * b[p * ldb + j];
                  }
                  T& w = want[i * ldc + j];
                  w = static_cast<T>(1.5 * sum + (beta == T(0) ? 0.0 : beta * w));
                }
              }
              Simd<T>().small_gemm(m, n, k, T(1.5), a.data(), a_row, a_col, b.data(), ldb, beta,
                                   c.data(), ldc);
              for (int64_t i = 0; i < m; ++i) {
                for (int64_t j = 0; j < n; ++j) {
                  ASSERT_NEAR(c[i * ldc + j], want[i * ldc + j], 16 * k * Tolerance<T>())
                      << "m " << m << " n " << n << " k " << k << " transposed " << transposed
                      << " beta " << beta << " at " << i << ", " << j;
                }
              }
            }
          }
        }
      }
    }
  });
}

// Whole 8 × 8 blocks and every kind of edge, with strides wider than the rows.
TYPED_TEST(SimdKernels, TransposeMovesEveryElement) {
  using T = TypeParam;
  ForEachTarget([&] {
    for (int64_t rows : {1, 7, 8, 9, 64, 67}) {
      for (int64_t cols : {1, 5, 8, 16, 19}) {
        const int64_t ld = cols + 3, ldd = rows + 2;
        const std::vector<T> src = Random<T>(rows * ld, 14);
        std::vector<T> dst(static_cast<size_t>(cols * ldd), T(-7));
        Simd<T>().transpose(src.data(), ld, rows, cols, dst.data(), ldd);
        for (int64_t c = 0; c < cols; ++c) {
          for (int64_t j = 0; j < ldd; ++j) {
            const T want = j < rows ? src[j * ld + c] : T(-7);  // padding left alone
            ASSERT_EQ(dst[c * ldd + j], want) << rows << " x " << cols << " at " << c << ", " << j;
          }
        }
      }
    }
  });
}

TYPED_TEST(SimdKernels, CausalSoftmaxAndCrossEntropyMatchTheReferences) {
  using T = TypeParam;
  ForEachTarget([&] {
    for (int64_t t : {1, 5, 16, 37}) {
      const int64_t batch = 2, n = batch * t * t;
      const std::vector<T> x = Random<T>(n, 5, -8, 8);
      std::vector<T> fast(n), ref(n);
      CausalSoftmaxFast<T>(x.data(), fast.data(), batch, t);
      CausalSoftmaxReference<T>(x.data(), ref.data(), batch, t);
      ExpectClose(fast, ref, Tolerance<T>(), "causal_softmax");
      for (int64_t i = 0; i < batch * t; ++i) {
        for (int64_t j = i % t + 1; j < t; ++j) EXPECT_EQ(fast[i * t + j], T(0)) << "masked";
      }
    }
    const int64_t tokens = 5;
    for (int64_t vocab : kLengths) {
      const std::vector<T> logits = Random<T>(tokens * vocab, 6, -10, 10);
      std::vector<int64_t> targets(tokens);
      for (int64_t r = 0; r < tokens; ++r) targets[r] = (r * 7) % vocab;
      targets[1] = kIgnoreTarget;
      const T fast = CrossEntropyFast<T, int64_t>(logits.data(), targets.data(), tokens, vocab);
      const T ref = CrossEntropyReference<T, int64_t>(logits.data(), targets.data(), tokens, vocab);
      EXPECT_NEAR(fast, ref, 4 * Tolerance<T>() * std::max(T(1), std::abs(ref)));
      std::vector<T> g(tokens * vocab), g_ref(tokens * vocab);
      CrossEntropyGradFast<T, int64_t>(logits.data(), targets.data(), T(1.5), g.data(), tokens,
                                       vocab);
      CrossEntropyGradReference<T, int64_t>(logits.data(), targets.data(), T(1.5), g_ref.data(),
                                            tokens, vocab);
      ExpectClose(g, g_ref, Tolerance<T>(), "cross_entropy_grad");
    }
  });
}

TYPED_TEST(SimdKernels, OptimizerUpdatesMatchTheReferences) {
  using T = TypeParam;
  ForEachTarget([&] {
    for (int64_t n : kLengths) {
      const std::vector<T> g = Random<T>(n, 9);
      std::vector<T> p = Random<T>(n, 10), m = Random<T>(n, 11, -0.1, 0.1),
                     v = Random<T>(n, 12, 0, 1);
      std::vector<T> p_ref = p, m_ref = m, v_ref = v;
      const AdamWHyper h{.weight_decay = 0.1};
      AdamWUpdateFast<T>(p.data(), g.data(), m.data(), v.data(), n, h, 1e-2, 3);
      AdamWUpdateReference<T>(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, h, 1e-2, 3);
      ExpectClose(p, p_ref, Tolerance<T>(), "adamw param");
      ExpectClose(m, m_ref, Tolerance<T>(), "adamw m");
      ExpectClose(v, v_ref, Tolerance<T>(), "adamw v");

      std::vector<T> q = Random<T>(n, 13), buf = Random<T>(n, 14), q_ref = q, buf_ref = buf;
      const SgdHyper s{.momentum = 0.9, .weight_decay = 0.01};
      SgdUpdateFast<T>(q.data(), g.data(), buf.data(), n, s, 0.1);
      SgdUpdateReference<T>(q_ref.data(), g.data(), buf_ref.data(), n, s, 0.1);
      ExpectClose(q, q_ref, Tolerance<T>(), "sgd param");
      ExpectClose(buf, buf_ref, Tolerance<T>(), "sgd momentum");
    }
  });
}

// The out-of-place forms (post-validation's spares) write bitwise what the in-place forms leave, on
// every target, and leave their inputs as they were — AdamW's outputs 64-byte aligned (streamed
// stores) and one element off (ordinary ones).
TYPED_TEST(SimdKernels, OutOfPlaceOptimizerUpdatesAreBitwiseTheInPlaceOnes) {
  using T = TypeParam;
  struct Free {
    void operator()(T* x) const { std::free(x); }
  };
  const auto aligned = [](int64_t n) {
    const size_t bytes = (static_cast<size_t>(n + 1) * sizeof(T) + 63) / 64 * 64;
    return std::unique_ptr<T, Free>(static_cast<T*>(std::aligned_alloc(64, bytes)));
  };
  ForEachTarget([&] {
    for (int64_t n : kLengths) {
      for (int64_t offset : {0, 1}) {
        const std::vector<T> g = Random<T>(n, 9), p = Random<T>(n, 10),
                             m = Random<T>(n, 11, -0.1, 0.1), v = Random<T>(n, 12, 0, 1);
        std::vector<T> p_in = p, m_in = m, v_in = v;
        auto p_out = aligned(n), m_out = aligned(n), v_out = aligned(n);
        const AdamWHyper h{.weight_decay = 0.1};
        AdamWUpdateFast<T>(p_in.data(), g.data(), m_in.data(), v_in.data(), n, h, 1e-2, 3);
        AdamWUpdateFast<T>(p.data(), g.data(), m.data(), v.data(), p_out.get() + offset,
                           m_out.get() + offset, v_out.get() + offset, n, h, 1e-2, 3);
        const size_t bytes = static_cast<size_t>(n) * sizeof(T);
        EXPECT_EQ(std::memcmp(p_in.data(), p_out.get() + offset, bytes), 0) << "adamw p " << n;
        EXPECT_EQ(std::memcmp(m_in.data(), m_out.get() + offset, bytes), 0) << "adamw m " << n;
        EXPECT_EQ(std::memcmp(v_in.data(), v_out.get() + offset, bytes), 0) << "adamw v " << n;
        EXPECT_EQ(p, Random<T>(n, 10)) << "the out-of-place update wrote its input";
      }
      const std::vector<T> g = Random<T>(n, 9);
      std::vector<T> q = Random<T>(n, 13), buf = Random<T>(n, 14), q_out(n), buf_out(n);
      const std::vector<T> q0 = q, buf0 = buf;
      const SgdHyper s{.momentum = 0.9, .weight_decay = 0.01};
      SgdUpdateFast<T>(q0.data(), g.data(), buf0.data(), q_out.data(), buf_out.data(), n, s, 0.1);
      SgdUpdateFast<T>(q.data(), g.data(), buf.data(), n, s, 0.1);
      EXPECT_EQ(q, q_out) << "sgd param " << n;
      EXPECT_EQ(buf, buf_out) << "sgd momentum " << n;
    }
  });
}

// The equal-shapes rows of kernels/binary.h: one IEEE operation per element, so the bits of the
// scalar loop on every target — special values (zeros of both signs, infinities, NaN, subnormals,
// division by zero) included, in every position of a vector and of the tail.
TYPED_TEST(SimdKernels, BinaryRowsAreBitwiseTheScalarLoop) {
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity();
  const T specials[] = {T(0),
                        T(-0.0),
                        inf,
                        -inf,
                        std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::denorm_min(),
                        T(1),
                        T(-3)};
  ForEachTarget([&] {
    for (int64_t n : kLengths) {
      std::vector<T> a = Random<T>(n, 15), b = Random<T>(n, 16);
      for (int64_t i = 0; i < n; ++i) {
        if (i % 3 == 0) a[i] = specials[(i / 3) % 8];
        if (i % 5 == 0) b[i] = specials[(i / 5 + 3) % 8];
      }
      const SimdRowKernels<T>& k = Simd<T>();
      const struct {
        const char* name;
        void (*row)(const T*, const T*, T*, int64_t);
        T (*scalar)(T, T);
      } ops[] = {{"add", k.add, [](T x, T y) { return x + y; }},
                 {"sub", k.sub, [](T x, T y) { return x - y; }},
                 {"mul", k.mul, [](T x, T y) { return x * y; }},
                 {"div", k.div, [](T x, T y) { return x / y; }}};
      for (const auto& op : ops) {
        std::vector<T> fast(n), ref(n);
        op.row(a.data(), b.data(), fast.data(), n);
        for (int64_t i = 0; i < n; ++i) ref[i] = op.scalar(a[i], b[i]);
        EXPECT_EQ(std::memcmp(fast.data(), ref.data(), n * sizeof(T)), 0) << op.name << " n=" << n;
      }
      // In place: out is a.
      std::vector<T> in_place = a, ref(n);
      k.add(in_place.data(), b.data(), in_place.data(), n);
      for (int64_t i = 0; i < n; ++i) ref[i] = a[i] + b[i];
      EXPECT_EQ(std::memcmp(in_place.data(), ref.data(), n * sizeof(T)), 0) << "add in place";
    }
  });
}

TEST(SimdTargets, AnUnknownTargetIsAnErrorNamingTheAvailableOnes) {
  try {
    ForceSimdTarget("NO_SUCH_ISA");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("NO_SUCH_ISA"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(SimdTargets().front()), std::string::npos) << e.what();
  }
  EXPECT_EQ(SimdTarget(), SimdTargets().front()) << "a failed force leaves the default";
}

// The portable baseline is always compiled in (last, the worst), so a CPU without AVX2 or even
// SSE4 still has a target to run; the tests above run it.
TEST(SimdTargets, TheBaselineIsAvailable) {
  const std::vector<std::string> targets = SimdTargets();
#if defined(__x86_64__)
  EXPECT_EQ(targets.back(), "SCALAR") << ::testing::PrintToString(targets);
#endif
  EXPECT_GE(targets.size(), 1u);
}

}  // namespace
}  // namespace sluice::kernels
