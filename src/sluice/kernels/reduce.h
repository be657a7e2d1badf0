// Sum reductions over chosen axes of a contiguous tensor.
//
//   out[kept...] = Σ over the reduced axes of x[...]
// x is contiguous of shape `shape`; `reduced` marks the summed axes (bit d = axis d); out is
// contiguous and holds the kept axes in their order (with or without size-1 axes in the reduced
// places: the element order is the same). Reducing no axis copies; reducing every axis gives one
// element; an empty reduced extent gives zeros.
//
// SumReference: for each output element, a walk over the reduced multi-index with index arithmetic
// per element, accumulating in T.
// SumFast: merges neighbouring axes with the same role ([B, T, C] summed over B and T is [B·T] ×
// [C]), then runs the innermost axis as a tight loop: a vectorized row sum (several accumulators)
// when it is reduced, a vectorized out[j] += x[j] row accumulation when it is kept. Column sums
// ([R] reduced × [N] kept, e.g. a bias gradient) run as the runtime-dispatched column_sum of
// simd_kernels.h on the intra-op threads (kernels/parallel.h), chunks of whole columns, each
// column added top to bottom: bitwise the reference's result at every thread count. Row sums add
// in another order than the reference, so their f32 results agree to rounding, not bitwise.
//
// Thread-safety: pure functions of their inputs.
#pragma once

#include <bitset>
#include <cstdint>

#include "sluice/core/shape.h"

namespace sluice::kernels {

using AxisSet = std::bitset<kMaxRank>;

template <typename T>
void SumReference(const T* x, const Shape& shape, AxisSet reduced, T* out);
template <typename T>
void SumFast(const T* x, const Shape& shape, AxisSet reduced, T* out);

// Number of elements summed into each output element: the product of the reduced dimensions.
int64_t ReducedCount(const Shape& shape, AxisSet reduced);

}  // namespace sluice::kernels
