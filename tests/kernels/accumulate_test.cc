#include "sluice/kernels/accumulate.h"

#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace sluice::kernels {
namespace {

template <typename T>
std::vector<T> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(u(rng));
  return v;
}

template <typename T>
class Accumulate : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Accumulate, FloatTypes);

// Lengths around the vector widths and an odd tail.
constexpr int64_t kLengths[] = {0, 1, 7, 8, 33, 1000, 4099};

TYPED_TEST(Accumulate, AxpyOfOneIsBitwiseTheReference) {
  using T = TypeParam;
  for (int64_t n : kLengths) {
    const std::vector<T> x = Random<T>(n, 1);
    std::vector<T> fast = Random<T>(n, 2), ref = fast;
    AxpyBlas<T>(x.data(), fast.data(), n, T(1));
    AxpyReference<T>(x.data(), ref.data(), n, T(1));
    EXPECT_EQ(fast, ref) << "n = " << n;
  }
}

TYPED_TEST(Accumulate, AxpyMatchesTheReference) {
  using T = TypeParam;
  for (int64_t n : kLengths) {
    const std::vector<T> x = Random<T>(n, 3);
    std::vector<T> fast = Random<T>(n, 4), ref = fast;
    AxpyBlas<T>(x.data(), fast.data(), n, T(-0.3));
    AxpyReference<T>(x.data(), ref.data(), n, T(-0.3));
    for (int64_t i = 0; i < n; ++i) {
      // One fused or two rounded operations: within an ulp of the larger term.
      EXPECT_NEAR(fast[i], ref[i], 4 * std::numeric_limits<T>::epsilon())
          << "n = " << n << ", i = " << i;
    }
  }
}

TYPED_TEST(Accumulate, ScaleInPlaceIsBitwiseTheReference) {
  using T = TypeParam;
  for (int64_t n : kLengths) {
    std::vector<T> fast = Random<T>(n, 5), ref = fast;
    ScaleInPlaceBlas<T>(fast.data(), n, T(1) / T(3));
    ScaleInPlaceReference<T>(ref.data(), n, T(1) / T(3));
    EXPECT_EQ(fast, ref) << "n = " << n;
  }
}

TYPED_TEST(Accumulate, ZeroLengthTouchesNothing) {
  using T = TypeParam;
  T x = T(1), y = T(2);
  AxpyBlas<T>(&x, &y, 0, T(1));
  ScaleInPlaceBlas<T>(&y, 0, T(5));
  EXPECT_EQ(y, T(2));
}

}  // namespace
}  // namespace sluice::kernels
