// Copies between strided views: the one data-movement kernel behind the copying shape ops
// (permute, transpose, slice, concat, split).
//
// CopyStrided(src, dst) writes every element of src into dst; both have the same shape and dtype
// and any strides — typically one side is a view made by Tensor::Permute/Transpose/Slice and the
// other a contiguous tensor or a slice of one. The two must not overlap. Works for every dtype
// (elements are moved as bytes).
//
// It drops size-1 axes and merges neighbouring axes that are contiguous in both tensors, so that
// the innermost axis is as long as possible; when that axis is contiguous on both sides each row is
// one memcpy (concat and split along any axis, slices, and permutations that keep the last axis,
// such as [B, T, H, D] -> [B, H, T, D]), otherwise a strided element loop. Outer axes advance a
// running multi-index.
// The plain reference is Tensor::CopyFrom (index arithmetic per element).
//
// Throws InternalError (SLUICE_CHECK) when shapes or dtypes differ.
// Thread-safety: writes dst only.
#pragma once

#include "sluice/core/tensor.h"

namespace sluice::kernels {

void CopyStrided(const Tensor& src, const Tensor& dst);

}  // namespace sluice::kernels
