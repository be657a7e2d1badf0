#include "sluice/kernels/unary.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

// GELU constants as PyTorch writes them: kBeta = M_SQRT2 · M_2_SQRTPI · 0.5 = √(2/π).
template <typename T>
constexpr T kBeta = static_cast<T>(std::numbers::sqrt2* std::numbers::inv_sqrtpi);
template <typename T>
constexpr T kKappa = T(0.044715);

}  // namespace

template <typename T>
void Neg(const T* __restrict x, T* __restrict y, int64_t n) {
  ForEachBlocked(n, [&](int64_t i) { y[i] = -x[i]; });
}

template <typename T>
void Scale(const T* __restrict x, T* __restrict y, int64_t n, T factor) {
  ForEachBlocked(n, [&](int64_t i) { y[i] = factor * x[i]; });
}

template <typename T>
void Relu(const T* __restrict x, T* __restrict y, int64_t n) {
  ForEachBlocked(n, [&](int64_t i) { y[i] = x[i] < T(0) ? T(0) : x[i]; });  // NaN stays NaN
}

template <typename T>
void GeluReference(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // PyTorch's GeluKernelImpl, approximate='tanh'.
    const T x_cube = x[i] * x[i] * x[i];
    const T inner = kBeta<T> * (x[i] + kKappa<T> * x_cube);
    y[i] = T(0.5) * x[i] * (T(1) + std::tanh(inner));
  }
}

template <typename T>
void GeluFast(const T* x, T* y, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    Simd<T>().gelu(x + begin, y + begin, end - begin);
  });
}

template <typename T>
void SiluReference(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}

// e^−x of a block by the SIMD exp, into `e` (kSiluBlock elements at most).
constexpr int64_t kSiluBlock = 256;

template <typename T>
void ExpNegBlock(const T* x, T* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = -x[i];
  Simd<T>().exp(e, e, n);
}

// y[i] = f(x[i], e^−x[i]), e^−x by the SIMD exp a block at a time.
template <typename T, typename F>
void MapWithExpNeg(const T* x, T* y, int64_t n, F f) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    T e[kSiluBlock];
    for (int64_t b = begin; b < end; b += kSiluBlock) {
      const int64_t m = std::min(kSiluBlock, end - b);
      ExpNegBlock(x + b, e, m);
      for (int64_t i = 0; i < m; ++i) y[b + i] = f(x[b + i], e[i]);
    }
  });
}

template <typename T>
void SiluFast(const T* x, T* y, int64_t n) {
  MapWithExpNeg(x, y, n, [](T v, T e) { return v / (T(1) + e); });
}

template <typename T>
void SigmoidReference(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}

template <typename T>
void SigmoidFast(const T* x, T* y, int64_t n) {
  MapWithExpNeg(x, y, n, [](T, T e) { return T(1) / (T(1) + e); });
}

template <typename T>
void SiluGradReference(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-x[i]));
    dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

template <typename T>
void SiluGradFast(const T* dy, const T* x, T* dx, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    T e[kSiluBlock];
    for (int64_t b = begin; b < end; b += kSiluBlock) {
      const int64_t m = std::min(kSiluBlock, end - b);
      ExpNegBlock(x + b, e, m);
      for (int64_t i = 0; i < m; ++i) {
        const T s = T(1) / (T(1) + e[i]);
        dx[b + i] = dy[b + i] * s * (T(1) + x[b + i] * (T(1) - s));
      }
    }
  });
}

template <typename T>
void GeluErf(const T* x, T* y, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * static_cast<T>(std::numbers::sqrt2 / 2)));
  });
}

template <typename T>
void GeluErfGrad(const T* dy, const T* x, T* dx, int64_t n) {
  // PyTorch's GeluBackwardKernelImpl, approximate='none': Φ(x) + x·φ(x).
  const T inv_sqrt2 = static_cast<T>(std::numbers::sqrt2 / 2);
  const T inv_sqrt_2pi = static_cast<T>(std::numbers::inv_sqrtpi * std::numbers::sqrt2 / 2);
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T cdf = T(0.5) * (T(1) + std::erf(x[i] * inv_sqrt2));
      const T pdf = inv_sqrt_2pi * std::exp(T(-0.5) * x[i] * x[i]);
      dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
  });
}

template <typename T>
void TanhReference(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

template <typename T>
void TanhFast(const T* x, T* y, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    Simd<T>().tanh(x + begin, y + begin, end - begin);
  });
}

template <typename T>
void ExpReference(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

template <typename T>
void ExpFast(const T* x, T* y, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    Simd<T>().exp(x + begin, y + begin, end - begin);
  });
}

template <typename T>
void Log(const T* __restrict x, T* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]);
}

template <typename T>
void Sqrt(const T* __restrict x, T* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
}

template <typename T>
void LeakyRelu(const T* __restrict x, T* __restrict y, int64_t n, T slope) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : x[i] * slope;
}

template <typename T>
void Hardtanh(const T* __restrict x, T* __restrict y, int64_t n, T lo, T hi) {
  // Vector code: the two selects are not if-converted at -O2 either (a branch per element).
  MapVec<T>(x, y, n, [lo, hi](Vec<T> v) SLUICE_ALWAYS_INLINE {
    const Vec<T> low = v < lo ? Vec<T>{} + lo : v;  // NaN stays NaN
    return low > hi ? Vec<T>{} + hi : low;
  });
}

template <typename T>
void HardtanhGrad(const T* __restrict dy, const T* __restrict y, T* __restrict dx, int64_t n, T lo,
                  T hi) {
  // As ReluGrad: a select on another operand is not if-converted at -O2 (a branch per element,
  // mispredicted on half of them: 60% of a MobileNet's step), so vector code.
  MapVec2<T>(dy, y, dx, n, [lo, hi](Vec<T> g, Vec<T> v) SLUICE_ALWAYS_INLINE {
    return (v > lo) & (v < hi) ? g : Vec<T>{};
  });
}

template <typename T>
void Softplus(const T* __restrict x, T* __restrict y, int64_t n, T beta, T threshold) {
  for (int64_t i = 0; i < n; ++i) {
    const T bx = x[i] * beta;
    y[i] = bx > threshold ? x[i] : std::log1p(std::exp(bx)) / beta;
  }
}

template <typename T>
void LeakyReluGrad(const T* __restrict dy, const T* __restrict x, T* __restrict dx, int64_t n,
                   T slope) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? dy[i] : dy[i] * slope;
}

template <typename T>
void SoftplusGrad(const T* __restrict dy, const T* __restrict x, T* __restrict dx, int64_t n,
                  T beta, T threshold) {
  for (int64_t i = 0; i < n; ++i) {
    const T bx = x[i] * beta;
    const T z = std::exp(bx);
    dx[i] = bx > threshold ? dy[i] : dy[i] * z / (z + T(1));
  }
}

template <typename T>
void ReluGrad(const T* __restrict dy, const T* __restrict s, T* __restrict dx, int64_t n) {
  // A select on another operand's sign is not if-converted at -O2: vector code.
  MapVec2<T>(dy, s, dx, n,
             [](Vec<T> g, Vec<T> v) SLUICE_ALWAYS_INLINE { return v > T(0) ? g : Vec<T>{}; });
}

template <typename T>
void GeluGradReference(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // PyTorch's GeluBackwardKernelImpl, approximate='tanh': d/dx of 0.5·x·(1 + tanh(inner)).
    const T x_sq = x[i] * x[i];
    const T x_cube = x_sq * x[i];
    const T inner = kBeta<T> * (x[i] + kKappa<T> * x_cube);
    const T tanh_inner = std::tanh(inner);
    const T left = T(0.5) * x[i];
    const T right = T(1) + tanh_inner;
    const T left_derivative = T(0.5) * right;
    const T tanh_derivative = T(1) - tanh_inner * tanh_inner;
    const T inner_derivative = kBeta<T> * (T(1) + T(3) * kKappa<T> * x_sq);
    const T right_derivative = left * tanh_derivative * inner_derivative;
    dx[i] = dy[i] * (left_derivative + right_derivative);
  }
}

template <typename T>
void GeluGradFast(const T* dy, const T* x, T* dx, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    Simd<T>().gelu_grad(dy + begin, x + begin, dx + begin, end - begin);
  });
}

template <typename T>
void TanhGrad(const T* __restrict dy, const T* __restrict y, T* __restrict dx, int64_t n) {
  ForEachBlocked(n, [&](int64_t i) { dx[i] = dy[i] * (T(1) - y[i] * y[i]); });
}

template <typename T>
void SigmoidGrad(const T* __restrict dy, const T* __restrict y, T* __restrict dx, int64_t n) {
  ForEachBlocked(n, [&](int64_t i) { dx[i] = dy[i] * y[i] * (T(1) - y[i]); });
}

template <typename From, typename To>
void Cast(const From* __restrict x, To* __restrict y, int64_t n) {
  ForEachBlocked(n, [&](int64_t i) { y[i] = static_cast<To>(x[i]); });
}

// Explicit instantiations for the two dtypes kernels compute.
template void Neg<float>(const float*, float*, int64_t);
template void Scale<float>(const float*, float*, int64_t, float);
template void Relu<float>(const float*, float*, int64_t);
template void GeluReference<float>(const float*, float*, int64_t);
template void GeluFast<float>(const float*, float*, int64_t);
template void SiluReference<float>(const float*, float*, int64_t);
template void SiluFast<float>(const float*, float*, int64_t);
template void GeluErf<float>(const float*, float*, int64_t);
template void SiluGradReference<float>(const float*, const float*, float*, int64_t);
template void SiluGradFast<float>(const float*, const float*, float*, int64_t);
template void GeluErfGrad<float>(const float*, const float*, float*, int64_t);
template void TanhReference<float>(const float*, float*, int64_t);
template void TanhFast<float>(const float*, float*, int64_t);
template void ExpReference<float>(const float*, float*, int64_t);
template void ExpFast<float>(const float*, float*, int64_t);
template void Log<float>(const float*, float*, int64_t);
template void Sqrt<float>(const float*, float*, int64_t);
template void ReluGrad<float>(const float*, const float*, float*, int64_t);
template void GeluGradReference<float>(const float*, const float*, float*, int64_t);
template void GeluGradFast<float>(const float*, const float*, float*, int64_t);
template void TanhGrad<float>(const float*, const float*, float*, int64_t);
template void SigmoidReference<float>(const float*, float*, int64_t);
template void SigmoidFast<float>(const float*, float*, int64_t);
template void SigmoidGrad<float>(const float*, const float*, float*, int64_t);
template void LeakyRelu<float>(const float*, float*, int64_t, float);
template void Hardtanh<float>(const float*, float*, int64_t, float, float);
template void HardtanhGrad<float>(const float*, const float*, float*, int64_t, float, float);
template void Hardtanh<double>(const double*, double*, int64_t, double, double);
template void HardtanhGrad<double>(const double*, const double*, double*, int64_t, double, double);
template void Softplus<float>(const float*, float*, int64_t, float, float);
template void LeakyReluGrad<float>(const float*, const float*, float*, int64_t, float);
template void SoftplusGrad<float>(const float*, const float*, float*, int64_t, float, float);
template void Neg<double>(const double*, double*, int64_t);
template void Scale<double>(const double*, double*, int64_t, double);
template void Relu<double>(const double*, double*, int64_t);
template void GeluReference<double>(const double*, double*, int64_t);
template void GeluFast<double>(const double*, double*, int64_t);
template void SiluReference<double>(const double*, double*, int64_t);
template void SiluFast<double>(const double*, double*, int64_t);
template void GeluErf<double>(const double*, double*, int64_t);
template void SiluGradReference<double>(const double*, const double*, double*, int64_t);
template void SiluGradFast<double>(const double*, const double*, double*, int64_t);
template void GeluErfGrad<double>(const double*, const double*, double*, int64_t);
template void TanhReference<double>(const double*, double*, int64_t);
template void TanhFast<double>(const double*, double*, int64_t);
template void ExpReference<double>(const double*, double*, int64_t);
template void ExpFast<double>(const double*, double*, int64_t);
template void Log<double>(const double*, double*, int64_t);
template void Sqrt<double>(const double*, double*, int64_t);
template void ReluGrad<double>(const double*, const double*, double*, int64_t);
template void GeluGradReference<double>(const double*, const double*, double*, int64_t);
template void GeluGradFast<double>(const double*, const double*, double*, int64_t);
template void TanhGrad<double>(const double*, const double*, double*, int64_t);
template void SigmoidReference<double>(const double*, double*, int64_t);
template void SigmoidFast<double>(const double*, double*, int64_t);
template void SigmoidGrad<double>(const double*, const double*, double*, int64_t);
template void LeakyRelu<double>(const double*, double*, int64_t, double);
template void Softplus<double>(const double*, double*, int64_t, double, double);
template void LeakyReluGrad<double>(const double*, const double*, double*, int64_t, double);
template void SoftplusGrad<double>(const double*, const double*, double*, int64_t, double, double);

template void Cast<float, double>(const float*, double*, int64_t);
template void Cast<double, float>(const double*, float*, int64_t);
template void Cast<float, float>(const float*, float*, int64_t);
template void Cast<double, double>(const double*, double*, int64_t);
template void Cast<int64_t, float>(const int64_t*, float*, int64_t);
template void Cast<int64_t, double>(const int64_t*, double*, int64_t);
template void Cast<int32_t, float>(const int32_t*, float*, int64_t);
template void Cast<int32_t, double>(const int32_t*, double*, int64_t);

}  // namespace sluice::kernels
