// Reductions.
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {

// Sums x over the axes that broadcasting stretched so that the result has `shape` (the gradient
// of a broadcast). `shape` must broadcast to x's shape.
Var SumTo(Var x, const Shape& shape);
// Repeats x along stretched axes to `shape` (NumPy broadcast_to); the inverse of SumTo.
Var BroadcastTo(Var x, const Shape& shape);

}  // namespace sluice
