// Allocator: the one interface through which sluice obtains tensor memory.
//
// Every instance keeps its own MemoryStats, so several can coexist (one per pipeline stage) and
// each reports only its own bytes.
//
// Contract for all implementations:
//   * Allocate(bytes) returns memory aligned to kAlignment for `bytes` > 0. It throws
//     InvalidArgument for 0 or for a size above kMaxAllocationBytes, and OutOfMemory when the
//     operating system refuses. It never returns nullptr.
//   * Deallocate(ptr, bytes) takes back a pointer from Allocate of the same instance with the same
//     `bytes`.
//   * Thread-safety: all methods may be called concurrently; in particular one thread may allocate
//     while another frees (the asynchronous garbage collector frees on its own thread).
//   * An allocator must outlive every Storage it handed memory to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "sluice/core/memory_stats.h"

namespace sluice {

inline constexpr size_t kAlignment = 64;
// Requests above this (1 TiB) are rejected as absurd before asking the OS.
inline constexpr size_t kMaxAllocationBytes = size_t{1} << 40;

// What one Deallocate costs, as an allocator declares it: the GC's auto mode frees in place where
// it is cheap and on a worker thread where it is expensive (exec/garbage_collector.h
// ResolveGcMode).
//   kCheap      about a function call: the block goes back to the allocator's own cache
//   kExpensive  it may return memory to the OS or a device (munmap, a driver call): microseconds
enum class FreeCost : uint8_t { kCheap, kExpensive };

class Allocator {
 public:
  virtual ~Allocator() = default;

  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;

  // The same pair with a token: AllocateWithToken may set *token to anything, and the caller
  // hands it back to DeallocateWithToken with the pointer and size (Storage does). An allocator
  // may keep there what finds its bookkeeping for the block without a lookup (CachingAllocator's
  // per-thread fast path). Memory from either Allocate may go back through either Deallocate
  // (token 0 when it came from plain Allocate). The defaults ignore the token.
  virtual void* AllocateWithToken(size_t bytes, uintptr_t* token) {
    *token = 0;
    return Allocate(bytes);
  }
  virtual void DeallocateWithToken(void* ptr, size_t bytes, uintptr_t /*token*/) {
    Deallocate(ptr, bytes);
  }

  // A consistent snapshot of this instance's statistics.
  virtual MemoryStats Stats() const = 0;
  // Peaks restart from the current values.
  virtual void ResetPeak() = 0;
  // Records (time, ±bytes, tag) for every allocation and free while on; turning on clears.
  virtual void EnableTimeline(bool on) = 0;
  virtual std::vector<MemoryEvent> Timeline() const = 0;

  // Short name for reports: "system", "caching".
  virtual std::string_view name() const = 0;
  // What a Deallocate costs (see FreeCost); a property of the implementation, not of a moment.
  virtual FreeCost free_cost() const = 0;
};

// Throws InvalidArgument when `bytes` is 0 or above kMaxAllocationBytes. `who` names the allocator.
void ValidateAllocationSize(size_t bytes, std::string_view who);

// Rounds `bytes` up to a multiple of `multiple` (a power of two).
constexpr size_t RoundUp(size_t bytes, size_t multiple) {
  return (bytes + multiple - 1) & ~(multiple - 1);
}

// The process-wide allocator used when none is given (a CachingAllocator).
Allocator& DefaultAllocator();

}  // namespace sluice
