// Matrix products. Shapes: a [..., M, K], b [K, N] (a weight shared by the batch) or [..., K, N].
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {

// op(a) · op(b), op transposing the last two axes when asked. out [..., M, N].
Var MatMul(Var a, Var b, bool transpose_a = false, bool transpose_b = false);

}  // namespace sluice
