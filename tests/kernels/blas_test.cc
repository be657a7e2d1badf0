// kernels/blas.h: sluice replaces OpenBLAS's fallback kernels on CPUs the library does not know.
#include "sluice/kernels/blas.h"

#include <cblas.h>

#include <cstdlib>

#include <gtest/gtest.h>

#include "sluice/kernels/matmul.h"

namespace sluice::kernels {
namespace {

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
