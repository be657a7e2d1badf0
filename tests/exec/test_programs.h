// Programs shared by the exec tests, built with the Builder from the basic ops.
#pragma once

#include <string>
#include <vector>

#include "sluice/exec/random_inputs.h"
#include "sluice/exec/scope.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"

namespace sluice::testing {

// Two matmuls of x that can run in parallel, a sum read twice (a diamond), a view chain
// (reshape of a reshape) whose base dies only after the views' last use, a copy nobody reads
// (freed right after its producer), a broadcast constant and a reduction.
//   x [B, C]; w1, w2 [C, H]; bias [H]; w3 [H, C]
//   s = x·w1 + x·w2 + bias      [B, H]
//   v = reshape(reshape(s, [B·H]), [B, H])
//   y = v·w3 + full(0.5) + x   [B, C]
//   outputs: z = sum_to(y, [1, C]), t = transpose(s, 0, 1) [H, B]
inline Program BranchyProgram(DType dtype = DType::kF32, int64_t B = 8, int64_t C = 16,
                              int64_t H = 32) {
  Builder b("branchy");
  Var x = b.Input("x", dtype, {B, C});
  Var w1 = b.Param("w1", dtype, {C, H});
  Var w2 = b.Param("w2", dtype, {C, H});
  Var bias = b.Param("bias", dtype, {H});
  Var w3 = b.Param("w3", dtype, {H, C});
  Var a = b.Name(MatMul(x, w1), "a");
  Var a2 = b.Name(MatMul(x, w2), "a2");
  Var s = b.Name(a + a2 + bias, "s");
  b.Name(Copy(x), "unused");
  Var flat = b.Name(Reshape(s, {B * H}), "flat");
  Var v = b.Name(Reshape(flat, {B, H}), "v");
  Var half = b.Name(Full(b, Shape{B, C}, 0.5, dtype), "half");
  Var y = b.Name(MatMul(v, w3) + half + x, "y");
  Var z = b.Name(SumTo(y, Shape{1, C}), "z");
  Var t = b.Name(Transpose(s, 0, 1), "t");
  b.Output(z);
  b.Output(t);
  return b.Build();
}

// A chain of n additions of a constant: y_{k+1} = y_k + c, all [size] f32.
inline Program AddChainProgram(int n, int64_t size = 64) {
  Builder b("add_chain");
  Var x = b.Input("x", DType::kF32, {size});
  Var c = b.Param("c", DType::kF32, {size});
  Var y = x;
  for (int k = 0; k < n; ++k) y = y + c;
  b.Output(b.Name(y, "y"));
  return b.Build();
}

// A two-layer perceptron with a mean loss, using the activation and reduction ops.
//   h = gelu(x·w1 + b1); p = softmax(h·w2); loss = mean(p ⊙ p)
inline Program MlpProgram(DType dtype = DType::kF32, int64_t B = 4, int64_t C = 8, int64_t H = 16) {
  Builder b("mlp");
  Var x = b.Input("x", dtype, {B, C});
  Var w1 = b.Param("w1", dtype, {C, H});
  Var b1 = b.Param("b1", dtype, {H});
  Var w2 = b.Param("w2", dtype, {H, C});
  Var h = b.Name(Gelu(MatMul(x, w1) + b1), "h");
  Var p = b.Name(Softmax(MatMul(h, w2)), "p");
  b.Output(b.Name(Mean(p * p), "loss"));
  return b.Build();
}

// A one-block transformer with a loss, using the nn ops: embedding, layer norm, causal softmax
// attention (one head), a GELU MLP, cross-entropy.  ids, targets [B, T] → loss []
inline Program TinyTransformerProgram(int64_t B = 2, int64_t T = 8, int64_t C = 16,
                                      int64_t vocab = 11) {
  Builder b("tiny_transformer");
  Var ids = b.Input("ids", DType::kI64, {B, T});
  Var targets = b.Input("targets", DType::kI64, {B, T});
  Var x = b.Name(Embedding(ids, b.Param("wte", DType::kF32, {vocab, C})), "x");
  Var ln = b.Name(
      LayerNorm(x, b.Param("ln.w", DType::kF32, {C}), b.Param("ln.b", DType::kF32, {C})), "ln");
  Var q = b.Name(MatMul(ln, b.Param("wq", DType::kF32, {C, C})), "q");
  Var k = b.Name(MatMul(ln, b.Param("wk", DType::kF32, {C, C})), "k");
  Var v = b.Name(MatMul(ln, b.Param("wv", DType::kF32, {C, C})), "v");
  Var probs = b.Name(CausalSoftmax(Scale(MatMul(q, k, false, true), 0.25)), "probs");
  x = b.Name(x + MatMul(probs, v), "x1");
  Var h = b.Name(Gelu(MatMul(x, b.Param("fc", DType::kF32, {C, 4 * C}))), "h");
  x = b.Name(x + MatMul(h, b.Param("proj", DType::kF32, {4 * C, C})), "x2");
  Var logits = b.Name(MatMul(x, b.Param("head", DType::kF32, {C, vocab})), "logits");
  b.Output(b.Name(CrossEntropy(logits, targets), "loss"));
  return b.Build();
}

inline Scope RandomScope(const Program& program, uint64_t seed) {
  Scope scope;
  BindRandomInputs(program, seed, scope);
  return scope;
}

}  // namespace sluice::testing
