// SystemAllocator: no caching at all. Small requests go to aligned_alloc; requests of
// kMapThreshold bytes or more are mapped from the OS (mmap) on every Allocate and unmapped
// (munmap) on every Deallocate, so freeing a large block is genuinely expensive — the case that
// asynchronous garbage collection exists for.
//
// Reserved bytes: the mapped length (page-rounded) for large blocks, the 64-byte-rounded size for
// small ones. Thread-safe (a mutex guards the statistics only; the OS calls run outside it).
#pragma once

#include <mutex>

#include "sluice/core/allocator.h"

namespace sluice {

class SystemAllocator final : public Allocator {
 public:
  static constexpr size_t kMapThreshold = 128 * 1024;

  SystemAllocator() = default;
  ~SystemAllocator() override = default;

  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  MemoryStats Stats() const override;
  void ResetPeak() override;
  void EnableTimeline(bool on) override;
  std::vector<MemoryEvent> Timeline() const override;
  std::string_view name() const override { return "system"; }
  // A free of kMapThreshold bytes or more is a munmap.
  FreeCost free_cost() const override { return FreeCost::kExpensive; }

 private:
  static size_t ReservedSize(size_t bytes);

  mutable std::mutex mu_;
  MemoryStatsRecorder recorder_;  // guarded by mu_
};

}  // namespace sluice
