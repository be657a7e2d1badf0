// Row helpers for the fast row-wise kernels (softmax, layer norm, cross-entropy): reductions over
// one contiguous row and a vectorizable exp.
//
// The reductions keep kLanes independent partial results, so the compiler can map them onto SIMD
// registers without reassociating floating-point sums it was not allowed to (no -ffast-math); the
// result therefore differs from a left-to-right sum by rounding only. The reference kernels never
// use these: they sum left to right.
//
// FastExp(x) is e^x for float by range reduction (x = n·ln2 + r, |r| ≤ ln2/2) and a degree-6
// polynomial, branch-free so that a loop over it vectorizes. Within a few ulps of std::exp for
// x in [-87.3, 88]; exactly 0 below -87.3 (results that would be subnormal are flushed, and a −inf
// mask entry becomes an exact 0, as softmax promises) and +inf above 88 (e^x overflows float at
// 88.72). The row kernels only call it on x − max ≤ 0. For double it is std::exp (f64 runs are
// for checks, not speed).
//
// Thread-safety: pure functions. Example:
//   const float m = RowMax(x, n);
//   for (int64_t j = 0; j < n; ++j) y[j] = FastExp(x[j] - m);
//   const float s = RowSum(y, n);
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace sluice::kernels {

inline constexpr int kLanes = 8;

template <typename T>
T RowMax(const T* __restrict x, int64_t n) {
  T acc[kLanes];
  std::fill_n(acc, kLanes, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) acc[u] = acc[u] < x[j + u] ? x[j + u] : acc[u];
  }
  for (; j < n; ++j) acc[0] = acc[0] < x[j] ? x[j] : acc[0];
  return *std::max_element(acc, acc + kLanes);
}

template <typename T>
T RowSum(const T* __restrict x, int64_t n) {
  T acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) acc[u] += x[j + u];
  }
  for (; j < n; ++j) acc[0] += x[j];
  T s = 0;
  for (int u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

// Σ a[j]·b[j].
template <typename T>
T RowDot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) acc[u] += a[j + u] * b[j + u];
  }
  for (; j < n; ++j) acc[0] += a[j] * b[j];
  T s = 0;
  for (int u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

// Σ (x[j] − c)², the centred sum of squares (biased variance · n).
template <typename T>
T RowCentredSquares(const T* __restrict x, T c, int64_t n) {
  T acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) acc[u] += (x[j + u] - c) * (x[j + u] - c);
  }
  for (; j < n; ++j) acc[0] += (x[j] - c) * (x[j] - c);
  T s = 0;
  for (int u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

inline float FastExp(float x) {
  // Clamp so that the exponent arithmetic stays in range; the selects at the end restore the
  // limits (0 below, +inf above). NaN passes through the clamps and the polynomial.
  const float xc = std::min(std::max(x, -87.3f), 88.0f);
  // n = round(x / ln2) by the magic-number trick: adding 1.5·2^23 leaves n in the low mantissa
  // bits of k (no float-to-int conversion, so NaN is harmless and the loop vectorizes).
  constexpr float kMagic = 12582912.0f;
  const float k = xc * 1.44269504088896341f + kMagic;
  const float n = k - kMagic;
  // r = x − n·ln2 in two steps (Cody–Waite) so that r keeps full precision.
  float r = xc - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-6f;
  // e^r for |r| ≤ ln2/2: Taylor terms to r^6, Horner form.
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n by writing n + 127 into the exponent bits (n ∈ [-126, 127] after the clamp).
  const int32_t bits = std::bit_cast<int32_t>(k) - std::bit_cast<int32_t>(kMagic);
  const float scale = std::bit_cast<float>((bits + 127) << 23);
  float e = p * scale;
  e = x < -87.3f ? 0.0f : e;
  e = x > 88.0f ? std::numeric_limits<float>::infinity() : e;
  return e;
}

inline double FastExp(double x) { return std::exp(x); }

}  // namespace sluice::kernels
