// Fused causal self-attention as one op (FlashAttention-style kernels, kernels/attention.h).
// Shapes use the glossary (docs/glossary.md): B batch, H heads, T sequence, D = C / H channels per
// head; "..." is any number of leading axes (usually [B, H]).
//
// causal_attention replaces the chain matmul(q, kᵀ) → scale → causal_mask → softmax → matmul(·, v)
// (the "naive" attention of nn/gpt.h): it keeps no [T, T] value alive. Its second output, the
// log-sum-exp of each query's scores, is what backward needs to recompute the probabilities.
//
// Example:
//   auto [y, lse] = CausalAttention(q, k, v, 1.0 / std::sqrt(D));   // q, k, v [B, H, T, D]
#pragma once

#include <utility>

#include "sluice/ir/builder.h"

namespace sluice {

// y = softmax(scale · q·kᵀ, keys after each query hidden) · v, and lse = the log-sum-exp of each
// row of scale · q·kᵀ over its visible keys. q, k, v [..., T, D] (one shape) -> {y [..., T, D],
// lse [..., T]}. Op "causal_attention", attribute scale. VJP: causal_attention_grad (q, k and v;
// a gradient reaching lse is taken into account).
std::pair<Var, Var> CausalAttention(Var q, Var k, Var v, double scale);
// dy [..., T, D], dlse [..., T], q, k, v, y [..., T, D], lse [..., T] -> {dq, dk, dv} [..., T, D].
// Op "causal_attention_grad", attribute scale; recomputes the probabilities tile by tile.
std::vector<Var> CausalAttentionGrad(Var dy, Var dlse, Var q, Var k, Var v, Var y, Var lse,
                                     double scale);

class OpRegistry;
// Registers causal_attention and causal_attention_grad; called once by OpRegistry::Global().
void RegisterAttentionOps(OpRegistry& registry);

}  // namespace sluice
