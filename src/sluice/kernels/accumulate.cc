#include "sluice/kernels/accumulate.h"

#include <cblas.h>

#include "sluice/kernels/blas.h"

#include <algorithm>
#include <climits>

namespace sluice::kernels {

namespace {

// Calls f(offset, count) over [0, n) in pieces CBLAS can count (int).
template <typename F>
void InBlasPieces(int64_t n, F f) {
  EnsureBlasKernels();
  for (int64_t offset = 0; offset < n; offset += INT_MAX) {
    f(offset, static_cast<int>(std::min<int64_t>(n - offset, INT_MAX)));
  }
}

void Axpy(int count, float alpha, const float* x, float* y) {
  cblas_saxpy(count, alpha, x, 1, y, 1);
}
void Axpy(int count, double alpha, const double* x, double* y) {
  cblas_daxpy(count, alpha, x, 1, y, 1);
}
void Scal(int count, float alpha, float* x) { cblas_sscal(count, alpha, x, 1); }
void Scal(int count, double alpha, double* x) { cblas_dscal(count, alpha, x, 1); }

}  // namespace

template <typename T>
void AxpyReference(const T* x, T* y, int64_t n, T alpha) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <typename T>
void AxpyBlas(const T* x, T* y, int64_t n, T alpha) {
  InBlasPieces(n, [&](int64_t offset, int count) { Axpy(count, alpha, x + offset, y + offset); });
}

template <typename T>
void ScaleInPlaceReference(T* x, int64_t n, T alpha) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

template <typename T>
void ScaleInPlaceBlas(T* x, int64_t n, T alpha) {
  InBlasPieces(n, [&](int64_t offset, int count) { Scal(count, alpha, x + offset); });
}

template void AxpyReference<float>(const float*, float*, int64_t, float);
template void AxpyReference<double>(const double*, double*, int64_t, double);
template void AxpyBlas<float>(const float*, float*, int64_t, float);
template void AxpyBlas<double>(const double*, double*, int64_t, double);
template void ScaleInPlaceReference<float>(float*, int64_t, float);
template void ScaleInPlaceReference<double>(double*, int64_t, double);
template void ScaleInPlaceBlas<float>(float*, int64_t, float);
template void ScaleInPlaceBlas<double>(double*, int64_t, double);

}  // namespace sluice::kernels
