#include "sluice/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "sluice/kernels/embedding.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

// The row max and Σ e^(x − max), plainly.
template <typename T>
void MaxAndSumReference(const T* x, int64_t vocab, T& m, T& s) {
  m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < vocab; ++j) m = std::max(m, x[j]);
  s = 0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(x[j] - m);
}

template <typename T>
void MaxAndSumFast(const T* x, int64_t vocab, T& m, T& s) {
  Simd<T>().max_and_sum_exp(x, vocab, &m, &s);
}

}  // namespace

template <typename I>
int64_t CountTargets(const I* targets, int64_t n) {
  int64_t counted = 0;
  for (int64_t r = 0; r < n; ++r) counted += static_cast<int64_t>(targets[r]) != kIgnoreTarget;
  return counted;
}

template <typename T, typename I>
double CrossEntropySumReference(const T* logits, const I* targets, int64_t n, int64_t vocab,
                                int64_t first_row) {
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == kIgnoreTarget) continue;
    CheckIndex("cross_entropy target", t, first_row + r, vocab);
    const T* x = logits + r * vocab;
    T m, s;
    MaxAndSumReference(x, vocab, m, s);
    // −log softmax(x)[t] = log Σ e^x − x[t] = (m + log s) − x[t]
    total += static_cast<double>(m + std::log(s) - x[t]);
  }
  return total;
}

template <typename T, typename I>
double CrossEntropySumFast(const T* logits, const I* targets, int64_t n, int64_t vocab,
                           int64_t first_row) {
  // Partial sums per chunk of rows, added in chunk order (kernels/parallel.h).
  return ParallelSum<double>(n, ChunkRows(vocab), [&](int64_t begin, int64_t end) {
    double partial = 0;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = static_cast<int64_t>(targets[r]);
      if (t == kIgnoreTarget) continue;
      CheckIndex("cross_entropy target", t, first_row + r, vocab);
      const T* x = logits + r * vocab;
      T m, s;
      MaxAndSumFast(x, vocab, m, s);
      partial += static_cast<double>(m + std::log(s) - x[t]);
    }
    return partial;
  });
}

template <typename T, typename I>
void CrossEntropyGradScaledReference(const T* logits, const I* targets, T scale, T* dlogits,
                                     int64_t n, int64_t vocab, int64_t first_row) {
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == kIgnoreTarget) {
      for (int64_t j = 0; j < vocab; ++j) dlogits[r * vocab + j] = T(0);
      continue;
    }
    CheckIndex("cross_entropy_grad target", t, first_row + r, vocab);
    const T* x = logits + r * vocab;
    T m, s;
    MaxAndSumReference(x, vocab, m, s);
    for (int64_t j = 0; j < vocab; ++j) {
      const T p = std::exp(x[j] - m) / s;
      dlogits[r * vocab + j] = scale * (p - (j == t ? T(1) : T(0)));
    }
  }
}

template <typename T, typename I>
void CrossEntropyGradScaledFast(const T* logits, const I* targets, T scale, T* dlogits, int64_t n,
                                int64_t vocab, int64_t first_row) {
  ParallelFor(n, ChunkRows(vocab), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = static_cast<int64_t>(targets[r]);
      T* d = dlogits + r * vocab;  // may be x: each element is read before it is written
      if (t == kIgnoreTarget) {
        std::fill_n(d, vocab, T(0));
        continue;
      }
      CheckIndex("cross_entropy_grad target", t, first_row + r, vocab);
      const T* x = logits + r * vocab;
      T m, s;
      MaxAndSumFast(x, vocab, m, s);
      // d = e^(x − m) · (scale / s), then the one-hot part at the target.
      Simd<T>().scaled_exp(x, m, scale / s, d, vocab);
      d[t] -= scale;
    }
  });
}

template <typename T, typename I>
T CrossEntropyReference(const T* logits, const I* targets, int64_t n, int64_t vocab) {
  const double total = CrossEntropySumReference(logits, targets, n, vocab);
  const int64_t counted = CountTargets(targets, n);
  return counted == 0 ? T(0) : static_cast<T>(total / static_cast<double>(counted));
}

template <typename T, typename I>
T CrossEntropyFast(const T* logits, const I* targets, int64_t n, int64_t vocab) {
  const double total = CrossEntropySumFast(logits, targets, n, vocab);
  const int64_t counted = CountTargets(targets, n);
  return counted == 0 ? T(0) : static_cast<T>(total / static_cast<double>(counted));
}

template <typename T, typename I>
void CrossEntropyGradReference(const T* logits, const I* targets, T dloss, T* dlogits, int64_t n,
                               int64_t vocab) {
  // The mean spreads dloss evenly over the counted tokens; ignored rows get no gradient.
  const int64_t counted = CountTargets(targets, n);
  const T scale = counted == 0 ? T(0) : dloss / static_cast<T>(counted);
  CrossEntropyGradScaledReference(logits, targets, scale, dlogits, n, vocab);
}

template <typename T, typename I>
void CrossEntropyGradFast(const T* logits, const I* targets, T dloss, T* dlogits, int64_t n,
                          int64_t vocab) {
  const int64_t counted = CountTargets(targets, n);
  const T scale = counted == 0 ? T(0) : dloss / static_cast<T>(counted);
  CrossEntropyGradScaledFast(logits, targets, scale, dlogits, n, vocab);
}

template int64_t CountTargets<int32_t>(const int32_t*, int64_t);
template int64_t CountTargets<int64_t>(const int64_t*, int64_t);
template double CrossEntropySumReference<float, int32_t>(const float*, const int32_t*, int64_t,
                                                         int64_t, int64_t);
template double CrossEntropySumReference<float, int64_t>(const float*, const int64_t*, int64_t,
                                                         int64_t, int64_t);
template double CrossEntropySumReference<double, int32_t>(const double*, const int32_t*, int64_t,
                                                          int64_t, int64_t);
template double CrossEntropySumReference<double, int64_t>(const double*, const int64_t*, int64_t,
                                                          int64_t, int64_t);
template double CrossEntropySumFast<float, int32_t>(const float*, const int32_t*, int64_t, int64_t,
                                                    int64_t);
template double CrossEntropySumFast<float, int64_t>(const float*, const int64_t*, int64_t, int64_t,
                                                    int64_t);
template double CrossEntropySumFast<double, int32_t>(const double*, const int32_t*, int64_t,
                                                     int64_t, int64_t);
template double CrossEntropySumFast<double, int64_t>(const double*, const int64_t*, int64_t,
                                                     int64_t, int64_t);
template void CrossEntropyGradScaledReference<float, int32_t>(const float*, const int32_t*, float,
                                                              float*, int64_t, int64_t, int64_t);
template void CrossEntropyGradScaledReference<float, int64_t>(const float*, const int64_t*, float,
                                                              float*, int64_t, int64_t, int64_t);
template void CrossEntropyGradScaledReference<double, int32_t>(const double*, const int32_t*,
                                                               double, double*, int64_t, int64_t,
                                                               int64_t);
template void CrossEntropyGradScaledReference<double, int64_t>(const double*, const int64_t*,
                                                               double, double*, int64_t, int64_t,
                                                               int64_t);
template void CrossEntropyGradScaledFast<float, int32_t>(const float*, const int32_t*, float,
                                                         float*, int64_t, int64_t, int64_t);
template void CrossEntropyGradScaledFast<float, int64_t>(const float*, const int64_t*, float,
                                                         float*, int64_t, int64_t, int64_t);
template void CrossEntropyGradScaledFast<double, int32_t>(const double*, const int32_t*, double,
                                                          double*, int64_t, int64_t, int64_t);
template void CrossEntropyGradScaledFast<double, int64_t>(const double*, const int64_t*, double,
                                                          double*, int64_t, int64_t, int64_t);
template float CrossEntropyReference<float, int32_t>(const float*, const int32_t*, int64_t,
                                                     int64_t);
template float CrossEntropyReference<float, int64_t>(const float*, const int64_t*, int64_t,
                                                     int64_t);
template double CrossEntropyReference<double, int32_t>(const double*, const int32_t*, int64_t,
                                                       int64_t);
template double CrossEntropyReference<double, int64_t>(const double*, const int64_t*, int64_t,
                                                       int64_t);
template float CrossEntropyFast<float, int32_t>(const float*, const int32_t*, int64_t, int64_t);
template float CrossEntropyFast<float, int64_t>(const float*, const int64_t*, int64_t, int64_t);
template double CrossEntropyFast<double, int32_t>(const double*, const int32_t*, int64_t, int64_t);
template double CrossEntropyFast<double, int64_t>(const double*, const int64_t*, int64_t, int64_t);
template void CrossEntropyGradReference<float, int32_t>(const float*, const int32_t*, float, float*,
                                                        int64_t, int64_t);
template void CrossEntropyGradReference<float, int64_t>(const float*, const int64_t*, float, float*,
                                                        int64_t, int64_t);
template void CrossEntropyGradReference<double, int32_t>(const double*, const int32_t*, double,
                                                         double*, int64_t, int64_t);
template void CrossEntropyGradReference<double, int64_t>(const double*, const int64_t*, double,
                                                         double*, int64_t, int64_t);
template void CrossEntropyGradFast<float, int32_t>(const float*, const int32_t*, float, float*,
                                                   int64_t, int64_t);
template void CrossEntropyGradFast<float, int64_t>(const float*, const int64_t*, float, float*,
                                                   int64_t, int64_t);
template void CrossEntropyGradFast<double, int32_t>(const double*, const int32_t*, double, double*,
                                                    int64_t, int64_t);
template void CrossEntropyGradFast<double, int64_t>(const double*, const int64_t*, double, double*,
                                                    int64_t, int64_t);

}  // namespace sluice::kernels
