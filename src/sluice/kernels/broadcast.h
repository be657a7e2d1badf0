// Broadcast iteration for elementwise kernels.
//
// BroadcastStrides gives, for an input of shape `in` broadcast to shape `out`, the element stride
// of each output axis in the (contiguous) input: 0 where the input is stretched. ForEachBroadcast
// walks a contiguous output of shape `out` in row-major order and calls f(out_index, a_index,
// b_index) with the matching input offsets; it keeps a running multi-index, so the cost per element
// is an increment, not a division per axis.
#pragma once

#include <cstdint>

#include "sluice/core/shape.h"

namespace sluice::kernels {

inline Strides BroadcastStrides(const Shape& in, const Shape& out) {
  Strides s{};
  Strides contiguous = in.ContiguousStrides();
  const int offset = out.rank() - in.rank();
  for (int i = 0; i < out.rank(); ++i) {
    int j = i - offset;
    s[i] = (j >= 0 && in[j] != 1) ? contiguous[j] : 0;
  }
  return s;
}

template <typename F>
void ForEachBroadcast(const Shape& out, const Strides& sa, const Strides& sb, F&& f) {
  const int rank = out.rank();
  const int64_t n = out.numel();
  if (n == 0) return;
  if (rank == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  // The innermost axis runs as a tight loop; outer axes advance a multi-index.
  const int inner = rank - 1;
  const int64_t inner_n = out[inner];
  const int64_t ia_step = sa[inner], ib_step = sb[inner];
  int64_t index[kMaxRank] = {};
  int64_t a = 0, b = 0;
  for (int64_t o = 0; o < n; o += inner_n) {
    int64_t ai = a, bi = b;
    for (int64_t k = 0; k < inner_n; ++k, ai += ia_step, bi += ib_step) f(o + k, ai, bi);
    for (int d = inner - 1; d >= 0; --d) {
      a += sa[d];
      b += sb[d];
      if (++index[d] < out[d]) break;
      a -= sa[d] * out[d];
      b -= sb[d] * out[d];
      index[d] = 0;
    }
  }
}

}  // namespace sluice::kernels
