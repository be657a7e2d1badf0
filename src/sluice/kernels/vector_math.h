// Vectorized transcendental functions on Vec<T> (kernels/simd.h), for fast kernels whose scalar
// form would call libm once per element (gelu, exp; softmax can use the same ExpVec).
//
// ExpVec(x) = e^x for f32 and f64 lanes, branch-free:
//   x = n·ln2 + r with n = round(x / ln2) and |r| ≤ ln2/2 (ln2 split in a high part that n
//   multiplies exactly and a low part: Cody–Waite reduction), e^r by its Taylor polynomial (degree
//   7 for f32, 13 for f64: truncation error below 6e-9 and 5e-18 relative), then a multiplication
//   by 2^n built from the exponent bits, as two factors 2^(n/2)·2^(n - n/2) so that the whole range
//   — up to the largest finite result and down through the subnormals — is covered.
// Accuracy: within a few ulp of std::exp. Special values: exp(+inf) = +inf, exp(-inf) = 0,
// exp(NaN) = NaN, results that overflow are +inf and results below the smallest subnormal are 0.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <bit>
#include <limits>

#include "sluice/kernels/simd.h"

namespace sluice::kernels {

template <typename T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  static constexpr float kLo = -104.0f;      // e^x rounds to 0 below (smallest subnormal e^-103.3)
  static constexpr float kHi = 88.7228391f;  // ln(FLT_MAX): e^x overflows above
  static constexpr float kMagic = 12582912.0f;   // 1.5·2^23: t + kMagic rounds t to an integer
  static constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits: n·kLn2Hi is exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr int kMantissaBits = 23, kExponentBias = 127, kDegree = 7;
};

template <>
struct ExpConstants<double> {
  static constexpr double kLo = -745.2;
  static constexpr double kHi = 709.782712893384;       // ln(DBL_MAX)
  static constexpr double kMagic = 6755399441055744.0;  // 1.5·2^52
  static constexpr double kLn2Hi = 6.93145751953125e-1;
  static constexpr double kLn2Lo = 1.42860682030941723212e-6;
  static constexpr int kMantissaBits = 52, kExponentBias = 1023, kDegree = 13;
};

// 1/0!, 1/1!, ..., 1/degree!
template <typename T, int kDegree>
constexpr std::array<T, kDegree + 1> InverseFactorials() {
  std::array<T, kDegree + 1> c{};
  c[0] = T(1);
  for (int k = 1; k <= kDegree; ++k) c[k] = c[k - 1] / T(k);
  return c;
}

template <typename T>
inline constexpr auto kExpTaylor = InverseFactorials<T, ExpConstants<T>::kDegree>();

// Σ_{j ≥ k} r^(j - k) / j! by Horner's rule, unrolled at compile time (a loop over the
// coefficients would reload and broadcast each one per call).
template <typename T, int k>
SLUICE_ALWAYS_INLINE inline Vec<T> ExpTaylorTail(Vec<T> r) {
  if constexpr (k == ExpConstants<T>::kDegree) {
    return Splat<T>(kExpTaylor<T>[k]);
  } else {
    return ExpTaylorTail<T, k + 1>(r) * r + kExpTaylor<T>[k];
  }
}

template <typename T>
SLUICE_ALWAYS_INLINE inline Vec<T> ExpVec(Vec<T> x) {
  using C = ExpConstants<T>;
  using I = IntOf<T>;
  // Clamp so that the integer arithmetic below stays in range (NaN passes through unchanged).
  Vec<T> xc = x < C::kLo ? Splat<T>(C::kLo) : x;
  xc = xc > C::kHi ? Splat<T>(C::kHi) : xc;

  // n = round(x / ln2), read both as a float (n_f) and from the low bits of t (n_i).
  const Vec<T> t = xc * T(1.44269504088896340736) + C::kMagic;
  const Vec<T> n_f = t - C::kMagic;
  const IVec<T> n_i = std::bit_cast<IVec<T>>(t) - std::bit_cast<I>(C::kMagic);
  const Vec<T> r = (xc - n_f * C::kLn2Hi) - n_f * C::kLn2Lo;

  // e^r = Σ_k r^k / k!
  const Vec<T> p = ExpTaylorTail<T, 0>(r);

  // 2^n = 2^n1 · 2^n2, each factor a normal number: exponent field (n_k + bias) << mantissa bits.
  const IVec<T> n1 = n_i >> 1;
  const IVec<T> n2 = n_i - n1;
  const Vec<T> scale1 = std::bit_cast<Vec<T>>((n1 + C::kExponentBias) << C::kMantissaBits);
  const Vec<T> scale2 = std::bit_cast<Vec<T>>((n2 + C::kExponentBias) << C::kMantissaBits);
  Vec<T> y = p * scale1 * scale2;

  y = x < C::kLo ? Splat<T>(T(0)) : y;
  return x > C::kHi ? Splat<T>(std::numeric_limits<T>::infinity()) : y;
}

}  // namespace sluice::kernels
