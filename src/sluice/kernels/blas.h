// Which GEMM kernels OpenBLAS runs, and setting them right on CPUs it does not know.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's is) picks its kernels for the CPU when it loads. A CPU
// newer than the library falls back to "Prescott", SSE3 kernels: OpenBLAS 0.3.21 (Debian 12) does
// not know Sapphire or Emerald Rapids, and there runs GEMM several times slower than its AVX-512
// kernels (docs/benchmarks.md, "GEMM kernels"). At sluice's first BLAS call EnsureBlasKernels()
// checks the choice: when OpenBLAS took a pre-AVX2 core on a CPU that runs AVX2 + FMA (or AVX-512),
// it switches to the kernels the CPU runs ("Haswell", or "SkylakeX"). A choice made by the user
// through OPENBLAS_CORETYPE is never changed, and a BLAS without OpenBLAS's dynamic dispatch is
// left alone.
//
// Thread-safety: EnsureBlasKernels is idempotent and safe from any thread; every BLAS call sluice
// makes (GEMM, axpy, scal, the thread setting) goes through it, so the switch happens before
// OpenBLAS runs any work, and no other sluice thread reaches OpenBLAS until it is done. OpenBLAS's
// own worker threads, started when the library loads, read the kernel table only when a call hands
// them work — except once at their own start, so the switch is made at the first BLAS call, not at
// the start of main() (ThreadSanitizer caught a worker still starting there).
//
// Example:
//   kernels::BlasKernels k = kernels::EnsureBlasKernels();
//   fmt::print("BLAS {}{}\n", k.core, k.switched ? " (OpenBLAS chose " + k.openblas_choice + ")" :
//   "");
#pragma once

#include <cstdint>
#include <string>

namespace sluice::kernels {

struct BlasKernels {
  std::string core;             // the kernels GEMM runs: "SkylakeX", "Haswell", "Prescott", ...
  std::string openblas_choice;  // what OpenBLAS chose by itself when it loaded
  bool switched = false;        // sluice replaced openblas_choice by core
};

// Checks (once per process) and returns the GEMM kernels in use.
const BlasKernels& EnsureBlasKernels();

// The kernels sluice would choose: `openblas_choice` is OpenBLAS's own pick, `user_choice` the
// OPENBLAS_CORETYPE setting (empty when unset), and `avx2`/`avx512` what the CPU and OS support.
// Empty: keep OpenBLAS's pick. (Pure; EnsureBlasKernels applies it.)
std::string BetterBlasCore(const std::string& openblas_choice, const std::string& user_choice,
                           bool avx2, bool avx512);

// OpenBLAS gives each of its threads a buffer of 128 MiB (its BUFFER_SIZE on x86-64, plus a page),
// allocated when the thread starts or first works; when that allocation fails, OpenBLAS's
// allocator retries for ever: the GEMM never returns, nor does the process's exit, which joins the
// thread (under `ulimit -v 8388608`, `--threads 64` hung so). CheckBlasThreadsFit(threads) is
// called before OpenBLAS is given `threads` threads: under an address-space limit (RLIMIT_AS) it
// throws ResourceError unless threads - 1 such buffers, their stacks and those of as many intra-op
// workers (kernels/parallel.h) fit in what the limit leaves, naming the most --threads that fit.
// Without a limit it checks nothing: memory the machine lacks is the memory check's
// (docs/errors.md, "A resource check before allocation").
inline constexpr int64_t kOpenBlasBufferBytes = (int64_t{128} << 20) + 4096;
// The address space `threads` intra-op threads take beyond the calling one's (both pools).
int64_t BlasThreadsAddressSpace(int threads);
void CheckBlasThreadsFit(int threads);

}  // namespace sluice::kernels
