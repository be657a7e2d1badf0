// Reductions, and the pair that moves gradients across broadcasting. Kernels: kernels/reduce.h.
//
// Sum and Mean reduce x (f32 or f64) over `axes`: negative axes count from the end, an empty list
// means every axis, an axis may appear once. With keepdims the reduced axes stay as size 1
// (so the result broadcasts against x); without, they are removed.
//   x [B, T, C]: Sum(x, {-1}) is [B, T]; Mean(x, {-1}, true) is [B, T, 1]; Sum(x) is [].
// Gradients: the output gradient reshaped to the keepdims shape and broadcast back to x's shape
// (Mean scales it by 1/count first, on the small tensor).
//
// Example:
//   Var mu = Mean(h, {-1}, /*keepdims=*/true);      // [B, T, 1]
//   Var loss = Mean(Sum(err * err, {-1}));           // []
#pragma once

#include <vector>

#include "sluice/ir/builder.h"

namespace sluice {

// Ops "sum" and "mean", attributes axes (ints), keepdims (bool).
Var Sum(Var x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Var Mean(Var x, const std::vector<int64_t>& axes = {}, bool keepdims = false);

// Sums x over the axes that broadcasting stretched so that the result has `shape` (the gradient
// of a broadcast). `shape` must broadcast to x's shape. Returns x when the shapes are equal.
Var SumTo(Var x, const Shape& shape);
// Repeats x along stretched axes to `shape` (NumPy broadcast_to); the inverse of SumTo. Returns x
// when the shapes are equal.
Var BroadcastTo(Var x, const Shape& shape);

}  // namespace sluice
