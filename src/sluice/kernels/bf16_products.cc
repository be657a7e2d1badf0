#include "sluice/kernels/bf16_products.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "sluice/core/error.h"

#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_gemm.h"
#include "sluice/kernels/linear.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_matmul.h"

namespace sluice::kernels {

namespace {

// t as f32, exactly; an f32 t (an operand rounded on load) rounded to bf16 first.
Tensor Widened(const Tensor& t) {
  Tensor out = Tensor::Empty(t.shape(), DType::kF32);
  if (t.dtype() == DType::kF32) {
    std::vector<BFloat16> rounded(static_cast<size_t>(t.numel()));
    ToBF16Reference(t.data<float>(), rounded.data(), t.numel());
    FromBF16Reference(rounded.data(), out.data<float>(), t.numel());
    return out;
  }
  FromBF16Reference(t.data<BFloat16>(), out.data<float>(), t.numel());
  return out;
}

std::vector<float> Widened(const BFloat16* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  FromBF16Reference(x, out.data(), n);
  return out;
}

std::vector<BFloat16> Rounded(const float* x, int64_t n) {
  std::vector<BFloat16> out(static_cast<size_t>(n));
  ToBF16Reference(x, out.data(), n);
  return out;
}

enum class Engine { kOneDnn, kWidened, kPacked };

Engine Bf16GemmEngineChoice() {
  static const Engine engine = [] {
    const char* env = std::getenv("SLUICE_BF16_GEMM");
    if (env == nullptr) {
      const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
      const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
      return (isa & amx) == amx ? Engine::kOneDnn : Engine::kPacked;
    }
    const std::string choice = env;
    if (choice == "onednn") return Engine::kOneDnn;
    if (choice == "openblas") return Engine::kWidened;
    if (choice == "packed") return Engine::kPacked;
    throw InvalidArgument(fmt::format(
        "SLUICE_BF16_GEMM='{}': the bf16 product engine is onednn, packed or openblas", choice));
  }();
  return engine;
}

// Rows [0, rows) of a bf16 matrix with row stride ld, columns [col, col + cols), into a packed
// f32 [rows, cols]. On the calling thread: handing each block to the intra-op pool between two
// OpenBLAS calls costs more than it saves at 2 threads (OpenBLAS's threads still spin when the
// pool's wake, and on 2 cores they take the pool's core: docs/benchmarks.md, "Mixed precision").
void WidenBlock(const BFloat16* x, int64_t ld, int64_t rows, int64_t col, int64_t cols,
                float* out) {
  if (col == 0 && cols == ld) {  // whole rows, one after the other: one call, the same bits
    FromBF16Fast(x, out, rows * cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) FromBF16Fast(x + r * ld + col, out + r * cols, cols);
}

}  // namespace

int64_t WidenedBf16GemmScratchFloats(const OneDnnGemmShape& shape) {
  if (shape.m == 0 || shape.n == 0) return 0;
  return std::min(shape.k, kWidenBlock) * (shape.m + shape.n);
}

// op(a)·op(b) through f32 GEMMs over blocks of k: each block of op(a)'s columns and op(b)'s rows
// widened to f32 (exact) into the scratch, then multiplied and added to c.
void WidenedBf16Gemm(const OneDnnGemmShape& s, const BFloat16* a, const BFloat16* b, float* c,
                     float* scratch) {
  const int64_t lda = s.lda != 0 ? s.lda : (s.transpose_a ? s.m : s.k);
  const int64_t ldb = s.ldb != 0 ? s.ldb : (s.transpose_b ? s.k : s.n);
  const int64_t ldc = s.ldc != 0 ? s.ldc : s.n;
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    if (!s.accumulate) {
      for (int64_t i = 0; i < s.m; ++i) std::fill_n(c + i * ldc, s.n, 0.0f);
    }
    return;
  }
  const int64_t block = std::min(s.k, kWidenBlock);
  float* wa = scratch;
  float* wb = scratch + block * s.m;
  for (int64_t k0 = 0; k0 < s.k; k0 += block) {
    const int64_t kb = std::min(block, s.k - k0);
    // a stored [m, k]: rows m, columns [k0, k0 + kb); stored [k, m]: rows [k0, k0 + kb).
    if (s.transpose_a) {
      WidenBlock(a + k0 * lda, lda, kb, 0, s.m, wa);
    } else {
      WidenBlock(a, lda, s.m, k0, kb, wa);
    }
    // b stored [k, n]: rows [k0, k0 + kb); stored [n, k]: rows n, columns [k0, k0 + kb).
    if (s.transpose_b) {
      WidenBlock(b, ldb, s.n, k0, kb, wb);
    } else {
      WidenBlock(b + k0 * ldb, ldb, kb, 0, s.n, wb);
    }
    const float beta = k0 > 0 || s.accumulate ? 1.0f : 0.0f;
    Gemm(s.transpose_a, s.transpose_b, s.m, s.n, kb, 1.0f, wa, s.transpose_a ? s.m : kb, wb,
         s.transpose_b ? kb : s.n, beta, c, ldc);
  }
}

const char* Bf16GemmEngine() {
  switch (Bf16GemmEngineChoice()) {
    case Engine::kOneDnn:
      return "onednn";
    case Engine::kWidened:
      return "openblas";
    case Engine::kPacked:
      break;
  }
  return "packed";
}

namespace {

// The floats past the engine's scratch that hold b rounded to bf16 (b_rounds, engines other than
// packed): k · n bf16.
int64_t RoundedBFloats(const OneDnnGemmShape& shape, bool b_rounds) {
  if (!b_rounds || Bf16GemmEngineChoice() == Engine::kPacked) return 0;
  return (shape.k * shape.n + 1) / 2;
}

int64_t EngineScratchFloats(const OneDnnGemmShape& shape) {
  switch (Bf16GemmEngineChoice()) {
    case Engine::kOneDnn:
      return (OneDnnScratchpadBytes(shape) + 3) / 4;
    case Engine::kWidened:
      return WidenedBf16GemmScratchFloats(shape);
    case Engine::kPacked:
      break;
  }
  return PackedBf16GemmScratchFloats(shape);
}

}  // namespace

int64_t Bf16GemmScratchFloats(const OneDnnGemmShape& shape, bool b_rounds) {
  return EngineScratchFloats(shape) + RoundedBFloats(shape, b_rounds);
}

void Bf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const float* b, float* c,
              float* scratch) {
  if (Bf16GemmEngineChoice() == Engine::kPacked) return PackedBf16Gemm(shape, a, b, c, scratch);
  if (shape.ldb != 0) {
    throw InternalError("Bf16Gemm: an f32 b is rounded on load only where its rows are packed");
  }
  auto* rounded = reinterpret_cast<BFloat16*>(scratch + EngineScratchFloats(shape));
  ToBF16Parallel(b, rounded, shape.k * shape.n);
  Bf16Gemm(shape, a, rounded, c, scratch);
}

void Bf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b, float* c,
              float* scratch) {
  switch (Bf16GemmEngineChoice()) {
    case Engine::kOneDnn:
      return OneDnnGemm(shape, a, b, c, nullptr, scratch);
    case Engine::kWidened:
      return WidenedBf16Gemm(shape, a, b, c, scratch);
    case Engine::kPacked:
      break;
  }
  PackedBf16Gemm(shape, a, b, c, scratch);
}

namespace {

// The products MatMulBF16 runs: one over every batch entry's rows, or one per batch entry.
OneDnnGemmShape MatMulBF16Product(const MatMulDims& d, bool transpose_a, bool transpose_b) {
  if (d.b_shared && !transpose_a) {
    return {
        .dtype = DType::kBF16, .transpose_b = transpose_b, .m = d.batch * d.m, .n = d.n, .k = d.k};
  }
  return {.dtype = DType::kBF16,
          .transpose_a = transpose_a,
          .transpose_b = transpose_b,
          .m = d.m,
          .n = d.n,
          .k = d.k};
}

}  // namespace

int64_t MatMulBF16ScratchFloats(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b,
                                bool b_rounds) {
  const MatMulDims d = MatMulShape(a, b, transpose_a, transpose_b);
  if (d.batch == 0) return 0;
  return Bf16GemmScratchFloats(MatMulBF16Product(d, transpose_a, transpose_b), b_rounds);
}

namespace {

template <typename TB>
void MatMulBF16Of(const Tensor& a, const TB* pb, const Tensor& out, const MatMulDims& d,
                  bool transpose_a, bool transpose_b, float* scratch) {
  const BFloat16* pa = a.data<BFloat16>();
  float* po = out.data<float>();
  const OneDnnGemmShape product = MatMulBF16Product(d, transpose_a, transpose_b);
  if (d.b_shared && !transpose_a) {
    // Rows of every batch entry are consecutive: one product of (batch·m) × k by k × n.
    Bf16Gemm(product, pa, pb, po, scratch);
    return;
  }
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    Bf16Gemm(product, pa + bi * d.m * d.k, d.b_shared ? pb : pb + bi * d.k * d.n,
             po + bi * d.m * d.n, scratch);
  }
}

}  // namespace

void MatMulBF16(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                bool transpose_b, float* scratch) {
  const MatMulDims d = MatMulShape(a.shape(), b.shape(), transpose_a, transpose_b);
  if (b.dtype() == DType::kF32) {
    return MatMulBF16Of(a, b.data<float>(), out, d, transpose_a, transpose_b, scratch);
  }
  MatMulBF16Of(a, b.data<BFloat16>(), out, d, transpose_a, transpose_b, scratch);
}

void MatMulBF16Reference(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                         bool transpose_b) {
  MatMulReference<float>(Widened(a), Widened(b), out, transpose_a, transpose_b);
}

int64_t LinearBF16ScratchFloats(int64_t m, int64_t k, int64_t n, bool w_rounds) {
  return Bf16GemmScratchFloats({.dtype = DType::kBF16, .m = m, .n = n, .k = k}, w_rounds);
}

namespace {

template <typename TW>
void LinearBF16Of(const BFloat16* x, const TW* w, const float* b, float* out, int64_t m, int64_t k,
                  int64_t n, float* scratch) {
  for (int64_t i = 0; i < m; ++i) std::copy_n(b, n, out + i * n);
  Bf16Gemm({.dtype = DType::kBF16, .m = m, .n = n, .k = k, .accumulate = true}, x, w, out, scratch);
}

}  // namespace

void LinearBF16(const BFloat16* x, const BFloat16* w, const float* b, float* out, int64_t m,
                int64_t k, int64_t n, float* scratch) {
  LinearBF16Of(x, w, b, out, m, k, n, scratch);
}

void LinearBF16(const BFloat16* x, const float* w, const float* b, float* out, int64_t m, int64_t k,
                int64_t n, float* scratch) {
  LinearBF16Of(x, w, b, out, m, k, n, scratch);
}

namespace {

OneDnnGemmShape RoundedLinearProduct(int64_t m, int64_t k, int64_t n) {
  return {.dtype = DType::kBF16, .m = m, .n = n, .k = k};
}

// Whether the rounding happens in the product's register tiles (else the f32 result goes through
// the scratch first).
bool RoundsInTheProduct(int64_t m, int64_t k, int64_t n) {
  return Bf16GemmEngineChoice() == Engine::kPacked &&
         PackedBf16GemmRoundsInOnePass(RoundedLinearProduct(m, k, n));
}

}  // namespace

int64_t LinearBF16RoundedScratchFloats(int64_t m, int64_t k, int64_t n, bool w_rounds) {
  if (RoundsInTheProduct(m, k, n))
    return PackedBf16GemmScratchFloats(RoundedLinearProduct(m, k, n));
  return m * n + LinearBF16ScratchFloats(m, k, n, w_rounds);
}

namespace {

template <typename TW>
void LinearBF16RoundedOf(const BFloat16* x, const TW* w, const float* b, BFloat16* out, int64_t m,
                         int64_t k, int64_t n, float* scratch) {
  if (RoundsInTheProduct(m, k, n)) {
    PackedBf16GemmRounded(RoundedLinearProduct(m, k, n), x, w, b, out, scratch);
    return;
  }
  LinearBF16(x, w, b, scratch, m, k, n, scratch + m * n);
  ToBF16Parallel(scratch, out, m * n);
}

}  // namespace

void LinearBF16Rounded(const BFloat16* x, const BFloat16* w, const float* b, BFloat16* out,
                       int64_t m, int64_t k, int64_t n, float* scratch) {
  LinearBF16RoundedOf(x, w, b, out, m, k, n, scratch);
}

void LinearBF16Rounded(const BFloat16* x, const float* w, const float* b, BFloat16* out, int64_t m,
                       int64_t k, int64_t n, float* scratch) {
  LinearBF16RoundedOf(x, w, b, out, m, k, n, scratch);
}

void LinearBF16RoundedReference(const BFloat16* x, const BFloat16* w, const float* b, BFloat16* out,
                                int64_t m, int64_t k, int64_t n) {
  std::vector<float> y(static_cast<size_t>(m * n));
  LinearBF16Reference(x, w, b, y.data(), m, k, n);
  ToBF16Reference(y.data(), out, m * n);
}

void LinearBF16RoundedReference(const BFloat16* x, const float* w, const float* b, BFloat16* out,
                                int64_t m, int64_t k, int64_t n) {
  LinearBF16RoundedReference(x, Rounded(w, k * n).data(), b, out, m, k, n);
}

void LinearBF16Reference(const BFloat16* x, const float* w, const float* b, float* out, int64_t m,
                         int64_t k, int64_t n) {
  LinearBF16Reference(x, Rounded(w, k * n).data(), b, out, m, k, n);
}

void LinearBF16Reference(const BFloat16* x, const BFloat16* w, const float* b, float* out,
                         int64_t m, int64_t k, int64_t n) {
  const std::vector<float> xf = Widened(x, m * k), wf = Widened(w, k * n);
  LinearReference<float>(xf.data(), wf.data(), b, out, m, k, n);
}

}  // namespace sluice::kernels
