#include "sluice/kernels/swiglu.h"

#include <algorithm>
#include <cmath>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

// e = e^−a over m elements, from the SIMD exp.
template <typename T>
void ExpNeg(const T* a, T* e, int64_t m) {
  for (int64_t i = 0; i < m; ++i) e[i] = -a[i];
  Simd<T>().exp(e, e, m);
}

}  // namespace

template <typename T>
void SwigluBlock(const T* a, const T* b, T* y, int64_t m) {
  T e[kSwigluBlock];
  ExpNeg(a, e, m);
  for (int64_t i = 0; i < m; ++i) y[i] = a[i] / (T(1) + e[i]) * b[i];
}

template <typename T>
void SwigluGradBlock(const T* dy, const T* a, const T* b, T* da, T* db, int64_t m) {
  T e[kSwigluBlock];
  ExpNeg(a, e, m);
  for (int64_t i = 0; i < m; ++i) {
    const T x = a[i], g = dy[i], s = T(1) / (T(1) + e[i]);
    da[i] = g * b[i] * s * (T(1) + x * (T(1) - s));
    db[i] = g * x * s;
  }
}

template <typename T>
void SwigluReference(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (T(1) + std::exp(-a[i])) * b[i];
}

template <typename T>
void SwigluFast(const T* a, const T* b, T* y, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; k += kSwigluBlock)
      SwigluBlock(a + k, b + k, y + k, std::min(kSwigluBlock, end - k));
  });
}

template <typename T>
void SwigluGradReference(const T* dy, const T* a, const T* b, T* da, T* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-a[i]));
    da[i] = dy[i] * b[i] * s * (T(1) + a[i] * (T(1) - s));
    db[i] = dy[i] * a[i] * s;
  }
}

template <typename T>
void SwigluGradFast(const T* dy, const T* a, const T* b, T* da, T* db, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; k += kSwigluBlock) {
      SwigluGradBlock(dy + k, a + k, b + k, da + k, db + k, std::min(kSwigluBlock, end - k));
    }
  });
}

template void SwigluBlock<float>(const float*, const float*, float*, int64_t);
template void SwigluGradBlock<float>(const float*, const float*, const float*, float*, float*,
                                     int64_t);
template void SwigluReference<float>(const float*, const float*, float*, int64_t);
template void SwigluFast<float>(const float*, const float*, float*, int64_t);
template void SwigluGradReference<float>(const float*, const float*, const float*, float*, float*,
                                         int64_t);
template void SwigluGradFast<float>(const float*, const float*, const float*, float*, float*,
                                    int64_t);
template void SwigluBlock<double>(const double*, const double*, double*, int64_t);
template void SwigluGradBlock<double>(const double*, const double*, const double*, double*, double*,
                                      int64_t);
template void SwigluReference<double>(const double*, const double*, double*, int64_t);
template void SwigluFast<double>(const double*, const double*, double*, int64_t);
template void SwigluGradReference<double>(const double*, const double*, const double*, double*,
                                          double*, int64_t);
template void SwigluGradFast<double>(const double*, const double*, const double*, double*, double*,
                                     int64_t);

}  // namespace sluice::kernels
