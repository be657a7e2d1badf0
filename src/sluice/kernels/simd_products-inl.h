// The per-target code of simd_kernels.h's small products and transpose, for fused attention
// (kernels/attention.h): included by simd_kernels.cc inside Highway's per-target compilation
// (hence the toggling guard of Highway's -inl.h convention, not #pragma once), so that the
// table there can point at these functions for every target.
//
// small_gemm: C = alpha · A · B + beta · C in register tiles of 4 rows × up to 4 vectors, A read
// element by element through two strides (so A or Aᵀ in place), B and C by rows. Attention's
// products are [32, 64] by [64, ≤ 256] and back: a BLAS call's packing, beta pass and dispatch
// cost as much as their arithmetic there.
// transpose: 8 × 8 f32 register blocks on AVX2/AVX-512, element by element elsewhere.

#if defined(SLUICE_KERNELS_SIMD_PRODUCTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SLUICE_KERNELS_SIMD_PRODUCTS_INL_H_
#undef SLUICE_KERNELS_SIMD_PRODUCTS_INL_H_
#else
#define SLUICE_KERNELS_SIMD_PRODUCTS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace sluice::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- small products (fused attention) ----

// The operand of a small product read element by element: A(i, p) = a[i·row + p·col], so A or Aᵀ
// of a row-major matrix without a copy.
template <typename T>
struct Strided {
  const T* a;
  int64_t row, col;
  T operator()(int64_t i, int64_t p) const { return a[i * row + p * col]; }
};

// One register tile of C: R ≤ 4 rows × V ≤ 4 vectors. Each step of p loads V vectors of B's row
// p, broadcasts R elements of A's column p and issues R·V FMAs into R·V accumulators (16 at
// 4 × 4: enough independent sums to cover the FMA latency on two ports). Named accumulators,
// not arrays: sizeless vector types (SVE, RVV) cannot form arrays; unused ones compile away.
template <size_t R, size_t V, class D, typename T = hn::TFromD<D>>
HWY_INLINE void ProductTile(D d, int64_t k, T alpha, Strided<T> a, int64_t i, const T* b,
                            int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(R >= 1 && R <= 4 && V >= 1 && V <= 4);
  const size_t L = hn::Lanes(d);
  auto c00 = hn::Zero(d), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
       c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00,
       c33 = c00;
  for (int64_t p = 0; p < k; ++p) {
    const T* bp = b + p * ldb;
    const auto b0 = hn::LoadU(d, bp);
    const auto b1 = V > 1 ? hn::LoadU(d, bp + L) : b0;
    const auto b2 = V > 2 ? hn::LoadU(d, bp + 2 * L) : b0;
    const auto b3 = V > 3 ? hn::LoadU(d, bp + 3 * L) : b0;
    const auto row = [&](auto& x0, auto& x1, auto& x2, auto& x3, int64_t r) {
      const auto av = hn::Set(d, a(i + r, p));
      x0 = hn::MulAdd(av, b0, x0);
      if constexpr (V > 1) x1 = hn::MulAdd(av, b1, x1);
      if constexpr (V > 2) x2 = hn::MulAdd(av, b2, x2);
      if constexpr (V > 3) x3 = hn::MulAdd(av, b3, x3);
    };
    row(c00, c01, c02, c03, 0);
    if constexpr (R > 1) row(c10, c11, c12, c13, 1);
    if constexpr (R > 2) row(c20, c21, c22, c23, 2);
    if constexpr (R > 3) row(c30, c31, c32, c33, 3);
  }
  const auto va = hn::Set(d, alpha), vb = hn::Set(d, beta);
  const auto store = [&](hn::Vec<D> x, int64_t r, size_t v) {
    T* out = c + (i + r) * ldc + v * L;
    // beta = 0 writes C without reading it (C may hold anything, NaN included).
    hn::StoreU(beta == T(0) ? hn::Mul(va, x) : hn::MulAdd(vb, hn::LoadU(d, out), hn::Mul(va, x)), d,
               out);
  };
  const auto store_row = [&](hn::Vec<D> x0, hn::Vec<D> x1, hn::Vec<D> x2, hn::Vec<D> x3,
                             int64_t r) {
    store(x0, r, 0);
    if constexpr (V > 1) store(x1, r, 1);
    if constexpr (V > 2) store(x2, r, 2);
    if constexpr (V > 3) store(x3, r, 3);
  };
  store_row(c00, c01, c02, c03, 0);
  if constexpr (R > 1) store_row(c10, c11, c12, c13, 1);
  if constexpr (R > 2) store_row(c20, c21, c22, c23, 2);
  if constexpr (R > 3) store_row(c30, c31, c32, c33, 3);
}

// The columns [j, j + V·lanes) of every row of C, four rows a tile.
template <size_t V, class D, typename T = hn::TFromD<D>>
HWY_INLINE void ProductColumns(D d, int64_t m, int64_t k, T alpha, Strided<T> a, const T* b,
                               int64_t ldb, T beta, T* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) ProductTile<4, V>(d, k, alpha, a, i, b, ldb, beta, c, ldc);
  switch (m - i) {
    case 3:
      return ProductTile<3, V>(d, k, alpha, a, i, b, ldb, beta, c, ldc);
    case 2:
      return ProductTile<2, V>(d, k, alpha, a, i, b, ldb, beta, c, ldc);
    case 1:
      return ProductTile<1, V>(d, k, alpha, a, i, b, ldb, beta, c, ldc);
    default:
      return;
  }
}

// C [m, n] = alpha · A [m, k] · B [k, n] + beta · C, A(i, p) = a[i·a_row + p·a_col], B and C
// row-major (ldb, ldc apart). Columns go four vectors at a time, then two, then one; the last
// n mod lanes columns (odd head sizes, short key chunks) by a scalar loop.
template <typename T>
void SmallGemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t a_row, int64_t a_col,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const Strided<T> sa{a, a_row, a_col};
  int64_t j = 0;
  for (; j + 4 * lanes <= n; j += 4 * lanes)
    ProductColumns<4>(d, m, k, alpha, sa, b + j, ldb, beta, c + j, ldc);
  if (j + 2 * lanes <= n) {
    ProductColumns<2>(d, m, k, alpha, sa, b + j, ldb, beta, c + j, ldc);
    j += 2 * lanes;
  }
  if (j + lanes <= n) {
    ProductColumns<1>(d, m, k, alpha, sa, b + j, ldb, beta, c + j, ldc);
    j += lanes;
  }
  for (int64_t i = 0; i < m && j < n; ++i) {
    for (int64_t jj = j; jj < n; ++jj) {
      T sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += sa(i, p) * b[p * ldb + jj];
      T& out = c[i * ldc + jj];
      out = beta == T(0) ? alpha * sum : alpha * sum + beta * out;
    }
  }
}

// ---- transpose ----

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // 256-bit vectors
// dst rows c0 … c0+7 (ldd apart), columns j0 … j0+7 = the 8 × 8 f32 block of src at rows j0 …,
// columns c0 … (ld apart): eight 256-bit loads, the classic three rounds of interleaves (32-bit
// pairs, 64-bit pairs, 128-bit halves) and eight stores.
HWY_INLINE void Transpose8x8(const float* src, int64_t ld, float* dst, int64_t ldd) {
  const hn::FixedTag<float, 8> d;
  const hn::Repartition<double, decltype(d)> dd;
  const auto r0 = hn::LoadU(d, src), r1 = hn::LoadU(d, src + ld), r2 = hn::LoadU(d, src + 2 * ld),
             r3 = hn::LoadU(d, src + 3 * ld), r4 = hn::LoadU(d, src + 4 * ld),
             r5 = hn::LoadU(d, src + 5 * ld), r6 = hn::LoadU(d, src + 6 * ld),
             r7 = hn::LoadU(d, src + 7 * ld);
  // Per 128-bit half: (a0 b0 a1 b1), (a2 b2 a3 b3).
  const auto t0 = hn::BitCast(dd, hn::InterleaveLower(d, r0, r1));
  const auto t1 = hn::BitCast(dd, hn::InterleaveUpper(d, r0, r1));
  const auto t2 = hn::BitCast(dd, hn::InterleaveLower(d, r2, r3));
  const auto t3 = hn::BitCast(dd, hn::InterleaveUpper(d, r2, r3));
  const auto t4 = hn::BitCast(dd, hn::InterleaveLower(d, r4, r5));
  const auto t5 = hn::BitCast(dd, hn::InterleaveUpper(d, r4, r5));
  const auto t6 = hn::BitCast(dd, hn::InterleaveLower(d, r6, r7));
  const auto t7 = hn::BitCast(dd, hn::InterleaveUpper(d, r6, r7));
  // Per 128-bit half: column c of rows 0–3 (u0 … u3), of rows 4–7 (u4 … u7); halves c and c + 4.
  const auto u0 = hn::BitCast(d, hn::InterleaveLower(dd, t0, t2));
  const auto u1 = hn::BitCast(d, hn::InterleaveUpper(dd, t0, t2));
  const auto u2 = hn::BitCast(d, hn::InterleaveLower(dd, t1, t3));
  const auto u3 = hn::BitCast(d, hn::InterleaveUpper(dd, t1, t3));
  const auto u4 = hn::BitCast(d, hn::InterleaveLower(dd, t4, t6));
  const auto u5 = hn::BitCast(d, hn::InterleaveUpper(dd, t4, t6));
  const auto u6 = hn::BitCast(d, hn::InterleaveLower(dd, t5, t7));
  const auto u7 = hn::BitCast(d, hn::InterleaveUpper(dd, t5, t7));
  hn::StoreU(hn::ConcatLowerLower(d, u4, u0), d, dst);
  hn::StoreU(hn::ConcatLowerLower(d, u5, u1), d, dst + ldd);
  hn::StoreU(hn::ConcatLowerLower(d, u6, u2), d, dst + 2 * ldd);
  hn::StoreU(hn::ConcatLowerLower(d, u7, u3), d, dst + 3 * ldd);
  hn::StoreU(hn::ConcatUpperUpper(d, u4, u0), d, dst + 4 * ldd);
  hn::StoreU(hn::ConcatUpperUpper(d, u5, u1), d, dst + 5 * ldd);
  hn::StoreU(hn::ConcatUpperUpper(d, u6, u2), d, dst + 6 * ldd);
  hn::StoreU(hn::ConcatUpperUpper(d, u7, u3), d, dst + 7 * ldd);
}
#endif

// dst [cols, rows] (rows ldd apart) = srcᵀ, src [rows, cols] (rows ld apart). f32 on AVX2 and
// AVX-512 in 8 × 8 register blocks; the edges, f64 and other targets element by element.
template <typename T>
void Transpose(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst, int64_t ldd) {
  int64_t j0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // 256-bit vectors
  if constexpr (std::is_same_v<T, float>) {
    for (; j0 + 8 <= rows; j0 += 8) {
      int64_t c0 = 0;
      for (; c0 + 8 <= cols; c0 += 8)
        Transpose8x8(src + j0 * ld + c0, ld, dst + c0 * ldd + j0, ldd);
      for (int64_t c = c0; c < cols; ++c) {
        for (int64_t j = j0; j < j0 + 8; ++j) dst[c * ldd + j] = src[j * ld + c];
      }
    }
  }
#endif
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t j = j0; j < rows; ++j) dst[c * ldd + j] = src[j * ld + c];
  }
}

}  // namespace sluice::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SLUICE_KERNELS_SIMD_PRODUCTS_INL_H_
