#include "sluice/core/allocator.h"

#include "sluice/core/system_allocator.h"

namespace sluice {

Allocator& DefaultAllocator() {
  // Never destroyed: tensors with static lifetime may still return memory at exit.
  static Allocator* const instance = new SystemAllocator();
  return *instance;
}

}  // namespace sluice
