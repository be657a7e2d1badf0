#include "sluice/kernels/linear_cross_entropy.h"

#include <algorithm>

#include "sluice/kernels/cross_entropy.h"
#include "sluice/kernels/matmul.h"

namespace sluice::kernels {

int64_t LinearCrossEntropyChunk(int64_t n, int64_t c, int64_t vocab, int64_t chunk) {
  if (chunk > 0) return std::max<int64_t>(1, std::min(chunk, n));
  const int64_t pieces = std::max<int64_t>(1, (vocab + c - 1) / std::max<int64_t>(c, 1));
  return std::max<int64_t>(1, (n + pieces - 1) / pieces);
}

namespace {

// logits [rows, vocab] = x [rows, C] · wᵀ, each product summed in T.
template <typename T>
void LogitsReference(const T* x, const T* w, int64_t rows, int64_t c, int64_t vocab, T* logits) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < vocab; ++v) {
      T sum = 0;
      for (int64_t k = 0; k < c; ++k) sum += x[r * c + k] * w[v * c + k];
      logits[r * vocab + v] = sum;
    }
  }
}

template <typename T>
T Mean(double total, int64_t counted) {
  return counted == 0 ? T(0) : static_cast<T>(total / static_cast<double>(counted));
}

template <typename T, typename I>
T Scale(const I* targets, int64_t n, T dloss) {
  const int64_t counted = CountTargets(targets, n);
  return counted == 0 ? T(0) : dloss / static_cast<T>(counted);
}

}  // namespace

template <typename T, typename I>
T LinearCrossEntropyReference(const T* x, const T* w, const I* targets, int64_t n, int64_t c,
                              int64_t vocab, int64_t chunk, T* scratch) {
  double total = 0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    LogitsReference(x + r0 * c, w, rows, c, vocab, scratch);
    total += CrossEntropySumReference(scratch, targets + r0, rows, vocab, r0);
  }
  return Mean<T>(total, CountTargets(targets, n));
}

template <typename T, typename I>
T LinearCrossEntropyFast(const T* x, const T* w, const I* targets, int64_t n, int64_t c,
                         int64_t vocab, int64_t chunk, T* scratch) {
  double total = 0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    Gemm(false, true, rows, vocab, c, T(1), x + r0 * c, w, T(0), scratch);
    total += CrossEntropySumFast(scratch, targets + r0, rows, vocab, r0);
  }
  return Mean<T>(total, CountTargets(targets, n));
}

template <typename T, typename I>
void LinearCrossEntropyGradReference(const T* x, const T* w, const I* targets, T dloss, int64_t n,
                                     int64_t c, int64_t vocab, int64_t chunk, T* scratch, T* dx,
                                     T* dw) {
  const T scale = Scale(targets, n, dloss);
  std::fill_n(dw, vocab * c, T(0));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    LogitsReference(x + r0 * c, w, rows, c, vocab, scratch);
    CrossEntropyGradScaledReference(scratch, targets + r0, scale, scratch, rows, vocab, r0);
    for (int64_t r = 0; r < rows; ++r) {  // dx rows = dlogits·w
      for (int64_t k = 0; k < c; ++k) {
        T sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += scratch[r * vocab + v] * w[v * c + k];
        dx[(r0 + r) * c + k] = sum;
      }
    }
    for (int64_t v = 0; v < vocab; ++v) {  // dw += dlogitsᵀ·x, this chunk's sum added once
      for (int64_t k = 0; k < c; ++k) {
        T sum = 0;
        for (int64_t r = 0; r < rows; ++r) sum += scratch[r * vocab + v] * x[(r0 + r) * c + k];
        dw[v * c + k] += sum;
      }
    }
  }
}

template <typename T, typename I>
void LinearCrossEntropyGradFast(const T* x, const T* w, const I* targets, T dloss, int64_t n,
                                int64_t c, int64_t vocab, int64_t chunk, T* scratch, T* dx, T* dw) {
  const T scale = Scale(targets, n, dloss);
  if (n == 0) std::fill_n(dw, vocab * c, T(0));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    Gemm(false, true, rows, vocab, c, T(1), x + r0 * c, w, T(0), scratch);
    CrossEntropyGradScaledFast(scratch, targets + r0, scale, scratch, rows, vocab, r0);
    Gemm(false, false, rows, c, vocab, T(1), scratch, w, T(0), dx + r0 * c);
    Gemm(true, false, vocab, c, rows, T(1), scratch, x + r0 * c, r0 == 0 ? T(0) : T(1), dw);
  }
}

template float LinearCrossEntropyReference<float, int32_t>(const float*, const float*,
                                                           const int32_t*, int64_t, int64_t,
                                                           int64_t, int64_t, float*);
template float LinearCrossEntropyReference<float, int64_t>(const float*, const float*,
                                                           const int64_t*, int64_t, int64_t,
                                                           int64_t, int64_t, float*);
template double LinearCrossEntropyReference<double, int32_t>(const double*, const double*,
                                                             const int32_t*, int64_t, int64_t,
                                                             int64_t, int64_t, double*);
template double LinearCrossEntropyReference<double, int64_t>(const double*, const double*,
                                                             const int64_t*, int64_t, int64_t,
                                                             int64_t, int64_t, double*);
template float LinearCrossEntropyFast<float, int32_t>(const float*, const float*, const int32_t*,
                                                      int64_t, int64_t, int64_t, int64_t, float*);
template float LinearCrossEntropyFast<float, int64_t>(const float*, const float*, const int64_t*,
                                                      int64_t, int64_t, int64_t, int64_t, float*);
template double LinearCrossEntropyFast<double, int32_t>(const double*, const double*,
                                                        const int32_t*, int64_t, int64_t, int64_t,
                                                        int64_t, double*);
template double LinearCrossEntropyFast<double, int64_t>(const double*, const double*,
                                                        const int64_t*, int64_t, int64_t, int64_t,
                                                        int64_t, double*);
template void LinearCrossEntropyGradReference<float, int32_t>(const float*, const float*,
                                                              const int32_t*, float, int64_t,
                                                              int64_t, int64_t, int64_t, float*,
                                                              float*, float*);
template void LinearCrossEntropyGradReference<float, int64_t>(const float*, const float*,
                                                              const int64_t*, float, int64_t,
                                                              int64_t, int64_t, int64_t, float*,
                                                              float*, float*);
template void LinearCrossEntropyGradReference<double, int32_t>(const double*, const double*,
                                                               const int32_t*, double, int64_t,
                                                               int64_t, int64_t, int64_t, double*,
                                                               double*, double*);
template void LinearCrossEntropyGradReference<double, int64_t>(const double*, const double*,
                                                               const int64_t*, double, int64_t,
                                                               int64_t, int64_t, int64_t, double*,
                                                               double*, double*);
template void LinearCrossEntropyGradFast<float, int32_t>(const float*, const float*, const int32_t*,
                                                         float, int64_t, int64_t, int64_t, int64_t,
                                                         float*, float*, float*);
template void LinearCrossEntropyGradFast<float, int64_t>(const float*, const float*, const int64_t*,
                                                         float, int64_t, int64_t, int64_t, int64_t,
                                                         float*, float*, float*);
template void LinearCrossEntropyGradFast<double, int32_t>(const double*, const double*,
                                                          const int32_t*, double, int64_t, int64_t,
                                                          int64_t, int64_t, double*, double*,
                                                          double*);
template void LinearCrossEntropyGradFast<double, int64_t>(const double*, const double*,
                                                          const int64_t*, double, int64_t, int64_t,
                                                          int64_t, int64_t, double*, double*,
                                                          double*);

}  // namespace sluice::kernels
