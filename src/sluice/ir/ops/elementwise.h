// Elementwise ops (NumPy broadcasting for binary ops; both operands of the same dtype).
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {

Var Add(Var a, Var b);  // a + b
inline Var operator+(Var a, Var b) { return Add(a, b); }

// A new tensor of `shape` filled with `value`. Op "full", no inputs; attributes shape, value, dtype.
Var Full(Builder& b, const Shape& shape, double value, DType dtype);
// A copy of x in fresh memory. Op "copy".
Var Copy(Var x);

}  // namespace sluice
