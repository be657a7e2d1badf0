// The per-target code of simd_kernels.h. Highway compiles this file once per target
// (hwy/foreach_target.h re-includes it with HWY_NAMESPACE set to N_AVX2, N_SSE4, ...); the part
// under HWY_ONCE, compiled once, exports the tables and picks one at run time.
//
// Every loop walks a row in whole vectors; a row's tail (fewer elements than lanes) is loaded into
// a padded vector (the padding being the operation's neutral element) and stored partially, so
// every element goes through the same vector code whatever its position.

// SSSE3 adds nothing over SSE4 for these kernels: one compilation fewer.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sluice/kernels/simd_kernels.cc"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include "sluice/kernels/simd_products-inl.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <type_traits>

#include "sluice/kernels/simd_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The widest vector of any target, in elements of T: room for a padded tail.
template <typename T>
inline constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(T);

// AVX2 and AVX-512 load and store 4- and 8-byte lanes under a mask without touching the memory of
// the lanes left out (no fault past the end, no write to a neighbour's elements): a row's tail is
// one masked instruction there. Other targets go through a padded buffer.
#undef SLUICE_MASKED_TAILS  // this file is compiled once per target
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define SLUICE_MASKED_TAILS 1
#else
#define SLUICE_MASKED_TAILS 0
#endif

// The `count` elements at p (count ≤ lanes), the other lanes set to `fill`.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, size_t count, T fill) {
  if (count == hn::Lanes(d)) return hn::LoadU(d, p);
#if SLUICE_MASKED_TAILS
  const auto m = hn::FirstN(d, count);
  return hn::IfThenElse(m, hn::MaskedLoad(m, d, p), hn::Set(d, fill));
#else
  HWY_ALIGN T buf[kMaxLanes<T>];
  std::fill_n(buf, hn::Lanes(d), fill);
  std::memcpy(buf, p, count * sizeof(T));
  return hn::Load(d, buf);
#endif
}

// Stores the first `count` lanes of v at p.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void StorePart(D d, hn::Vec<D> v, T* p, size_t count) {
  if (count == hn::Lanes(d)) return hn::StoreU(v, d, p);
#if SLUICE_MASKED_TAILS
  hn::BlendedStore(v, hn::FirstN(d, count), d, p);
#else
  HWY_ALIGN T buf[kMaxLanes<T>];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, count * sizeof(T));
#endif
}

// Calls f(j, count) for the vectors of a row of n elements: count = lanes, then the tail.
template <class D, class F>
HWY_INLINE void ForVectors(D d, int64_t n, F&& f) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) f(j, static_cast<size_t>(lanes));
  if (j < n) f(j, static_cast<size_t>(n - j));
}

// Software prefetch 4 KiB ahead of p. On the VMs measured the hardware prefetcher leaves the
// streaming kernels waiting on memory: GELU over 64 MiB took 12.4 ms without, 7.5 ms with
// (elementwise_bench, docs/benchmarks.md). A prefetch never faults, past the end of a buffer
// included, and costs one instruction per vector where the data is in cache already.
inline constexpr uintptr_t kPrefetchBytes = 4096;
template <typename T>
HWY_INLINE void PrefetchAhead(const T* p) {
  hwy::Prefetch(reinterpret_cast<const T*>(reinterpret_cast<uintptr_t>(p) + kPrefetchBytes));
}
// Every cache line of the n elements at p (a row that the next iterations will read).
template <typename T>
HWY_INLINE void PrefetchSpan(const T* p, int64_t n) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + n * sizeof(T);
  for (uintptr_t a = begin; a < end; a += 64) hwy::Prefetch(reinterpret_cast<const T*>(a));
}
// Rows ahead that the row kernels prefetch.
inline constexpr int64_t kRowsAhead = 2;

template <class D>
HWY_INLINE hn::TFromD<D> SumLanes(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}

// ---- row reductions ----

template <typename T>
T RowMax(const T* x, int64_t n) {
  const hn::ScalableTag<T> d;
  constexpr T kLow = -std::numeric_limits<T>::infinity();
  auto acc = hn::Set(d, kLow);
  ForVectors(d, n, [&](int64_t j, size_t c) { acc = hn::Max(acc, LoadPart(d, x + j, c, kLow)); });
  return hn::GetLane(hn::MaxOfLanes(d, acc));
}

template <typename T>
T RowSum(const T* x, int64_t n) {
  const hn::ScalableTag<T> d;
  auto acc = hn::Zero(d);
  ForVectors(d, n, [&](int64_t j, size_t c) { acc = hn::Add(acc, LoadPart(d, x + j, c, T(0))); });
  return SumLanes(d, acc);
}

template <typename T>
T RowDot(const T* a, const T* b, int64_t n) {
  const hn::ScalableTag<T> d;
  auto acc = hn::Zero(d);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    acc = hn::MulAdd(LoadPart(d, a + j, c, T(0)), LoadPart(d, b + j, c, T(0)), acc);
  });
  return SumLanes(d, acc);
}

// Σ_j (x[j] − c)².
template <typename T>
T RowCentredSquares(const T* x, T centre, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vc = hn::Set(d, centre);
  auto acc = hn::Zero(d);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    const auto v = hn::Sub(LoadPart(d, x + j, c, centre), vc);  // padding: centre, adds 0
    acc = hn::MulAdd(v, v, acc);
  });
  return SumLanes(d, acc);
}

// y[j] = e^(x[j] − shift) (y may be null); returns Σ_j e^(x[j] − shift). e^(−inf) is exactly 0,
// so padding with −inf adds nothing.
template <typename T>
T RowExpSum(const T* x, T shift, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vs = hn::Set(d, shift);
  auto acc = hn::Zero(d);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    const auto v = LoadPart(d, x + j, c, -std::numeric_limits<T>::infinity());
    const auto e = hn::Exp(d, hn::Sub(v, vs));
    if (y) StorePart(d, e, y + j, c);
    acc = hn::Add(acc, e);
  });
  return SumLanes(d, acc);
}

// y[j] *= k.
template <typename T>
void RowScaleInPlace(T* y, T k, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vk = hn::Set(d, k);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    StorePart(d, hn::Mul(LoadPart(d, y + j, c, T(0)), vk), y + j, c);
  });
}

// out = p · (dp − s).
template <typename T>
void SoftmaxGradRow(const T* p, const T* dp, T s, T* out, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vs = hn::Set(d, s);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    const auto pv = LoadPart(d, p + j, c, T(0));
    StorePart(d, hn::Mul(pv, hn::Sub(LoadPart(d, dp + j, c, T(0)), vs)), out + j, c);
  });
}

// ---- column sums ----

template <typename T>
void ColumnSum(const T* x, T* out, int64_t rows, int64_t cols, int64_t ld) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  // Four vectors of columns at a time: four independent chains of adds down the rows.
  for (; j + 4 * lanes <= cols; j += 4 * lanes) {
    auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * ld + j;
      if (r + 8 < rows) PrefetchSpan(row + 8 * ld, 4 * lanes);
      a0 = hn::Add(a0, hn::LoadU(d, row));
      a1 = hn::Add(a1, hn::LoadU(d, row + lanes));
      a2 = hn::Add(a2, hn::LoadU(d, row + 2 * lanes));
      a3 = hn::Add(a3, hn::LoadU(d, row + 3 * lanes));
    }
    hn::StoreU(a0, d, out + j);
    hn::StoreU(a1, d, out + j + lanes);
    hn::StoreU(a2, d, out + j + 2 * lanes);
    hn::StoreU(a3, d, out + j + 3 * lanes);
  }
  for (; j < cols; j += lanes) {
    const size_t c = static_cast<size_t>(std::min(lanes, cols - j));
    auto a = hn::Zero(d);
    for (int64_t r = 0; r < rows; ++r) a = hn::Add(a, LoadPart(d, x + r * ld + j, c, T(0)));
    StorePart(d, a, out + j, c);
  }
}

// ---- softmax ----

template <typename T>
void SoftmaxRow(const T* x, T* y, int64_t n) {
  const T m = RowMax(x, n);
  RowScaleInPlace(y, T(1) / RowExpSum(x, m, y, n), n);
}

template <typename T>
void Softmax(const T* x, T* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kRowsAhead < rows) PrefetchSpan(x + (r + kRowsAhead) * cols, cols);
    SoftmaxRow(x + r * cols, y + r * cols, cols);
  }
}

template <typename T>
void CausalSoftmax(const T* x, T* y, int64_t begin, int64_t end, int64_t t) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t visible = row % t + 1;
    SoftmaxRow(x + row * t, y + row * t, visible);
    std::fill(y + row * t + visible, y + (row + 1) * t, T(0));
  }
}

template <typename T>
void SoftmaxGrad(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * cols;
    const T* yr = y + r * cols;
    SoftmaxGradRow(yr, dyr, RowDot(dyr, yr, cols), dx + r * cols, cols);
  }
}

// ---- layer norm ----

template <typename T>
struct RowStats {
  T mean, rstd;
};

template <typename T>
RowStats<T> Stats(const T* x, int64_t n, T eps) {
  const T mean = RowSum(x, n) / static_cast<T>(n);
  const T var = RowCentredSquares(x, mean, n) / static_cast<T>(n);
  return {mean, T(1) / std::sqrt(var + eps)};
}

template <typename T>
void LayerNorm(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t cols, T eps) {
  const hn::ScalableTag<T> d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    if (r + kRowsAhead < rows) PrefetchSpan(xr + kRowsAhead * cols, cols);
    const RowStats<T> s = Stats(xr, cols, eps);
    const auto mean = hn::Set(d, s.mean), rstd = hn::Set(d, s.rstd);
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto xhat = hn::Mul(hn::Sub(LoadPart(d, xr + j, c, T(0)), mean), rstd);
      StorePart(d, hn::MulAdd(xhat, LoadPart(d, w + j, c, T(0)), LoadPart(d, b + j, c, T(0))),
                yr + j, c);
    });
  }
}

template <typename T>
void LayerNormGradX(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t cols, T eps) {
  const hn::ScalableTag<T> d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    if (r + kRowsAhead < rows) {
      PrefetchSpan(xr + kRowsAhead * cols, cols);
      PrefetchSpan(dyr + kRowsAhead * cols, cols);
    }
    const RowStats<T> s = Stats(xr, cols, eps);
    const auto mean = hn::Set(d, s.mean), rstd = hn::Set(d, s.rstd);
    // Σ g and Σ g·x̂ with g = dy·weight (padding: dy = 0, so g = 0).
    auto g_acc = hn::Zero(d), gx_acc = hn::Zero(d);
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto g = hn::Mul(LoadPart(d, dyr + j, c, T(0)), LoadPart(d, w + j, c, T(0)));
      const auto xhat = hn::Mul(hn::Sub(LoadPart(d, xr + j, c, s.mean), mean), rstd);
      g_acc = hn::Add(g_acc, g);
      gx_acc = hn::MulAdd(g, xhat, gx_acc);
    });
    const auto g_mean = hn::Set(d, SumLanes(d, g_acc) / static_cast<T>(cols));
    const auto gx_mean = hn::Set(d, SumLanes(d, gx_acc) / static_cast<T>(cols));
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto g = hn::Mul(LoadPart(d, dyr + j, c, T(0)), LoadPart(d, w + j, c, T(0)));
      const auto xhat = hn::Mul(hn::Sub(LoadPart(d, xr + j, c, s.mean), mean), rstd);
      // rstd · (g − g_mean − x̂·gx_mean)
      StorePart(d, hn::Mul(rstd, hn::NegMulAdd(xhat, gx_mean, hn::Sub(g, g_mean))), dxr + j, c);
    });
  }
}

template <typename T>
void LayerNormGradParams(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t cols, T eps) {
  const hn::ScalableTag<T> d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    if (r + kRowsAhead < rows) {
      PrefetchSpan(xr + kRowsAhead * cols, cols);
      PrefetchSpan(dyr + kRowsAhead * cols, cols);
    }
    const RowStats<T> s = Stats(xr, cols, eps);
    const auto mean = hn::Set(d, s.mean), rstd = hn::Set(d, s.rstd);
    // Across channels: no sum is reordered, rows are added in order.
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto g = LoadPart(d, dyr + j, c, T(0));
      const auto xhat = hn::Mul(hn::Sub(LoadPart(d, xr + j, c, s.mean), mean), rstd);
      StorePart(d, hn::MulAdd(g, xhat, LoadPart(d, dw + j, c, T(0))), dw + j, c);
      StorePart(d, hn::Add(g, LoadPart(d, db + j, c, T(0))), db + j, c);
    });
  }
}

// ---- RMS norm ----

// 1 / sqrt(mean of squares + eps); the squares summed per lane (padding 0 adds nothing).
template <typename T>
T RmsRstd(const T* x, int64_t n, T eps) {
  return T(1) / std::sqrt(RowDot(x, x, n) / static_cast<T>(n) + eps);
}

template <typename T>
void RmsNorm(const T* x, const T* w, T* y, int64_t rows, int64_t cols, T eps) {
  const hn::ScalableTag<T> d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    if (r + kRowsAhead < rows) PrefetchSpan(xr + kRowsAhead * cols, cols);
    const auto rstd = hn::Set(d, RmsRstd(xr, cols, eps));
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto xhat = hn::Mul(LoadPart(d, xr + j, c, T(0)), rstd);
      StorePart(d, hn::Mul(xhat, LoadPart(d, w + j, c, T(0))), yr + j, c);
    });
  }
}

template <typename T>
void RmsNormGradX(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t cols, T eps) {
  const hn::ScalableTag<T> d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    if (r + kRowsAhead < rows) {
      PrefetchSpan(xr + kRowsAhead * cols, cols);
      PrefetchSpan(dyr + kRowsAhead * cols, cols);
    }
    const auto rstd = hn::Set(d, RmsRstd(xr, cols, eps));
    // Σ g·x̂ with g = dy·weight (padding: dy = 0, so g = 0).
    auto gx_acc = hn::Zero(d);
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto g = hn::Mul(LoadPart(d, dyr + j, c, T(0)), LoadPart(d, w + j, c, T(0)));
      gx_acc = hn::MulAdd(g, hn::Mul(LoadPart(d, xr + j, c, T(0)), rstd), gx_acc);
    });
    const auto gx_mean = hn::Set(d, SumLanes(d, gx_acc) / static_cast<T>(cols));
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto g = hn::Mul(LoadPart(d, dyr + j, c, T(0)), LoadPart(d, w + j, c, T(0)));
      const auto xhat = hn::Mul(LoadPart(d, xr + j, c, T(0)), rstd);
      // rstd · (g − x̂·gx_mean)
      StorePart(d, hn::Mul(rstd, hn::NegMulAdd(xhat, gx_mean, g)), dxr + j, c);
    });
  }
}

template <typename T>
void RmsNormGradWeight(const T* dy, const T* x, T* dw, int64_t rows, int64_t cols, T eps) {
  const hn::ScalableTag<T> d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    if (r + kRowsAhead < rows) {
      PrefetchSpan(xr + kRowsAhead * cols, cols);
      PrefetchSpan(dyr + kRowsAhead * cols, cols);
    }
    const auto rstd = hn::Set(d, RmsRstd(xr, cols, eps));
    // Across channels: no sum is reordered, rows are added in order.
    ForVectors(d, cols, [&](int64_t j, size_t c) {
      const auto xhat = hn::Mul(LoadPart(d, xr + j, c, T(0)), rstd);
      StorePart(d, hn::MulAdd(LoadPart(d, dyr + j, c, T(0)), xhat, LoadPart(d, dw + j, c, T(0))),
                dw + j, c);
    });
  }
}

// ---- cross-entropy rows ----

template <typename T>
void MaxAndSumExp(const T* x, int64_t n, T* max, T* sum) {
  *max = RowMax(x, n);
  *sum = RowExpSum<T>(x, *max, nullptr, n);
}

template <typename T>
void ScaledExp(const T* x, T shift, T scale, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vs = hn::Set(d, shift), vk = hn::Set(d, scale);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    const auto e = hn::Exp(d, hn::Sub(LoadPart(d, x + j, c, shift), vs));
    StorePart(d, hn::Mul(e, vk), y + j, c);
  });
}

// Σ x² in double: every element widened before it is squared, so a sum over millions of
// parameters (the gradient norm) rounds as a double loop does, in a different order. Two
// accumulators a step: a load, a widen and an FMA per vector of doubles, memory-bound.
template <typename T>
double SumSquares(const T* x, int64_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<T, decltype(dd)> dt;  // as many T as dd has doubles
  const auto widen = [&](const T* p) {
    if constexpr (std::is_same_v<T, double>) {
      return hn::LoadU(dd, p);
    } else {
      return hn::PromoteTo(dd, hn::LoadU(dt, p));
    }
  };
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  auto a0 = hn::Zero(dd), a1 = hn::Zero(dd);
  int64_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    PrefetchAhead(x + j);
    const auto v0 = widen(x + j), v1 = widen(x + j + lanes);
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
  }
  double sum = SumLanes(dd, hn::Add(a0, a1));
  for (; j < n; ++j) sum += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  return sum;
}

// ---- batch norm (kernels/batch_norm.h) ----

// Elements per block of the blocked sums below: each lane adds at most kBlockedSumElements /
// lanes terms in T (32 with AVX-512's 16 floats) before the block's lanes are added into a
// double, so a sum's error is that of 32 f32 additions plus a double sum, however long the run.
inline constexpr int64_t kBlockedSumElements = 512;

// Runs add(s0, s1, j, count) over the vectors of n elements in blocks of kBlockedSumElements,
// two vector accumulators per block (zeroed), and returns the blocks' totals summed in double.
// add must leave the accumulators unchanged by lanes at or past count.
template <class D, class F>
HWY_INLINE std::pair<double, double> BlockedSums(D d, int64_t n, F&& add) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  double t0 = 0, t1 = 0;
  for (int64_t b = 0; b < n; b += kBlockedSumElements) {
    const int64_t end = std::min(n, b + kBlockedSumElements);
    auto s0 = hn::Zero(d), s1 = hn::Zero(d);
    int64_t j = b;
    for (; j + lanes <= end; j += lanes) add(s0, s1, j, static_cast<size_t>(lanes));
    if (j < end) add(s0, s1, j, static_cast<size_t>(end - j));
    t0 += static_cast<double>(SumLanes(d, s0));
    t1 += static_cast<double>(SumLanes(d, s1));
  }
  return {t0, t1};
}

template <typename T>
double BlockedSum(const T* x, int64_t n) {
  const hn::ScalableTag<T> d;
  return BlockedSums(d, n,
                     [&](auto& s, auto&, int64_t j, size_t c) {
                       s = hn::Add(s, LoadPart(d, x + j, c, T(0)));
                     })
      .first;
}

template <typename T>
double CenteredSquares(const T* x, T shift, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vs = hn::Set(d, shift);
  return BlockedSums(d, n,
                     [&](auto& s, auto&, int64_t j, size_t c) {
                       const auto v = hn::Sub(LoadPart(d, x + j, c, shift), vs);
                       s = hn::MulAdd(v, v, s);
                     })
      .first;
}

template <typename T>
void CenteredDot(const T* dy, const T* x, T shift, int64_t n, double* sum, double* dot) {
  const hn::ScalableTag<T> d;
  const auto vs = hn::Set(d, shift);
  const auto [s, p] = BlockedSums(d, n, [&](auto& s0, auto& s1, int64_t j, size_t c) {
    const auto g = LoadPart(d, dy + j, c, T(0));
    s0 = hn::Add(s0, g);
    s1 = hn::MulAdd(g, hn::Sub(LoadPart(d, x + j, c, shift), vs), s1);
  });
  *sum = s;
  *dot = p;
}

template <typename T>
void Affine(const T* x, T a, T b, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto va = hn::Set(d, a), vb = hn::Set(d, b);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    StorePart(d, hn::MulAdd(LoadPart(d, x + j, c, T(0)), va, vb), y + j, c);
  });
}

template <typename T>
void BatchNormGradRow(const T* dy, const T* x, T mean, T k, T grad_mean, T scale, T* dx,
                      int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vm = hn::Set(d, mean), vk = hn::Set(d, k), vg = hn::Set(d, grad_mean),
             vs = hn::Set(d, scale);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    const auto centered = hn::Sub(LoadPart(d, x + j, c, T(0)), vm);
    const auto g = hn::Sub(LoadPart(d, dy + j, c, T(0)), vg);
    StorePart(d, hn::Mul(hn::NegMulAdd(centered, vk, g), vs), dx + j, c);
  });
}

// ---- elementwise ----

// Highway's Exp is accurate up to 104 (f32) / 706 (f64) and garbage far beyond; past these
// bounds every result overflows anyway (e^88.8 > FLT_MAX, e^709.8 > DBL_MAX), so larger inputs
// are clamped to them and the answer is +inf. The f64 bound is 709.8, not 706: the 2^q scaling
// (two factors 2^(q/2)) holds up to overflow, which tests/ops check at 709.7.
template <typename T>
inline constexpr T kExpClamp = sizeof(T) == 4 ? T(104) : T(709.8);

template <typename T>
void Exp(const T* x, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto hi = hn::Set(d, kExpClamp<T>);
  const auto inf = hn::Set(d, std::numeric_limits<T>::infinity());
  ForVectors(d, n, [&](int64_t j, size_t c) {
    PrefetchAhead(x + j);
    const auto v = LoadPart(d, x + j, c, T(0));
    auto e = hn::Exp(d, hn::Min(v, hi));
    e = hn::IfThenElse(hn::Gt(v, hi), inf, e);
    StorePart(d, hn::IfThenElse(hn::IsNaN(v), v, e), y + j, c);
  });
}

template <typename T>
void Tanh(const T* x, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  ForVectors(d, n, [&](int64_t j, size_t c) {
    PrefetchAhead(x + j);
    StorePart(d, hn::Tanh(d, LoadPart(d, x + j, c, T(0))), y + j, c);
  });
}

// GELU, tanh approximation (the reference kernel's and PyTorch's function), evaluated through the
// logistic function: 0.5·(1 + tanh(u)) = σ(2u) = 1 / (1 + e^(−2u)), with u = β·(x + κ·x³),
// β = √(2/π), κ = 0.044715. With e = e^(−2u) and s = 1 / (1 + e):
//   gelu(x)  = x · s
//   gelu'(x) = s + x·s·(1 − s)·2u' = s · (1 + 2·x·u'·e·s),   u' = β·(1 + 3κ·x²)
// One exp and one division per element, where tanh costs an expm1 and a division; and nothing
// cancels (1 − s is e·s), where 1 + tanh(u) does for negative x. −2u is clamped at kSigmoidClamp
// (e^88 in f32): beyond it Exp is inaccurate and 1 + e overflows, and s < 1e-38 there anyway.
template <typename T>
inline constexpr T kBeta = static_cast<T>(std::numbers::sqrt2* std::numbers::inv_sqrtpi);
template <typename T>
inline constexpr T kKappa = T(0.044715);
template <typename T>
inline constexpr T kSigmoidClamp = sizeof(T) == 4 ? T(88) : T(709);

// e^(−2u) for x (the e above), and x² for the caller.
template <class D>
HWY_INLINE hn::Vec<D> GeluExp(D d, hn::Vec<D> x, hn::Vec<D> x_square) {
  using T = hn::TFromD<D>;
  // −2u = −2β·(x + κ·x³) = −2β·x·(1 + κ·x²)
  const auto minus_two_u = hn::Mul(hn::Mul(hn::Set(d, T(-2) * kBeta<T>), x),
                                   hn::MulAdd(hn::Set(d, kKappa<T>), x_square, hn::Set(d, T(1))));
  return hn::Exp(d, hn::Min(minus_two_u, hn::Set(d, kSigmoidClamp<T>)));
}

template <typename T>
void Gelu(const T* x, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto one = hn::Set(d, T(1));
  ForVectors(d, n, [&](int64_t j, size_t c) {
    PrefetchAhead(x + j);
    const auto v = LoadPart(d, x + j, c, T(0));
    const auto e = GeluExp(d, v, hn::Mul(v, v));
    StorePart(d, hn::Div(v, hn::Add(one, e)), y + j, c);
  });
}

template <typename T>
void GeluGrad(const T* dy, const T* x, T* dx, int64_t n) {
  const hn::ScalableTag<T> d;
  const auto one = hn::Set(d, T(1));
  const auto two_beta = hn::Set(d, T(2) * kBeta<T>), three_kappa = hn::Set(d, T(3) * kKappa<T>);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    PrefetchAhead(x + j);
    PrefetchAhead(dy + j);
    const auto v = LoadPart(d, x + j, c, T(0));
    const auto v_square = hn::Mul(v, v);
    const auto e = GeluExp(d, v, v_square);
    const auto s = hn::Div(one, hn::Add(one, e));
    // 2·x·u' = 2β·x·(1 + 3κ·x²)
    const auto two_x_du = hn::Mul(hn::Mul(two_beta, v), hn::MulAdd(three_kappa, v_square, one));
    const auto derivative = hn::Mul(s, hn::MulAdd(two_x_du, hn::Mul(e, s), one));
    StorePart(d, hn::Mul(LoadPart(d, dy + j, c, T(0)), derivative), dx + j, c);
  });
}

// ---- elementwise binary ----

struct AddOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
};
struct SubOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Sub(a, b);
  }
};
struct MulOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Mul(a, b);
  }
};
struct DivOp {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Div(a, b);
  }
};

// out = op(a, b) over n elements; four vectors a step (the rows of the dispatch chain are short:
// 64 floats are two steps of AVX2), then single vectors, then a padded tail. One IEEE operation
// per element, so every target gives the scalar loop's bits.
template <typename T, class Op>
void Binary(const T* a, const T* b, T* out, int64_t n) {
  const hn::ScalableTag<T> d;
  const Op op;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  const bool stream = static_cast<uintptr_t>(n) * sizeof(T) > 4 * kPrefetchBytes;  // not short rows
  for (; j + 4 * lanes <= n; j += 4 * lanes) {
    if (stream) {
      for (int64_t o = 0; o < 4 * lanes; o += lanes) {
        PrefetchAhead(a + j + o);
        PrefetchAhead(b + j + o);
      }
    }
    const auto r0 = op(hn::LoadU(d, a + j), hn::LoadU(d, b + j));
    const auto r1 = op(hn::LoadU(d, a + j + lanes), hn::LoadU(d, b + j + lanes));
    const auto r2 = op(hn::LoadU(d, a + j + 2 * lanes), hn::LoadU(d, b + j + 2 * lanes));
    const auto r3 = op(hn::LoadU(d, a + j + 3 * lanes), hn::LoadU(d, b + j + 3 * lanes));
    hn::StoreU(r0, d, out + j);
    hn::StoreU(r1, d, out + j + lanes);
    hn::StoreU(r2, d, out + j + 2 * lanes);
    hn::StoreU(r3, d, out + j + 3 * lanes);
  }
  for (; j + lanes <= n; j += lanes)
    hn::StoreU(op(hn::LoadU(d, a + j), hn::LoadU(d, b + j)), d, out + j);
  if (j < n) {
    const size_t c = static_cast<size_t>(n - j);
    StorePart(d, op(LoadPart(d, a + j, c, T(1)), LoadPart(d, b + j, c, T(1))), out + j, c);
  }
}

// ---- optimizer updates ----

// Out of place (outputs apart from the inputs, post-validation's spares), the outputs are written
// with streaming stores: their lines were last touched a training step ago and are out of the
// caches, and an ordinary store would first read each line it fills (measured in
// docs/benchmarks.md, "A rollback that costs nothing").
template <typename T>
void AdamW(const T* p, const T* g, const T* m, const T* v, T* p_out, T* m_out, T* v_out, int64_t n,
           const AdamWScalars<T>& s) {
  const hn::ScalableTag<T> d;
  const auto decay = hn::Set(d, s.decay), b1 = hn::Set(d, s.beta1),
             c1 = hn::Set(d, s.one_minus_beta1), b2 = hn::Set(d, s.beta2),
             c2 = hn::Set(d, s.one_minus_beta2), step_size = hn::Set(d, s.step_size),
             bias2_sqrt = hn::Set(d, s.bias2_sqrt), eps = hn::Set(d, s.eps);
  const size_t lanes = hn::Lanes(d);
  const auto aligned = [&](const T* x) {
    return reinterpret_cast<uintptr_t>(x) % (lanes * sizeof(T)) == 0;
  };
  const bool stream = p_out != p && aligned(p_out) && aligned(m_out) && aligned(v_out);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    PrefetchAhead(g + j);
    PrefetchAhead(m + j);
    PrefetchAhead(v + j);
    PrefetchAhead(p + j);
    // Every load of a vector comes before its stores, so an output may be its input (in place).
    const auto gv = LoadPart(d, g + j, c, T(0));
    const auto mi = hn::Add(hn::Mul(b1, LoadPart(d, m + j, c, T(0))), hn::Mul(c1, gv));
    const auto vi = hn::Add(hn::Mul(b2, LoadPart(d, v + j, c, T(0))), hn::Mul(hn::Mul(c2, gv), gv));
    const auto denom = hn::Add(hn::Div(hn::Sqrt(vi), bias2_sqrt), eps);
    const auto pv = hn::Mul(LoadPart(d, p + j, c, T(0)), decay);
    const auto pn = hn::Sub(pv, hn::Mul(step_size, hn::Div(mi, denom)));
    if (stream && c == lanes) {
      hn::Stream(mi, d, m_out + j);
      hn::Stream(vi, d, v_out + j);
      hn::Stream(pn, d, p_out + j);
      return;
    }
    StorePart(d, mi, m_out + j, c);
    StorePart(d, vi, v_out + j, c);
    StorePart(d, pn, p_out + j, c);
  });
  if (stream) hwy::FlushStream();  // the streamed stores are visible before the caller goes on
}

template <typename T>
void Sgd(const T* p, const T* g, const T* buf, T* p_out, T* buf_out, int64_t n, T weight_decay,
         T momentum, T lr) {
  const hn::ScalableTag<T> d;
  const auto wd = hn::Set(d, weight_decay), mu = hn::Set(d, momentum), rate = hn::Set(d, lr);
  ForVectors(d, n, [&](int64_t j, size_t c) {
    PrefetchAhead(p + j);
    PrefetchAhead(g + j);
    if (momentum != T(0)) PrefetchAhead(buf + j);
    const auto pv = LoadPart(d, p + j, c, T(0));
    auto dir = hn::Add(LoadPart(d, g + j, c, T(0)), hn::Mul(wd, pv));
    if (momentum != T(0)) {
      dir = hn::Add(hn::Mul(mu, LoadPart(d, buf + j, c, T(0))), dir);
      StorePart(d, dir, buf_out + j, c);
    }
    StorePart(d, hn::Sub(pv, hn::Mul(rate, dir)), p_out + j, c);
  });
}

// A function-local static: initialised on first use, whatever the order of static initialisers.
template <typename T>
const SimdRowKernels<T>* Table() {
  static const SimdRowKernels<T> table = {
      .target = hwy::TargetName(HWY_TARGET),
      .softmax = Softmax<T>,
      .causal_softmax = CausalSoftmax<T>,
      .softmax_grad = SoftmaxGrad<T>,
      .layer_norm = LayerNorm<T>,
      .layer_norm_grad_x = LayerNormGradX<T>,
      .layer_norm_grad_params = LayerNormGradParams<T>,
      .rms_norm = RmsNorm<T>,
      .rms_norm_grad_x = RmsNormGradX<T>,
      .rms_norm_grad_weight = RmsNormGradWeight<T>,
      .column_sum = ColumnSum<T>,
      .row_max = RowMax<T>,
      .row_dot = RowDot<T>,
      .sum_squares = SumSquares<T>,
      .blocked_sum = BlockedSum<T>,
      .centered_squares = CenteredSquares<T>,
      .centered_dot = CenteredDot<T>,
      .affine = Affine<T>,
      .batch_norm_grad_row = BatchNormGradRow<T>,
      .small_gemm = SmallGemm<T>,
      .transpose = Transpose<T>,
      .exp_sum = RowExpSum<T>,
      .scale_in_place = RowScaleInPlace<T>,
      .softmax_grad_row = SoftmaxGradRow<T>,
      .max_and_sum_exp = MaxAndSumExp<T>,
      .scaled_exp = ScaledExp<T>,
      .exp = Exp<T>,
      .tanh = Tanh<T>,
      .gelu = Gelu<T>,
      .gelu_grad = GeluGrad<T>,
      .adamw = AdamW<T>,
      .sgd = Sgd<T>,
      .add = Binary<T, AddOp>,
      .sub = Binary<T, SubOp>,
      .mul = Binary<T, MulOp>,
      .div = Binary<T, DivOp>,
  };
  return &table;
}

// The exported functions (HWY_EXPORT takes names, not templates).
const SimdRowKernels<float>* TableF32() { return Table<float>(); }
const SimdRowKernels<double>* TableF64() { return Table<double>(); }

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "sluice/core/error.h"

namespace sluice::kernels {

HWY_EXPORT(TableF32);
HWY_EXPORT(TableF64);

namespace {

// The tables in use, remembered after the first HWY_DYNAMIC_DISPATCH (whose lookup is a call into
// libhwy per use: a small kernel, such as an add of 64 floats, paid it on every call) and forgotten
// by ForceSimdTarget.
std::atomic<const SimdRowKernels<float>*> chosen_f32{nullptr};
std::atomic<const SimdRowKernels<double>*> chosen_f64{nullptr};

template <typename T, typename Choose>
const SimdRowKernels<T>& Chosen(std::atomic<const SimdRowKernels<T>*>& chosen, Choose choose) {
  const SimdRowKernels<T>* table = chosen.load(std::memory_order_acquire);
  if (table == nullptr) {
    table = choose();
    chosen.store(table, std::memory_order_release);
  }
  return *table;
}

}  // namespace

template <>
const SimdRowKernels<float>& Simd<float>() {
  return Chosen(chosen_f32, [] { return HWY_DYNAMIC_DISPATCH(TableF32)(); });
}
template <>
const SimdRowKernels<double>& Simd<double>() {
  return Chosen(chosen_f64, [] { return HWY_DYNAMIC_DISPATCH(TableF64)(); });
}

std::string SimdTarget() { return Simd<float>().target; }

std::vector<std::string> SimdTargets() {
  // SupportedAndGeneratedTargets lists the lowest bit (the best target) first.
  std::vector<std::string> names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

void ForceSimdTarget(std::string_view target) {
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU supports
  chosen_f32.store(nullptr, std::memory_order_release);
  chosen_f64.store(nullptr, std::memory_order_release);
  if (target.empty()) return;
  std::string available;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (target == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      chosen_f32.store(nullptr, std::memory_order_release);
      chosen_f64.store(nullptr, std::memory_order_release);
      return;
    }
    available += available.empty() ? "" : ", ";
    available += hwy::TargetName(t);
  }
  throw InvalidArgument("SIMD target '" + std::string(target) +
                        "' is not available on this machine (available: " + available + ")");
}

}  // namespace sluice::kernels
#endif  // HWY_ONCE
