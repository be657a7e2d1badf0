#include "sluice/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

// One row of the reference softmax over its first n entries: left-to-right max and sum, std::exp.
template <typename T>
void SoftmaxRowReference(const T* x, T* y, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    y[j] = std::exp(x[j] - m);
    sum += y[j];
  }
  for (int64_t j = 0; j < n; ++j) y[j] /= sum;
}

}  // namespace

template <typename T>
void SoftmaxReference(const T* x, T* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) SoftmaxRowReference(x + r * cols, y + r * cols, cols);
}

template <typename T>
void SoftmaxFast(const T* x, T* y, int64_t rows, int64_t cols) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    Simd<T>().softmax(x + begin * cols, y + begin * cols, end - begin, cols);
  });
}

template <typename T>
void SoftmaxGradReference(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * cols;
    const T* yr = y + r * cols;
    T* dxr = dx + r * cols;
    // s = Σ_k dy_k·y_k is the part of dy along y; the Jacobian diag(y) − y·yᵀ removes it.
    T s = 0;
    for (int64_t k = 0; k < cols; ++k) s += dyr[k] * yr[k];
    for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - s);
  }
}

template <typename T>
void SoftmaxGradFast(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols;
    Simd<T>().softmax_grad(dy + at, y + at, dx + at, end - begin, cols);
  });
}

template <typename T>
void CausalMaskReference(const T* x, T* y, int64_t batch, int64_t t, T value) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < t; ++j) {
        const int64_t at = (b * t + i) * t + j;
        y[at] = j > i ? value : x[at];  // key j comes after query i: hidden
      }
    }
  }
}

template <typename T>
void CausalMaskFast(const T* x, T* y, int64_t batch, int64_t t, T value) {
  for (int64_t row = 0; row < batch * t; ++row) {
    const int64_t i = row % t;  // query position: keys 0..i are visible
    std::memcpy(y + row * t, x + row * t, static_cast<size_t>(i + 1) * sizeof(T));
    std::fill(y + row * t + i + 1, y + (row + 1) * t, value);
  }
}

template <typename T>
void CausalSoftmaxReference(const T* x, T* y, int64_t batch, int64_t t) {
  for (int64_t row = 0; row < batch * t; ++row) {
    const int64_t i = row % t;
    SoftmaxRowReference(x + row * t, y + row * t, i + 1);  // over the visible keys 0..i
    for (int64_t j = i + 1; j < t; ++j) y[row * t + j] = T(0);
  }
}

template <typename T>
void CausalSoftmaxFast(const T* x, T* y, int64_t batch, int64_t t) {
  ParallelFor(batch * t, ChunkRows(t),
              [&](int64_t begin, int64_t end) { Simd<T>().causal_softmax(x, y, begin, end, t); });
}

template void SoftmaxReference<float>(const float*, float*, int64_t, int64_t);
template void SoftmaxFast<float>(const float*, float*, int64_t, int64_t);
template void SoftmaxGradReference<float>(const float*, const float*, float*, int64_t, int64_t);
template void SoftmaxGradFast<float>(const float*, const float*, float*, int64_t, int64_t);
template void CausalMaskReference<float>(const float*, float*, int64_t, int64_t, float);
template void CausalMaskFast<float>(const float*, float*, int64_t, int64_t, float);
template void CausalSoftmaxReference<float>(const float*, float*, int64_t, int64_t);
template void CausalSoftmaxFast<float>(const float*, float*, int64_t, int64_t);
template void SoftmaxReference<double>(const double*, double*, int64_t, int64_t);
template void SoftmaxFast<double>(const double*, double*, int64_t, int64_t);
template void SoftmaxGradReference<double>(const double*, const double*, double*, int64_t, int64_t);
template void SoftmaxGradFast<double>(const double*, const double*, double*, int64_t, int64_t);
template void CausalMaskReference<double>(const double*, double*, int64_t, int64_t, double);
template void CausalMaskFast<double>(const double*, double*, int64_t, int64_t, double);
template void CausalSoftmaxReference<double>(const double*, double*, int64_t, int64_t);
template void CausalSoftmaxFast<double>(const double*, double*, int64_t, int64_t);

}  // namespace sluice::kernels
