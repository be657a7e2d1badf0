// Dropout: y = x · keep / (1 − p) in training, x in evaluation — PyTorch's nn.Dropout — with a mask
// that is drawn, never stored.
//
// dropout(x, key) {p, stream, training}: whether an element of x is kept is a pure function of
// its example's random key, the instruction's `stream` (its identity in the program: a program
// gives each dropout its own) and the element's index within its example (kernels/dropout.h:
// Philox-4x32-10). key is i64[B], one key per example — training binds its data array
// `random_key` to keys drawn from --seed, the batch's index and the example's row (nn/data.h
// RandomKey) — and x's elements are B equal runs, one per example: x's leading axis is the batch
// (or B·H, heads merged into it). So the mask is the same wherever and however often it is drawn
// — the gradient, a recompute, any stage split, schedule, thread count or rank, a data-parallel
// replica holding some of the batch's rows — and backward draws it again instead of keeping it:
// the op saves nothing but reads the key (8 bytes per example). An i64[] key serves all of x.
//
//   p         the probability of dropping an element, in [0, 1]: 0 gives x bitwise, 1 zeros
//   stream    a non-negative integer; two dropouts of one program with the same stream and keys
//             draw the same mask on same-sized operands
//   training  true by default; false (what the inference form sets, ir/inference_form.h) gives x
//
// Gradient: dx = dy · keep / (1 − p), which is dropout itself applied to dy with the same key,
// stream and p — the VJP emits exactly that. The key has none.
// x is f32, f64 or bf16 (computed in f32, rounded once); y has x's dtype and shape.
//
// Example (a residual branch; key: the program input `input %key: i64[B] = random_key`):
//   Var h = Dropout(Linear(a, w, b), key, 0.1, /*stream=*/2);
#pragma once

#include <cstdint>

#include "sluice/ir/builder.h"

namespace sluice {

// x [B, ...] (float or bf16), key i64[B] -> y [B, ...] in x's dtype. Op "dropout".
Var Dropout(Var x, Var key, double p, int64_t stream);

void RegisterDropoutOps(OpRegistry& registry);

}  // namespace sluice
