#include "sluice/kernels/blas.h"

#include <dlfcn.h>

#include <sys/resource.h>

#include <cblas.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/system_memory.h"

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

int64_t BlasThreadsAddressSpace(int threads) {
  // A thread's stack is RLIMIT_STACK's soft limit (glibc's default; 8 MiB when unlimited).
  int64_t stack = int64_t{8} << 20;
  rlimit limit{};
  if (::getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    stack = static_cast<int64_t>(limit.rlim_cur);
  }
  const int64_t more = std::max(0, threads - 1);
  return more * (kOpenBlasBufferBytes + stack) + more * stack;
}

void CheckBlasThreadsFit(int threads) {
  const SystemMemory m = ReadSystemMemory();
  const int64_t left = m.AddressLeft();
  if (left < 0 || BlasThreadsAddressSpace(threads) <= left) return;
  int fit = threads;
  while (fit > 1 && BlasThreadsAddressSpace(fit) > left) --fit;
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
  throw ResourceError(fmt::format(
      "{} intra-op threads need {:.1f} GiB of address space (OpenBLAS's 128 MiB buffer and the "
      "stacks of each thread past the first), and the address-space limit (ulimit -v, {:.1f} GiB) "
      "leaves {:.1f} GiB: ask for at most {} (--threads {}) or raise the limit",
      threads, gib(BlasThreadsAddressSpace(threads)), gib(m.address_limit_bytes),
      gib(std::max<int64_t>(left, 0)), fit, fit));
}

const BlasKernels& EnsureBlasKernels() {
  static const BlasKernels kernels = Choose();  // C++ guarantees one initialisation
  return kernels;
}

}  // namespace sluice::kernels
