// Runtime-dispatched SIMD row kernels (Google Highway): the vector code behind the *Fast kernels
// of softmax.h, layer_norm.h, rms_norm.h, batch_norm.h, cross_entropy.h, unary.h, optimizer.h
// and binary.h (equal shapes).
//
// simd_kernels.cc is compiled once per instruction set that Highway targets on the machine's
// architecture (x86-64: AVX-512 "AVX3", AVX2+FMA "AVX2", "SSE4" and the one-lane portable
// baseline "SCALAR"), and the first call picks the best one the CPU runs (HWY_DYNAMIC_DISPATCH):
// one binary runs everywhere, with wide vectors where the CPU has them. Simd<T>() returns the
// chosen target's table of kernels; a table entry works on whole rows (or whole buffers), so a
// kernel pays the dispatch once per call, not per element.
//
// Accuracy against the reference kernels (plain loops, libm; tests/kernels/simd_kernels_test.cc
// checks every available target):
//   exp   within 1 ulp of the exact result (Highway's contrib/math Exp), so ≤ 2 ulp from std::exp;
//         e^(−inf) = 0, e^(+inf) and overflow = +inf, NaN stays NaN.
//   tanh  within 4 ulp (Highway's Tanh), so ≤ 5 ulp from std::tanh.
//   gelu, gelu_grad: the reference's function through the logistic form 0.5·(1 + tanh(u)) =
//         1 / (1 + e^(−2u)) — one exp and one division (simd_kernels.cc) — within a few ulp
//         relative of the exact value; beside the reference (libm tanh, where 1 + tanh cancels for
//         negative x) within 2e-6 in f32 (absolute below 1, relative above), tested over ±12.
//   softmax, layer norm, RMS norm, cross-entropy: sums are kept per lane and added at the end, so
//         results differ from the left-to-right reference by rounding only (relative 2e-5 in f32,
//         the op harness's tolerance). The lane count, and so the rounding, depends on the target:
//         results are bitwise reproducible on one machine, not across instruction sets.
//   blocked_sum, centered_squares, centered_dot: per lane in T over blocks of 512 elements, then in
//         double: beside a double loop, relative ~1e-7 in f32 (batch norm's statistics).
//   sum_squares: in double, per lane then across lanes: a double loop's result up to the order of
//         its additions (relative 1e-15 on the gradient norm's sums).
//   adamw, sgd: elementwise, the fast kernels' formulas exactly (no sums to reorder).
//   add, sub, mul, div: one IEEE operation per element, so bitwise equal to the scalar loop on
//         every target.
//
// Thread-safety: the table is immutable; kernels are plain functions over caller-owned memory, and
// calls on disjoint outputs may run concurrently. ForceSimdTarget is for tests and benchmarks: it
// changes the choice for the whole process and must not race with running kernels.
//
// Example:
//   kernels::Simd<float>().softmax(x, y, rows, cols);
//   for (const std::string& t : kernels::SimdTargets()) { kernels::ForceSimdTarget(t); ... }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::kernels {

// AdamW's per-step scalars (optimizer.h): p = p·decay − step_size·m / (√v / bias2_sqrt + eps).
template <typename T>
struct AdamWScalars {
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias2_sqrt, eps;
};

template <typename T>
struct SimdRowKernels {
  const char* target;  // Highway's name of the instruction set: "AVX3", "AVX2", "SSE4", "SCALAR"
  // x, y [rows, cols]: y = softmax over each row.
  void (*softmax)(const T* x, T* y, int64_t rows, int64_t cols);
  // Rows [begin, end) of [batch·t, t] causal scores: row r is query r % t, keys 0..r % t visible;
  // y is the softmax over the visible keys and 0 elsewhere.
  void (*causal_softmax)(const T* x, T* y, int64_t begin, int64_t end, int64_t t);
  // dx = y · (dy − Σ dy·y) per row.
  void (*softmax_grad)(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols);
  void (*layer_norm)(const T* x, const T* weight, const T* bias, T* y, int64_t rows, int64_t cols,
                     T eps);
  void (*layer_norm_grad_x)(const T* dy, const T* x, const T* weight, T* dx, int64_t rows,
                            int64_t cols, T eps);
  // Adds the rows' Σ dy·x̂ to dweight and Σ dy to dbias ([cols] each), rows in order.
  void (*layer_norm_grad_params)(const T* dy, const T* x, T* dweight, T* dbias, int64_t rows,
                                 int64_t cols, T eps);
  void (*rms_norm)(const T* x, const T* weight, T* y, int64_t rows, int64_t cols, T eps);
  void (*rms_norm_grad_x)(const T* dy, const T* x, const T* weight, T* dx, int64_t rows,
                          int64_t cols, T eps);
  // Adds the rows' Σ dy·x̂ to dweight ([cols]), rows in order.
  void (*rms_norm_grad_weight)(const T* dy, const T* x, T* dweight, int64_t rows, int64_t cols,
                               T eps);
  // out[j] = Σ_r x[r·ld + j] for j in [0, cols): the column sums of [rows, cols] (row stride ld),
  // each column added top to bottom from 0 — the reference's order, so bitwise equal to it.
  void (*column_sum)(const T* x, T* out, int64_t rows, int64_t cols, int64_t ld);
  // Row primitives (fused attention, kernels/attention.h); x and y may be the same buffer.
  T (*row_max)(const T* x, int64_t n);
  T (*row_dot)(const T* a, const T* b, int64_t n);
  // Σ x² over n elements, each widened to double first (the gradient norm).
  double (*sum_squares)(const T* x, int64_t n);
  // Batch norm's channel sums (kernels/batch_norm.h): in lanes of T over blocks of 512 elements,
  // each block's lanes added into a double (a lane adds at most 512 / lanes terms in T).
  // blocked_sum: Σ x. centered_squares: Σ (x − shift)². centered_dot: Σ dy and Σ dy·(x − shift).
  double (*blocked_sum)(const T* x, int64_t n);
  double (*centered_squares)(const T* x, T shift, int64_t n);
  void (*centered_dot)(const T* dy, const T* x, T shift, int64_t n, double* sum, double* dot);
  // y = x·a + b (one fused multiply-add).
  void (*affine)(const T* x, T a, T b, T* y, int64_t n);
  // dx = (dy − grad_mean − (x − mean)·k)·scale: batch norm's input gradient on a run of a channel.
  void (*batch_norm_grad_row)(const T* dy, const T* x, T mean, T k, T grad_mean, T scale, T* dx,
                              int64_t n);
  // c [m, n] = alpha · A [m, k] · b [k, n] + beta · c, with A(i, p) = a[i·a_row + p·a_col] (A or
  // Aᵀ of a row-major matrix), b and c row-major (ldb, ldc apart); beta = 0 does not read c. For
  // the small products of fused attention (kernels/attention.h), where a BLAS call's packing and
  // dispatch cost as much as its arithmetic: register tiles of 4 rows × up to 4 vectors.
  void (*small_gemm)(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t a_row,
                     int64_t a_col, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
  // dst [cols, rows] (rows ldd apart) = srcᵀ for src [rows, cols] (rows ld apart); not in place.
  void (*transpose)(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst, int64_t ldd);
  // y = e^(x − shift); returns Σ y.
  T (*exp_sum)(const T* x, T shift, T* y, int64_t n);
  // y *= k.
  void (*scale_in_place)(T* y, T k, int64_t n);
  // out = p · (dp − s) (out may be dp).
  void (*softmax_grad_row)(const T* p, const T* dp, T s, T* out, int64_t n);
  // max = max_j x[j], sum = Σ_j e^(x[j] − max): a log-sum-exp row (cross-entropy).
  void (*max_and_sum_exp)(const T* x, int64_t n, T* max, T* sum);
  // y = scale · e^(x − shift).
  void (*scaled_exp)(const T* x, T shift, T scale, T* y, int64_t n);
  void (*exp)(const T* x, T* y, int64_t n);
  void (*tanh)(const T* x, T* y, int64_t n);
  void (*gelu)(const T* x, T* y, int64_t n);
  void (*gelu_grad)(const T* dy, const T* x, T* dx, int64_t n);
  // The optimizer updates read the state (param, m, v; param, momentum_buf) and write the new
  // values to the *_out buffers: each either its input (in place) or a buffer overlapping none.
  void (*adamw)(const T* param, const T* grad, const T* m, const T* v, T* param_out, T* m_out,
                T* v_out, int64_t n, const AdamWScalars<T>& s);
  // d = g + weight_decay·p; with momentum: buf = momentum·buf + d, d = buf; p = p − lr·d. With
  // momentum 0 neither momentum_buf nor momentum_out is touched.
  void (*sgd)(const T* param, const T* grad, const T* momentum_buf, T* param_out, T* momentum_out,
              int64_t n, T weight_decay, T momentum, T lr);
  // out = a ∘ b over n elements (the equal-shapes case of kernels/binary.h); out may be a or b.
  void (*add)(const T* a, const T* b, T* out, int64_t n);
  void (*sub)(const T* a, const T* b, T* out, int64_t n);
  void (*mul)(const T* a, const T* b, T* out, int64_t n);
  void (*div)(const T* a, const T* b, T* out, int64_t n);
};

// The table of the target in use (T = float or double).
template <typename T>
const SimdRowKernels<T>& Simd();

// The name of the target in use, e.g. "AVX2".
std::string SimdTarget();
// The targets compiled in and supported by this CPU, best first; the first is the default.
std::vector<std::string> SimdTargets();
// Restricts dispatch to the named target (one of SimdTargets()); "" restores the default.
// Throws InvalidArgument naming the target and the available ones when it is not available.
void ForceSimdTarget(std::string_view target);

}  // namespace sluice::kernels
