// Kernels of dropout (ir/ops/dropout.h): y = x · keep / (1 − p), where whether an element is kept
// is drawn by a counter-based generator — Philox-4x32-10 (Random123, Salmon et al. 2011) — as a
// pure function of (key, stream, j), j the element's index under its key:
//
//   x's n elements are K consecutive runs of n / K, one per key (keys[b]: example b's key when
//   x's leading axis is the batch, however the rest is shaped)
//   draws of block c = Philox4x32-10(counter = {c mod 2^32, c div 2^32, stream mod 2^32,
//                                               stream div 2^32}, key = {k mod 2^32, k div 2^32})
//   u_j              = word j mod 4 of the draws of block j div 4 (a uniform 32-bit integer)
//   keep_j           = u_j ≥ DropThreshold(p) = ⌊p · 2^32⌋
//
// so P(keep) = 1 − ⌊p · 2^32⌋ / 2^32, p to within 2^−32; p = 0 keeps every element and p = 1 none.
// No state, no order: a mask is the same whichever thread draws which elements, in what order,
// how often (a recompute, the gradient), on one stage or many, and an example's mask is the same
// whichever batch holds it (a data-parallel replica's rows draw what those rows of the whole
// batch draw) — nothing about it is stored.
// Kept elements are scaled by 1/(1 − p) in the element type (bf16 x: computed in f32, rounded
// once), dropped ones are 0; p = 0 gives x bitwise (the factor is exactly 1), p = 1 gives zeros.
//
// The reference kernel is one plain loop over Random123's scalar generator. The fast one is
// Highway vector code (one compilation per instruction set, the best the CPU runs chosen at the
// first call, as kernels/simd_kernels.h): Philox-4x32-10 on one block per 64-bit lane (MulEven's
// 32×32→64-bit products), the draws of a vector of blocks interleaved into element order and
// consumed at once by the scaling — the mask never leaves the registers and L1. It runs over
// chunks of kChunkElements elements of each key's run (a multiple of 4: a chunk starts on a
// block) on the intra-op pool (kernels/parallel.h). Both give the same bits on every target and at
// any thread count (tests/kernels/dropout_kernel_test.cc). Element i is read before element i is
// written and no other element after: y may be x's storage (in place).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "sluice/core/dtype.h"

namespace sluice::kernels {

// ⌊p · 2^32⌋ for p in [0, 1]: element i is dropped when its draw u_i is below it.
uint64_t DropThreshold(double p);

// The four 32-bit draws of block `block` (elements 4·block … 4·block + 3).
std::array<uint32_t, 4> DropoutDraws(uint64_t key, uint64_t stream, uint64_t block);

// The draws of blocks first … first + count − 1 in element order: out[4·b + w] = word w of block
// first + b (DropoutDraws), 4·count words. The fast form is the vector generator the fast kernel
// draws with, bitwise the reference's.
void DropoutDrawsReference(uint64_t key, uint64_t stream, uint64_t first, int64_t count,
                           uint32_t* out);
void DropoutDrawsFast(uint64_t key, uint64_t stream, uint64_t first, int64_t count, uint32_t* out);

// y[i] = keep ? x[i] · (1/(1 − p)) : 0 for i in [0, n), element i drawn under keys[i / (n / K)]
// at j = i mod (n / K). K = keys.size() ≥ 1 divides n. T: float, double or BFloat16.
template <typename T>
void DropoutReference(const T* x, T* y, int64_t n, std::span<const int64_t> keys, uint64_t stream,
                      double p);
template <typename T>
void DropoutFast(const T* x, T* y, int64_t n, std::span<const int64_t> keys, uint64_t stream,
                 double p);

}  // namespace sluice::kernels
