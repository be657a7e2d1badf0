// Linear (fully connected) layer kernels.
//
//   out[m, n] = x[m, k] · w[k, n] + b[n]
// where m folds every leading axis of x (x [..., k] has m = numel / k rows). The weight is stored
// [in, out] = [k, n], so the forward product needs no transpose and x·w is one row-major GEMM.
// All pointers address contiguous row-major buffers; out must not alias the inputs.
//
// LinearReference: the textbook triple loop, bias first, accumulating in T.
// LinearBlas: copies b into every row of out, then one CBLAS GEMM with beta = 1 adds x·w on top
// (no temporary, out is written twice only in cache-friendly row order). When the f32 GEMMs run on
// oneDNN (SLUICE_GEMM=onednn, kernels/matmul.h), the f32 form is one oneDNN matmul with b as its
// bias input instead: the bias added in the product's epilogue, out written once
// (docs/benchmarks.md, "GEMM epilogues").
//
// Thread-safety: plain functions over caller-owned memory; concurrent calls on disjoint outputs
// are safe. Failure modes: none (shapes are checked by the op's inference).
//
// Example:
//   // x [B·T, C], w [C, 3C], b [3C] -> qkv [B·T, 3C]
//   kernels::LinearBlas<float>(x, w, b, qkv, B * T, C, 3 * C);
#pragma once

#include <cstdint>

namespace sluice::kernels {

template <typename T>
void LinearReference(const T* x, const T* w, const T* b, T* out, int64_t m, int64_t k, int64_t n);

template <typename T>
void LinearBlas(const T* x, const T* w, const T* b, T* out, int64_t m, int64_t k, int64_t n);

}  // namespace sluice::kernels
