// The per-target conversions between f32 vectors and bf16 bits, shared by the kernels that
// convert as they go (kernels/bf16_convert.cc, kernels/bf16_gemm.cc): included inside Highway's
// per-target compilation (hence the toggling guard of Highway's -inl.h convention, not
// #pragma once).
//
//   WidenVector(x):        the vector of f32 holding bf16 x[0, lanes) exactly (a bf16 is the high
//                          half of its f32).
//   StoreRounded(v, out):  v rounded to the nearest bf16, ties to even (a NaN quieted), stored as
//                          lanes u16 bits at out: core/dtype.h's FloatToBF16, lane by lane.
//   RoundedVector(v):      v rounded as StoreRounded rounds it, widened back to f32: the value a
//                          cast to bf16 then to f32 gives, lane by lane, in registers.

#if defined(SLUICE_KERNELS_BF16_ROUND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SLUICE_KERNELS_BF16_ROUND_INL_H_
#undef SLUICE_KERNELS_BF16_ROUND_INL_H_
#else
#define SLUICE_KERNELS_BF16_ROUND_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "sluice/core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE hn::Vec<hn::ScalableTag<float>> WidenVector(const BFloat16* x) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const auto u = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(x)));
  return hn::BitCast(df, hn::ShiftLeft<16>(u));
}

HWY_INLINE void StoreRounded(hn::Vec<hn::ScalableTag<float>> v, uint16_t* out) {
  const hn::RebindToUnsigned<hn::ScalableTag<float>> du;
  const hn::Rebind<uint16_t, hn::ScalableTag<float>> du16;
  const auto one = hn::Set(du, 1u), half = hn::Set(du, 0x7fffu), quiet = hn::Set(du, 0x40u);
  const auto u = hn::BitCast(du, v);
  // Round to nearest even: add 0x7fff plus the lowest bit kept, then keep the upper half.
  const auto rounded =
      hn::ShiftRight<16>(hn::Add(u, hn::Add(half, hn::And(hn::ShiftRight<16>(u), one))));
  const auto nan = hn::Or(hn::ShiftRight<16>(u), quiet);
  const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded);
  hn::StoreU(hn::TruncateTo(du16, bits), du16, out);
}

HWY_INLINE hn::Vec<hn::ScalableTag<float>> RoundedVector(hn::Vec<hn::ScalableTag<float>> v) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto one = hn::Set(du, 1u), half = hn::Set(du, 0x7fffu), high = hn::Set(du, 0xffff0000u);
  const auto u = hn::BitCast(du, v);
  // StoreRounded's bits, kept in the upper half: (u >> 16 | 0x40) << 16 for a NaN.
  const auto rounded =
      hn::And(hn::Add(u, hn::Add(half, hn::And(hn::ShiftRight<16>(u), one))), high);
  const auto nan = hn::And(hn::Or(u, hn::Set(du, 0x400000u)), high);
  return hn::BitCast(df, hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded));
}

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SLUICE_KERNELS_BF16_ROUND_INL_H_
