// Fused self-attention as one op (FlashAttention-style kernels, kernels/attention.h): causal (a
// decoder's) or over every key (an encoder's), with an optional key bias (a padding mask).
// Shapes use the glossary (docs/glossary.md): B batch, H heads, T sequence, D = C / H channels per
// head; "..." is any number of leading axes (usually [B, H]).
//
// causal_attention replaces the chain matmul(q, kᵀ) → scale → causal_mask → softmax → matmul(·, v)
// (the "naive" attention of nn/gpt.h): it keeps no [T, T] value alive. Its second output, the
// log-sum-exp of each query's scores, is what backward needs to recompute the probabilities.
//
// Example:
//   auto [y, lse] = CausalAttention(q, k, v, 1.0 / std::sqrt(D));   // q, k, v [B, H, T, D]
//   auto [y, lse] = CausalAttentionQkv(qkv, H, 1.0 / std::sqrt(D));  // qkv [B, T, 3C], y [B, T, C]
//   auto [y, lse] = Attention(q, k, v, 1.0 / std::sqrt(D), bias);   // bias [B, T]: 0 or -inf
#pragma once

#include <utility>

#include "sluice/ir/builder.h"

namespace sluice {

// y = softmax(scale · q·kᵀ, keys after each query hidden) · v, and lse = the log-sum-exp of each
// row of scale · q·kᵀ over its visible keys. q, k, v [..., T, D] (one shape) -> {y [..., T, D],
// lse [..., T]}. Grouped-query attention: k and v [..., H_kv, T, D] with H_kv dividing q's H
// (axis -3, the rest as q's); query head h reads key/value head h / (H / H_kv), in place — what
// repeat_interleave of k and v along the heads computes, without the copies. Under mixed
// precision q, k, v and y are bf16 (computed in f32) and lse f32. Op "causal_attention", attribute
// scale. VJP: causal_attention_grad (q, k and v; a gradient reaching lse is taken into account).
std::pair<Var, Var> CausalAttention(Var q, Var k, Var v, double scale);
// dy [..., T, D], dlse [..., T], q, k, v, y [..., T, D], lse [..., T] -> {dq, dk, dv} [..., T, D]
// (with grouped-query k and v, dk and dv have k's shape: the sums over each group; with bf16 q, k,
// v and y, dy, dlse, lse and the results are f32). Op "causal_attention_grad", attribute scale;
// recomputes the probabilities tile by tile.
std::vector<Var> CausalAttentionGrad(Var dy, Var dlse, Var q, Var k, Var v, Var y, Var lse,
                                     double scale);

// attention: causal_attention's y and lse with every key visible to every query — softmax(scale ·
// q·kᵀ)·v, an encoder's attention (BERT, nn.TransformerEncoder, ViT). With key_bias [..., T] (q's
// axes before H, then T: one row per sequence that its H heads share), op
// "attention_key_bias": softmax(scale · q·kᵀ + key_bias)·v, the bias added to every query's score
// of key j — 0 keeps a key, -inf hides it (a key-padding mask), a finite value shifts it. A query
// whose every key is hidden gets y = NaN and lse = -inf (PyTorch's softmax over a row of -inf
// gives NaN; nn.MultiheadAttention does the same). key_bias is f32 under mixed precision (q, k,
// v, y bf16) and takes no gradient (autodiff refuses a key_bias that depends on a parameter).
// Grouped-query k and v as causal_attention. Op "attention" (q, k, v) or "attention_key_bias"
// (q, k, v, key_bias), attribute scale; VJP: attention_grad / attention_key_bias_grad (dy, dlse,
// q, k, v, y, lse[, key_bias] -> dq, dk, dv, as causal_attention_grad).
std::pair<Var, Var> Attention(Var q, Var k, Var v, double scale, Var key_bias = {});
// dy, dlse, q, k, v, y, lse as CausalAttentionGrad's (and the key bias) -> {dq, dk, dv}. Op
// "attention_grad" or "attention_key_bias_grad".
std::vector<Var> AttentionGrad(Var dy, Var dlse, Var q, Var k, Var v, Var y, Var lse, double scale,
                               Var key_bias = {});

// causal_attention on heads packed the way a GPT's c_attn projection writes them: qkv [..., T, 3C]
// holds q, k and v side by side, each H heads of D = C / H channels (head h of q in columns
// [h·D, (h + 1)·D)). -> {y [..., T, C] (heads side by side: what the output projection reads),
// lse [..., H, T]}. The same results as Split → Reshape [..., T, H, D] → Transpose →
// causal_attention → Transpose → Reshape, without the copies; the forward keeps qkv and y for
// backward instead of q, k, v, y per head and the merged y. Op "causal_attention_qkv", attributes
// heads and scale; VJP: causal_attention_qkv_grad.
std::pair<Var, Var> CausalAttentionQkv(Var qkv, int64_t heads, double scale);
// dy [..., T, C], dlse [..., H, T], qkv [..., T, 3C], y [..., T, C], lse [..., H, T] -> dqkv
// [..., T, 3C]. Op "causal_attention_qkv_grad".
Var CausalAttentionQkvGrad(Var dy, Var dlse, Var qkv, Var y, Var lse, int64_t heads, double scale);

class OpRegistry;
// Registers causal_attention, attention, attention_key_bias, causal_attention_qkv and their
// gradients; called once by OpRegistry::Global().
void RegisterAttentionOps(OpRegistry& registry);

}  // namespace sluice
