// Autocast: the pass that turns an f32 forward program into its mixed-precision (bf16) form, what
// `--precision bf16` trains a `--program` with (docs/program-format.md, "Mixed precision").
//
// The rules are PyTorch's CPU autocast in sluice's form "bf16 storage, f32 compute":
//   products      matmul and linear multiply bf16 operands (a, b; x, w) into an f32 result;
//                 linear's bias stays f32. An f32 operand is rounded by a `cast`, one per value,
//                 shared by every product reading it — except a parameter (or input) as the
//                 second operand (matmul's b, linear's w): the product reads it f32 and rounds it
//                 to bf16 as it loads it (`round_b = true`, `round_w = true`; bitwise the product
//                 of its cast), so a weight has no bf16 copy, forward or in backward, where the
//                 input gradient's product dy·wᵀ keeps the attribute (ir/ops/linalg.cc). A
//                 parameter another bf16 op reads (or a product's first operand) gets a copy in
//                 each unit that reads it, just before its first reader there (autodiff remakes a
//                 parameter's copy in backward rather than keeping it). A linear whose result
//                 nothing reads as f32 (every reader in its unit takes it bf16; no program
//                 output) stores it rounded itself: `linear {dtype = "bf16"}`, named `NAME.bf16`,
//                 the bits of the linear then its cast without the f32 result (the GPT's qkv and
//                 c_fc).
//   activations   gelu, layer_norm (x; weight and bias f32), rms_norm (x; weight f32), swiglu
//                 (both operands), causal_attention_qkv (qkv; lse f32), causal_attention, attention
//                 and attention_key_bias (q, k, v; lse and key bias f32) take bf16 and give bf16,
//                 computing in f32 — when every reader of their output takes bf16 (a product, or an
//                 op of this list or the next two running bf16): then their input is rounded as a
//                 product's is and their output is what the next product multiplies. Otherwise they
//                 run f32 (their output would only be widened again).
//   shape ops     reshape, transpose, permute, slice, split (every piece) and concat (every
//                 input) carry bf16 as they are (bytes moved), on the same terms: a layer norm, a
//                 reshape, then a product stay bf16 throughout.
//   arithmetic    add, mul and dropout (x; its keys stay i64) give bf16, computing in f32, on the
//                 same terms and only where each operand is bf16 already — made by an activation
//                 running bf16, or carried by a shape op or arithmetic from one — as PyTorch's type
//                 promotion gives bf16 for bf16 operands only: an f32 operand (a parameter, a
//                 constant table, a product's result, the residual stream, an op running f32) keeps
//                 the op f32, never rounded for it.
//   the rest      every other op runs f32: the fp32 fallback. A bf16 value it reads is widened
//                 by a `cast` to f32, one per value and unit, just before its first reader there.
//                 Losses, reductions, softmax and norms' statistics are never bf16.
//   unit boundary an f32 value made in one unit and read in another (the residual stream between
//                 blocks, wherever a pipeline cut may fall) is rounded to bf16 by the unit making
//                 it, right after it is made, and the units reading it read the rounded copy
//                 (widened where they compute f32) — on one stage as on many, so that a pipeline
//                 stays bitwise one stage and its messages are bf16 (docs/memory.md "bf16 at unit
//                 boundaries"). Readers inside the making unit read the f32 value.
// Only f32 values change: f64 and integer values, and ops reading them, are left as written.
// Inputs, parameters, outputs and every value of the program keep their names and types (an
// activation that runs bf16 has a bf16 output: never a program output), but for a linear storing
// its result rounded, whose value becomes its rounded copy `NAME.bf16`; the casts are new values,
// `NAME.bf16` and `NAME.f32` (with a suffix when taken), inside the unit they belong to.
//
// A program that already has a bf16 value (declared, or made by a cast) is left as it is: the
// result names the first such value, and the program is returned unchanged, so the pass is
// idempotent; callers that want an error say so (`sluice train --precision bf16` refuses it).
//
// Example:
//   AutocastResult r = AutocastBf16(program);   // program: verified, f32
//   r.program   // the bf16 program; r.f32_ops: {"add", "cross_entropy", ...}
//
// Thread-safety: reentrant. Cost: linear in the program's values and instructions per sweep of
// the choice of what runs bf16, repeated until it settles (each sweep but the last turns at least
// one op back to f32).
#pragma once

#include <string>
#include <vector>

#include "sluice/ir/program.h"

namespace sluice {

struct AutocastResult {
  Program program;
  // The ops of the program's instructions that run with bf16 operands, and those that compute on
  // f32 values in f32 (the fallback), each name once, sorted. Casts the pass adds are in neither.
  std::vector<std::string> bf16_ops;
  std::vector<std::string> f32_ops;
  // The first bf16 value of the program given (then `program` is that program unchanged and the
  // lists are empty); empty when there is none.
  std::string already_bf16;
};

AutocastResult AutocastBf16(const Program& program);

}  // namespace sluice
