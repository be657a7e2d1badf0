// Matrix products and the linear layer.
// Shapes: a [..., m, k], b [k, n] (a weight shared by the batch) or [..., k, n] — lower case, the
// dimensions of one product (docs/glossary.md).
#pragma once

#include <vector>

#include "sluice/ir/builder.h"

namespace sluice {

// op(a) · op(b), op transposing the last two axes when asked. out [..., m, n].
// gelu_grad(matmul(a, b, transpose_a, transpose_b), x) as one instruction: x [..., m, n] is the
// GELU's input, the product its output gradient. Op "matmul_gelu_grad", no VJP (autodiff emits it:
// autodiff.h). The product is written into the result and scaled there, so no [..., m, n] value
// lives beside the result.
Var MatMulGeluGrad(Var a, Var b, Var x, bool transpose_a = false, bool transpose_b = false);
// round_b: b f32, rounded to bf16 as the product loads it (a bf16).
Var MatMul(Var a, Var b, bool transpose_a = false, bool transpose_b = false, bool round_b = false);

// x·w + b: x [..., k], w [k, n], b [n] -> [..., n], x of rank 2 or more ([B·T, C] or [B, T, C]).
// The weight is stored [in, out] = [k, n] (the transpose of PyTorch's nn.Linear.weight), so the
// forward product is a plain GEMM. One GEMM in all: b is copied into the output rows and the GEMM
// adds x·w on top (beta = 1). Op "linear"; VJP: dx = dy·wᵀ, dw = xᵀ·dy (batch folded into rows,
// one GEMM each), db = sum_to(dy, [N]).
//
// Example:
//   Var qkv = Linear(x, w_qkv, b_qkv);  // x [B, T, C], w_qkv [C, 3C], b_qkv [3C] -> [B, T, 3C]
Var Linear(Var x, Var w, Var b);

// dy [..., n] f32 -> {dy rounded to bf16 [..., n], dy summed over its leading axes [n] f32}: a bf16
// linear's output gradient as the operand of its products and its bias gradient, from one pass
// over dy, bitwise Cast(dy, kBF16) and SumTo(dy, [n]). Op "cast_bf16_and_sum", no VJP (the
// linear's VJP emits it under mixed precision).
std::vector<Var> CastBf16AndSum(Var dy);

}  // namespace sluice
