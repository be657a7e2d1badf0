// Storage: the reference-counted owner of one allocation.
//
// A Storage is created through Storage::Create, which returns a std::shared_ptr; the shared_ptr's
// count is the reference count. Tensors and views share one Storage; the memory goes back to the
// allocator when the last reference is dropped — on whichever thread drops it (this is how the
// asynchronous garbage collector moves freeing off the executing thread).
//
// Invariants: data() is non-null and kAlignment-aligned when nbytes() > 0; a zero-byte Storage
// holds no memory and never calls its allocator. The allocator must outlive the Storage.
#pragma once

#include <cstddef>
#include <memory>

#include "sluice/core/allocator.h"

namespace sluice {

class Storage {
 public:
  // Allocates `nbytes` from `allocator`. Throws what Allocator::Allocate throws.
  static std::shared_ptr<Storage> Create(Allocator& allocator, size_t nbytes);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Allocator* allocator() const { return allocator_; }

 private:
  Storage(Allocator* allocator, void* data, size_t nbytes)
      : allocator_(allocator), data_(data), nbytes_(nbytes) {}

  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
};

}  // namespace sluice
