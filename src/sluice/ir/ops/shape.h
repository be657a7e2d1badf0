// Shape ops. Every program value is contiguous, so an op whose result is a contiguous range of its
// input is a view (no copy) and the rest copy (kernels/copy.h). Shape ops move elements of any
// dtype; their gradients exist for floating values (of a bf16 value: f32, ir/gradient_type.h).
//
//   reshape      view                    same elements, new shape
//   transpose    copy                    swap two axes
//   permute      copy                    reorder all axes
//   slice        view or copy            elements [start, end) along one axis
//   concat       copy                    join along one axis
//   split        views or copies         cut along one axis into pieces of given sizes
//
// Slice and Split are views ("slice_view", "split_view": kView ops aliasing their input) when the
// pieces are contiguous ranges of the input, i.e. every axis before `axis` has size 1 (slicing the
// batch axis of [B, T, C], splitting a [1, T, C] along T); otherwise copies ("slice", "split"). The
// builder functions choose; both forms compute the same values.
//
// Example:
//   Var qkv = MatMul(x, w_qkv);                              // [B, T, 3C]
//   std::vector<Var> p = Split(qkv, -1, {C, C, C});           // q, k, v: [B, T, C] each (copies)
//   Var q = Permute(Reshape(p[0], {B, T, H, C / H}), {0, 2, 1, 3});  // [B, H, T, C/H]
#pragma once

#include <vector>

#include "sluice/ir/builder.h"

namespace sluice {

// Same elements, new shape (one dimension may be -1). A view of x's storage. Op "reshape".
Var Reshape(Var x, const std::vector<int64_t>& dims);
// Swaps axes dim0 and dim1 (negative counts from the end). Op "transpose", attributes dim0, dim1.
Var Transpose(Var x, int64_t dim0, int64_t dim1);
// y.shape[i] = x.shape[order[i]]; order is a permutation of the axes (negative counts from the
// end). Op "permute", attribute order.
Var Permute(Var x, const std::vector<int64_t>& order);
// Elements [start, end) along `axis`, 0 ≤ start ≤ end ≤ x.shape[axis]. Ops "slice_view" / "slice",
// attributes axis, start, end.
Var Slice(Var x, int64_t axis, int64_t start, int64_t end);
// xs joined along `axis`; all of one dtype and rank, equal on every other axis. Op "concat",
// attribute axis.
Var Concat(const std::vector<Var>& xs, int64_t axis);
// x cut along `axis` into pieces of `sizes` (non-negative, summing to x.shape[axis]). Ops
// "split_view" / "split", attributes axis, sizes.
std::vector<Var> Split(Var x, int64_t axis, const std::vector<int64_t>& sizes);

}  // namespace sluice
