// Fused causal attention, forward and backward, in the manner of FlashAttention (Dao et al. 2022):
// the [T, T] probabilities are never stored. Per batch entry (one head of one sequence):
//
//   s[i, j] = scale · q[i]·k[j]                     for keys j ≤ i (causal), −inf for j > i
//   lse[i]  = log Σ_j e^(s[i, j])                   (the log-sum-exp of row i)
//   p[i, j] = e^(s[i, j] − lse[i])                  (softmax over the visible keys)
//   y[i]    = Σ_j p[i, j] · v[j]
//
// q, k, v, y are [batch, T, D] (batch = B·H, T positions, D head channels) and lse is [batch, T];
// forward writes y and lse, and backward recomputes p from q, k and lse:
//
//   dp[i, j] = dy[i]·v[j]
//   ds[i, j] = p[i, j] · (dp[i, j] − (dy[i]·y[i] − dlse[i]))   (softmax backward; dlse[i] adds to
//   it) dq[i] = scale · Σ_j ds[i, j] · k[j]    dk[j] = scale · Σ_i ds[i, j] · q[i]    dv[j] = Σ_i
//   p[i, j] · dy[i]
//
// *Reference: the formulas row by row with std::exp and left-to-right sums, the whole row of p
// at once. *Fast: tiles of kTile queries × kTile keys: s by GEMM (kernels/matmul.h), an online
// softmax per query row (running max and sum, earlier partial outputs rescaled when the max grows),
// y, dq, dk, dv by GEMM, exp through the SIMD row kernels (kernels/simd_kernels.h); tiles above
// the diagonal are skipped and the diagonal tile's rows stop at the query. Scratch: a few tiles
// (O(kTile²) floats), never O(T²). Fast agrees with the reference to rounding (sums in another
// order): relative 1e-5 in f32 on the op tests.
//
// Outputs must not alias inputs. Thread-safety: plain functions over caller-owned memory.
// Failure modes: none (shapes are checked by the op's inference).
//
// Example:
//   // q, k, v, y [B·H, T, D], lse [B·H, T]
//   kernels::CausalAttentionFast<float>(q, k, v, y, lse, B * H, T, D, 1.0f / std::sqrt(D));
#pragma once

#include <cstdint>

namespace sluice::kernels {

// Queries and keys per tile of the fast kernels.
inline constexpr int64_t kAttentionTile = 64;

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

}  // namespace sluice::kernels
