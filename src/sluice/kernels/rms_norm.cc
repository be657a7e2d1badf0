#include "sluice/kernels/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

// 1 / sqrt(mean of squares + eps), the squares summed left to right.
template <typename T>
T RstdReference(const T* x, int64_t n, T eps) {
  T sq = 0;
  for (int64_t j = 0; j < n; ++j) sq += x[j] * x[j];
  return T(1) / std::sqrt(sq / static_cast<T>(n) + eps);
}

}  // namespace

template <typename T>
void RmsNormReference(const T* x, const T* weight, T* y, int64_t rows, int64_t cols, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T rstd = RstdReference(xr, cols, eps);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = xr[j] * rstd * weight[j];
  }
}

template <typename T>
void RmsNormFast(const T* x, const T* weight, T* y, int64_t rows, int64_t cols, T eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols;
    Simd<T>().rms_norm(x + at, weight, y + at, end - begin, cols, eps);
  });
}

template <typename T>
void RmsNormGradXReference(const T* dy, const T* x, const T* weight, T* dx, int64_t rows,
                           int64_t cols, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const T rstd = RstdReference(xr, cols, eps);
    // With g = dy·weight, the gradient through x̂ = x·rstd removes g's component along x̂ (rstd
    // depends on x through its squares only, so, unlike layer norm, no mean of g is removed).
    T gx_sum = 0;
    for (int64_t j = 0; j < cols; ++j) gx_sum += dyr[j] * weight[j] * (xr[j] * rstd);
    const T gx_mean = gx_sum / static_cast<T>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const T g = dyr[j] * weight[j];
      const T xhat = xr[j] * rstd;
      dx[r * cols + j] = rstd * (g - xhat * gx_mean);
    }
  }
}

template <typename T>
void RmsNormGradXFast(const T* dy, const T* x, const T* weight, T* dx, int64_t rows, int64_t cols,
                      T eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols;
    Simd<T>().rms_norm_grad_x(dy + at, x + at, weight, dx + at, end - begin, cols, eps);
  });
}

template <typename T>
void RmsNormGradWeightReference(const T* dy, const T* x, T* dweight, int64_t rows, int64_t cols,
                                T eps) {
  std::fill_n(dweight, cols, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T rstd = RstdReference(xr, cols, eps);
    for (int64_t j = 0; j < cols; ++j) dweight[j] += dy[r * cols + j] * (xr[j] * rstd);
  }
}

template <typename T>
void RmsNormGradWeightFast(const T* dy, const T* x, T* dweight, int64_t rows, int64_t cols, T eps) {
  // One [dweight] partial per chunk of rows, added in chunk order: the same at any thread count
  // (kernels/parallel.h).
  const int64_t chunk = ChunkRows(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  std::vector<T> partials(static_cast<size_t>(chunks * cols), T(0));
  ParallelFor(rows, chunk, [&](int64_t begin, int64_t end) {
    T* pw = partials.data() + (begin / chunk) * cols;
    const int64_t at = begin * cols;
    Simd<T>().rms_norm_grad_weight(dy + at, x + at, pw, end - begin, cols, eps);
  });
  std::fill_n(dweight, cols, T(0));
  for (int64_t c = 0; c < chunks; ++c) {
    const T* pw = partials.data() + c * cols;
    for (int64_t j = 0; j < cols; ++j) dweight[j] += pw[j];
  }
}

template void RmsNormReference<float>(const float*, const float*, float*, int64_t, int64_t, float);
template void RmsNormFast<float>(const float*, const float*, float*, int64_t, int64_t, float);
template void RmsNormGradXReference<float>(const float*, const float*, const float*, float*,
                                           int64_t, int64_t, float);
template void RmsNormGradXFast<float>(const float*, const float*, const float*, float*, int64_t,
                                      int64_t, float);
template void RmsNormGradWeightReference<float>(const float*, const float*, float*, int64_t,
                                                int64_t, float);
template void RmsNormGradWeightFast<float>(const float*, const float*, float*, int64_t, int64_t,
                                           float);
template void RmsNormReference<double>(const double*, const double*, double*, int64_t, int64_t,
                                       double);
template void RmsNormFast<double>(const double*, const double*, double*, int64_t, int64_t, double);
template void RmsNormGradXReference<double>(const double*, const double*, const double*, double*,
                                            int64_t, int64_t, double);
template void RmsNormGradXFast<double>(const double*, const double*, const double*, double*,
                                       int64_t, int64_t, double);
template void RmsNormGradWeightReference<double>(const double*, const double*, double*, int64_t,
                                                 int64_t, double);
template void RmsNormGradWeightFast<double>(const double*, const double*, double*, int64_t, int64_t,
                                            double);

}  // namespace sluice::kernels
