#include "sluice/kernels/bf16_products.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "sluice/core/error.h"

#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/linear.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_matmul.h"

namespace sluice::kernels {

namespace {

// t as f32, exactly.
Tensor Widened(const Tensor& t) {
  Tensor out = Tensor::Empty(t.shape(), DType::kF32);
  FromBF16Reference(t.data<BFloat16>(), out.data<float>(), t.numel());
  return out;
}

std::vector<float> Widened(const BFloat16* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  FromBF16Reference(x, out.data(), n);
  return out;
}

bool Bf16GemmOnOneDnn() {
  static const bool onednn = [] {
    const char* env = std::getenv("SLUICE_BF16_GEMM");
    if (env == nullptr) {
      const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
      const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
      return (isa & amx) == amx;
    }
    const std::string choice = env;
    if (choice != "openblas" && choice != "onednn") {
      throw InvalidArgument(fmt::format(
          "SLUICE_BF16_GEMM='{}': the bf16 product engine is onednn or openblas", choice));
    }
    return choice == "onednn";
  }();
  return onednn;
}

// Rows [0, rows) of a bf16 matrix with row stride ld, columns [col, col + cols), into a packed
// f32 [rows, cols].
void WidenBlock(const BFloat16* x, int64_t ld, int64_t rows, int64_t col, int64_t cols,
                float* out) {
  for (int64_t r = 0; r < rows; ++r) FromBF16Fast(x + r * ld + col, out + r * cols, cols);
}

// op(a)·op(b) through f32 GEMMs over blocks of k: each block of op(a)'s columns and op(b)'s rows
// widened to f32 (exact), then multiplied and added to c.
void WidenedGemm(const OneDnnGemmShape& s, const BFloat16* a, const BFloat16* b, float* c) {
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
  thread_local std::vector<float> wa, wb;
  const int64_t block = std::min(s.k, kWidenBlock);
  wa.resize(static_cast<size_t>(block * s.m));
  wb.resize(static_cast<size_t>(block * s.n));
  for (int64_t k0 = 0; k0 < s.k; k0 += block) {
    const int64_t kb = std::min(block, s.k - k0);
    // a stored [m, k]: rows m, columns [k0, k0 + kb); stored [k, m]: rows [k0, k0 + kb).
    if (s.transpose_a) {
      WidenBlock(a + k0 * lda, lda, kb, 0, s.m, wa.data());
    } else {
      WidenBlock(a, lda, s.m, k0, kb, wa.data());
    }
    // b stored [k, n]: rows [k0, k0 + kb); stored [n, k]: rows n, columns [k0, k0 + kb).
    if (s.transpose_b) {
      WidenBlock(b, ldb, s.n, k0, kb, wb.data());
    } else {
      WidenBlock(b + k0 * ldb, ldb, kb, 0, s.n, wb.data());
    }
    const float beta = k0 > 0 || s.accumulate ? 1.0f : 0.0f;
    Gemm(s.transpose_a, s.transpose_b, s.m, s.n, kb, 1.0f, wa.data(), s.transpose_a ? s.m : kb,
         wb.data(), s.transpose_b ? kb : s.n, beta, c, ldc);
  }
}

}  // namespace

const char* Bf16GemmEngine() { return Bf16GemmOnOneDnn() ? "onednn" : "openblas"; }

void Bf16Gemm(const OneDnnGemmShape& shape, const BFloat16* a, const BFloat16* b, float* c) {
  if (Bf16GemmOnOneDnn()) {
    OneDnnGemm(shape, a, b, c);
  } else {
    WidenedGemm(shape, a, b, c);
  }
}

void MatMulBF16(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                bool transpose_b) {
  const MatMulDims d = MatMulShape(a.shape(), b.shape(), transpose_a, transpose_b);
  const BFloat16* pa = a.data<BFloat16>();
  const BFloat16* pb = b.data<BFloat16>();
  float* po = out.data<float>();
  if (d.b_shared && !transpose_a) {
    // Rows of every batch entry are consecutive: one product of (batch·m) × k by k × n.
    Bf16Gemm(
        {.dtype = DType::kBF16, .transpose_b = transpose_b, .m = d.batch * d.m, .n = d.n, .k = d.k},
        pa, pb, po);
    return;
  }
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    Bf16Gemm({.dtype = DType::kBF16,
              .transpose_a = transpose_a,
              .transpose_b = transpose_b,
              .m = d.m,
              .n = d.n,
              .k = d.k},
             pa + bi * d.m * d.k, d.b_shared ? pb : pb + bi * d.k * d.n, po + bi * d.m * d.n);
  }
}

void MatMulBF16Reference(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                         bool transpose_b) {
  MatMulReference<float>(Widened(a), Widened(b), out, transpose_a, transpose_b);
}

void LinearBF16(const BFloat16* x, const BFloat16* w, const float* b, float* out, int64_t m,
                int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) std::copy_n(b, n, out + i * n);
  Bf16Gemm({.dtype = DType::kBF16, .m = m, .n = n, .k = k, .accumulate = true}, x, w, out);
}

void LinearBF16Reference(const BFloat16* x, const BFloat16* w, const float* b, float* out,
                         int64_t m, int64_t k, int64_t n) {
  const std::vector<float> xf = Widened(x, m * k), wf = Widened(w, k * n);
  LinearReference<float>(xf.data(), wf.data(), b, out, m, k, n);
}

}  // namespace sluice::kernels
