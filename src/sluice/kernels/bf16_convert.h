// Conversions between f32 and bf16 (core/dtype.h's BFloat16): the kernels of the `cast` op under
// `--precision bf16`.
//
//   ToBF16*:   y[i] = x[i] rounded to the nearest bf16, ties to even (NaN stays a quiet NaN, ±inf
//              stays ±inf, values past the largest bf16 round to ±inf) — core/dtype.h's
//              FloatToBF16.
//   FromBF16*: y[i] = x[i] exactly (a bf16 is the upper half of an f32).
// x [n], y [n]; contiguous, not overlapping.
//
// The *Reference kernels are plain loops over core/dtype.h's scalar conversions; the *Fast kernels
// are Highway vector code (one compilation per instruction set, the best the CPU runs chosen at the
// first call, as kernels/simd_kernels.h) computing the same rounding with integer operations, so
// both are bitwise equal on every target (tests/kernels/bf16_convert_test.cc checks every target).
//
// Thread-safety: plain functions over caller-owned memory; calls on disjoint outputs may run
// concurrently.
//
// Example:
//   kernels::ToBF16Fast(x.data<float>(), y.data<BFloat16>(), x.numel());
#pragma once

#include <cstdint>

#include "sluice/core/dtype.h"

namespace sluice::kernels {

void ToBF16Reference(const float* x, BFloat16* y, int64_t n);
void FromBF16Reference(const BFloat16* x, float* y, int64_t n);

void ToBF16Fast(const float* x, BFloat16* y, int64_t n);
void FromBF16Fast(const BFloat16* x, float* y, int64_t n);

// y = ToBF16(x) and sum[j] = Σ_r x[r, j] in one pass over x [rows, cols] (y [rows, cols], sum
// [cols]): a bf16 linear's output gradient rounded for its products and summed for its bias
// (the `cast_bf16_and_sum` op). Each column is added from 0 in row order, in f32 — the bits of
// kernels/reduce.h's SumFast and of the sum_to reference — and y holds ToBF16's bits. The
// Parallel kernel runs chunks of columns on the intra-op threads (the same bits at any count).
void ToBF16ColumnSumReference(const float* x, BFloat16* y, float* sum, int64_t rows, int64_t cols);
void ToBF16ColumnSumParallel(const float* x, BFloat16* y, float* sum, int64_t rows, int64_t cols);

// The *Fast kernels over chunks of kernels/parallel.h's kChunkElements on the intra-op threads
// (the `cast` op's kernels; element by element, so the same bits at any thread count).
void ToBF16Parallel(const float* x, BFloat16* y, int64_t n);
void FromBF16Parallel(const BFloat16* x, float* y, int64_t n);

}  // namespace sluice::kernels
