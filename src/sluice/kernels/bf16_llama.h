// The Llama activations under `--precision bf16`: RMS norm and the SwiGLU gate on bf16 tensors, by
// autocast's rule "bf16 in, f32 compute, bf16 out" (as kernels/bf16_activations.h for GELU and
// layer norm).
//
// Each fast kernel widens a block of its bf16 operands to f32 (kernels/bf16_convert.h), runs the
// f32 fast kernel's arithmetic on that block (kernels/rms_norm.h, swiglu.h: the same SIMD row
// kernels and the same blocks) and rounds the block's bf16 output to nearest even. Gradients are
// f32 (a bf16 value's gradient is f32: ir/gradient_type.h) — except SwiGLU's when bf16 products
// alone read them (autodiff/autodiff.h, "bf16 where it is made"): then da and db are
// rounded to bf16 as they are stored, bit for bit what casting the f32 ones would give; rstd is
// computed in f32 and never rounded. So a fast kernel gives, bit for bit, what casting its bf16
// inputs to f32, running the f32 fast kernel and rounding its output to bf16 would give — without
// the f32 copies living as tensors:
//
//   RmsNormBF16             x [rows, C] bf16, weight [C] f32  -> y [rows, C] bf16
//   RmsNormGradXBF16        dy f32, x bf16, weight f32        -> dx [rows, C] f32
//   RmsNormGradWeightBF16   dy f32, x bf16                    -> dweight [C] f32 (overwritten)
//   SwigluBF16              a [n] bf16, b [n] bf16            -> y [n] bf16
//   SwigluGradBF16          dy [n] f32, a bf16, b bf16        -> da, db [n] f32, or bf16 (Out)
//
// The *Reference kernels widen whole operands with core/dtype.h's scalar conversions and run the
// f32 reference kernels; the op harness compares each pair, and each with the f32 op on the same
// values (tests/ops/op_cases_bf16_llama.cc).
//
// Scratch: the row kernels widen up to 4096 elements at a time (whole rows) into 16 KiB buffers on
// the calling thread's stack, except a row of more than 4096 channels, which takes a one-row heap
// buffer; SwiGLU widens 256 elements of each operand at a time on the stack;
// RmsNormGradWeightBF16Fast keeps one [C] partial per chunk of rows, as the f32 kernel. Nothing
// for the memory forecast to count beyond what the f32 ops take.
//
// Threading: as the f32 kernels (kernels/parallel.h): chunks fixed by the work, bitwise the same
// at any thread count. Outputs must not alias inputs. Failure modes: none (the ops' inference
// checks shapes and dtypes).
//
// Example:
//   // h [B·T, C] bf16 -> y [B·T, C] bf16
//   kernels::RmsNormBF16Fast(h.data<BFloat16>(), w.data<float>(), y.data<BFloat16>(), B * T, C,
//                            1e-6f);
#pragma once

#include <cstdint>

#include "sluice/core/dtype.h"

namespace sluice::kernels {

void RmsNormBF16Reference(const BFloat16* x, const float* weight, BFloat16* y, int64_t rows,
                          int64_t cols, float eps);
void RmsNormBF16Fast(const BFloat16* x, const float* weight, BFloat16* y, int64_t rows,
                     int64_t cols, float eps);
void RmsNormGradXBF16Reference(const float* dy, const BFloat16* x, const float* weight, float* dx,
                               int64_t rows, int64_t cols, float eps);
void RmsNormGradXBF16Fast(const float* dy, const BFloat16* x, const float* weight, float* dx,
                          int64_t rows, int64_t cols, float eps);
void RmsNormGradWeightBF16Reference(const float* dy, const BFloat16* x, float* dweight,
                                    int64_t rows, int64_t cols, float eps);
void RmsNormGradWeightBF16Fast(const float* dy, const BFloat16* x, float* dweight, int64_t rows,
                               int64_t cols, float eps);

void SwigluBF16Reference(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n);
void SwigluBF16Fast(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n);
// Out: float, or BFloat16 (da and db rounded to nearest even).
template <typename Out>
void SwigluGradBF16Reference(const float* dy, const BFloat16* a, const BFloat16* b, Out* da,
                             Out* db, int64_t n);
template <typename Out>
void SwigluGradBF16Fast(const float* dy, const BFloat16* a, const BFloat16* b, Out* da, Out* db,
                        int64_t n);

}  // namespace sluice::kernels
