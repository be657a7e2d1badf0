// The per-target code of bf16_gemm.h. Highway compiles this file once per target
// (hwy/foreach_target.h re-includes it); the part under HWY_ONCE exports the table.
//
// The register tile keeps its accumulators in arrays of vectors, which sizeless vector types
// (SVE, RVV) cannot form: those targets are not compiled (their CPUs run NEON or the portable
// EMU128 code here).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sluice/kernels/bf16_gemm.cc"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/dtype.h"
#include "sluice/core/error.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_gemm.h"
#include "sluice/kernels/bf16_round-inl.h"
#include "sluice/kernels/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DF()));
constexpr int64_t kNC = kPackedGemmNC;
// The register tile, MR rows × NR = 2 vectors: 2·MR accumulators, 2 vectors of b and a broadcast
// fit the 32 vector registers of AVX-512 at MR = 12 and the 16 of the others at MR = 6.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int64_t kMR = 12;
#else
constexpr int64_t kMR = 6;
#endif
constexpr int64_t kNR = 2 * kLanes;

// The stored operands and where op(a) and op(b) are in them.
struct Operands {
  const BFloat16* a;
  const void* b;  // bf16, or f32 rounded to bf16 as it is packed (Gemm's TB)
  float* c;
  int64_t m, n, k, lda, ldb, ldc;
  bool transpose_a, transpose_b;
};

// y[i] = x[i] as f32 (exact), i in [0, count): bf16_convert.h's widening.
HWY_INLINE void Widen(const BFloat16* x, float* y, int64_t count) { FromBF16Fast(x, y, count); }

// An f32 operand rounded to bf16 where it is loaded, then widened: y[i] = f32(bf16(x[i])), the
// value a cast to bf16 gives, so the product is bitwise the product of the cast operand.
HWY_INLINE void Widen(const float* x, float* y, int64_t count) {
  const DF d;
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) hn::StoreU(RoundedVector(hn::LoadU(d, x + i)), d, y + i);
  for (; i < count; ++i) y[i] = BF16ToFloat(FloatToBF16(x[i]));
}

// A vector of op(b) as f32: bf16 widened, or f32 rounded to bf16 and widened.
HWY_INLINE hn::Vec<DF> LoadWide(const BFloat16* x) { return WidenVector(x); }
HWY_INLINE hn::Vec<DF> LoadWide(const float* x) { return RoundedVector(hn::LoadU(DF(), x)); }

// Floats a tile buffer holds past MR·KC: the k-major packing stores whole vectors.
constexpr int64_t kTileSlack = kLanes;

// A tile of op(a): rows [i0, i0 + rows) (rows ≤ MR), k [p0, p0 + kc), widened into `out`, the
// rows past `rows` zero. Layouts, chosen by how a is stored so that the packing reads a's rows:
//   a [m, k] (row-major tile): out[r·KC + p], each row of the tile a row of a;
//   a [k, m] (k-major tile):   out[p·MR + r], each k a run of MR elements of a row of a, widened
//                              a vector at a time (out holds MR·KC + kTileSlack floats).
template <int64_t kKC>
void PackATile(const Operands& s, int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* out) {
  if (!s.transpose_a) {
    for (int64_t r = 0; r < rows; ++r) Widen(s.a + (i0 + r) * s.lda + p0, out + r * kKC, kc);
    for (int64_t r = rows; r < kMR; ++r) std::fill_n(out + r * kKC, kc, 0.0f);
    return;
  }
  // Whole vectors where they stay within a's rows, stored in order of address: each store's
  // lanes past its run are overwritten by the next.
  const DF d;
  for (int64_t p = 0; p < kc; ++p) {
    const BFloat16* x = s.a + (p0 + p) * s.lda + i0;
    float* y = out + p * kMR;
    for (int64_t r0 = 0; r0 < kMR; r0 += kLanes) {
      const int64_t valid = std::clamp<int64_t>(rows - r0, 0, kLanes);
      if (i0 + r0 + kLanes <= s.lda) {
        const auto keep = hn::FirstN(d, static_cast<size_t>(valid));
        hn::StoreU(hn::IfThenElseZero(keep, WidenVector(x + r0)), d, y + r0);
        continue;
      }
      for (int64_t r = 0; r < std::min(kLanes, kMR - r0); ++r) {
        y[r0 + r] = r < valid ? BF16ToFloat(x[r0 + r]) : 0.0f;
      }
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// rows[i] = column i of the 16 × 16 block `rows` (rows[q][i] ← rows[i][q]): 32-bit, 64-bit and
// two 128-bit interleavings.
HWY_INLINE void Transpose16x16(__m512 rows[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
  }
  // rows[4g + c], lane block l: column 4l + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    rows[g] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    rows[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    rows[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    rows[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_f32x4(rows[c], rows[4 + c], 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(rows[c], rows[4 + c], 0xdd);
    t[8 + c] = _mm512_shuffle_f32x4(rows[8 + c], rows[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(rows[8 + c], rows[12 + c], 0xdd);
  }
  for (int c = 0; c < 8; ++c) {
    rows[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    rows[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
}
#endif

// A panel of op(b): columns [j0, j0 + cols) (cols ≤ NR), k [p0, p0 + kc), widened into
// out[p·NR + j], the columns past `cols` zero. TB: b's element, BFloat16 or float (rounded to
// bf16 as it is loaded: round then widen, the bits of a cast then the packing).
template <int64_t kKC, typename TB>
void PackBPanel(const Operands& s, int64_t j0, int64_t cols, int64_t p0, int64_t kc, float* out) {
  const TB* b = static_cast<const TB*>(s.b);
  if (!s.transpose_b) {  // b [k, n]: each k a run of b's row, the rows 8 ahead requested
    const DF d;
    for (int64_t p = 0; p < kc; ++p) {
      float* row = out + p * kNR;
      const TB* x = b + (p0 + p) * s.ldb + j0;
      if (p + 8 < kc) hwy::Prefetch(x + 8 * s.ldb);
      if (cols == kNR) {
        hn::StoreU(LoadWide(x), d, row);
        hn::StoreU(LoadWide(x + kLanes), d, row + kLanes);
        continue;
      }
      Widen(x, row, cols);
      std::fill(row + cols, row + kNR, 0.0f);
    }
    return;
  }
  // b [n, k]: each column of op(b) a row of b. On AVX-512, blocks of 16 columns × 16 k widened
  // and transposed in registers; elsewhere (and for what is left) each column widened whole, then
  // stored into the panel one float at a time.
  int64_t p_done = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  static_assert(kLanes == 16 && kNR == 32);
  if (cols == kNR) {
    p_done = kc / 16 * 16;
    for (int64_t jg = 0; jg < kNR; jg += 16) {
      for (int64_t p = 0; p < p_done; p += 16) {
        __m512 block[16];
        for (int64_t i = 0; i < 16; ++i) {
          block[i] = LoadWide(b + (j0 + jg + i) * s.ldb + p0 + p).raw;
        }
        Transpose16x16(block);
        for (int64_t q = 0; q < 16; ++q) _mm512_storeu_ps(out + (p + q) * kNR + jg, block[q]);
      }
    }
  }
#endif
  if (p_done == kc) return;
  HWY_ALIGN float column[kKC];
  if (cols < kNR) std::fill_n(out, kc * kNR, 0.0f);
  for (int64_t j = 0; j < cols; ++j) {
    Widen(b + (j0 + j) * s.ldb + p0 + p_done, column, kc - p_done);
    for (int64_t p = p_done; p < kc; ++p) out[p * kNR + j] = column[p - p_done];
  }
}

// Where a register tile's sums go: c[i, j] (= or +=, row stride ld), or, with `rounded`, y[i, j]
// (bf16, row stride ld) = the sum plus bias[j] rounded to bf16. Pointers at the tile's corner.
struct TileOut {
  float* c = nullptr;
  uint16_t* rounded = nullptr;
  const float* bias = nullptr;
  int64_t ld = 0;
  bool add = false;
};

// The product of a tile of op(a) and a panel of op(b) over kc into rows × cols of `out`. The
// sums start from 0 and run over p in order.
template <bool kKMajorA, int64_t kKC>
HWY_NOINLINE void MultiplyTile(int64_t kc, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                               const TileOut& out, int64_t rows, int64_t cols) {
  const DF d;
  // c's lines are requested now and arrive while the sums run: on the medium GPT a tile of c
  // was last touched a block of k ago and comes from L3.
  if (out.c != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      hwy::Prefetch(out.c + r * out.ld);
      hwy::Prefetch(out.c + r * out.ld + cols - 1);
    }
  }
  hn::Vec<DF> lo[kMR], hi[kMR];
#pragma GCC unroll 16
  for (int64_t r = 0; r < kMR; ++r) lo[r] = hi[r] = hn::Zero(d);
  for (int64_t p = 0; p < kc; ++p) {
    const auto b0 = hn::LoadU(d, b + p * kNR);
    const auto b1 = hn::LoadU(d, b + p * kNR + kLanes);
#pragma GCC unroll 16
    for (int64_t r = 0; r < kMR; ++r) {
      const auto x = hn::Set(d, kKMajorA ? a[p * kMR + r] : a[r * kKC + p]);
      lo[r] = hn::MulAdd(x, b0, lo[r]);
      hi[r] = hn::MulAdd(x, b1, hi[r]);
    }
  }
  if (out.rounded != nullptr && rows == kMR && cols == kNR) {
    const auto bias0 = hn::LoadU(d, out.bias), bias1 = hn::LoadU(d, out.bias + kLanes);
#pragma GCC unroll 16
    for (int64_t r = 0; r < kMR; ++r) {
      uint16_t* y = out.rounded + r * out.ld;
      StoreRounded(hn::Add(bias0, lo[r]), y);
      StoreRounded(hn::Add(bias1, hi[r]), y + kLanes);
    }
    return;
  }
  if (out.rounded == nullptr && rows == kMR && cols == kNR) {
#pragma GCC unroll 16
    for (int64_t r = 0; r < kMR; ++r) {
      float* c = out.c + r * out.ld;
      if (out.add) {
        hn::StoreU(hn::Add(hn::LoadU(d, c), lo[r]), d, c);
        hn::StoreU(hn::Add(hn::LoadU(d, c + kLanes), hi[r]), d, c + kLanes);
      } else {
        hn::StoreU(lo[r], d, c);
        hn::StoreU(hi[r], d, c + kLanes);
      }
    }
    return;
  }
  HWY_ALIGN float tile[kMR * kNR];
#pragma GCC unroll 16  // constant indices: the accumulators stay in registers
  for (int64_t r = 0; r < kMR; ++r) {
    hn::Store(lo[r], d, tile + r * kNR);
    hn::Store(hi[r], d, tile + r * kNR + kLanes);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* sums = tile + r * kNR;
    if (out.rounded != nullptr) {
      BFloat16* y = reinterpret_cast<BFloat16*>(out.rounded + r * out.ld);
      for (int64_t j = 0; j < cols; ++j) y[j] = FloatToBF16(out.bias[j] + sums[j]);
      continue;
    }
    float* c = out.c + r * out.ld;
    for (int64_t j = 0; j < cols; ++j) c[j] = out.add ? c[j] + sums[j] : sums[j];
  }
}

// The product into c (accumulate: c +=), or, where `rounded` is given (one block of k), into
// rounded = bf16(product + bias).
template <int64_t kKC, typename TB>
void Gemm(const Operands& s, bool accumulate, float* scratch, uint16_t* rounded,
          const float* bias) {
  float* panels = scratch;  // KC × (NC's full panels)
  HWY_ALIGN float b_tail[kKC * kNR];
  const auto multiply = s.transpose_a ? &MultiplyTile<true, kKC> : &MultiplyTile<false, kKC>;
  const int64_t m_tiles = (s.m + kMR - 1) / kMR;
  for (int64_t j0 = 0; j0 < s.n; j0 += kNC) {
    const int64_t nc = std::min(kNC, s.n - j0);
    const int64_t n_panels = (nc + kNR - 1) / kNR;
    for (int64_t p0 = 0; p0 < s.k; p0 += kKC) {
      const int64_t kc = std::min(kKC, s.k - p0);
      ParallelFor(n_panels, 1, [&](int64_t begin, int64_t end) {
        for (int64_t jp = begin; jp < end; ++jp) {
          const int64_t j = j0 + jp * kNR, cols = std::min(kNR, j0 + nc - j);
          PackBPanel<kKC, TB>(s, j, cols, p0, kc, cols == kNR ? panels + jp * kKC * kNR : b_tail);
        }
      });
      // One tile of op(a) a chunk, packed by the thread that uses it and kept in L1 while the
      // block's panels of op(b) stream past it from L2 (BLIS's order: the register tile's
      // broadcast operand resident, its loaded one streamed).
      ParallelFor(m_tiles, 1, [&](int64_t begin, int64_t end) {
        HWY_ALIGN float tile[kMR * kKC + kTileSlack];
        for (int64_t t = begin; t < end; ++t) {
          const int64_t i = t * kMR, rows = std::min(kMR, s.m - i);
          PackATile<kKC>(s, i, rows, p0, kc, tile);
          for (int64_t jp = 0; jp < n_panels; ++jp) {
            const int64_t j = j0 + jp * kNR, cols = std::min(kNR, j0 + nc - j);
            const float* panel = cols == kNR ? panels + jp * kKC * kNR : b_tail;
            TileOut out{.ld = s.ldc};
            if (rounded != nullptr) {
              out.rounded = rounded + i * s.ldc + j;
              out.bias = bias + j;
            } else {
              out.c = s.c + i * s.ldc + j;
              out.add = accumulate || p0 > 0;
            }
            multiply(kc, tile, panel, out, rows, cols);
          }
        }
      });
    }
  }
}

template <typename TB>
void GemmOf(const Operands& s, int64_t kc, bool accumulate, float* scratch, uint16_t* y,
            const float* bias) {
  switch (kc) {
    case 384:
      return Gemm<384, TB>(s, accumulate, scratch, y, bias);
    case 256:
      return Gemm<256, TB>(s, accumulate, scratch, y, bias);
    default:
      return Gemm<128, TB>(s, accumulate, scratch, y, bias);
  }
}

// b_f32: b is f32, rounded to bf16 as it is packed (else bf16).
void PackedGemm(const OneDnnGemmShape& shape, const BFloat16* a, const void* b, bool b_f32,
                float* c, float* scratch, BFloat16* rounded, const float* bias) {
  const Operands s{.a = a,
                   .b = b,
                   .c = c,
                   .m = shape.m,
                   .n = shape.n,
                   .k = shape.k,
                   .lda = shape.lda != 0 ? shape.lda : (shape.transpose_a ? shape.m : shape.k),
                   .ldb = shape.ldb != 0 ? shape.ldb : (shape.transpose_b ? shape.k : shape.n),
                   .ldc = shape.ldc != 0 ? shape.ldc : shape.n,
                   .transpose_a = shape.transpose_a,
                   .transpose_b = shape.transpose_b};
  auto* y = reinterpret_cast<uint16_t*>(rounded);
  const int64_t kc = PackedBf16GemmBlockK(shape);
  if (b_f32) return GemmOf<float>(s, kc, shape.accumulate, scratch, y, bias);
  GemmOf<BFloat16>(s, kc, shape.accumulate, scratch, y, bias);
}

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sluice::kernels {

HWY_EXPORT(PackedGemm);

int64_t PackedBf16GemmScratchFloats(const OneDnnGemmShape& shape) {
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return 0;
  return PackedBf16GemmBlockK(shape) * std::min(shape.n, kPackedGemmNC);
}

namespace {

void PackedProduct(const OneDnnGemmShape& shape, const BFloat16* a, const void* b, bool b_f32,
                   float* c, float* scratch) {
  if (shape.m == 0 || shape.n == 0) return;
  if (shape.k == 0) {
    if (!shape.accumulate) {
      const int64_t ldc = shape.ldc != 0 ? shape.ldc : shape.n;
      for (int64_t i = 0; i < shape.m; ++i) std::fill_n(c + i * ldc, shape.n, 0.0f);
    }
    return;
  }
  HWY_DYNAMIC_DISPATCH(PackedGemm)(shape, a, b, b_f32, c, scratch, nullptr, nullptr);
}

void PackedRoundedProduct(const OneDnnGemmShape& shape, const BFloat16* a, const void* b,
                          bool b_f32, const float* bias, BFloat16* y, float* scratch) {
  if (!PackedBf16GemmRoundsInOnePass(shape) || shape.accumulate) {
    throw InternalError(fmt::format(
        "PackedBf16GemmRounded: k {} takes more than one block of k, or accumulate was asked",
        shape.k));
  }
  if (shape.m == 0 || shape.n == 0) return;
  HWY_DYNAMIC_DISPATCH(PackedGemm)(shape, a, b, b_f32, nullptr, scratch, y, bias);
}

}  // namespace

void PackedBf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b, float* c,
                    float* scratch) {
  PackedProduct(shape, a, b, false, c, scratch);
}

void PackedBf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const float* b, float* c,
                    float* scratch) {
  PackedProduct(shape, a, b, true, c, scratch);
}

bool PackedBf16GemmRoundsInOnePass(const OneDnnGemmShape& shape) {
  return shape.k > 0 && shape.k <= PackedBf16GemmBlockK(shape);
}

void PackedBf16GemmRounded(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b,
                           const float* bias, BFloat16* y, float* scratch) {
  PackedRoundedProduct(shape, a, b, false, bias, y, scratch);
}

void PackedBf16GemmRounded(const OneDnnGemmShape& shape, const BFloat16* a, const float* b,
                           const float* bias, BFloat16* y, float* scratch) {
  PackedRoundedProduct(shape, a, b, true, bias, y, scratch);
}

}  // namespace sluice::kernels
#endif  // HWY_ONCE
