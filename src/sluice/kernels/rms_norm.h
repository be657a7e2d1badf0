// RMS normalization over the last axis (Llama's RMSNorm), forward and backward.
//
// Buffers are contiguous row-major, x [..., C] seen as `rows` rows of C = `cols` channels.
//   forward   rstd_r = 1 / sqrt(Σ_j x[r, j]² / C + eps),  x̂ = x · rstd_r   (no mean removed)
//             y[r, j] = x̂[r, j] · weight[j]
//             (PyTorch: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight)
//   grad x    g = dy · weight,  dx = rstd_r · (g − x̂ · mean_j(g · x̂))
//   grad w    dweight[j] = Σ_r dy[r, j] · x̂[r, j]
//
// Memory choice, as layer_norm.h: nothing is saved between forward and backward except x itself;
// both backward kernels recompute rstd from x. The gradient is split into the x part and the
// weight part so that a zero-bubble schedule can run the weight part (W) after the input part (B).
//
// *Reference: plain loops summing left to right. *Fast: the same passes as runtime-dispatched
// SIMD row kernels (kernels/simd_kernels.h), sums kept per lane.
// Outputs must not alias inputs.
// Thread-safety: plain functions over caller-owned memory. Failure modes: none (shapes are checked
// by the op's inference; eps > 0 keeps rstd finite for all-zero rows).
//
// Example:
//   // x [B·T, C] -> y [B·T, C]
//   kernels::RmsNormFast<float>(x, w, y, B * T, C, 1e-6f);
#pragma once

#include <cstdint>

namespace sluice::kernels {

// y [rows, cols] from x [rows, cols] and weight [cols].
template <typename T>
void RmsNormReference(const T* x, const T* weight, T* y, int64_t rows, int64_t cols, T eps);
template <typename T>
void RmsNormFast(const T* x, const T* weight, T* y, int64_t rows, int64_t cols, T eps);

// dx [rows, cols] from dy, x [rows, cols] and weight [cols].
template <typename T>
void RmsNormGradXReference(const T* dy, const T* x, const T* weight, T* dx, int64_t rows,
                           int64_t cols, T eps);
template <typename T>
void RmsNormGradXFast(const T* dy, const T* x, const T* weight, T* dx, int64_t rows, int64_t cols,
                      T eps);

// dweight [cols] from dy, x [rows, cols]; the output is overwritten.
template <typename T>
void RmsNormGradWeightReference(const T* dy, const T* x, T* dweight, int64_t rows, int64_t cols,
                                T eps);
template <typename T>
void RmsNormGradWeightFast(const T* dy, const T* x, T* dweight, int64_t rows, int64_t cols, T eps);

}  // namespace sluice::kernels
