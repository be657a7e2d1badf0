// Elementwise unary kernels and their fused gradients, on contiguous buffers of n elements
// (any shape flattened: x, y, dy, dx are all [N]). T is float or double; explicit instantiations
// live in unary.cc.
//
// Where a fast kernel differs from the plain one, both exist: *Reference is the formula as written
// (libm calls, one element at a time) and *Fast is the vectorized form the ops run: the
// runtime-dispatched Highway kernels of simd_kernels.h (vectorised exp and tanh; the accuracy
// bounds are there); the op tests compare them. Kernels with one version are already tight loops
// (ForEachBlocked) or call libm functions that have no cheaper accurate form here (log, sqrt).
//
// GELU is the tanh approximation, exactly PyTorch's gelu(approximate='tanh'), in both versions:
//   gelu(x) = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
//
// SiLU is x·σ(x) = x / (1 + e^−x), PyTorch's silu; its fast form takes e^−x from the SIMD exp, as
// the sigmoid's does.
// The exact GELU is 0.5·x·(1 + erf(x/√2)), PyTorch's gelu(approximate='none'), with libm's erf.
//
// Inputs and outputs may not overlap (pointers are __restrict), unless a kernel says otherwise.
// Thread-safety: pure functions of their inputs.
#pragma once

#include <cstdint>

namespace sluice::kernels {

// y = -x.
template <typename T>
void Neg(const T* x, T* y, int64_t n);
// y = factor · x.
template <typename T>
void Scale(const T* x, T* y, int64_t n, T factor);
// y = max(x, 0).
template <typename T>
void Relu(const T* x, T* y, int64_t n);
// y = gelu(x) (tanh approximation).
template <typename T>
void GeluReference(const T* x, T* y, int64_t n);
template <typename T>
void GeluFast(const T* x, T* y, int64_t n);
// y = silu(x) = x / (1 + e^−x).
template <typename T>
void SiluReference(const T* x, T* y, int64_t n);
template <typename T>
void SiluFast(const T* x, T* y, int64_t n);
// y = σ(x) = 1 / (1 + e^−x), PyTorch's sigmoid: 0 (not NaN) where e^−x overflows.
template <typename T>
void SigmoidReference(const T* x, T* y, int64_t n);
template <typename T>
void SigmoidFast(const T* x, T* y, int64_t n);
// y = 0.5·x·(1 + erf(x/√2)) (exact GELU).
template <typename T>
void GeluErf(const T* x, T* y, int64_t n);
// y = tanh(x), e^x, ln x, √x.
template <typename T>
void TanhReference(const T* x, T* y, int64_t n);
template <typename T>
void TanhFast(const T* x, T* y, int64_t n);
template <typename T>
void ExpReference(const T* x, T* y, int64_t n);
template <typename T>
void ExpFast(const T* x, T* y, int64_t n);
template <typename T>
void Log(const T* x, T* y, int64_t n);
template <typename T>
void Sqrt(const T* x, T* y, int64_t n);

// y = x where x > 0, slope·x elsewhere (PyTorch's leaky_relu, negative_slope = slope).
template <typename T>
void LeakyRelu(const T* x, T* y, int64_t n, T slope);
// y = x clamped to [lo, hi] (PyTorch's hardtanh, min_val = lo, max_val = hi; ReLU6 is [0, 6]).
template <typename T>
void Hardtanh(const T* x, T* y, int64_t n, T lo, T hi);
// y = log(1 + e^(beta·x)) / beta, and x itself where beta·x > threshold (PyTorch's softplus, its
// formula: log1p(exp(beta·x)) / beta).
template <typename T>
void Softplus(const T* x, T* y, int64_t n, T beta, T threshold);

// Fused gradients: dx from the output gradient dy and one saved forward value.
// dx = dy where s > 0, else 0; s is relu's input or its output (they have the same sign pattern).
template <typename T>
void ReluGrad(const T* dy, const T* s, T* dx, int64_t n);
// dx = dy · gelu'(x). Both may run in place (dx = dy).
template <typename T>
void GeluGradReference(const T* dy, const T* x, T* dx, int64_t n);
template <typename T>
void GeluGradFast(const T* dy, const T* x, T* dx, int64_t n);
// dx = dy · silu'(x) = dy · σ(x)·(1 + x·(1 − σ(x))). Both may run in place (dx = dy).
template <typename T>
void SiluGradReference(const T* dy, const T* x, T* dx, int64_t n);
template <typename T>
void SiluGradFast(const T* dy, const T* x, T* dx, int64_t n);
// dx = dy · (Φ(x) + x·φ(x)), the exact GELU's derivative (Φ, φ: the normal CDF and density).
template <typename T>
void GeluErfGrad(const T* dy, const T* x, T* dx, int64_t n);
// dx = dy where x > 0, slope·dy elsewhere.
template <typename T>
void LeakyReluGrad(const T* dy, const T* x, T* dx, int64_t n, T slope);
// dx = dy where lo < y < hi, else 0; y is hardtanh's output (strictly inside exactly where its
// input is: PyTorch's hardtanh_backward).
template <typename T>
void HardtanhGrad(const T* dy, const T* y, T* dx, int64_t n, T lo, T hi);
// dx = dy · σ(beta·x) = dy · z / (z + 1), z = e^(beta·x); dy where beta·x > threshold.
template <typename T>
void SoftplusGrad(const T* dy, const T* x, T* dx, int64_t n, T beta, T threshold);
// dx = dy · (1 − y²) with y = tanh(x).
template <typename T>
void TanhGrad(const T* dy, const T* y, T* dx, int64_t n);
// dx = dy · y·(1 − y) with y = σ(x).
template <typename T>
void SigmoidGrad(const T* dy, const T* y, T* dx, int64_t n);

// y = static_cast<To>(x).
template <typename From, typename To>
void Cast(const From* x, To* y, int64_t n);

}  // namespace sluice::kernels
