// Fused attention, forward and backward, in the manner of FlashAttention (Dao et al. 2022): the
// [T, T] probabilities are never stored. Per batch entry (one head of one sequence):
//
//   s[i, j] = scale · q[i]·k[j] + bias[j]           for the keys query i sees, −inf for the others
//   lse[i]  = log Σ_j e^(s[i, j])                   (the log-sum-exp of row i)
//   p[i, j] = e^(s[i, j] − lse[i])                  (softmax over the visible keys)
//   y[i]    = Σ_j p[i, j] · v[j]
//
// q, k, v, y are [batch, T, D] (batch = B·H, T positions, D head channels) and lse is [batch, T];
// forward writes y and lse, and backward recomputes p from q, k and lse:
//
//   dp[i, j] = dy[i]·v[j]
//   ds[i, j] = p[i, j] · (dp[i, j] − (dy[i]·y[i] − dlse[i]))   (softmax backward, with dlse)
//   dq[i] = scale · Σ_j ds[i, j] · k[j]    dk[j] = scale · Σ_i ds[i, j] · q[i]
//   dv[j] = Σ_i p[i, j] · dy[i]
//
// Which keys query i sees is an AttentionMask: keys j ≤ i (causal: a decoder, causal_attention),
// or every key (an encoder: BERT, nn.TransformerEncoder, ViT); bias is an optional additive key
// bias [batch / H, T], one row per sequence shared by its H heads — 0 keeps a key, −inf hides
// it (a key-padding mask), a finite value shifts it (BERT's (1 − mask) · −10000). A query that
// sees no key (every bias −inf) gets y = NaN and lse = −inf, as PyTorch's softmax over a row of
// −inf gives NaN; its gradients are NaN too.
//
// Where the [T, D] matrices live is an AttentionLayout: contiguous [batch, T, D] tensors, or the
// heads read in place from a GPT's packed projections — q, k, v as column blocks of qkv [B, T, 3C]
// and y written straight into [B, T, C] (heads side by side, the layout the output projection
// reads) — so that no split, transpose or concat copies them. lse is always [batch, T].
//
// Grouped-query attention (GQA): `group` query heads share one key/value head. q, y, lse and dy
// have `batch` entries (B·H), k, v, dk and dv batch / group (B·H_kv); query entry e reads
// key/value entry e / group — with q [B, H, T, D] and k, v [B, H_kv, T, D], H = H_kv · group,
// query head h of sequence b reads key/value head h / group of b, as repeat_interleave of k and v
// by group along the heads would give, without the copies. Backward sums dk and dv over the
// group: the fast kernel runs one key/value entry per chunk and its query entries one after the
// other, so no two threads write one dk.
//
// *Reference: the formulas row by row with std::exp and left-to-right sums, the whole row of p
// at once. *Fast: tiles of kAttentionQueryTile queries, each against the keys up to its diagonal
// in chunks of at most kAttentionKeyChunk keys (one chunk for T ≤ 256; every key when not
// causal): s by a small product (plus the bias row), an online softmax per query row across chunks
// (running max and sum, earlier partial outputs rescaled when the max grows), y, dq, dk, dv by
// small products; products and exp through the SIMD kernels (kernels/simd_kernels.h: `small_gemm`,
// a register-tiled product that reads one operand in place by broadcasts, so kᵀ and vᵀ are the only
// copies, one per head). Causal: keys past the diagonal are skipped and the diagonal's rows stop at
// the query; 32-query tiles waste 1/8 of the products on the masked triangle at T = 256, 64-query
// tiles 1/4. Backward walks the query tiles from the last, which sees every key, so dk and dv need
// no zeroing pass. Scratch, per thread and kept between calls: 2·T·D + T + 2·kQ·kK elements, never
// O(T²). Fast agrees with the reference to rounding (sums in another order): relative 1e-5 in f32
// on the op tests. The fast kernels run key/value entries on the intra-op threads
// (kernels/parallel.h), one per chunk with its group of query entries, each writing only its own
// rows and columns.
//
// Outputs must not alias inputs. Thread-safety: plain functions over caller-owned memory.
// Failure modes: none (shapes are checked by the op's inference).
//
// Example:
//   // q, k, v, y [B·H, T, D], lse [B·H, T]
//   kernels::CausalAttentionFast<float>(q, k, v, y, lse, B * H, T, D, 1.0f / std::sqrt(D));
//   // qkv [B, T, 3C] (q, k, v side by side), y [B, T, C], lse [B, H, T]
//   const auto in = kernels::AttentionLayout::Packed(H, T, C, 3 * C);
//   const auto out = kernels::AttentionLayout::Packed(H, T, C, C);
//   kernels::AttentionFast<float>(qkv, qkv + C, qkv + 2 * C, y, lse, B * H, T, C / H, scale,
//                                 {in, in, out});
//   // q [B, H, T, D], k, v [B, H / 2, T, D] (two query heads per key/value head)
//   kernels::AttentionFast<float>(q, k, v, y, lse, B * H, T, D, scale,
//                                 kernels::AttentionLayouts::Contiguous(T, D, 2));
//   // every key seen, padding keys hidden: bias [B, T] (0 or −inf)
//   kernels::AttentionFast<float>(q, k, v, y, lse, B * H, T, D, scale,
//                                 kernels::AttentionLayouts::Contiguous(T, D, 1),
//                                 kernels::AttentionMask<float>::Bidirectional(bias, H));
#pragma once

#include <cstdint>

namespace sluice::kernels {

// The fast kernels' tiling: queries per tile, and the most keys one product of a query tile
// takes (a query tile meets the keys up to its diagonal in chunks of this many).
inline constexpr int64_t kAttentionQueryTile = 32;
inline constexpr int64_t kAttentionKeyChunk = 256;

// Where batch entry e's [T, D] matrix lives: row i at base + Offset(e) + i·row_stride, with
// e = b·heads + h (b the sequence, h the head).
struct AttentionLayout {
  int64_t heads = 1;
  int64_t batch_stride = 0;  // from one sequence to the next
  int64_t head_stride = 0;   // from one head to the next within a sequence
  int64_t row_stride = 0;    // from one position to the next

  int64_t Offset(int64_t e) const { return (e / heads) * batch_stride + (e % heads) * head_stride; }

  // [batch, T, D], contiguous.
  static AttentionLayout Contiguous(int64_t t, int64_t d) { return {1, t * d, 0, d}; }
  // H heads of D = C / H channels side by side in rows `width` elements apart: [B, T, width] with
  // the heads in columns [0, C) — y [B, T, C] (width C), or q in qkv [B, T, 3C] (width 3C; k and
  // v have the same layout from base + C and base + 2C).
  static AttentionLayout Packed(int64_t heads, int64_t t, int64_t c, int64_t width) {
    return {heads, t * width, c / heads, width};
  }
};

// The layouts of one call: q and dq (indexed by query entry), k, v, dk and dv (indexed by
// key/value entry), y and dy (by query entry), and the query heads per key/value head.
struct AttentionLayouts {
  AttentionLayout q, kv, y;
  int64_t group = 1;

  // q, y [batch, T, D] and k, v [batch / group, T, D], contiguous.
  static AttentionLayouts Contiguous(int64_t t, int64_t d, int64_t group) {
    const AttentionLayout l = AttentionLayout::Contiguous(t, d);
    return {l, l, l, group};
  }
};

// Which keys each query sees (see the top): causal, or every key; and the key bias, row e / heads
// of [batch / heads, T] for query entry e (null: none).
template <typename T>
struct AttentionMask {
  bool causal = true;
  const T* key_bias = nullptr;
  int64_t heads = 1;  // query entries (heads of one sequence) per bias row

  static AttentionMask Causal() { return {}; }
  static AttentionMask Bidirectional(const T* key_bias = nullptr, int64_t heads = 1) {
    return {false, key_bias, heads};
  }
  // Query entry e's bias row of T keys, or null.
  const T* BiasRow(int64_t e, int64_t t) const {
    return key_bias == nullptr ? nullptr : key_bias + (e / heads) * t;
  }
};

// Causal, contiguous [batch, T, D] operands.
template <typename T>
void CausalAttentionReference(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch,
                              int64_t t, int64_t d, T scale);
template <typename T>
void CausalAttentionFast(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                         int64_t d, T scale);
// dlse may be null (no gradient reaches lse: dlse = 0).
template <typename T>
void CausalAttentionGradReference(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                                  const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                                  int64_t t, int64_t d, T scale);
template <typename T>
void CausalAttentionGradFast(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                             const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                             int64_t t, int64_t d, T scale);

// The operands where `l` says, the keys `mask` says; batch counts query entries.
template <typename T>
void AttentionReference(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                        int64_t d, T scale, const AttentionLayouts& l,
                        const AttentionMask<T>& mask = {});
template <typename T>
void AttentionFast(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                   int64_t d, T scale, const AttentionLayouts& l,
                   const AttentionMask<T>& mask = {});
template <typename T>
void AttentionGradReference(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                            const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch, int64_t t,
                            int64_t d, T scale, const AttentionLayouts& l,
                            const AttentionMask<T>& mask = {});
template <typename T>
void AttentionGradFast(const T* dy, const T* dlse, const T* q, const T* k, const T* v, const T* y,
                       const T* lse, T* dq, T* dk, T* dv, int64_t batch, int64_t t, int64_t d,
                       T scale, const AttentionLayouts& l, const AttentionMask<T>& mask = {});

}  // namespace sluice::kernels
