// Elementwise binary kernels with NumPy broadcasting: out = f(a, b), out contiguous of the
// broadcast shape, a and b contiguous.
//
// BinaryReference is the plain version: one multi-index computation per element.
// BinaryFast takes the common shapes straight: equal shapes, a scalar operand, and b repeating
// along the leading axes (bias rows); everything else goes through ForEachBroadcast.
#pragma once

#include <cstdint>

#include "sluice/core/tensor.h"
#include "sluice/kernels/broadcast.h"

namespace sluice::kernels {

template <typename T, typename F>
void BinaryReference(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const Shape& s = out.shape();
  const Strides sa = BroadcastStrides(a.shape(), s), sb = BroadcastStrides(b.shape(), s);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for (int64_t i = 0, n = s.numel(); i < n; ++i) {
    // Decompose the flat output index into a multi-index, axis by axis from the last.
    int64_t rem = i, ia = 0, ib = 0;
    for (int d = s.rank() - 1; d >= 0; --d) {
      int64_t k = rem % s[d];
      rem /= s[d];
      ia += k * sa[d];
      ib += k * sb[d];
    }
    po[i] = f(pa[ia], pb[ib]);
  }
}

template <typename T, typename F>
void BinaryFast(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const T* __restrict pa = a.data<T>();
  const T* __restrict pb = b.data<T>();
  T* __restrict po = out.data<T>();
  const int64_t n = out.numel();
  if (a.shape() == out.shape() && b.shape() == out.shape()) {
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return;
  }
  if (a.shape() == out.shape() && b.numel() == 1) {
    const T s = pb[0];
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], s);
    return;
  }
  if (b.shape() == out.shape() && a.numel() == 1) {
    const T s = pa[0];
    for (int64_t i = 0; i < n; ++i) po[i] = f(s, pb[i]);
    return;
  }
  // b is a row repeated along the leading axes of a (e.g. a bias [C] added to [B, T, C]).
  const int64_t m = b.numel();
  if (a.shape() == out.shape() && m > 0 && n % m == 0 && b.rank() <= out.rank()) {
    bool trailing = true;
    for (int i = 1; i <= b.rank(); ++i) trailing &= b.shape()[b.rank() - i] == out.shape()[out.rank() - i];
    if (trailing) {
      for (int64_t r = 0; r < n; r += m) {
        for (int64_t j = 0; j < m; ++j) po[r + j] = f(pa[r + j], pb[j]);
      }
      return;
    }
  }
  ForEachBroadcast(out.shape(), BroadcastStrides(a.shape(), out.shape()),
                   BroadcastStrides(b.shape(), out.shape()),
                   [&](int64_t o, int64_t ia, int64_t ib) { po[o] = f(pa[ia], pb[ib]); });
}

}  // namespace sluice::kernels
