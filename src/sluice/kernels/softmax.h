// Softmax kernels over the last axis, with its gradient and causal (attention) masking.
//
// Every kernel works on contiguous row-major buffers seen as `rows` rows of `cols` entries
// (x [..., C] has rows = numel / C, cols = C); the causal ones see `batch` square matrices
// scores [..., T, T] (batch = numel / (T·T)), row i of a matrix being query position i and
// column j key position j.
//
//   Softmax         y[r, j] = e^(x[r, j] − m) / Σ_k e^(x[r, k] − m),  m = max_k x[r, k]
//                   (subtracting the row max keeps e^ ≤ 1: no overflow for any finite input).
//   SoftmaxGrad     dx[r, j] = y[r, j] · (dy[r, j] − Σ_k dy[r, k] · y[r, k])
//                   — the softmax VJP from y alone, so backward reads y and never x.
//   CausalMask      y = x, except y[b, i, j] = value for j > i (a key after the query).
//                   The default value is −inf: softmax then gives exactly 0 there, since
//                   e^(−inf) = 0 and the diagonal keeps every row's max finite.
//   CausalSoftmax   Softmax(CausalMask(x)) in one pass that never touches the masked entries
//                   except to write their 0s. Its VJP is SoftmaxGrad (y is 0 where masked).
//
// *Reference: plain loops, left-to-right sums, std::exp. *Fast: the runtime-dispatched SIMD row
// kernels (kernels/simd_kernels.h: Highway, vectorised exp; accuracy bounds there).
// Outputs must not alias inputs. Thread-safety: plain functions over caller-owned memory.
// Failure modes: none (shapes are checked by the op's inference); NaN in, NaN out.
//
// Example:
//   // attention probabilities: scores [B·H, T, T] -> probs [B·H, T, T]
//   kernels::CausalSoftmaxFast<float>(scores, probs, B * H, T);
#pragma once

#include <cstdint>

namespace sluice::kernels {

template <typename T>
void SoftmaxReference(const T* x, T* y, int64_t rows, int64_t cols);
template <typename T>
void SoftmaxFast(const T* x, T* y, int64_t rows, int64_t cols);

template <typename T>
void SoftmaxGradReference(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols);
template <typename T>
void SoftmaxGradFast(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols);

template <typename T>
void CausalMaskReference(const T* x, T* y, int64_t batch, int64_t t, T value);
template <typename T>
void CausalMaskFast(const T* x, T* y, int64_t batch, int64_t t, T value);

template <typename T>
void CausalSoftmaxReference(const T* x, T* y, int64_t batch, int64_t t);
template <typename T>
void CausalSoftmaxFast(const T* x, T* y, int64_t batch, int64_t t);

}  // namespace sluice::kernels
