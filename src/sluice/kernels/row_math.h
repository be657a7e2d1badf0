// Row reductions for the fast row-wise kernels (softmax, layer norm, cross-entropy): one
// contiguous row of n elements in, one scalar out, on explicit vectors (kernels/simd.h) so that
// they vectorize at -O2 without -ffast-math. Partial results are kept per lane and added at the
// end, so a result differs from a left-to-right sum by rounding only; the reference kernels never
// use these helpers. A row's tail (n not a multiple of the lane count) is loaded padded with the
// reduction's neutral element, so every element goes through the same vector code.
//
// Exponentials use ExpVec (kernels/vector_math.h): e^(−inf) is exactly 0, so masked entries add
// nothing to a softmax sum.
//
// Thread-safety: pure functions.
//
// Example (a softmax row):
//   const float m = RowMax(x, n);
//   const float inv = 1.0f / RowExp(x, m, y, n);   // y = e^(x − m)
//   ForEachBlocked(n, [&](int64_t j) { y[j] *= inv; });
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "sluice/kernels/simd.h"
#include "sluice/kernels/vector_math.h"

namespace sluice::kernels {

// The `count` (< lanes) elements at p, the remaining lanes set to `fill`.
template <typename T>
Vec<T> LoadPadded(const T* p, int64_t count, T fill) {
  Vec<T> v = Splat<T>(fill);
  for (int64_t u = 0; u < count; ++u) v[u] = p[u];  // a few scalar moves, cheaper than memcpy
  return v;
}

template <typename T>
T LaneSum(Vec<T> v) {
  T s = 0;
  for (int u = 0; u < kLanes<T>; ++u) s += v[u];
  return s;
}

// max_j x[j]; −inf for an empty row.
template <typename T>
T RowMax(const T* x, int64_t n) {
  constexpr T kLow = -std::numeric_limits<T>::infinity();
  Vec<T> acc = Splat<T>(kLow);
  int64_t j = 0;
  for (; j + kLanes<T> <= n; j += kLanes<T>) {
    const Vec<T> v = Load(x + j);
    acc = acc < v ? v : acc;
  }
  if (j < n) {
    const Vec<T> v = LoadPadded(x + j, n - j, kLow);
    acc = acc < v ? v : acc;
  }
  T m = kLow;
  for (int u = 0; u < kLanes<T>; ++u) m = std::max(m, acc[u]);
  return m;
}

// Σ_j x[j].
template <typename T>
T RowSum(const T* x, int64_t n) {
  Vec<T> acc = Splat<T>(0);
  int64_t j = 0;
  for (; j + kLanes<T> <= n; j += kLanes<T>) acc += Load(x + j);
  if (j < n) acc += LoadPadded(x + j, n - j, T(0));
  return LaneSum<T>(acc);
}

// Σ_j a[j]·b[j].
template <typename T>
T RowDot(const T* a, const T* b, int64_t n) {
  Vec<T> acc = Splat<T>(0);
  int64_t j = 0;
  for (; j + kLanes<T> <= n; j += kLanes<T>) acc += Load(a + j) * Load(b + j);
  if (j < n) acc += LoadPadded(a + j, n - j, T(0)) * LoadPadded(b + j, n - j, T(0));
  return LaneSum<T>(acc);
}

// Σ_j (x[j] − c)²: the centred sum of squares (n times the biased variance when c is the mean).
template <typename T>
T RowCentredSquares(const T* x, T c, int64_t n) {
  Vec<T> acc = Splat<T>(0);
  int64_t j = 0;
  for (; j + kLanes<T> <= n; j += kLanes<T>) {
    const Vec<T> d = Load(x + j) - c;
    acc += d * d;
  }
  if (j < n) {
    const Vec<T> d = LoadPadded(x + j, n - j, c) - c;
    acc += d * d;
  }
  return LaneSum<T>(acc);
}

// y[j] = e^(x[j] − shift); returns Σ_j y[j]. With y == nullptr only the sum is computed.
template <typename T>
T RowExp(const T* x, T shift, T* y, int64_t n) {
  Vec<T> acc = Splat<T>(0);
  int64_t j = 0;
  for (; j + kLanes<T> <= n; j += kLanes<T>) {
    const Vec<T> e = ExpVec<T>(Load(x + j) - shift);
    if (y) Store(y + j, e);
    acc += e;
  }
  if (j < n) {
    // Padding with −inf gives e = 0 in the unused lanes.
    const Vec<T> e =
        ExpVec<T>(LoadPadded(x + j, n - j, -std::numeric_limits<T>::infinity()) - shift);
    if (y) {
      for (int64_t u = 0; u < n - j; ++u) y[j + u] = e[u];
    }
    acc += e;
  }
  return LaneSum<T>(acc);
}

}  // namespace sluice::kernels
