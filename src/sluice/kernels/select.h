// Kernels of comparisons and selection (ir/ops/select.h), with NumPy broadcasting.
//
// Compare functors give 1 where the relation holds and 0 elsewhere, in the operands' float dtype;
// they run through the binary kernels (kernels/binary.h: BinaryReference, BinaryFast).
// Where picks a where cond is nonzero, b elsewhere: one plain loop with a running multi-index over
// the three operands' broadcast strides (no arithmetic per element beyond an add per operand).
//
// Thread-safety: pure functions of their inputs.
#pragma once

#include <cstdint>

#include "sluice/core/tensor.h"
#include "sluice/kernels/broadcast.h"

namespace sluice::kernels {

template <typename Relation>
struct CompareAs {
  template <typename T>
  T operator()(T a, T b) const {
    return Relation{}(a, b) ? T(1) : T(0);
  }
};

// out[i] = cond[i] != 0 ? a[i] : b[i], each operand broadcast to out's shape.
template <typename T>
void Where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape& s = out.shape();
  const int64_t n = s.numel();
  if (n == 0) return;
  const Strides strides[3] = {BroadcastStrides(cond.shape(), s), BroadcastStrides(a.shape(), s),
                              BroadcastStrides(b.shape(), s)};
  const T* pc = cond.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  if (s.rank() == 0) {
    po[0] = pc[0] != T(0) ? pa[0] : pb[0];
    return;
  }
  const int inner = s.rank() - 1;
  const int64_t inner_n = s[inner];
  int64_t index[kMaxRank] = {};
  int64_t at[3] = {0, 0, 0};  // the offsets of cond, a and b for the row's first element
  for (int64_t o = 0; o < n; o += inner_n) {
    for (int64_t k = 0; k < inner_n; ++k) {
      const int64_t c = at[0] + k * strides[0][inner];
      po[o + k] =
          pc[c] != T(0) ? pa[at[1] + k * strides[1][inner]] : pb[at[2] + k * strides[2][inner]];
    }
    for (int d = inner - 1; d >= 0; --d) {  // advance the outer multi-index
      for (int i = 0; i < 3; ++i) at[i] += strides[i][d];
      if (++index[d] < s[d]) break;
      for (int i = 0; i < 3; ++i) at[i] -= strides[i][d] * s[d];
      index[d] = 0;
    }
  }
}

}  // namespace sluice::kernels
