// The kernels of dropout.h. The fast kernels are Highway vector code: this file is compiled once
// per target (hwy/foreach_target.h re-includes it), the part under HWY_ONCE exports them; the
// scalar part (the reference, Random123's Philox) is compiled once, behind its own guard.

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sluice/kernels/dropout.cc"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <Random123/philox.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "sluice/kernels/bf16_round-inl.h"
#include "sluice/kernels/dropout.h"
#include "sluice/kernels/parallel.h"

#ifndef SLUICE_KERNELS_DROPOUT_SCALAR_
#define SLUICE_KERNELS_DROPOUT_SCALAR_
namespace sluice::kernels {
namespace {

uint32_t Low(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t High(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

// The type the product x · 1/(1 − p) is computed in: f32 for bf16.
template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, BFloat16>, float, T>;

template <typename T>
Compute<T> DropScale(double p) {
  return p < 1 ? static_cast<Compute<T>>(1.0 / (1.0 - p)) : Compute<T>(0);
}

// One element: the reference's arithmetic, which the vector kernels compute lane by lane.
template <typename T>
T DropElement(T x, bool keep, Compute<T> scale) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return keep ? FloatToBF16(BF16ToFloat(x) * scale) : BFloat16{};
  } else {
    return keep ? x * scale : T(0);
  }
}

}  // namespace
}  // namespace sluice::kernels
#endif  // SLUICE_KERNELS_DROPOUT_SCALAR_

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DU64 = hn::ScalableTag<uint64_t>;

// Blocks per group: two vectors of them, whose rounds interleave (two independent chains of
// multiplies keep the multiplier busy while each waits on the last one's latency).
HWY_INLINE int64_t GroupBlocks() { return 2 * static_cast<int64_t>(hn::Lanes(DU64())); }
// Draws per group: four words per block.
HWY_INLINE int64_t GroupDraws() { return 4 * GroupBlocks(); }

// The full 64-bit product of each lane's low half and m: MulEven on the lanes seen as u32 pairs
// (the single-lane scalar target has no pairs: its MulEven takes the u32 itself).
HWY_INLINE hn::Vec<DU64> MulLow(hn::Vec<DU64> c, uint32_t m) {
#if HWY_TARGET == HWY_SCALAR
  const hn::Rebind<uint32_t, DU64> d32;
  return hn::MulEven(hn::Set(d32, static_cast<uint32_t>(hn::GetLane(c))), hn::Set(d32, m));
#else
  const hn::Repartition<uint32_t, DU64> d32;
  return hn::MulEven(hn::BitCast(d32, c), hn::BitCast(d32, hn::Set(DU64(), uint64_t{m})));
#endif
}

// One Philox-4x32 round on a vector of blocks, the round's key words k0, k1 in every lane.
HWY_INLINE void PhiloxRound(hn::Vec<DU64>& c0, hn::Vec<DU64>& c1, hn::Vec<DU64>& c2,
                            hn::Vec<DU64>& c3, hn::Vec<DU64> k0, hn::Vec<DU64> k1) {
  const auto p0 = MulLow(c0, PHILOX_M4x32_0);  // hi0:lo0 = M0 · c0
  const auto p1 = MulLow(c2, PHILOX_M4x32_1);  // hi1:lo1 = M1 · c2
  c0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), k0);
  c1 = p1;
  c2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), k1);
  c3 = p0;
}

// Stores the words (low halves of c0 … c3, one block per lane) in element order: c0 and c1 of a
// lane joined into one 64-bit word (c0 first in memory: little-endian), interleaved with the
// joined c2 and c3.
HWY_INLINE void StoreBlocks(hn::Vec<DU64> c0, hn::Vec<DU64> c1, hn::Vec<DU64> c2, hn::Vec<DU64> c3,
                            uint32_t* HWY_RESTRICT out) {
  static_assert(std::endian::native == std::endian::little, "a u64 holds its low u32 first");
  const DU64 d;
  const auto low = hn::Set(d, uint64_t{0xffffffff});
  const auto w01 = hn::Or(hn::And(c0, low), hn::ShiftLeft<32>(c1));
  const auto w23 = hn::Or(hn::And(c2, low), hn::ShiftLeft<32>(c3));
  hn::StoreInterleaved2(w01, w23, d, reinterpret_cast<uint64_t*>(out));
}

// Philox-4x32-10 of the GroupBlocks() blocks first, first + 1, …, one block per 64-bit lane: each
// counter word rides in the low half of its lane. MulLow multiplies the low halves into the full
// 64-bit product (its high word is the upper half), and XOR keeps the halves apart, so whatever
// the upper halves hold never reaches a low one. The draws go to out in element order
// (out[4·l + w] = word w of block first + l).
HWY_INLINE void PhiloxGroup(uint64_t key, uint64_t stream, uint64_t first,
                            uint32_t* HWY_RESTRICT out) {
  const DU64 d;
  const auto lanes = static_cast<uint64_t>(hn::Lanes(d));
  const auto block_a = hn::Add(hn::Set(d, first), hn::Iota(d, 0));  // carries into the high word
  const auto block_b = hn::Add(hn::Set(d, first + lanes), hn::Iota(d, 0));
  auto a0 = block_a, a1 = hn::ShiftRight<32>(block_a);
  auto b0 = block_b, b1 = hn::ShiftRight<32>(block_b);
  auto a2 = hn::Set(d, uint64_t{Low(stream)}), a3 = hn::Set(d, uint64_t{High(stream)});
  auto b2 = a2, b3 = a3;
  uint32_t k0 = Low(key), k1 = High(key);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // Random123's bumpkey before every round but the first
      k0 += PHILOX_W32_0;
      k1 += PHILOX_W32_1;
    }
    const auto key0 = hn::Set(d, uint64_t{k0}), key1 = hn::Set(d, uint64_t{k1});
    PhiloxRound(a0, a1, a2, a3, key0, key1);
    PhiloxRound(b0, b1, b2, b3, key0, key1);
  }
  StoreBlocks(a0, a1, a2, a3, out);
  StoreBlocks(b0, b1, b2, b3, out + 4 * lanes);
}

void Draws(uint64_t key, uint64_t stream, uint64_t first, int64_t count, uint32_t* out) {
  const int64_t group = GroupBlocks();
  HWY_ALIGN uint32_t draws[HWY_MAX_BYTES];  // GroupDraws() ≤ 4 · 2 · HWY_MAX_BYTES / 8
  int64_t b = 0;
  for (; b + group <= count; b += group) {
    PhiloxGroup(key, stream, first + static_cast<uint64_t>(b), out + 4 * b);
  }
  if (b < count) {
    PhiloxGroup(key, stream, first + static_cast<uint64_t>(b), draws);
    std::copy(draws, draws + 4 * (count - b), out + 4 * b);
  }
}

// The vectors of T a group's elements are scaled in: f32 for f32 and bf16, f64 for f64.
template <typename T>
using DT = hn::ScalableTag<Compute<T>>;

// Lanes [0, Lanes(DT<T>)) of x · scale where draws[l] ≥ threshold, else 0, stored at y (which
// may be x).
template <typename T>
HWY_INLINE void DropVector(const T* x, T* y, const uint32_t* HWY_RESTRICT draws, uint64_t threshold,
                           hn::Vec<DT<T>> scale) {
  const DT<T> d;
  const hn::RebindToUnsigned<DT<T>> du;
  const hn::Rebind<uint32_t, DT<T>> du32;
  const auto u = [&] {  // the draws as T's unsigned lanes
    if constexpr (sizeof(Compute<T>) == 8) {
      return hn::PromoteTo(du, hn::LoadU(du32, draws));
    } else {
      return hn::LoadU(du, draws);
    }
  }();
  const auto drop =
      hn::RebindMask(d, hn::Lt(u, hn::Set(du, static_cast<hn::TFromD<decltype(du)>>(threshold))));
  if constexpr (std::is_same_v<T, BFloat16>) {
    StoreRounded(hn::IfThenZeroElse(drop, hn::Mul(WidenVector(x), scale)),
                 reinterpret_cast<uint16_t*>(y));
  } else {
    hn::StoreU(hn::IfThenZeroElse(drop, hn::Mul(hn::LoadU(d, x), scale)), d, y);
  }
}

// Elements [begin, end) of one key's run (x and y start at the run); begin is a multiple of 4.
// Each group of GroupDraws() elements draws its blocks at once, then goes through whole vectors;
// the last, partial group's elements past its whole vectors take the scalar form.
template <typename T>
void DropRange(const T* x, T* y, int64_t begin, int64_t end, uint64_t key, uint64_t stream,
               double p) {
  const uint64_t threshold = DropThreshold(p);
  if (threshold > 0xffffffffu) {  // p = 1: every element dropped (x · 0 would keep NaNs)
    std::fill(y + begin, y + end, T{});
    return;
  }
  const Compute<T> scale = DropScale<T>(p);
  const DT<T> d;
  const auto scale_v = hn::Set(d, scale);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), group = GroupDraws();
  HWY_ALIGN uint32_t draws[HWY_MAX_BYTES];  // GroupDraws() ≤ 4 · 2 · HWY_MAX_BYTES / 8
  for (int64_t i = begin; i < end; i += group) {
    PhiloxGroup(key, stream, static_cast<uint64_t>(i / 4), draws);
    const int64_t n = std::min(group, end - i);
    int64_t j = 0;
    for (; j + lanes <= n; j += lanes)
      DropVector(x + i + j, y + i + j, draws + j, threshold, scale_v);
    for (; j < n; ++j) y[i + j] = DropElement(x[i + j], draws[j] >= threshold, scale);
  }
}

// HWY_EXPORT takes names, not templates.
void DropRangeF32(const float* x, float* y, int64_t begin, int64_t end, uint64_t key,
                  uint64_t stream, double p) {
  DropRange(x, y, begin, end, key, stream, p);
}
void DropRangeF64(const double* x, double* y, int64_t begin, int64_t end, uint64_t key,
                  uint64_t stream, double p) {
  DropRange(x, y, begin, end, key, stream, p);
}
void DropRangeBF16(const BFloat16* x, BFloat16* y, int64_t begin, int64_t end, uint64_t key,
                   uint64_t stream, double p) {
  DropRange(x, y, begin, end, key, stream, p);
}

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sluice::kernels {

HWY_EXPORT(Draws);
HWY_EXPORT(DropRangeF32);
HWY_EXPORT(DropRangeF64);
HWY_EXPORT(DropRangeBF16);

namespace {

// Elements [begin, end) of one key's run, scalar (begin a multiple of 4).
template <typename T>
void DropRangeReference(const T* x, T* y, int64_t begin, int64_t end, uint64_t key, uint64_t stream,
                        double p) {
  const uint64_t threshold = DropThreshold(p);
  const Compute<T> scale = DropScale<T>(p);
  for (int64_t i = begin; i < end; i += 4) {
    const std::array<uint32_t, 4> u = DropoutDraws(key, stream, static_cast<uint64_t>(i / 4));
    const int64_t block_end = std::min<int64_t>(i + 4, end);
    for (int64_t k = i; k < block_end; ++k) {
      y[k] = DropElement(x[k], u[static_cast<size_t>(k - i)] >= threshold, scale);
    }
  }
}

template <typename T>
void DropRangeFast(const T* x, T* y, int64_t begin, int64_t end, uint64_t key, uint64_t stream,
                   double p) {
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(DropRangeF32)(x, y, begin, end, key, stream, p);
  } else if constexpr (std::is_same_v<T, double>) {
    HWY_DYNAMIC_DISPATCH(DropRangeF64)(x, y, begin, end, key, stream, p);
  } else {
    HWY_DYNAMIC_DISPATCH(DropRangeBF16)(x, y, begin, end, key, stream, p);
  }
}

}  // namespace

uint64_t DropThreshold(double p) {
  // p · 2^32 is exact in a double; the floor of it is at most 2^32 (p = 1: every draw is below).
  return static_cast<uint64_t>(std::floor(p * 4294967296.0));
}

std::array<uint32_t, 4> DropoutDraws(uint64_t key, uint64_t stream, uint64_t block) {
  const r123::Philox4x32::ctr_type counter = {{Low(block), High(block), Low(stream), High(stream)}};
  const r123::Philox4x32::key_type k = {{Low(key), High(key)}};
  const r123::Philox4x32::ctr_type r = r123::Philox4x32()(counter, k);
  return {r[0], r[1], r[2], r[3]};
}

void DropoutDrawsReference(uint64_t key, uint64_t stream, uint64_t first, int64_t count,
                           uint32_t* out) {
  for (int64_t b = 0; b < count; ++b) {
    const std::array<uint32_t, 4> u = DropoutDraws(key, stream, first + static_cast<uint64_t>(b));
    std::copy(u.begin(), u.end(), out + 4 * b);
  }
}

void DropoutDrawsFast(uint64_t key, uint64_t stream, uint64_t first, int64_t count, uint32_t* out) {
  HWY_DYNAMIC_DISPATCH(Draws)(key, stream, first, count, out);
}

template <typename T>
void DropoutReference(const T* x, T* y, int64_t n, std::span<const int64_t> keys, uint64_t stream,
                      double p) {
  const int64_t run = n / static_cast<int64_t>(keys.size());
  for (size_t b = 0; b < keys.size(); ++b) {
    const int64_t at = static_cast<int64_t>(b) * run;
    DropRangeReference(x + at, y + at, 0, run, static_cast<uint64_t>(keys[b]), stream, p);
  }
}

template <typename T>
void DropoutFast(const T* x, T* y, int64_t n, std::span<const int64_t> keys, uint64_t stream,
                 double p) {
  static_assert(kChunkElements % 4 == 0, "a chunk starts on a block of four draws");
  const int64_t run = n / static_cast<int64_t>(keys.size());
  const int64_t chunks_per_run = (run + kChunkElements - 1) / kChunkElements;
  // Chunk c: run c / chunks_per_run, its elements from (c mod chunks_per_run) · kChunkElements.
  ParallelFor(static_cast<int64_t>(keys.size()) * chunks_per_run,
              ChunkRows(std::min(run, kChunkElements)), [&](int64_t first, int64_t last) {
                for (int64_t c = first; c < last; ++c) {
                  const int64_t b = c / chunks_per_run;
                  const int64_t begin = (c % chunks_per_run) * kChunkElements;
                  const int64_t end = std::min(begin + kChunkElements, run);
                  DropRangeFast(x + b * run, y + b * run, begin, end,
                                static_cast<uint64_t>(keys[static_cast<size_t>(b)]), stream, p);
                }
              });
}

template void DropoutReference<float>(const float*, float*, int64_t, std::span<const int64_t>,
                                      uint64_t, double);
template void DropoutReference<double>(const double*, double*, int64_t, std::span<const int64_t>,
                                       uint64_t, double);
template void DropoutReference<BFloat16>(const BFloat16*, BFloat16*, int64_t,
                                         std::span<const int64_t>, uint64_t, double);
template void DropoutFast<float>(const float*, float*, int64_t, std::span<const int64_t>, uint64_t,
                                 double);
template void DropoutFast<double>(const double*, double*, int64_t, std::span<const int64_t>,
                                  uint64_t, double);
template void DropoutFast<BFloat16>(const BFloat16*, BFloat16*, int64_t, std::span<const int64_t>,
                                    uint64_t, double);

}  // namespace sluice::kernels
#endif  // HWY_ONCE
