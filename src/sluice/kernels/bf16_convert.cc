// The per-target code of bf16_convert.h. Highway compiles this file once per target
// (hwy/foreach_target.h re-includes it); the part under HWY_ONCE exports the kernels.

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sluice/kernels/bf16_convert.cc"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>

#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_round-inl.h"
#include "sluice/kernels/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Whole vectors through SIMD, the tail (fewer than a vector's lanes) through the scalar
// conversion, which computes the same bits.
void ToBF16(const float* x, BFloat16* y, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto* out = reinterpret_cast<uint16_t*>(y);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) StoreRounded(hn::LoadU(df, x + i), out + i);
  for (; i < n; ++i) y[i] = FloatToBF16(x[i]);
}

// Columns [0, cols) of x [rows, ld]: y (same layout) = x rounded, sum[j] = x[0, j] + x[1, j] + ...
// added from 0 in row order (what kernels/simd_kernels.h's column_sum adds, lane by lane). Four
// vectors of columns at a time down the rows; the columns left (fewer than four vectors) one at a
// time through the scalar conversion and the same additions in the same order.
void ToBF16ColumnSum(const float* x, BFloat16* y, float* sum, int64_t rows, int64_t cols,
                     int64_t ld) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto* out = reinterpret_cast<uint16_t*>(y);
  int64_t j = 0;
  for (; j + 4 * lanes <= cols; j += 4 * lanes) {
    auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * ld + j;
      uint16_t* o = out + r * ld + j;
      if (r + 8 < rows) {
        for (int64_t v = 0; v < 4; ++v) hwy::Prefetch(row + 8 * ld + v * lanes);
      }
      const auto v0 = hn::LoadU(df, row), v1 = hn::LoadU(df, row + lanes),
                 v2 = hn::LoadU(df, row + 2 * lanes), v3 = hn::LoadU(df, row + 3 * lanes);
      a0 = hn::Add(a0, v0);
      a1 = hn::Add(a1, v1);
      a2 = hn::Add(a2, v2);
      a3 = hn::Add(a3, v3);
      StoreRounded(v0, o);
      StoreRounded(v1, o + lanes);
      StoreRounded(v2, o + 2 * lanes);
      StoreRounded(v3, o + 3 * lanes);
    }
    hn::StoreU(a0, df, sum + j);
    hn::StoreU(a1, df, sum + j + lanes);
    hn::StoreU(a2, df, sum + j + 2 * lanes);
    hn::StoreU(a3, df, sum + j + 3 * lanes);
  }
  for (; j < cols; ++j) {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      s += x[r * ld + j];
      y[r * ld + j] = FloatToBF16(x[r * ld + j]);
    }
    sum[j] = s;
  }
}

void FromBF16(const BFloat16* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(WidenVector(x + i), df, y + i);
  for (; i < n; ++i) y[i] = BF16ToFloat(x[i]);
}

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sluice::kernels {

HWY_EXPORT(ToBF16);
HWY_EXPORT(FromBF16);
HWY_EXPORT(ToBF16ColumnSum);

void ToBF16Reference(const float* x, BFloat16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = FloatToBF16(x[i]);
}

void FromBF16Reference(const BFloat16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = BF16ToFloat(x[i]);
}

void ToBF16Fast(const float* x, BFloat16* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ToBF16)(x, y, n); }

void FromBF16Fast(const BFloat16* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FromBF16)(x, y, n);
}

void ToBF16Parallel(const float* x, BFloat16* y, int64_t n) {
  ParallelFor(n, kChunkElements,
              [&](int64_t begin, int64_t end) { ToBF16Fast(x + begin, y + begin, end - begin); });
}

void FromBF16Parallel(const BFloat16* x, float* y, int64_t n) {
  ParallelFor(n, kChunkElements,
              [&](int64_t begin, int64_t end) { FromBF16Fast(x + begin, y + begin, end - begin); });
}

void ToBF16ColumnSumReference(const float* x, BFloat16* y, float* sum, int64_t rows, int64_t cols) {
  ToBF16Reference(x, y, rows * cols);
  for (int64_t j = 0; j < cols; ++j) sum[j] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) sum[j] += x[r * cols + j];
  }
}

void ToBF16ColumnSumParallel(const float* x, BFloat16* y, float* sum, int64_t rows, int64_t cols) {
  if (rows == 0) {
    for (int64_t j = 0; j < cols; ++j) sum[j] = 0.0f;
    return;
  }
  // Chunks of whole columns, a multiple of 64 (whole vectors on every target), as SumFast's.
  const int64_t chunk = (ChunkRows(rows) + 63) / 64 * 64;
  ParallelFor(cols, chunk, [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(ToBF16ColumnSum)
    (x + begin, y + begin, sum + begin, rows, end - begin, cols);
  });
}

}  // namespace sluice::kernels
#endif  // HWY_ONCE
