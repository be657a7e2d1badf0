// What the machine and the process's limits leave for it: the memory Linux reports available
// (/proc/meminfo MemAvailable) and the address-space limit (RLIMIT_AS, `ulimit -v`) beside the
// address space already mapped (/proc/self/status VmSize). Read before work that would otherwise
// fail deep inside an allocator — or, for OpenBLAS, never return — so that the error can name the
// option that asks for too much (kernels/blas.h CheckBlasThreadsFit, cli's memory check) — and
// the process's peak resident set (VmHWM), what the machine saw of a run, beside the tensor bytes
// its allocator counted (the training summary).
//
// Thread-safety: ReadSystemMemory only reads files and a limit; call it from any thread.
#pragma once

#include <cstdint>

namespace sluice {

struct SystemMemory {
  int64_t available_bytes = -1;      // MemAvailable; -1 when /proc/meminfo does not say
  int64_t address_limit_bytes = -1;  // the soft RLIMIT_AS; -1 when unlimited
  int64_t address_used_bytes = 0;    // VmSize: what this process has mapped now
  int64_t peak_resident_bytes = -1;  // VmHWM: the most of it ever resident; -1 when unknown

  // The address space the limit leaves (-1 when unlimited).
  int64_t AddressLeft() const {
    return address_limit_bytes < 0 ? -1 : address_limit_bytes - address_used_bytes;
  }
};

SystemMemory ReadSystemMemory();

}  // namespace sluice
