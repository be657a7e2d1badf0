#include "sluice/core/allocator.h"

#include "sluice/core/caching_allocator.h"

namespace sluice {

Allocator& DefaultAllocator() {
  // Never destroyed: tensors with static lifetime may still return memory at exit.
  static Allocator* const instance = new CachingAllocator();
  return *instance;
}

}  // namespace sluice
