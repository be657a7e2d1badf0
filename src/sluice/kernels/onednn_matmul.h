// GEMM through oneDNN's matmul primitive (Debian's libdnnl, 2.6): f32, and bf16 inputs with f32
// accumulation and f32 output — the mixed-precision product of `--precision bf16`.
//
//   c[m, n] = op(a)[m, k] · op(b)[k, n]  (+ c[m, n] when accumulate)
// and with an epilogue fused into the product (oneDNN applies it as it stores each block of c, no
// second pass over c):
//   c[m, n] = gelu(op(a) · op(b) + bias[n])   (bias and gelu each optional)
// where op(a) is a or its transpose (a stored [k, m]), likewise b (stored [n, k]); lda, ldb, ldc
// are the row strides (in elements) of the buffers as stored, as in kernels/matmul.h's Gemm. a and
// b are both f32 or both bf16; c is always f32.
//
// oneDNN JIT-compiles a primitive per problem (shape, strides, dtypes, transposes, accumulate,
// epilogue) and OpenMP thread count: creating one takes far longer than running it at the GPT's
// sizes, so each is made once, under SetOneDnnThreads' count, and kept in a process-wide cache
// keyed by all of these (a program runs the same few shapes every step; onednn_runtime.h's
// OneDnnCache says why the count belongs to the key).
// oneDNN picks the kernels for the CPU at hand: AVX512_BF16 or AMX instructions for bf16 where the
// CPU has them, otherwise an emulation several times slower than f32 (OneDnnBf16Native() says
// which; on such CPUs `--precision bf16` still computes its products in f32).
//
// Threads: Debian's oneDNN runs its work on OpenMP threads. SetOneDnnThreads(n) sets the count
// every call uses (step/stage_program.cc sets it with the BLAS threads); each calling thread
// applies it to its own OpenMP setting before it runs a primitive. With OMP_WAIT_POLICY unset
// the count is 1 whatever n: libgomp's default workers spin between primitives and take the
// cores the intra-op pool and OpenBLAS need (10x a 2-thread bf16 step's CPU time on AMX); with
// OMP_WAIT_POLICY set (passive: they sleep) the count is n. The `sluice` command sets passive,
// restarting itself, when the variable is unset (cli/main.cc).
//
// Thread-safety: every function may be called from any thread. The cache is guarded by a mutex
// (lookups and inserts); oneDNN primitives are immutable once made and run concurrently from
// several threads, each thread through its own stream and each call with its own scratchpad, the
// caller's or its thread's (the user scratchpad mode: oneDNN's default one is shared by the
// process and holds only while a primitive stays on the thread that made it; pipeline stages
// sharing it gave other bits, or NaN). Failures: oneDNN's
// errors (no implementation for a problem, out of memory) are rethrown as InternalError naming the
// problem.
//
// Example:
//   // x [B·T, C] bf16, w [C, 3C] bf16 -> qkv [B·T, 3C] f32
//   kernels::OneDnnGemm({.dtype = DType::kBF16, .m = B * T, .n = 3 * C, .k = C}, x, w, qkv);
#pragma once

#include <cstdint>
#include <string>

#include "sluice/core/dtype.h"

namespace sluice::kernels {

struct OneDnnGemmShape {
  DType dtype = DType::kF32;  // of a and b: kF32 or kBF16 (c is f32)
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  // Row strides as stored; 0 means packed (a: k, or m when transposed; b: n, or k; c: n).
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool accumulate = false;  // c += product (beta = 1) instead of c = product
  // The epilogue. bias: an f32 row bias[n] added to every row of the product (oneDNN's matmul
  // bias input). gelu: then the tanh-approximation GELU (oneDNN's eltwise_gelu_tanh post-op, the
  // formula of kernels/unary.h's GeluReference computed with oneDNN's own tanh: within
  // kOneDnnGeluTolerance·(1 + |y|) of GeluReference<float>, tests/kernels/onednn_epilogue_test.cc).
  // Neither combines with accumulate.
  bool bias = false;
  bool gelu = false;
};

inline constexpr float kOneDnnGeluTolerance = 1e-6f;

// Runs the product. m, n or k of 0: c is left alone (k = 0 and !accumulate: c is zeroed; with an
// epilogue, c is gelu(bias) or bias). `bias` ([n] f32) is read when and only when shape.bias;
// a missing bias, or an epilogue beside accumulate, throws InternalError. `scratchpad`: at least
// OneDnnScratchpadBytes(shape) bytes, aligned to 64, used by this call alone (the bf16 products
// take it from the executor's allocator, so that the memory forecast counts it); null: the
// calling thread's own buffer, grown to the largest scratchpad the thread ran, kept for the
// thread's life and outside the forecast (the f32 engine's products, SLUICE_GEMM=onednn).
void OneDnnGemm(const OneDnnGemmShape& shape, const void* a, const void* b, float* c,
                const float* bias = nullptr, void* scratchpad = nullptr);

// The bytes of the scratchpad the product of `shape` needs (oneDNN's working buffers: packed
// blocks of the operands, AMX tile configurations, partial sums), 0 for an empty product. Makes
// the primitive (JIT) when it is not in the cache yet.
int64_t OneDnnScratchpadBytes(const OneDnnGemmShape& shape);

// The threads each oneDNN primitive uses (≥ 1; default 1; 1 while OMP_WAIT_POLICY is unset,
// unless SizeOneDnnForSleepingWorkers was called). Primitives are made for that count, and their
// scratchpads sized for it (OneDnnScratchpadBytes): ask and run under the same count.
void SetOneDnnThreads(int threads);

// For a process that makes primitives only to size them for a run in another process whose
// OpenMP workers sleep (`sluice plan` with OMP_WAIT_POLICY unset forecasts a `sluice train` that
// restarts with passive: cli/main.cc): SetOneDnnThreads then takes the count as that run does.
// Call it before SetOneDnnThreads; this process's primitives should not run (its workers spin).
void SizeOneDnnForSleepingWorkers();

// Whether the CPU multiplies bf16 natively (AVX512_BF16 or AMX), as oneDNN sees it; honours
// ONEDNN_MAX_CPU_ISA.
bool OneDnnBf16Native();

// The implementation oneDNN chose for an f32 or bf16 product of m×k by k×n: "brg:avx512_core_bf16",
// "gemm:jit", ... (for the training summary and benchmarks); the second form for any shape,
// epilogue included.
std::string OneDnnImplementation(DType dtype, int64_t m, int64_t n, int64_t k);
std::string OneDnnImplementation(const OneDnnGemmShape& shape);

// Primitives made so far (the cache's size; tests check that a shape is made once).
int64_t OneDnnCachedPrimitives();

}  // namespace sluice::kernels
