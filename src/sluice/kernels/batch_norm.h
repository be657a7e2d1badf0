// Batch normalization over every axis but the channels (nn.BatchNorm1d/2d), forward, backward and
// the running statistics' update.
//
// Buffers are contiguous row-major, x [B, C, S...] seen as [B, C, S] with S the product of the
// axes after the channels (1 for [B, C]); channel c holds the N = B·S values x[b, c, s].
//   batch statistics  mean_c = Σ x / N,  var_c = Σ (x − mean_c)² / N  (biased, as PyTorch's
//   forward) forward           rstd_c = 1 / sqrt(var_c + eps),  y = (x − mean_c) · rstd_c ·
//   weight_c + bias_c
//                     (with given statistics — the running ones, in evaluation — instead of the
//                     batch's when mean and var are passed)
//   grad x            x̂ = (x − mean_c) · rstd_c,
//                     dx = weight_c · rstd_c · (dy − mean(dy) − x̂ · mean(dy · x̂))  (batch
//                     statistics)
//   grad w, b         dweight_c = Σ dy · x̂,  dbias_c = Σ dy
//   running update    running_mean = (1 − momentum) · running_mean + momentum · mean_c,
//                     running_var = (1 − momentum) · running_var + momentum · var_c · N / (N − 1)
//                     (the unbiased variance, as PyTorch; N = 1 keeps var_c · N / (N − 1) = NaN, as
//                     PyTorch does)
// The reference accumulates every per-channel sum in double, as PyTorch's CPU kernels do; the fast
// kernels add a run of S values in vector lanes of T over blocks of 512 elements and the blocks in
// double (simd_kernels.h blocked_sum, centered_squares, centered_dot: a lane adds at most 32 f32
// terms with AVX-512), the variance about the mean rounded to T with that rounding's share taken
// off exactly — within 2e-5 relative of the reference in f32 (the op harness's tolerance), runs
// shorter than 16 values (BatchNorm1d's [B, C]) through the reference's double loops.
//
// Memory choice: nothing is saved between forward and backward but x; both backward kernels
// recompute the channel's mean and rstd from x (one pass over values about to be read anyway).
//
// *Reference: the formulas above, one channel after another. *Fast: the channels split over the
// intra-op threads (kernels/parallel.h), the output an affine map of x per channel (PyTorch's
// alpha = rstd · weight, beta = bias − mean · alpha), every pass over a run one SIMD row kernel
// (kernels/simd_kernels.h: two passes for the statistics, one for Σ dy and Σ dy·x̂, one for the
// output), one channel's work on one thread, so the result is the same at any thread count. Outputs
// must not alias inputs. Thread-safety: plain functions over caller-owned memory. Failure modes:
// none (shapes are checked by the ops' inference; eps > 0 keeps rstd finite for a constant
// channel).
//
// Example:
//   // x [B, C, H, W] -> y [B, C, H, W]
//   kernels::BatchNormFast<float>(x, w, b, nullptr, nullptr, y, {B, C, H * W}, 1e-5);
#pragma once

#include <cstdint>

namespace sluice::kernels {

// x as [B, C, S].
struct BatchNormDims {
  int64_t batch = 0, channels = 0, inner = 1;
};

// y from x, weight and bias [C], with the batch's statistics (mean and var null) or the given
// ones (mean and var [C]).
template <typename T>
void BatchNormReference(const T* x, const T* weight, const T* bias, const T* mean, const T* var,
                        T* y, BatchNormDims d, double eps);
template <typename T>
void BatchNormFast(const T* x, const T* weight, const T* bias, const T* mean, const T* var, T* y,
                   BatchNormDims d, double eps);

// dx from dy, x and weight under the batch's statistics.
template <typename T>
void BatchNormGradXReference(const T* dy, const T* x, const T* weight, T* dx, BatchNormDims d,
                             double eps);
template <typename T>
void BatchNormGradXFast(const T* dy, const T* x, const T* weight, T* dx, BatchNormDims d,
                        double eps);

// dweight, dbias [C] from dy and x under the batch's statistics; both overwritten.
template <typename T>
void BatchNormGradParamsReference(const T* dy, const T* x, T* dweight, T* dbias, BatchNormDims d,
                                  double eps);
template <typename T>
void BatchNormGradParamsFast(const T* dy, const T* x, T* dweight, T* dbias, BatchNormDims d,
                             double eps);

// running_mean, running_var [C] moved towards x's batch statistics, in place.
template <typename T>
void BatchNormUpdateStatsReference(const T* x, T* running_mean, T* running_var, BatchNormDims d,
                                   double momentum);
template <typename T>
void BatchNormUpdateStatsFast(const T* x, T* running_mean, T* running_var, BatchNormDims d,
                              double momentum);

}  // namespace sluice::kernels
