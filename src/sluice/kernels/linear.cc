#include "sluice/kernels/linear.h"

#include <algorithm>
#include <type_traits>

#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_matmul.h"

namespace sluice::kernels {

template <typename T>
void LinearReference(const T* x, const T* w, const T* b, T* out, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      // out[i, j] = b[j] + Σ_p x[i, p] · w[p, j]
      T acc = b[j];
      for (int64_t p = 0; p < k; ++p) acc += x[i * k + p] * w[p * n + j];
      out[i * n + j] = acc;
    }
  }
}

template <typename T>
void LinearBlas(const T* x, const T* w, const T* b, T* out, int64_t m, int64_t k, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (Fp32GemmOnOneDnn()) {
      OneDnnGemm({.m = m, .n = n, .k = k, .bias = true}, x, w, out, b);
      return;
    }
  }
  for (int64_t i = 0; i < m; ++i) std::copy_n(b, n, out + i * n);
  // CBLAS rejects a leading dimension of 0, and with k = 0 the product adds nothing anyway.
  if (m == 0 || n == 0 || k == 0) return;
  Gemm(false, false, m, n, k, T(1), x, w, T(1), out);
}

template void LinearReference<float>(const float*, const float*, const float*, float*, int64_t,
                                     int64_t, int64_t);
template void LinearReference<double>(const double*, const double*, const double*, double*, int64_t,
                                      int64_t, int64_t);
template void LinearBlas<float>(const float*, const float*, const float*, float*, int64_t, int64_t,
                                int64_t);
template void LinearBlas<double>(const double*, const double*, const double*, double*, int64_t,
                                 int64_t, int64_t);

}  // namespace sluice::kernels
