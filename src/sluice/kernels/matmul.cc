#include "sluice/kernels/matmul.h"

#include <cblas.h>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "sluice/core/error.h"
#include "sluice/kernels/blas.h"
#include "sluice/kernels/onednn_matmul.h"

namespace sluice::kernels {

MatMulDims MatMulShape(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b) {
  auto fail = [&](const std::string& why) {
    throw ShapeError(
        fmt::format("matmul{}{} of {} and {}: {}", transpose_a ? " (a transposed)" : "",
                    transpose_b ? " (b transposed)" : "", a.ToString(), b.ToString(), why));
  };
  if (a.rank() < 2 || b.rank() < 2) fail("both operands need rank 2 or more");
  MatMulDims d;
  const int ra = a.rank(), rb = b.rank();
  d.m = transpose_a ? a[ra - 1] : a[ra - 2];
  d.k = transpose_a ? a[ra - 2] : a[ra - 1];
  const int64_t kb = transpose_b ? b[rb - 1] : b[rb - 2];
  d.n = transpose_b ? b[rb - 2] : b[rb - 1];
  if (d.k != kb) fail(fmt::format("inner dimensions differ ({} vs {})", d.k, kb));
  for (int i = 0; i < ra - 2; ++i) d.batch *= a[i];
  if (rb == 2) {
    d.b_shared = true;
  } else {
    if (rb != ra) fail("b must have rank 2 or the rank of a");
    for (int i = 0; i < ra - 2; ++i) {
      if (a[i] != b[i]) fail(fmt::format("batch dimension {} differs ({} vs {})", i, a[i], b[i]));
    }
  }
  return d;
}

template <typename T>
void MatMulReference(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                     bool transpose_b) {
  const MatMulDims d = MatMulShape(a.shape(), b.shape(), transpose_a, transpose_b);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    const T* A = pa + bi * d.m * d.k;
    const T* B = d.b_shared ? pb : pb + bi * d.k * d.n;
    T* C = po + bi * d.m * d.n;
    for (int64_t i = 0; i < d.m; ++i) {
      for (int64_t j = 0; j < d.n; ++j) {
        T acc = 0;
        for (int64_t p = 0; p < d.k; ++p) {
          // A is [m, k] (or [k, m] when transposed); B is [k, n] (or [n, k]).
          T x = transpose_a ? A[p * d.m + i] : A[i * d.k + p];
          T y = transpose_b ? B[j * d.k + p] : B[p * d.n + j];
          acc += x * y;
        }
        C[i * d.n + j] = acc;
      }
    }
  }
}

bool Fp32GemmOnOneDnn() {
  static const bool onednn = [] {
    const char* env = std::getenv("SLUICE_GEMM");
    const std::string choice = env == nullptr ? "openblas" : env;
    if (choice != "openblas" && choice != "onednn") {
      throw InvalidArgument(
          fmt::format("SLUICE_GEMM='{}': the f32 GEMM engine is openblas or onednn", choice));
    }
    return choice == "onednn";
  }();
  return onednn;
}

const char* Fp32GemmEngineName() { return Fp32GemmOnOneDnn() ? "onednn" : "openblas"; }

const char* Fp32GemmChosenBy() {
  Fp32GemmOnOneDnn();  // a bad SLUICE_GEMM is refused here too
  return std::getenv("SLUICE_GEMM") == nullptr ? "default: measured" : "SLUICE_GEMM";
}

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (Fp32GemmOnOneDnn() && alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
    OneDnnGemm({.transpose_a = ta,
                .transpose_b = tb,
                .m = m,
                .n = n,
                .k = k,
                .lda = lda,
                .ldb = ldb,
                .ldc = ldc,
                .accumulate = beta == 1.0f},
               a, b, c);
    return;
  }
  EnsureBlasKernels();
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  EnsureBlasKernels();
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  Gemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          const double* b, double beta, double* c) {
  Gemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

template <typename T>
void MatMulBlas(const Tensor& a, const Tensor& b, const Tensor& out, bool transpose_a,
                bool transpose_b) {
  const MatMulDims d = MatMulShape(a.shape(), b.shape(), transpose_a, transpose_b);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  if (d.k == 0) {
    for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = T(0);
    return;
  }
  if (d.b_shared && !transpose_a) {
    // Rows of every batch entry are consecutive: one GEMM of (batch·m) × k by k × n.
    Gemm(false, transpose_b, d.batch * d.m, d.n, d.k, T(1), pa, pb, T(0), po);
    return;
  }
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    Gemm(transpose_a, transpose_b, d.m, d.n, d.k, T(1), pa + bi * d.m * d.k,
         d.b_shared ? pb : pb + bi * d.k * d.n, T(0), po + bi * d.m * d.n);
  }
}

namespace {

// acc must be the [m, n] product of 2-D operands: a throwing check, the op's inference does the
// same for programs.
MatMulDims AccumulateShape(const Tensor& acc, const Tensor& a, const Tensor& b, bool transpose_a,
                           bool transpose_b) {
  const MatMulDims d = MatMulShape(a.shape(), b.shape(), transpose_a, transpose_b);
  if (a.rank() != 2 || b.rank() != 2 || acc.shape() != Shape{d.m, d.n}) {
    throw ShapeError(
        fmt::format("matmul_accumulate: acc {} must be the [m, n] = [{}, {}] product "
                    "of 2-D a {} and b {}",
                    acc.shape().ToString(), d.m, d.n, a.shape().ToString(), b.shape().ToString()));
  }
  return d;
}

// Whether beta = 1 gives bitwise c + a·b for this k, on a 256 x 256 product of values in [-1, 1).
template <typename T>
bool AddsOnce(int64_t k) {
  constexpr int64_t kSide = 256;
  std::mt19937 rng(static_cast<uint32_t>(k));
  std::uniform_real_distribution<T> u(T(-1), T(1));
  std::vector<T> a(static_cast<size_t>(k * kSide)), b(a.size()), c(kSide * kSide), sum(c.size());
  for (T& x : a) x = u(rng);
  for (T& x : b) x = u(rng);
  for (T& x : c) x = u(rng);
  // The weight-gradient layout: aᵀ·b with a [k, m].
  Gemm(true, false, kSide, kSide, k, T(1), a.data(), b.data(), T(0), sum.data());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = c[i] + sum[i];
  Gemm(true, false, kSide, kSide, k, T(1), a.data(), b.data(), T(1), c.data());
  return std::memcmp(c.data(), sum.data(), c.size() * sizeof(T)) == 0;
}

int64_t ProbeOneBlockK() {
  int64_t fits = 0;
  for (int64_t k = 16; k <= 4096; k *= 2) {
    if (!AddsOnce<float>(k) || !AddsOnce<double>(k)) break;
    fits = k;
  }
  return fits;
}

}  // namespace

int64_t GemmOneBlockK() {
  static const int64_t k = ProbeOneBlockK();  // C++ guarantees one initialisation
  return k;
}

template <typename T>
void MatMulAccumulateReference(const Tensor& acc, const Tensor& a, const Tensor& b,
                               bool transpose_a, bool transpose_b) {
  const MatMulDims d = AccumulateShape(acc, a, b, transpose_a, transpose_b);
  const T* A = a.data<T>();
  const T* B = b.data<T>();
  T* C = acc.data<T>();
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = 0; j < d.n; ++j) {
      T sum = 0;  // the product in full, as MatMulReference sums it, then one addition
      for (int64_t p = 0; p < d.k; ++p) {
        T x = transpose_a ? A[p * d.m + i] : A[i * d.k + p];
        T y = transpose_b ? B[j * d.k + p] : B[p * d.n + j];
        sum += x * y;
      }
      C[i * d.n + j] += sum;
    }
  }
}

template <typename T>
void MatMulAccumulateBlas(const Tensor& acc, const Tensor& a, const Tensor& b, bool transpose_a,
                          bool transpose_b) {
  const MatMulDims d = AccumulateShape(acc, a, b, transpose_a, transpose_b);
  if (d.m == 0 || d.n == 0 || d.k == 0) return;  // acc += 0
  Gemm(transpose_a, transpose_b, d.m, d.n, d.k, T(1), a.data<T>(), b.data<T>(), T(1),
       acc.data<T>());
}

template void MatMulAccumulateReference<float>(const Tensor&, const Tensor&, const Tensor&, bool,
                                               bool);
template void MatMulAccumulateReference<double>(const Tensor&, const Tensor&, const Tensor&, bool,
                                                bool);
template void MatMulAccumulateBlas<float>(const Tensor&, const Tensor&, const Tensor&, bool, bool);
template void MatMulAccumulateBlas<double>(const Tensor&, const Tensor&, const Tensor&, bool, bool);
template void MatMulReference<float>(const Tensor&, const Tensor&, const Tensor&, bool, bool);
template void MatMulReference<double>(const Tensor&, const Tensor&, const Tensor&, bool, bool);
template void MatMulBlas<float>(const Tensor&, const Tensor&, const Tensor&, bool, bool);
template void MatMulBlas<double>(const Tensor&, const Tensor&, const Tensor&, bool, bool);

void SetBlasThreads(int threads) {
  EnsureBlasKernels();
  CheckBlasThreadsFit(threads);  // before OpenBLAS starts threads it could not give a buffer
  openblas_set_num_threads(threads);
}

}  // namespace sluice::kernels
