// The per-target code of bf16_convert.h. Highway compiles this file once per target
// (hwy/foreach_target.h re-includes it); the part under HWY_ONCE exports the kernels.

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sluice/kernels/bf16_convert.cc"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <cstdint>

#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whole vectors through SIMD, the tail (fewer than a vector's lanes) through the scalar
// conversion, which computes the same bits.
void ToBF16(const float* x, BFloat16* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;    // u32 lanes
  const hn::Rebind<uint16_t, decltype(df)> du16;  // as many u16 lanes
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto* out = reinterpret_cast<uint16_t*>(y);
  const auto one = hn::Set(du, 1u), half = hn::Set(du, 0x7fffu), quiet = hn::Set(du, 0x40u);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, x + i);
    const auto u = hn::BitCast(du, v);
    // Round to nearest even: add 0x7fff plus the lowest bit kept, then keep the upper half.
    const auto rounded =
        hn::ShiftRight<16>(hn::Add(u, hn::Add(half, hn::And(hn::ShiftRight<16>(u), one))));
    const auto nan = hn::Or(hn::ShiftRight<16>(u), quiet);
    const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded);
    hn::StoreU(hn::TruncateTo(du16, bits), du16, out + i);
  }
  for (; i < n; ++i) y[i] = FloatToBF16(x[i]);
}

void FromBF16(const BFloat16* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto* in = reinterpret_cast<const uint16_t*>(x);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto u = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, in + i)));
    hn::StoreU(hn::BitCast(df, u), df, y + i);
  }
  for (; i < n; ++i) y[i] = BF16ToFloat(x[i]);
}

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sluice::kernels {

HWY_EXPORT(ToBF16);
HWY_EXPORT(FromBF16);

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

}  // namespace sluice::kernels
#endif  // HWY_ONCE
