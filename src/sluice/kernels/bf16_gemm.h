// An f32 GEMM over bf16 operands that widens them inside its packing: the `packed` engine of
// kernels/bf16_products.h (bf16 storage, f32 compute), for CPUs where bf16 dot products do not pay.
//
//   PackedBf16Gemm: c[m, n] = op(a)[m, k] · op(b)[k, n] (+ c when shape.accumulate), a and b bf16,
//                   c f32 — kernels/onednn_matmul.h's OneDnnGemmShape contract (dtype kBF16,
//                   lda/ldb/ldc 0 for packed rows).
//   PackedBf16GemmRounded: y[m, n] = bf16(op(a)·op(b) + bias[n]), y bf16 with row stride ldc — a
//                   linear whose result is stored bf16: the sums PackedBf16Gemm adds to c
//                   prefilled with bias, rounded to the nearest bf16 (ties to even) as they leave
//                   the register tile, so the bits of PackedBf16Gemm then ToBF16 without the f32
//                   result in memory. Only where PackedBf16GemmRoundsInOnePass (k within one
//                   block of k: the sums are final at the tile), without accumulate.
//   Both with b f32 (the overloads taking const float* b): b rounded to bf16 (ties to even) as
//                   the packing loads it, then widened — the bits of casting b to bf16 first,
//                   without the bf16 copy of b in memory (a weight's cast, ir/autocast.h).
//
// How (the GotoBLAS/BLIS blocking): k is cut into blocks of PackedBf16GemmBlockK and n into
// blocks of at most kPackedGemmNC columns. Each block of op(b) is widened into panels of NR
// columns (the panel's rows contiguous) and kept in L2; op(a) is widened a tile of MR rows at a
// time, and the tile stays in L1 while a register tile of MR × NR f32 sums (MR = 12, NR = 32 on
// AVX-512: 24 zmm accumulators) runs the block's k with one FMA per product against each panel in
// turn. The widening is exact, so every product of two bf16 numbers is exact in f32; sums are
// f32, over k in order within a block of KC, the blocks' sums added to c in order. Each element
// of c is computed by one thread in that order whatever the thread count: the same bits at 1, 2
// or any number of threads. Highway vector code, one compilation per instruction set, the best
// the CPU runs chosen at the first call (kernels/simd_kernels.h); MR and NR depend on the target,
// the order of the sums does not.
//
// Scratch: PackedBf16GemmScratchFloats(shape) floats from the caller, KC · min(n, NC): the packed
// block of op(b) (the last, partial panel and the tiles of op(a) live on the stack).
// Threads: on the intra-op pool (kernels/parallel.h): the panels of a block of op(b) packed one a
// chunk, then the tiles of op(a) one a chunk, each packed and multiplied by the thread that
// takes it.
//
// Thread-safety: plain function over caller-owned memory; calls on disjoint outputs and scratch
// may run concurrently.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sluice/kernels/onednn_matmul.h"

namespace sluice::kernels {

inline constexpr int64_t kPackedGemmNC = 512;

// The block of k, KC: 384, 256 or 128, the largest that k fills and whose packed block of op(b)
// KC·min(n, NC) takes no more floats than the widened engine's blocks of 128
// (kernels/bf16_products.h), so that a product's scratch never grows. Fewer blocks of k mean
// fewer passes over c.
inline int64_t PackedBf16GemmBlockK(const OneDnnGemmShape& s) {
  const int64_t packed = std::min(s.n, kPackedGemmNC);
  for (int64_t kc : {384, 256}) {
    if (s.k >= kc && kc * packed <= 128 * (s.m + s.n)) return kc;
  }
  return 128;
}

int64_t PackedBf16GemmScratchFloats(const OneDnnGemmShape& shape);
void PackedBf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b, float* c,
                    float* scratch);
// b f32, rounded to bf16 as it is packed: bitwise PackedBf16Gemm of b cast to bf16.
void PackedBf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const float* b, float* c,
                    float* scratch);
bool PackedBf16GemmRoundsInOnePass(const OneDnnGemmShape& shape);
// Throws InternalError where !PackedBf16GemmRoundsInOnePass(shape) or shape.accumulate.
void PackedBf16GemmRounded(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b,
                           const float* bias, BFloat16* y, float* scratch);
void PackedBf16GemmRounded(const OneDnnGemmShape& shape, const BFloat16* a, const float* b,
                           const float* bias, BFloat16* y, float* scratch);

}  // namespace sluice::kernels
