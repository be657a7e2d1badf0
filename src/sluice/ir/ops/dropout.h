// Dropout: y = x · keep / (1 − p) in training, x in evaluation — PyTorch's nn.Dropout — with a mask
// that is drawn, never stored.
//
// dropout(x, key) {p, stream, training}: whether element i of x is kept is a pure function of the
// run's random key (an i64 scalar input: training binds its data array `random_key` to a key drawn
// for each micro-batch from --seed and the batch's index, nn/data.h RandomKey), the instruction's
// `stream` (its identity in the program: a program gives each dropout its own) and i
// (kernels/dropout.h: Philox-4x32-10). So the mask is the same wherever and however often it is
// drawn — the gradient, a recompute, any stage split, schedule, thread count or rank — and
// backward draws it again instead of keeping it: the op saves nothing but reads the 8-byte key.
//
//   p         the probability of dropping an element, in [0, 1]: 0 gives x bitwise, 1 zeros
//   stream    a non-negative integer; two dropouts of one program with the same stream and key
//             draw the same mask on same-sized operands
//   training  true by default; false (what the inference form sets, ir/inference_form.h) gives x
//
// Gradient: dx = dy · keep / (1 − p), which is dropout itself applied to dy with the same key,
// stream and p — the VJP emits exactly that. The key has none.
// x is f32, f64 or bf16 (computed in f32, rounded once); y has x's dtype and shape.
//
// Example (a residual branch; key: the program input `input %key: i64[] = random_key`):
//   Var h = Dropout(Linear(a, w, b), key, 0.1, /*stream=*/2);
#pragma once

#include <cstdint>

#include "sluice/ir/builder.h"

namespace sluice {

// x [...] (float or bf16), key i64[] -> y [...] in x's dtype. Op "dropout".
Var Dropout(Var x, Var key, double p, int64_t stream);

void RegisterDropoutOps(OpRegistry& registry);

}  // namespace sluice
