// The activation kernels of `--precision bf16` beyond the products: GELU, layer norm and the
// packed causal attention on bf16 tensors, by autocast's rule "bf16 in, f32 compute, bf16 out".
//
// Each kernel widens a block of its bf16 operands to f32 (kernels/bf16_convert.h, Highway), runs
// the f32 kernel on that block (kernels/unary.h, layer_norm.h, attention.h — the same code the
// f32 ops run), and rounds the block's bf16 outputs to nearest even. Gradients stay f32 (a bf16
// value's gradient is f32: ir/gradient_type.h); statistics (layer norm's mean and rstd, the
// attention's running max, sum and lse) are computed in f32 and never rounded. So a fast kernel
// gives, bit for bit, what casting its bf16 inputs to f32, running the f32 fast kernel and casting
// its bf16 outputs back would give — without the f32 copies living as tensors:
//
//   GeluBF16         x [n] bf16                  -> y [n] bf16
//   GeluGradBF16     dy [n] f32, x [n] bf16      -> dx [n] f32
//   LayerNormBF16    x [rows, C] bf16, w, b [C]  -> y [rows, C] bf16
//   LayerNormGradXBF16      dy f32, x bf16, w    -> dx [rows, C] f32
//   LayerNormGradParamsBF16 dy f32, x bf16       -> dweight, dbias [C] f32 (overwritten)
//   CausalAttentionQkvBF16      qkv [B, T, 3C] bf16 -> y [B, T, C] bf16, lse [B, H, T] f32
//   CausalAttentionQkvGradBF16  dy [B, T, C] f32, dlse [B, H, T] f32 (or null), qkv bf16, y bf16,
//                               lse f32 -> dqkv [B, T, 3C] f32
//   CausalAttentionBF16         q [B, H, T, D], k, v [B, H_kv, T, D] bf16 -> y [B, H, T, D] bf16,
//                               lse [B, H, T] f32
//   CausalAttentionGradBF16     dy [B, H, T, D] f32, dlse [B, H, T] f32 (or null), q, k, v, y bf16,
//                               lse f32 -> dq [B, H, T, D], dk, dv [B, H_kv, T, D] f32
//
// (B sequences, T positions, C channels in H heads of D = C / H; qkv holds q, k, v side by side, as
// causal_attention_qkv reads them; the split form has the heads apart, as causal_attention reads
// them, H_kv dividing H: grouped-query attention, kernels/attention.h.) The *Reference kernels
// widen the whole operands with core/dtype.h's scalar conversions and run the f32 reference
// kernels; the op harness compares each pair, and each with the f32 op on the same values
// (tests/ops/).
//
// Scratch: GELU and layer norm widen 4096 elements at a time (whole rows for layer norm) into a
// 16 KiB buffer on the calling thread's stack — bounded, no heap, so nothing for the memory
// forecast to count — except a layer norm row of more than 4096 channels, which takes a one-row
// heap buffer. The attention widens one sequence's qkv and y into the caller's scratch,
// CausalAttentionQkvBF16ScratchFloats (T·4C floats), which the ops take from
// KernelContext::allocator (counted by the forecast: OpDef::scratch_bytes); the split form widens
// one sequence's q, k, v and y, AttentionBF16ScratchFloats (T·D·(2·H + 2·H_kv) floats),
// likewise. The references allocate whole f32 copies (tests only).
//
// Threading: as the f32 kernels (kernels/parallel.h): chunks fixed by the work, bitwise the same
// at any thread count. The attention runs one sequence at a time, its key/value heads on the
// intra-op threads (its widening and rounding too). Outputs must not alias inputs. Failure modes:
// none (the ops' inference checks shapes).
//
// Example:
//   // h [B·T, 4C] bf16 -> g [B·T, 4C] bf16
//   kernels::GeluBF16Fast(h.data<BFloat16>(), g.data<BFloat16>(), h.numel());
#pragma once

#include <cstdint>

#include "sluice/core/dtype.h"
#include "sluice/kernels/attention.h"

namespace sluice::kernels {

void GeluBF16Reference(const BFloat16* x, BFloat16* y, int64_t n);
void GeluBF16Fast(const BFloat16* x, BFloat16* y, int64_t n);
void GeluGradBF16Reference(const float* dy, const BFloat16* x, float* dx, int64_t n);
void GeluGradBF16Fast(const float* dy, const BFloat16* x, float* dx, int64_t n);

void LayerNormBF16Reference(const BFloat16* x, const float* weight, const float* bias, BFloat16* y,
                            int64_t rows, int64_t cols, float eps);
void LayerNormBF16Fast(const BFloat16* x, const float* weight, const float* bias, BFloat16* y,
                       int64_t rows, int64_t cols, float eps);
void LayerNormGradXBF16Reference(const float* dy, const BFloat16* x, const float* weight, float* dx,
                                 int64_t rows, int64_t cols, float eps);
void LayerNormGradXBF16Fast(const float* dy, const BFloat16* x, const float* weight, float* dx,
                            int64_t rows, int64_t cols, float eps);
void LayerNormGradParamsBF16Reference(const float* dy, const BFloat16* x, float* dweight,
                                      float* dbias, int64_t rows, int64_t cols, float eps);
void LayerNormGradParamsBF16Fast(const float* dy, const BFloat16* x, float* dweight, float* dbias,
                                 int64_t rows, int64_t cols, float eps);

// The packed attention's shape: B sequences of T positions, C channels in H heads.
struct PackedAttentionDims {
  int64_t sequences, t, c, heads;
};

void CausalAttentionQkvBF16Reference(const BFloat16* qkv, BFloat16* y, float* lse,
                                     const PackedAttentionDims& n, float scale);
// The fast attention kernels' scratch (forward and backward alike).
int64_t CausalAttentionQkvBF16ScratchFloats(const PackedAttentionDims& n);
void CausalAttentionQkvBF16Fast(const BFloat16* qkv, BFloat16* y, float* lse,
                                const PackedAttentionDims& n, float scale, float* scratch);
void CausalAttentionQkvGradBF16Reference(const float* dy, const float* dlse, const BFloat16* qkv,
                                         const BFloat16* y, const float* lse, float* dqkv,
                                         const PackedAttentionDims& n, float scale);
void CausalAttentionQkvGradBF16Fast(const float* dy, const float* dlse, const BFloat16* qkv,
                                    const BFloat16* y, const float* lse, float* dqkv,
                                    const PackedAttentionDims& n, float scale, float* scratch);

// The split form's shape: B sequences of H query heads and H_kv key/value heads (H_kv dividing
// H), T positions, D channels per head.
struct HeadsAttentionDims {
  int64_t sequences, heads, kv_heads, t, d;
};

// `mask` as the f32 kernels' (kernels/attention.h), its key bias [sequences, T] f32 (heads is
// set from n); causal by default.
void AttentionBF16Reference(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* y,
                            float* lse, const HeadsAttentionDims& n, float scale,
                            const AttentionMask<float>& mask = {});
// The split form's scratch (forward and backward alike).
int64_t AttentionBF16ScratchFloats(const HeadsAttentionDims& n);
void AttentionBF16Fast(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* y,
                       float* lse, const HeadsAttentionDims& n, float scale, float* scratch,
                       const AttentionMask<float>& mask = {});
void AttentionGradBF16Reference(const float* dy, const float* dlse, const BFloat16* q,
                                const BFloat16* k, const BFloat16* v, const BFloat16* y,
                                const float* lse, float* dq, float* dk, float* dv,
                                const HeadsAttentionDims& n, float scale,
                                const AttentionMask<float>& mask = {});
void AttentionGradBF16Fast(const float* dy, const float* dlse, const BFloat16* q, const BFloat16* k,
                           const BFloat16* v, const BFloat16* y, const float* lse, float* dq,
                           float* dk, float* dv, const HeadsAttentionDims& n, float scale,
                           float* scratch, const AttentionMask<float>& mask = {});

}  // namespace sluice::kernels
