#include "sluice/kernels/blas.h"

#include <dlfcn.h>

#include <cblas.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

namespace sluice::kernels {
namespace {

// OpenBLAS's names for cores whose kernels predate AVX2: on a CPU with AVX2 one of these means
// OpenBLAS did not recognise it (or was told so).
constexpr const char* kPreAvx2Cores[] = {
    "prescott",    "core2",   "penryn",       "dunnington", "nehalem",    "sandybridge",
    "atom",        "nano",    "barcelona",    "bobcat",     "bulldozer",  "piledriver",
    "steamroller", "opteron", "opteron_sse3", "katmai",     "coppermine", "northwood",
    "banias",      "athlon",  "unknown"};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

BlasKernels Choose() {
  BlasKernels k;
  k.openblas_choice = k.core = openblas_get_corename();
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  // __builtin_cpu_supports checks that the OS saves the vector registers too (XCR0).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const std::string better = BetterBlasCore(k.openblas_choice, user ? user : "", avx2, avx512);
  if (better.empty()) return k;
  // Exported by DYNAMIC_ARCH builds only: looked up rather than linked, so another build of
  // OpenBLAS still links and simply keeps its kernels.
  using Hook = void (*)();
  auto quit = reinterpret_cast<Hook>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Hook>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return k;
  // gotoblas_dynamic_init reads the core from OPENBLAS_CORETYPE; the variable is restored after.
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  quit();
  init();
  unsetenv("OPENBLAS_CORETYPE");
  k.core = openblas_get_corename();
  k.switched = k.core != k.openblas_choice;
  return k;
}

}  // namespace

std::string BetterBlasCore(const std::string& openblas_choice, const std::string& user_choice,
                           bool avx2, bool avx512) {
  if (!user_choice.empty() || !avx2) return "";
  const std::string core = Lower(openblas_choice);
  if (std::find(std::begin(kPreAvx2Cores), std::end(kPreAvx2Cores), core) ==
      std::end(kPreAvx2Cores)) {
    return "";
  }
  return avx512 ? "SkylakeX" : "Haswell";
}

const BlasKernels& EnsureBlasKernels() {
  static const BlasKernels kernels = Choose();  // C++ guarantees one initialisation
  return kernels;
}

}  // namespace sluice::kernels
