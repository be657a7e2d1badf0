// Matrix multiplication kernels.
//
//   out[..., m, n] = op(a)[..., m, k] · op(b)[..., k, n]
// where op(a) is a or its transpose over the last two axes (transpose_a), likewise b.
// a has rank ≥ 2; b has rank 2 (shared by every batch entry, as a weight) or a's rank with the
// same leading (batch) dimensions. All tensors contiguous, out preallocated.
//
// MatMulReference: the textbook triple loop, accumulating in T.
// MatMulBlas: one CBLAS GEMM per batch entry (one GEMM in all when b is a 2-D weight and a is
// not transposed, by folding a's batch axes into m).
#pragma once

#include "sluice/core/tensor.h"

namespace sluice::kernels {

struct MatMulDims {
  int64_t batch = 1;  // product of a's leading dimensions
  int64_t m = 0, k = 0, n = 0;
  bool b_shared = false;  // b is 2-D and used by every batch entry
};

// Throws ShapeError when the shapes do not fit (the message shows both shapes).
MatMulDims MatMulShape(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b);

template <typename T>
void MatMulReference(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                     bool transpose_b);
template <typename T>
void MatMulBlas(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                bool transpose_b);

// Plain GEMM on raw row-major buffers through CBLAS: c = alpha·op(a)·op(b) + beta·c.
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c);
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, const double* b, double beta, double* c);
// The same on matrices inside larger ones: lda, ldb, ldc are the row strides (in elements) of the
// buffers a, b and c as stored (a is [m, k], or [k, m] when transposed; likewise b).
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// Accumulating products for weight gradients: acc[m, n] += op(a)·op(b), a and b 2-D.
//   MatMulAccumulateReference: the product of each element summed in T (as MatMulReference), then
//   added to acc: bitwise acc + MatMulReference(a, b).
//   MatMulAccumulateBlas: one GEMM with beta = 1 straight into acc, no [m, n] temporary. OpenBLAS
//   adds into C once per block of the inner dimension k, so the result is bitwise acc + (a·b) as
//   MatMulBlas computes it only while k fits one block: k <= GemmOneBlockK(). Beyond it the sum is
//   ((acc + p1) + p2) + ..., a different rounding of the same sum.
template <typename T>
void MatMulAccumulateReference(const Tensor& acc, const Tensor& a, const Tensor& b,
                               bool transpose_a, bool transpose_b);
template <typename T>
void MatMulAccumulateBlas(const Tensor& acc, const Tensor& a, const Tensor& b, bool transpose_a,
                          bool transpose_b);

// The largest inner dimension k (a power of two, at most 4096) for which the GEMM kernels in use
// give bitwise C + A·B with beta = 1, for C, A, B in f32 and f64 alike: probed once per process on
// a 256 x 256 product (OpenBLAS blocks k by its GEMM_Q, 256 to 384 on AVX2 and AVX-512 cores,
// 128 on pre-AVX2 ones). 0 when even k = 16 differs. Thread-safe (computed once).
int64_t GemmOneBlockK();

// The library that runs the f32 GEMMs above: OpenBLAS ("openblas", the default: even with oneDNN
// at one thread on the GPT's training steps, and at two on shared cores never the ~4× loser that
// oneDNN's spinning OpenMP threads are there, docs/benchmarks.md "GEMM epilogues") or
// oneDNN ("onednn", kernels/onednn_matmul.h), chosen with SLUICE_GEMM=openblas|onednn (read once;
// another value throws InvalidArgument naming it). oneDNN takes the products with alpha 1 and beta
// 0 or 1; others go to OpenBLAS. f64 GEMMs are always OpenBLAS's. Under oneDNN the f32 linear
// layer (kernels/linear.h) takes its bias in the product's epilogue.
const char* Fp32GemmEngineName();
bool Fp32GemmOnOneDnn();  // Fp32GemmEngineName() is "onednn"
// What chose it, for the training summary: "SLUICE_GEMM" when the variable is set, otherwise
// "default: measured" (OpenBLAS: docs/benchmarks.md, "GEMM epilogues", says on which figures).
const char* Fp32GemmChosenBy();

// The threads every GEMM of the process uses (OpenBLAS's own pool; process-wide). Called once per
// engine by step/stage_program.h's ShareIntraOpThreads, the one place sluice decides it (it sizes
// the other kernels' intra-op pool, kernels/parallel.h, to the same count).
void SetBlasThreads(int threads);

}  // namespace sluice::kernels
