// Storage: the reference-counted owner of one allocation.
//
// A Storage is created through Storage::Create, which returns a std::shared_ptr; the shared_ptr's
// count is the reference count. The object and its count live in one recycled node of the
// StoragePool (core/storage_pool.h), not in a heap block of their own. Tensors and views share one
// Storage; the memory goes back to the allocator when the last reference is dropped — on whichever
// thread drops it (this is how the asynchronous garbage collector moves freeing off the executing
// thread).
//
// A *borrowed* Storage (Storage::Borrowed) owns no memory: it is a window of nbytes() onto memory
// its creator holds — an executable's arena (exec/memory_plan.h) — and its creator points it at
// that memory with Rebind for as long as it holds it. Destroying it frees nothing; allocator()
// is still the one copies of it should come from (Tensor::Reshape of a strided view).
//
// Invariants: an owning Storage's data() is non-null and kAlignment-aligned when nbytes() > 0; a
// zero-byte Storage holds no memory and never calls its allocator. A borrowed Storage's data() is
// what its creator last bound (null when unbound). The allocator must outlive the Storage.
#pragma once

#include <cstddef>
#include <memory>

#include "sluice/core/allocator.h"

namespace sluice {

class Storage {
 public:
  // Allocates `nbytes` from `allocator`. Throws what Allocator::Allocate throws.
  static std::shared_ptr<Storage> Create(Allocator& allocator, size_t nbytes);
  // A borrowed Storage of `nbytes`, unbound (data() null) until Rebind. Allocates nothing from
  // `allocator`, which copies of its tensors use.
  static std::shared_ptr<Storage> Borrowed(Allocator& allocator, size_t nbytes);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Allocator* allocator() const { return allocator_; }
  bool borrowed() const { return !owns_; }

  // Points a borrowed Storage at `data` (kAlignment-aligned, at least nbytes() long, or null to
  // unbind). REQUIRES: borrowed(), and no other thread uses the storage meanwhile.
  void Rebind(void* data);

 private:
  Storage(Allocator* allocator, void* data, size_t nbytes, bool owns, uintptr_t token)
      : allocator_(allocator), data_(data), nbytes_(nbytes), token_(token), owns_(owns) {}

  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
  uintptr_t token_;  // from Allocator::AllocateWithToken, handed back when freeing
  bool owns_;
};

}  // namespace sluice
