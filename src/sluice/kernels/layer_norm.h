// Layer normalization over the last axis, forward and backward.
//
// Buffers are contiguous row-major, x [..., C] seen as `rows` rows of C = `cols` channels.
//   forward   mean_r = Σ_j x[r, j] / C,  var_r = Σ_j (x[r, j] − mean_r)² / C  (biased, as PyTorch)
//             rstd_r = 1 / sqrt(var_r + eps),  x̂ = (x − mean_r) · rstd_r
//             y[r, j] = x̂[r, j] · weight[j] + bias[j]
//   grad x    g = dy · weight,  dx = rstd_r · (g − mean_j(g) − x̂ · mean_j(g · x̂))
//   grad w,b  dweight[j] = Σ_r dy[r, j] · x̂[r, j],  dbias[j] = Σ_r dy[r, j]
//
// Memory choice: nothing is saved between forward and backward except x itself. Both backward
// kernels recompute mean and rstd from x (one extra pass over a row that is about to be read
// anyway) instead of keeping [rows] means and rstds alive from forward to backward. The gradient
// is split into the x part and the parameter part so that a zero-bubble schedule can run the
// parameter part (W) after the input part (B).
//
// *Reference: plain two-pass loops summing left to right. *Fast: the same two passes as
// runtime-dispatched SIMD row kernels (kernels/simd_kernels.h), sums kept per lane.
// Outputs must not alias inputs.
// Thread-safety: plain functions over caller-owned memory. Failure modes: none (shapes are checked
// by the op's inference; eps > 0 keeps rstd finite for constant rows).
//
// Example:
//   // x [B·T, C] -> y [B·T, C]
//   kernels::LayerNormFast<float>(x, w, b, y, B * T, C, 1e-5f);
#pragma once

#include <cstdint>

namespace sluice::kernels {

template <typename T>
void LayerNormReference(const T* x, const T* weight, const T* bias, T* y, int64_t rows,
                        int64_t cols, T eps);
template <typename T>
void LayerNormFast(const T* x, const T* weight, const T* bias, T* y, int64_t rows, int64_t cols,
                   T eps);

// dx [rows, cols] from dy, x [rows, cols] and weight [cols].
template <typename T>
void LayerNormGradXReference(const T* dy, const T* x, const T* weight, T* dx, int64_t rows,
                             int64_t cols, T eps);
template <typename T>
void LayerNormGradXFast(const T* dy, const T* x, const T* weight, T* dx, int64_t rows, int64_t cols,
                        T eps);

// dweight, dbias [cols] from dy, x [rows, cols]; both outputs are overwritten.
template <typename T>
void LayerNormGradParamsReference(const T* dy, const T* x, T* dweight, T* dbias, int64_t rows,
                                  int64_t cols, T eps);
template <typename T>
void LayerNormGradParamsFast(const T* dy, const T* x, T* dweight, T* dbias, int64_t rows,
                             int64_t cols, T eps);

}  // namespace sluice::kernels
