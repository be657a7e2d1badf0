// Comparisons and selection: what a padding mask, torch.where, masked_fill and clamp are made of.
//
// compare(a, b) {relation} gives 1 where `a relation b` holds and 0 elsewhere (relation one of
// "eq", "ne", "lt", "le", "gt", "ge"), in a and b's float dtype, broadcast as add is. A comparison
// is flat almost everywhere: it has no gradient (its VJP gives none), as PyTorch's boolean
// results have none.
// where(cond, a, b) gives a where cond is nonzero and b elsewhere; cond, a and b (one float dtype)
// broadcast to the output. Gradients: da = dy where cond, db = dy elsewhere (each summed back to
// its operand's shape), cond none — so a masked_fill, where(mask, value, x), passes dy to x
// exactly where the mask is 0, and a -inf it puts into attention scores never meets a 0 · ∞.
// Kernels: kernels/select.h.
//
// Example (a padding mask over attention scores [B, H, T, T], pad [B, 1, 1, T] 1 for a token):
//   Var masked = Where(Compare(pad, zero, "eq"), minus_inf, scores);   // zero, minus_inf: f32[]
#pragma once

#include <string>

#include "sluice/ir/builder.h"

namespace sluice {

// 1 where `a relation b`, 0 elsewhere. Op "compare", attribute relation.
Var Compare(Var a, Var b, const std::string& relation);
// a where cond != 0, b elsewhere. Op "where".
Var Where(Var cond, Var a, Var b);

void RegisterSelectOps(OpRegistry& registry);

}  // namespace sluice
