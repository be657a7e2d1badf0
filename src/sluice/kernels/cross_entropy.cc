#include "sluice/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sluice/kernels/bf16_convert.h"
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

// One counted row's loss from its log-sum-exp: lse − (1 − ε)·x[t] − ε·mean(x); the mean is only
// read when ε > 0, so an unsmoothed loss is exactly lse − x[t] as before.
template <typename T>
double RowLoss(const T* x, int64_t vocab, int64_t t, T lse, double smoothing) {
  if (smoothing == 0) return static_cast<double>(lse - x[t]);
  double mean = 0;
  for (int64_t j = 0; j < vocab; ++j) mean += static_cast<double>(x[j]);
  mean /= static_cast<double>(vocab);
  return static_cast<double>(lse) - (1 - smoothing) * static_cast<double>(x[t]) - smoothing * mean;
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
                                int64_t first_row, double smoothing) {
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == kIgnoreTarget) continue;
    CheckIndex("cross_entropy target", t, first_row + r, vocab);
    const T* x = logits + r * vocab;
    T m, s;
    MaxAndSumReference(x, vocab, m, s);
    // −log softmax(x)[t] = log Σ e^x − x[t] = (m + log s) − x[t]
    total += RowLoss(x, vocab, t, m + std::log(s), smoothing);
  }
  return total;
}

template <typename T, typename I>
double CrossEntropySumFast(const T* logits, const I* targets, int64_t n, int64_t vocab,
                           int64_t first_row, double smoothing) {
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
      partial += RowLoss(x, vocab, t, m + std::log(s), smoothing);
    }
    return partial;
  });
}

template <typename T, typename I>
void CrossEntropyGradScaledReference(const T* logits, const I* targets, T scale, T* dlogits,
                                     int64_t n, int64_t vocab, int64_t first_row,
                                     double smoothing) {
  const T on = static_cast<T>(1 - smoothing), spread = static_cast<T>(smoothing / vocab);
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
      dlogits[r * vocab + j] = scale * (p - (j == t ? on : T(0)) - spread);
    }
  }
}

template <typename T, typename I>
void CrossEntropyGradScaledFast(const T* logits, const I* targets, T scale, T* dlogits, int64_t n,
                                int64_t vocab, int64_t first_row, double smoothing) {
  const T on = static_cast<T>(1 - smoothing), spread = static_cast<T>(smoothing / vocab);
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
      if (spread != T(0)) {
        for (int64_t j = 0; j < vocab; ++j) d[j] -= scale * spread;
      }
      d[t] -= scale * on;
    }
  });
}

namespace {

// The loss from the sum over the counted rows: their mean, or the sum itself.
template <typename T, typename I>
T Reduce(double total, const I* targets, int64_t n, CrossEntropyOptions options) {
  if (options.sum) return static_cast<T>(total);
  const int64_t counted = CountTargets(targets, n);
  return counted == 0 ? T(0) : static_cast<T>(total / static_cast<double>(counted));
}

// The factor of each counted row's gradient: the mean spreads dloss evenly over the counted
// tokens; the sum gives each all of it.
template <typename T, typename I>
T GradScale(T dloss, const I* targets, int64_t n, CrossEntropyOptions options) {
  if (options.sum) return dloss;
  const int64_t counted = CountTargets(targets, n);
  return counted == 0 ? T(0) : dloss / static_cast<T>(counted);
}

}  // namespace

template <typename T, typename I>
T CrossEntropyReference(const T* logits, const I* targets, int64_t n, int64_t vocab,
                        CrossEntropyOptions options) {
  const double total = CrossEntropySumReference(logits, targets, n, vocab, 0, options.smoothing);
  return Reduce<T>(total, targets, n, options);
}

template <typename T, typename I>
T CrossEntropyFast(const T* logits, const I* targets, int64_t n, int64_t vocab,
                   CrossEntropyOptions options) {
  const double total = CrossEntropySumFast(logits, targets, n, vocab, 0, options.smoothing);
  return Reduce<T>(total, targets, n, options);
}

template <typename T, typename I>
void CrossEntropyGradReference(const T* logits, const I* targets, T dloss, T* dlogits, int64_t n,
                               int64_t vocab, CrossEntropyOptions options) {
  // Ignored rows get no gradient.
  CrossEntropyGradScaledReference(logits, targets, GradScale(dloss, targets, n, options), dlogits,
                                  n, vocab, 0, options.smoothing);
}

template <typename T, typename I>
void CrossEntropyGradFast(const T* logits, const I* targets, T dloss, T* dlogits, int64_t n,
                          int64_t vocab, CrossEntropyOptions options) {
  CrossEntropyGradScaledFast(logits, targets, GradScale(dloss, targets, n, options), dlogits, n,
                             vocab, 0, options.smoothing);
}

template <typename I>
void CrossEntropyGradBF16Reference(const float* logits, const I* targets, float dloss,
                                   BFloat16* dlogits, int64_t n, int64_t vocab,
                                   CrossEntropyOptions options) {
  std::vector<float> d(static_cast<size_t>(n * vocab));
  CrossEntropyGradReference(logits, targets, dloss, d.data(), n, vocab, options);
  ToBF16Reference(d.data(), dlogits, n * vocab);
}

template <typename I>
void CrossEntropyGradBF16Fast(const float* logits, const I* targets, float dloss, BFloat16* dlogits,
                              int64_t n, int64_t vocab, CrossEntropyOptions options) {
  const float scale = GradScale(dloss, targets, n, options);
  // Each chunk's rows as the f32 kernel computes them (one chunk of it: run here), then rounded.
  ParallelFor(n, ChunkRows(vocab), [&](int64_t begin, int64_t end) {
    std::vector<float> rows(static_cast<size_t>((end - begin) * vocab));
    CrossEntropyGradScaledFast(logits + begin * vocab, targets + begin, scale, rows.data(),
                               end - begin, vocab, begin, options.smoothing);
    ToBF16Fast(rows.data(), dlogits + begin * vocab, (end - begin) * vocab);
  });
}

template void CrossEntropyGradBF16Reference<int32_t>(const float*, const int32_t*, float, BFloat16*,
                                                     int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradBF16Reference<int64_t>(const float*, const int64_t*, float, BFloat16*,
                                                     int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradBF16Fast<int32_t>(const float*, const int32_t*, float, BFloat16*,
                                                int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradBF16Fast<int64_t>(const float*, const int64_t*, float, BFloat16*,
                                                int64_t, int64_t, CrossEntropyOptions);
template int64_t CountTargets<int32_t>(const int32_t*, int64_t);
template int64_t CountTargets<int64_t>(const int64_t*, int64_t);
template double CrossEntropySumReference<float, int32_t>(const float*, const int32_t*, int64_t,
                                                         int64_t, int64_t, double);
template double CrossEntropySumReference<float, int64_t>(const float*, const int64_t*, int64_t,
                                                         int64_t, int64_t, double);
template double CrossEntropySumReference<double, int32_t>(const double*, const int32_t*, int64_t,
                                                          int64_t, int64_t, double);
template double CrossEntropySumReference<double, int64_t>(const double*, const int64_t*, int64_t,
                                                          int64_t, int64_t, double);
template double CrossEntropySumFast<float, int32_t>(const float*, const int32_t*, int64_t, int64_t,
                                                    int64_t, double);
template double CrossEntropySumFast<float, int64_t>(const float*, const int64_t*, int64_t, int64_t,
                                                    int64_t, double);
template double CrossEntropySumFast<double, int32_t>(const double*, const int32_t*, int64_t,
                                                     int64_t, int64_t, double);
template double CrossEntropySumFast<double, int64_t>(const double*, const int64_t*, int64_t,
                                                     int64_t, int64_t, double);
template void CrossEntropyGradScaledReference<float, int32_t>(const float*, const int32_t*, float,
                                                              float*, int64_t, int64_t, int64_t,
                                                              double);
template void CrossEntropyGradScaledReference<float, int64_t>(const float*, const int64_t*, float,
                                                              float*, int64_t, int64_t, int64_t,
                                                              double);
template void CrossEntropyGradScaledReference<double, int32_t>(const double*, const int32_t*,
                                                               double, double*, int64_t, int64_t,
                                                               int64_t, double);
template void CrossEntropyGradScaledReference<double, int64_t>(const double*, const int64_t*,
                                                               double, double*, int64_t, int64_t,
                                                               int64_t, double);
template void CrossEntropyGradScaledFast<float, int32_t>(const float*, const int32_t*, float,
                                                         float*, int64_t, int64_t, int64_t, double);
template void CrossEntropyGradScaledFast<float, int64_t>(const float*, const int64_t*, float,
                                                         float*, int64_t, int64_t, int64_t, double);
template void CrossEntropyGradScaledFast<double, int32_t>(const double*, const int32_t*, double,
                                                          double*, int64_t, int64_t, int64_t,
                                                          double);
template void CrossEntropyGradScaledFast<double, int64_t>(const double*, const int64_t*, double,
                                                          double*, int64_t, int64_t, int64_t,
                                                          double);
template float CrossEntropyReference<float, int32_t>(const float*, const int32_t*, int64_t, int64_t,
                                                     CrossEntropyOptions);
template float CrossEntropyReference<float, int64_t>(const float*, const int64_t*, int64_t, int64_t,
                                                     CrossEntropyOptions);
template double CrossEntropyReference<double, int32_t>(const double*, const int32_t*, int64_t,
                                                       int64_t, CrossEntropyOptions);
template double CrossEntropyReference<double, int64_t>(const double*, const int64_t*, int64_t,
                                                       int64_t, CrossEntropyOptions);
template float CrossEntropyFast<float, int32_t>(const float*, const int32_t*, int64_t, int64_t,
                                                CrossEntropyOptions);
template float CrossEntropyFast<float, int64_t>(const float*, const int64_t*, int64_t, int64_t,
                                                CrossEntropyOptions);
template double CrossEntropyFast<double, int32_t>(const double*, const int32_t*, int64_t, int64_t,
                                                  CrossEntropyOptions);
template double CrossEntropyFast<double, int64_t>(const double*, const int64_t*, int64_t, int64_t,
                                                  CrossEntropyOptions);
template void CrossEntropyGradReference<float, int32_t>(const float*, const int32_t*, float, float*,
                                                        int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradReference<float, int64_t>(const float*, const int64_t*, float, float*,
                                                        int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradReference<double, int32_t>(const double*, const int32_t*, double,
                                                         double*, int64_t, int64_t,
                                                         CrossEntropyOptions);
template void CrossEntropyGradReference<double, int64_t>(const double*, const int64_t*, double,
                                                         double*, int64_t, int64_t,
                                                         CrossEntropyOptions);
template void CrossEntropyGradFast<float, int32_t>(const float*, const int32_t*, float, float*,
                                                   int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradFast<float, int64_t>(const float*, const int64_t*, float, float*,
                                                   int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradFast<double, int32_t>(const double*, const int32_t*, double, double*,
                                                    int64_t, int64_t, CrossEntropyOptions);
template void CrossEntropyGradFast<double, int64_t>(const double*, const int64_t*, double, double*,
                                                    int64_t, int64_t, CrossEntropyOptions);

}  // namespace sluice::kernels
