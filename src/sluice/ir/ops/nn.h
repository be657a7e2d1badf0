// Neural-network ops: softmax, causal masking, layer and RMS normalization, embeddings,
// cross-entropy (alone, or fused with the linear head before it).
// Shapes use the glossary (docs/glossary.md): B batch, T sequence, C channels, H heads, and vocab
// the vocabulary size; "..." is any number of leading axes. Every op takes f32 or f64 (one dtype
// per op); ids and targets are i32 or i64. Kernels: kernels/{softmax,layer_norm,rms_norm,
// embedding,cross_entropy}.h.
//
// The *Grad functions are the fused backward ops the VJP rules emit; they are ops of their own
// (reference and fast kernels, harness entries) but have no VJP themselves.
//
// Example (one attention head's probabilities and a language-model loss):
//   Var probs = Softmax(CausalMask(scores));    // scores [B, H, T, T]
//   Var loss = CrossEntropy(logits, targets);   // logits [B, T, vocab], targets [B, T]
#pragma once

#include <limits>
#include <utility>

#include "sluice/ir/builder.h"

namespace sluice {

// Softmax over the last axis, numerically stable (the row max is subtracted first).
// x [..., C] -> [..., C]. Op "softmax"; VJP: softmax_grad(dy, y) (reads y, not x).
Var Softmax(Var x);
// dx = y · (dy − Σ_last dy · y). dy, y [..., C] -> dx [..., C]. Op "softmax_grad".
Var SoftmaxGrad(Var dy, Var y);

// Hides keys after the query: y = x except y[..., i, j] = value for j > i.
// scores [..., T, T] -> [..., T, T]. Op "causal_mask", attribute value (absent: −inf, so that a
// following softmax gives exact zeros there). VJP: causal_mask(dy, value = 0).
Var CausalMask(Var scores, double value = -std::numeric_limits<double>::infinity());
// Softmax(CausalMask(scores)) in one pass: exact zeros for j > i. [..., T, T] -> [..., T, T].
// Op "causal_softmax"; VJP: softmax_grad(dy, y).
Var CausalSoftmax(Var scores);

// Layer normalization over the last axis with biased variance (PyTorch's LayerNorm).
// x [..., C], weight [C], bias [C] -> [..., C]. Op "layer_norm", attribute eps.
// VJP: layer_norm_grad_x and layer_norm_grad_params, which recompute mean and rstd from x (no
// statistics are saved from forward).
Var LayerNorm(Var x, Var weight, Var bias, double eps = 1e-5);
// dy, x [..., C], weight [C] -> dx [..., C]. Op "layer_norm_grad_x", attribute eps.
Var LayerNormGradX(Var dy, Var x, Var weight, double eps = 1e-5);
// dy, x [..., C] -> {dweight [C], dbias [C]}. Op "layer_norm_grad_params", attribute eps.
std::pair<Var, Var> LayerNormGradParams(Var dy, Var x, double eps = 1e-5);

// RMS normalization over the last axis (Llama's RMSNorm; no mean removed, no bias):
// y = x / sqrt(mean(x²) + eps) · weight, as PyTorch's
// x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.
// x [..., C], weight [C] -> [..., C]. Op "rms_norm", attribute eps (> 0).
// VJP: rms_norm_grad_x and rms_norm_grad_weight, which recompute rstd from x (no statistics are
// saved from forward); the weight part is its own op so that the zero-bubble split defers it to W.
Var RmsNorm(Var x, Var weight, double eps = 1e-6);
// dy, x [..., C], weight [C] -> dx [..., C]. Op "rms_norm_grad_x", attribute eps.
Var RmsNormGradX(Var dy, Var x, Var weight, double eps = 1e-6);
// dy, x [..., C] -> dweight [C]. Op "rms_norm_grad_weight", attribute eps.
Var RmsNormGradWeight(Var dy, Var x, double eps = 1e-6);

// Row lookup: ids [B, T] (any shape, i32 or i64), table [vocab, C] -> [B, T, C].
// An id outside [0, vocab) is an InvalidArgument error at run time. Op "embedding";
// VJP (table only): embedding_grad.
Var Embedding(Var ids, Var table);
// Scatter-add of dy rows into zeros [num_embeddings, C] (the table's [vocab, C]) in token order
// (deterministic).
// ids [B, T], dy [B, T, C] -> dtable [num_embeddings, C]. Op "embedding_grad".
Var EmbeddingGrad(Var ids, Var dy, int64_t num_embeddings);

// Mean over tokens of −log softmax(logits)[target], fused (log-sum-exp, no probabilities kept).
// logits [N, vocab] or [B, T, vocab], targets [N] or [B, T] (i32 or i64) -> loss []. A target
// outside [0, vocab) is an InvalidArgument error at run time; a target of kernels::kIgnoreTarget
// (-1) does not count. Op "cross_entropy"; VJP (logits only):
// cross_entropy_grad, which recomputes the softmax.
Var CrossEntropy(Var logits, Var targets);
// (dloss / N) · (softmax(logits) − onehot(targets)). logits [..., vocab], targets [...], dloss []
// -> dlogits [..., vocab]. Op "cross_entropy_grad".
Var CrossEntropyGrad(Var logits, Var targets, Var dloss);

// CrossEntropy(MatMul(x, w, false, true), targets) without the logits ever whole: a linear head
// (w [vocab, C], torch.nn.Linear's layout, no bias) and its loss, over chunks of `chunk` tokens
// (0: chunks whose logits take as many values as x; kernels/linear_cross_entropy.h). x [..., C],
// targets x's shape without C -> loss []. The kernel's scratch is one chunk's logits. Op
// "linear_cross_entropy", attribute chunk; VJP: linear_cross_entropy_grad, which recomputes each
// chunk's logits. The loss is the unfused one's within rounding of its double sum (1e-15).
Var LinearCrossEntropy(Var x, Var w, Var targets, int64_t chunk = 0);
// {dx [..., C], dw [vocab, C]} of LinearCrossEntropy for dloss []; dw sums over the chunks, so it
// agrees with the unfused ops' within rounding. Op "linear_cross_entropy_grad".
std::pair<Var, Var> LinearCrossEntropyGrad(Var x, Var w, Var targets, Var dloss, int64_t chunk = 0);

}  // namespace sluice
