#include "sluice/core/system_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

void ValidateAllocationSize(size_t bytes, std::string_view who) {
  if (bytes == 0) {
    throw InvalidArgument(fmt::format("{} allocator: cannot allocate 0 bytes", who));
  }
  if (bytes > kMaxAllocationBytes) {
    throw InvalidArgument(
        fmt::format("{} allocator: request of {} bytes exceeds the limit of {} bytes (1 TiB)", who,
                    bytes, kMaxAllocationBytes));
  }
}

size_t SystemAllocator::ReservedSize(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes >= kMapThreshold ? RoundUp(bytes, page) : RoundUp(bytes, kAlignment);
}

void* SystemAllocator::Allocate(size_t bytes) {
  ValidateAllocationSize(bytes, name());
  const size_t reserved = ReservedSize(bytes);
  void* ptr = nullptr;
  if (bytes >= kMapThreshold) {
    ptr = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) ptr = nullptr;
  } else {
    ptr = std::aligned_alloc(kAlignment, reserved);
  }
  if (ptr == nullptr) {
    throw OutOfMemory(
        fmt::format("system allocator: the OS refused {} bytes ({})", bytes, std::strerror(errno)));
  }
  std::lock_guard lock(mu_);
  recorder_.OnReserve(static_cast<int64_t>(reserved));
  recorder_.OnAllocate(static_cast<int64_t>(bytes));
  return ptr;
}

void SystemAllocator::Deallocate(void* ptr, size_t bytes) {
  const size_t reserved = ReservedSize(bytes);
  if (bytes >= kMapThreshold) {
    SLUICE_CHECK(munmap(ptr, reserved) == 0, "munmap of {} bytes failed", reserved);
  } else {
    std::free(ptr);
  }
  std::lock_guard lock(mu_);
  recorder_.OnFree(static_cast<int64_t>(bytes));
  recorder_.OnUnreserve(static_cast<int64_t>(reserved));
}

MemoryStats SystemAllocator::Stats() const {
  std::lock_guard lock(mu_);
  return recorder_.stats();
}

void SystemAllocator::ResetPeak() {
  std::lock_guard lock(mu_);
  recorder_.ResetPeak();
}

void SystemAllocator::EnableTimeline(bool on) {
  std::lock_guard lock(mu_);
  recorder_.EnableTimeline(on);
}

std::vector<MemoryEvent> SystemAllocator::Timeline() const {
  std::lock_guard lock(mu_);
  return recorder_.timeline();
}

}  // namespace sluice
