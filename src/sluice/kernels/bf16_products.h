// Mixed-precision products: bf16 operands, f32 accumulation, f32 results — the matmul and linear
// kernels of `--precision bf16` (autocast's rule for products).
//
//   MatMulBF16*: out[..., m, n] = op(a)[..., m, k] · op(b)[..., k, n], a and b bf16, out f32, with
//                kernels/matmul.h's shapes and batching (MatMulShape).
//   LinearBF16*: out[m, n] = x[m, k] · w[k, n] + b[n], x and w bf16, b and out f32 (linear.h).
//   LinearBF16Rounded*: the same rounded to bf16 (out bf16): bitwise LinearBF16 then ToBF16.
//   Each also with b (w) f32 — the overloads taking const float* b / w, b_rounds / w_rounds in
//                the scratch sizes: b rounded to bf16 where the product loads it, bitwise the
//                product of b cast to bf16 (ir/autocast.h: a weight read by products only is never
//                copied to bf16). On
//                the packed engine with k within one block of k the rounding happens as the sums
//                leave the product's register tiles (bf16_gemm.h PackedBf16GemmRounded: no f32
//                result in memory, no second pass); elsewhere the f32 result goes through the
//                scratch (m · n floats more) and is rounded after.
//
// The fast kernels run every product through Bf16Gemm, on one of three engines (Bf16GemmEngine):
//   onednn    oneDNN's bf16 matmul (kernels/onednn_matmul.h): the bf16 instructions (AVX512_BF16,
//             AMX) multiply. The default where oneDNN can use AMX.
//   packed    kernels/bf16_gemm.h: an f32 GEMM whose packing widens the bf16 operands (exactly):
//             bf16 storage, f32 compute, no separate widening pass. The default elsewhere: on an
//             AVX512_BF16 Xeon without AMX oneDNN's bf16 products ran at 0.55× its f32 ones
//             (docs/benchmarks.md, "Mixed precision"), and without bf16 instructions oneDNN
//             emulates them (0.28× on Zen 4, issue 35).
//   openblas  the operands widened to f32 (exactly) in blocks of kWidenBlock along k, each block an
//             f32 GEMM (kernels/matmul.h's Gemm) accumulating into the result: what packed
//             replaced, kept for comparison (bench/gemm_precision_bench.cc).
// SLUICE_BF16_GEMM=onednn|packed|openblas overrides the default (read once; another value throws
// InvalidArgument naming it). The scratch is the caller's: *ScratchFloats(...) floats — the packed
// blocks (bf16_gemm.h), min(k, kWidenBlock) · (m + n) on the openblas engine (never less than the
// packed engine's), on onednn the primitive's scratchpad (OneDnnScratchpadBytes) — which the ops
// take from KernelContext::allocator so that the memory forecast counts them
// (OpDef::scratch_bytes). On the openblas engine the widening runs on the calling thread, the GEMMs
// on OpenBLAS's threads; the packed engine runs on the intra-op threads. kWidenBlock is 128: on the
// GPT's products it runs as fast as 256 did (GEMM within ±5% of OpenBLAS f32 on the medium GPT)
// with half the scratch. The reference kernels widen each operand to f32 exactly and run the f32
// reference (kernels/matmul.h, linear.h): both compute the exact products of the same bf16 numbers
// and differ by the order of f32 additions only (relative 1e-5 at the GPT's k;
// tests/ops/linalg_test.cc).
//
// Thread-safety: plain functions over caller-owned memory; calls on disjoint outputs may run
// concurrently. The reference kernels allocate their f32 copies.
//
// Example:
//   // x [B·T, C] bf16, w [C, 4C] bf16, b [4C] f32 -> h [B·T, 4C] f32
//   std::vector<float> scratch(kernels::LinearBF16ScratchFloats(B * T, C, 4 * C));
//   kernels::LinearBF16(x, w, b, h, B * T, C, 4 * C, scratch.data());
#pragma once

#include <cstdint>

#include "sluice/core/tensor.h"
#include "sluice/kernels/onednn_matmul.h"

namespace sluice::kernels {

// c[m, n] = op(a)·op(b) (+ c when shape.accumulate), a and b bf16 — OneDnnGemm's contract
// (shape.dtype must be kBF16), on the engine Bf16GemmEngine names. scratch: at least
// Bf16GemmScratchFloats(shape) floats (may be null when that is 0).
void Bf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b, float* c,
              float* scratch);
// b f32 with packed rows (ldb 0), rounded to bf16 where it is loaded: bitwise Bf16Gemm of b cast
// to bf16. The packed engine rounds inside its packing; the others round b into the scratch's
// last k·n bf16 (Bf16GemmScratchFloats(shape, true)), then multiply.
void Bf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const float* b, float* c,
              float* scratch);
// b_rounds: the scratch of the overload taking an f32 b.
int64_t Bf16GemmScratchFloats(const OneDnnGemmShape& shape, bool b_rounds = false);
// "onednn", "packed" or "openblas" (see above).
const char* Bf16GemmEngine();

// The openblas engine itself (whatever Bf16GemmEngine names), for benchmarks and tests.
inline constexpr int64_t kWidenBlock = 128;
int64_t WidenedBf16GemmScratchFloats(const OneDnnGemmShape& shape);
void WidenedBf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b, float* c,
                     float* scratch);

// MatMulBF16's scratch for a, b of these shapes (MatMulShape's rules).
int64_t MatMulBF16ScratchFloats(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b,
                                bool b_rounds = false);
void MatMulBF16(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                bool transpose_b, float* scratch);
void MatMulBF16Reference(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                         bool transpose_b);

int64_t LinearBF16ScratchFloats(int64_t m, int64_t k, int64_t n, bool w_rounds = false);
void LinearBF16(const BFloat16* x, const BFloat16* w, const float* b, float* out, int64_t m,
                int64_t k, int64_t n, float* scratch);
void LinearBF16(const BFloat16* x, const float* w, const float* b, float* out, int64_t m, int64_t k,
                int64_t n, float* scratch);
void LinearBF16Reference(const BFloat16* x, const BFloat16* w, const float* b, float* out,
                         int64_t m, int64_t k, int64_t n);
void LinearBF16Reference(const BFloat16* x, const float* w, const float* b, float* out, int64_t m,
                         int64_t k, int64_t n);

int64_t LinearBF16RoundedScratchFloats(int64_t m, int64_t k, int64_t n, bool w_rounds = false);
void LinearBF16Rounded(const BFloat16* x, const BFloat16* w, const float* b, BFloat16* out,
                       int64_t m, int64_t k, int64_t n, float* scratch);
void LinearBF16Rounded(const BFloat16* x, const float* w, const float* b, BFloat16* out, int64_t m,
                       int64_t k, int64_t n, float* scratch);
void LinearBF16RoundedReference(const BFloat16* x, const BFloat16* w, const float* b, BFloat16* out,
                                int64_t m, int64_t k, int64_t n);
void LinearBF16RoundedReference(const BFloat16* x, const float* w, const float* b, BFloat16* out,
                                int64_t m, int64_t k, int64_t n);

}  // namespace sluice::kernels
