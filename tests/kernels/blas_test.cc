// kernels/blas.h: sluice replaces OpenBLAS's fallback kernels on CPUs the library does not know.
#include "sluice/kernels/blas.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/kernels/matmul.h"

namespace sluice::kernels {
namespace {

// A weight gradient added into its buffer by one GEMM with beta = 1 is bitwise the buffer plus
// the product MatMulBlas gives, for every k up to GemmOneBlockK() (and the reference likewise).
TEST(Blas, AccumulatingGemmIsTheBufferPlusTheProductWithinOneBlock) {
  const int64_t one_block = GemmOneBlockK();
  ASSERT_GE(one_block, 64) << "OpenBLAS blocks k by 128 or more on every x86 core";
  for (const int64_t k : {int64_t{1}, int64_t{7}, int64_t{64}, one_block}) {
    SCOPED_TRACE(k);
    // dW [m, n] = aᵀ·b with a [k, m], b [k, n]: the weight-gradient layout.
    const int64_t m = 33, n = 65;
    const Tensor a = Tensor::Empty({k, m}, DType::kF32), b = Tensor::Empty({k, n}, DType::kF32);
    const Tensor acc = Tensor::Empty({m, n}, DType::kF32);
    uint32_t state = 7;
    auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
    };
    for (const Tensor* t : {&a, &b, &acc})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = next();
    const Tensor product = Tensor::Empty({m, n}, DType::kF32);
    MatMulBlas<float>(a, b, product, true, false);
    std::vector<float> expected(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m * n; ++i)
      expected[static_cast<size_t>(i)] = acc.data<float>()[i] + product.data<float>()[i];
    const Tensor ref = Tensor::Empty({m, n}, DType::kF32);
    ref.CopyFrom(acc);
    MatMulAccumulateBlas<float>(acc, a, b, true, false);
    EXPECT_EQ(std::memcmp(acc.data<float>(), expected.data(), expected.size() * sizeof(float)), 0);
    // The reference sums the product in full first, then adds: its own matmul plus the buffer.
    MatMulReference<float>(a, b, product, true, false);
    for (int64_t i = 0; i < m * n; ++i)
      expected[static_cast<size_t>(i)] = ref.data<float>()[i] + product.data<float>()[i];
    MatMulAccumulateReference<float>(ref, a, b, true, false);
    EXPECT_EQ(std::memcmp(ref.data<float>(), expected.data(), expected.size() * sizeof(float)), 0);
  }
}

TEST(Blas, APreAvx2FallbackIsReplacedByWhatTheCpuRuns) {
  EXPECT_EQ(BetterBlasCore("Prescott", "", /*avx2=*/true, /*avx512=*/true), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Prescott", "", true, false), "Haswell");
  EXPECT_EQ(BetterBlasCore("Nehalem", "", true, false), "Haswell");
  EXPECT_EQ(BetterBlasCore("Sandybridge", "", true, true), "SkylakeX");
}

TEST(Blas, AKnownCoreAnOldCpuOrTheUsersChoiceIsKept) {
  EXPECT_EQ(BetterBlasCore("Haswell", "", true, true), "");  // OpenBLAS knew this one
  EXPECT_EQ(BetterBlasCore("SkylakeX", "", true, true), "");
  EXPECT_EQ(BetterBlasCore("Zen", "", true, false), "");
  EXPECT_EQ(BetterBlasCore("Prescott", "", false, false), "");        // a CPU without AVX2: right
  EXPECT_EQ(BetterBlasCore("Prescott", "Prescott", true, true), "");  // OPENBLAS_CORETYPE set
}

// On this machine: whatever OpenBLAS chose, the kernels in use afterwards are the ones sluice's
// rule asks for, GEMM still computes the right product, and the environment is as it was.
TEST(Blas, TheKernelsInUseFollowTheRule) {
  const bool user_set = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  const BlasKernels& k = EnsureBlasKernels();
  EXPECT_EQ(k.core, openblas_get_corename());
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE") != nullptr, user_set);
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const std::string want = BetterBlasCore(k.openblas_choice, user_set ? "set" : "", avx2, avx512);
  if (!want.empty()) {
    EXPECT_TRUE(k.switched);
    EXPECT_EQ(k.core, want);
  } else {
    EXPECT_FALSE(k.switched);
    EXPECT_EQ(k.core, k.openblas_choice);
  }
  EXPECT_EQ(&EnsureBlasKernels(), &k);  // once per process
  // [2,3]·[3,2] through the kernels in use.
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};
  float c[4] = {};
  Gemm(false, false, 2, 2, 3, 1.0f, a, b, 0.0f, c);
  EXPECT_EQ(c[0], 58);
  EXPECT_EQ(c[1], 64);
  EXPECT_EQ(c[2], 139);
  EXPECT_EQ(c[3], 154);
}

}  // namespace
}  // namespace sluice::kernels
