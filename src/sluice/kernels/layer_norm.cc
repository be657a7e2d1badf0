#include "sluice/kernels/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

template <typename T>
struct RowStats {
  T mean, rstd;
};

// Two passes, left to right: the mean, then the mean squared deviation from it.
template <typename T>
RowStats<T> StatsReference(const T* x, int64_t n, T eps) {
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const T mean = sum / static_cast<T>(n);
  T sq = 0;
  for (int64_t j = 0; j < n; ++j) sq += (x[j] - mean) * (x[j] - mean);
  const T var = sq / static_cast<T>(n);
  return {mean, T(1) / std::sqrt(var + eps)};
}

}  // namespace

template <typename T>
void LayerNormReference(const T* x, const T* weight, const T* bias, T* y, int64_t rows,
                        int64_t cols, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const RowStats<T> s = StatsReference(xr, cols, eps);
    for (int64_t j = 0; j < cols; ++j) {
      y[r * cols + j] = (xr[j] - s.mean) * s.rstd * weight[j] + bias[j];
    }
  }
}

template <typename T>
void LayerNormFast(const T* x, const T* weight, const T* bias, T* y, int64_t rows, int64_t cols,
                   T eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols;
    Simd<T>().layer_norm(x + at, weight, bias, y + at, end - begin, cols, eps);
  });
}

template <typename T>
void LayerNormGradXReference(const T* dy, const T* x, const T* weight, T* dx, int64_t rows,
                             int64_t cols, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const RowStats<T> s = StatsReference(xr, cols, eps);
    // With g = dy·weight, the gradient through x̂ removes g's mean and its component along x̂.
    T g_sum = 0, gx_sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const T g = dyr[j] * weight[j];
      const T xhat = (xr[j] - s.mean) * s.rstd;
      g_sum += g;
      gx_sum += g * xhat;
    }
    const T g_mean = g_sum / static_cast<T>(cols), gx_mean = gx_sum / static_cast<T>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const T g = dyr[j] * weight[j];
      const T xhat = (xr[j] - s.mean) * s.rstd;
      dx[r * cols + j] = s.rstd * (g - g_mean - xhat * gx_mean);
    }
  }
}

template <typename T>
void LayerNormGradXFast(const T* dy, const T* x, const T* weight, T* dx, int64_t rows, int64_t cols,
                        T eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols;
    Simd<T>().layer_norm_grad_x(dy + at, x + at, weight, dx + at, end - begin, cols, eps);
  });
}

template <typename T>
void LayerNormGradParamsReference(const T* dy, const T* x, T* dweight, T* dbias, int64_t rows,
                                  int64_t cols, T eps) {
  std::fill_n(dweight, cols, T(0));
  std::fill_n(dbias, cols, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const RowStats<T> s = StatsReference(xr, cols, eps);
    for (int64_t j = 0; j < cols; ++j) {
      const T xhat = (xr[j] - s.mean) * s.rstd;
      dweight[j] += dy[r * cols + j] * xhat;
      dbias[j] += dy[r * cols + j];
    }
  }
}

template <typename T>
void LayerNormGradParamsFast(const T* dy, const T* x, T* dweight, T* dbias, int64_t rows,
                             int64_t cols, T eps) {
  // One [dweight, dbias] partial per chunk of rows, added in chunk order: the same at any thread
  // count (kernels/parallel.h).
  const int64_t chunk = ChunkRows(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  std::vector<T> partials(static_cast<size_t>(chunks * 2 * cols), T(0));
  ParallelFor(rows, chunk, [&](int64_t begin, int64_t end) {
    T* pw = partials.data() + (begin / chunk) * 2 * cols;
    const int64_t at = begin * cols;
    Simd<T>().layer_norm_grad_params(dy + at, x + at, pw, pw + cols, end - begin, cols, eps);
  });
  std::fill_n(dweight, cols, T(0));
  std::fill_n(dbias, cols, T(0));
  for (int64_t c = 0; c < chunks; ++c) {
    const T* pw = partials.data() + c * 2 * cols;
    for (int64_t j = 0; j < cols; ++j) dweight[j] += pw[j];
    for (int64_t j = 0; j < cols; ++j) dbias[j] += pw[cols + j];
  }
}

template void LayerNormReference<float>(const float*, const float*, const float*, float*, int64_t,
                                        int64_t, float);
template void LayerNormFast<float>(const float*, const float*, const float*, float*, int64_t,
                                   int64_t, float);
template void LayerNormGradXReference<float>(const float*, const float*, const float*, float*,
                                             int64_t, int64_t, float);
template void LayerNormGradXFast<float>(const float*, const float*, const float*, float*, int64_t,
                                        int64_t, float);
template void LayerNormGradParamsReference<float>(const float*, const float*, float*, float*,
                                                  int64_t, int64_t, float);
template void LayerNormGradParamsFast<float>(const float*, const float*, float*, float*, int64_t,
                                             int64_t, float);
template void LayerNormReference<double>(const double*, const double*, const double*, double*,
                                         int64_t, int64_t, double);
template void LayerNormFast<double>(const double*, const double*, const double*, double*, int64_t,
                                    int64_t, double);
template void LayerNormGradXReference<double>(const double*, const double*, const double*, double*,
                                              int64_t, int64_t, double);
template void LayerNormGradXFast<double>(const double*, const double*, const double*, double*,
                                         int64_t, int64_t, double);
template void LayerNormGradParamsReference<double>(const double*, const double*, double*, double*,
                                                   int64_t, int64_t, double);
template void LayerNormGradParamsFast<double>(const double*, const double*, double*, double*,
                                              int64_t, int64_t, double);

}  // namespace sluice::kernels
