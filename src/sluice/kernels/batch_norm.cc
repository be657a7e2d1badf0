// Batch normalization kernels: see batch_norm.h for the formulas.
#include "sluice/kernels/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

// Values of channel c: the B runs of S values x[b, c, :].
template <typename T>
T* RunOf(T* x, BatchNormDims d, int64_t b, int64_t c) {
  return x + (b * d.channels + c) * d.inner;
}

int64_t Count(BatchNormDims d) { return d.batch * d.inner; }

struct ChannelStats {
  double mean = 0, var = 0;  // var biased (divided by N)
};

// Two passes over channel c, summing in double.
template <typename T>
ChannelStats StatsOf(const T* x, BatchNormDims d, int64_t c) {
  double sum = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    const T* run = RunOf(x, d, b, c);
    for (int64_t s = 0; s < d.inner; ++s) sum += static_cast<double>(run[s]);
  }
  const double n = static_cast<double>(Count(d));
  const double mean = sum / n;
  double squares = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    const T* run = RunOf(x, d, b, c);
    for (int64_t s = 0; s < d.inner; ++s) {
      const double diff = static_cast<double>(run[s]) - mean;
      squares += diff * diff;
    }
  }
  return {mean, squares / n};
}

// Σ dy and Σ dy · (x − mean) over channel c.
template <typename T>
std::pair<double, double> GradSums(const T* dy, const T* x, BatchNormDims d, int64_t c,
                                   double mean) {
  double sum = 0, dot = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    const T* g = RunOf(dy, d, b, c);
    const T* v = RunOf(x, d, b, c);
    for (int64_t s = 0; s < d.inner; ++s) {
      sum += static_cast<double>(g[s]);
      dot += static_cast<double>(g[s]) * (static_cast<double>(v[s]) - mean);
    }
  }
  return {sum, dot};
}

// The fast kernels' sums: a channel's runs of S values through the SIMD row kernels (f32 lanes
// over blocks, each block added in double: simd_kernels.h), or, for runs too short to fill
// vectors (BatchNorm1d's [B, C], S = 1), the plain double loops above.
inline constexpr int64_t kShortestSimdRun = 16;

// StatsOf in two passes as well: Σ x, then Σ (x − shift)² about the mean rounded to T, less the
// rounding's share: Σ (x − shift)² = Σ (x − mean)² + N·(mean − shift)².
template <typename T>
ChannelStats FastStatsOf(const T* x, BatchNormDims d, int64_t c) {
  if (d.inner < kShortestSimdRun) return StatsOf(x, d, c);
  const SimdRowKernels<T>& simd = Simd<T>();
  double sum = 0;
  for (int64_t b = 0; b < d.batch; ++b) sum += simd.blocked_sum(RunOf(x, d, b, c), d.inner);
  const double n = static_cast<double>(Count(d));
  const double mean = sum / n;
  const T shift = static_cast<T>(mean);
  double squares = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    squares += simd.centered_squares(RunOf(x, d, b, c), shift, d.inner);
  }
  const double off = mean - static_cast<double>(shift);
  return {mean, std::max(0.0, squares / n - off * off)};
}

// GradSums likewise: Σ dy·(x − mean) = Σ dy·(x − shift) + (shift − mean)·Σ dy.
template <typename T>
std::pair<double, double> FastGradSums(const T* dy, const T* x, BatchNormDims d, int64_t c,
                                       double mean) {
  if (d.inner < kShortestSimdRun) return GradSums(dy, x, d, c, mean);
  const SimdRowKernels<T>& simd = Simd<T>();
  const T shift = static_cast<T>(mean);
  double sum = 0, dot = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    double run_sum = 0, run_dot = 0;
    simd.centered_dot(RunOf(dy, d, b, c), RunOf(x, d, b, c), shift, d.inner, &run_sum, &run_dot);
    sum += run_sum;
    dot += run_dot;
  }
  return {sum, dot + (static_cast<double>(shift) - mean) * sum};
}

// fn(c) for every channel: one after another, or split over the intra-op threads (a channel's
// work stays on one thread, so the results do not depend on the thread count).
template <bool kParallel, typename F>
void ForEachChannel(BatchNormDims d, F&& fn) {
  if constexpr (kParallel) {
    ParallelFor(d.channels, ChunkRows(2 * Count(d)), [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) fn(c);
    });
  } else {
    for (int64_t c = 0; c < d.channels; ++c) fn(c);
  }
}

}  // namespace

template <typename T>
void BatchNormReference(const T* x, const T* weight, const T* bias, const T* mean, const T* var,
                        T* y, BatchNormDims d, double eps) {
  ForEachChannel<false>(d, [&](int64_t c) {
    const ChannelStats st =
        mean != nullptr ? ChannelStats{static_cast<double>(mean[c]), static_cast<double>(var[c])}
                        : StatsOf(x, d, c);
    const double rstd = 1.0 / std::sqrt(st.var + eps);
    for (int64_t b = 0; b < d.batch; ++b) {
      const T* in = RunOf(x, d, b, c);
      T* out = RunOf(y, d, b, c);
      for (int64_t s = 0; s < d.inner; ++s) {
        const double xhat = (static_cast<double>(in[s]) - st.mean) * rstd;
        out[s] =
            static_cast<T>(xhat * static_cast<double>(weight[c]) + static_cast<double>(bias[c]));
      }
    }
  });
}

template <typename T>
void BatchNormFast(const T* x, const T* weight, const T* bias, const T* mean, const T* var, T* y,
                   BatchNormDims d, double eps) {
  ForEachChannel<true>(d, [&](int64_t c) {
    const ChannelStats st =
        mean != nullptr ? ChannelStats{static_cast<double>(mean[c]), static_cast<double>(var[c])}
                        : FastStatsOf(x, d, c);
    const double rstd = 1.0 / std::sqrt(st.var + eps);
    const T alpha = static_cast<T>(rstd * static_cast<double>(weight[c]));
    const T beta = static_cast<T>(static_cast<double>(bias[c]) -
                                  st.mean * rstd * static_cast<double>(weight[c]));
    for (int64_t b = 0; b < d.batch; ++b) {
      const T* in = RunOf(x, d, b, c);
      T* out = RunOf(y, d, b, c);
      if (d.inner >= kShortestSimdRun) {
        Simd<T>().affine(in, alpha, beta, out, d.inner);
      } else {
        for (int64_t s = 0; s < d.inner; ++s) out[s] = in[s] * alpha + beta;
      }
    }
  });
}

template <typename T>
void BatchNormGradXReference(const T* dy, const T* x, const T* weight, T* dx, BatchNormDims d,
                             double eps) {
  const double n = static_cast<double>(Count(d));
  ForEachChannel<false>(d, [&](int64_t c) {
    const ChannelStats st = StatsOf(x, d, c);
    const double rstd = 1.0 / std::sqrt(st.var + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t s = 0; s < d.inner; ++s) {
        const double g = static_cast<double>(RunOf(dy, d, b, c)[s]);
        sum_dy += g;
        sum_dy_xhat += g * (static_cast<double>(RunOf(x, d, b, c)[s]) - st.mean) * rstd;
      }
    }
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t s = 0; s < d.inner; ++s) {
        const double g = static_cast<double>(RunOf(dy, d, b, c)[s]);
        const double xhat = (static_cast<double>(RunOf(x, d, b, c)[s]) - st.mean) * rstd;
        RunOf(dx, d, b, c)[s] = static_cast<T>(static_cast<double>(weight[c]) * rstd *
                                               (g - sum_dy / n - xhat * sum_dy_xhat / n));
      }
    }
  });
}

template <typename T>
void BatchNormGradXFast(const T* dy, const T* x, const T* weight, T* dx, BatchNormDims d,
                        double eps) {
  const double n = static_cast<double>(Count(d));
  ForEachChannel<true>(d, [&](int64_t c) {
    const ChannelStats st = FastStatsOf(x, d, c);
    const double rstd = 1.0 / std::sqrt(st.var + eps);
    const auto [sum, dot] = FastGradSums(dy, x, d, c, st.mean);
    // dx = (dy − mean(dy) − (x − mean) · k) · rstd · weight, k = Σ dy·(x − mean) · rstd² / N.
    const T k = static_cast<T>(dot * rstd * rstd / n);
    const T grad_mean = static_cast<T>(sum / n);
    const T mean = static_cast<T>(st.mean);
    const T scale = static_cast<T>(rstd * static_cast<double>(weight[c]));
    for (int64_t b = 0; b < d.batch; ++b) {
      const T* g = RunOf(dy, d, b, c);
      const T* v = RunOf(x, d, b, c);
      T* out = RunOf(dx, d, b, c);
      if (d.inner >= kShortestSimdRun) {
        Simd<T>().batch_norm_grad_row(g, v, mean, k, grad_mean, scale, out, d.inner);
        continue;
      }
      for (int64_t s = 0; s < d.inner; ++s) {
        out[s] = (g[s] - grad_mean - (v[s] - mean) * k) * scale;
      }
    }
  });
}

template <typename T>
void BatchNormGradParamsReference(const T* dy, const T* x, T* dweight, T* dbias, BatchNormDims d,
                                  double eps) {
  ForEachChannel<false>(d, [&](int64_t c) {
    const ChannelStats st = StatsOf(x, d, c);
    const double rstd = 1.0 / std::sqrt(st.var + eps);
    double dw = 0, db = 0;
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t s = 0; s < d.inner; ++s) {
        const double g = static_cast<double>(RunOf(dy, d, b, c)[s]);
        dw += g * (static_cast<double>(RunOf(x, d, b, c)[s]) - st.mean) * rstd;
        db += g;
      }
    }
    dweight[c] = static_cast<T>(dw);
    dbias[c] = static_cast<T>(db);
  });
}

template <typename T>
void BatchNormGradParamsFast(const T* dy, const T* x, T* dweight, T* dbias, BatchNormDims d,
                             double eps) {
  ForEachChannel<true>(d, [&](int64_t c) {
    const ChannelStats st = FastStatsOf(x, d, c);
    const auto [sum, dot] = FastGradSums(dy, x, d, c, st.mean);
    dweight[c] = static_cast<T>(dot / std::sqrt(st.var + eps));
    dbias[c] = static_cast<T>(sum);
  });
}

template <typename T>
void BatchNormUpdateStatsReference(const T* x, T* running_mean, T* running_var, BatchNormDims d,
                                   double momentum) {
  const double n = static_cast<double>(Count(d));
  ForEachChannel<false>(d, [&](int64_t c) {
    const ChannelStats st = StatsOf(x, d, c);
    running_mean[c] =
        static_cast<T>(momentum * st.mean + (1 - momentum) * static_cast<double>(running_mean[c]));
    running_var[c] = static_cast<T>(momentum * st.var * n / (n - 1) +
                                    (1 - momentum) * static_cast<double>(running_var[c]));
  });
}

template <typename T>
void BatchNormUpdateStatsFast(const T* x, T* running_mean, T* running_var, BatchNormDims d,
                              double momentum) {
  const double n = static_cast<double>(Count(d));
  const double keep = 1 - momentum;
  ForEachChannel<true>(d, [&](int64_t c) {
    const ChannelStats st = FastStatsOf(x, d, c);
    const double unbiased = st.var * (n / (n - 1));
    running_mean[c] =
        static_cast<T>(momentum * st.mean + keep * static_cast<double>(running_mean[c]));
    running_var[c] =
        static_cast<T>(momentum * unbiased + keep * static_cast<double>(running_var[c]));
  });
}

template void BatchNormReference<float>(const float*, const float*, const float*, const float*,
                                        const float*, float*, BatchNormDims, double);
template void BatchNormFast<float>(const float*, const float*, const float*, const float*,
                                   const float*, float*, BatchNormDims, double);
template void BatchNormGradXReference<float>(const float*, const float*, const float*, float*,
                                             BatchNormDims, double);
template void BatchNormGradXFast<float>(const float*, const float*, const float*, float*,
                                        BatchNormDims, double);
template void BatchNormGradParamsReference<float>(const float*, const float*, float*, float*,
                                                  BatchNormDims, double);
template void BatchNormGradParamsFast<float>(const float*, const float*, float*, float*,
                                             BatchNormDims, double);
template void BatchNormUpdateStatsReference<float>(const float*, float*, float*, BatchNormDims,
                                                   double);
template void BatchNormUpdateStatsFast<float>(const float*, float*, float*, BatchNormDims, double);

template void BatchNormReference<double>(const double*, const double*, const double*, const double*,
                                         const double*, double*, BatchNormDims, double);
template void BatchNormFast<double>(const double*, const double*, const double*, const double*,
                                    const double*, double*, BatchNormDims, double);
template void BatchNormGradXReference<double>(const double*, const double*, const double*, double*,
                                              BatchNormDims, double);
template void BatchNormGradXFast<double>(const double*, const double*, const double*, double*,
                                         BatchNormDims, double);
template void BatchNormGradParamsReference<double>(const double*, const double*, double*, double*,
                                                   BatchNormDims, double);
template void BatchNormGradParamsFast<double>(const double*, const double*, double*, double*,
                                              BatchNormDims, double);
template void BatchNormUpdateStatsReference<double>(const double*, double*, double*, BatchNormDims,
                                                    double);
template void BatchNormUpdateStatsFast<double>(const double*, double*, double*, BatchNormDims,
                                               double);

}  // namespace sluice::kernels
