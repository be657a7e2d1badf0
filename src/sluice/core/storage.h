// Storage: the reference-counted owner of one allocation.
//
// A Storage is created through Storage::Create, which returns a std::shared_ptr; the shared_ptr's
// count is the reference count. The object and its count live in one recycled node of the
// StoragePool (core/storage_pool.h), not in a heap block of their own. Tensors and views share one
// Storage; the memory goes back to the allocator when the last reference is dropped — on whichever
// thread drops it (this is how the asynchronous garbage collector moves freeing off the executing
// thread).
//
// An owning Storage can give its memory back early and take as much again later (Vacate, Refill)
// instead of being destroyed and made anew: an executable keeps an intermediate's storage in the
// value's slot from one run to the next (exec/interpreter.cc), and the allocator sees the same
// frees and allocations at the same moments. A vacant Storage's data() is null.
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
  // Owns its memory and holds none now (after Vacate; always for a zero-byte storage).
  bool vacant() const { return owns_ && data_ == nullptr; }

  // Gives the memory back to the allocator; data() is null until Refill. REQUIRES: owns its
  // memory, and the caller holds the only reference (no one can see the memory go).
  void Vacate();
  // Allocates nbytes() again (a new token). Throws what Allocator::AllocateWithToken throws; the
  // storage then stays vacant. REQUIRES: vacant().
  void Refill();

  // Exchanges the memory of `a` and `b`: every tensor and view of `a` then reads what `b` held,
  // and the other way round — post-validation's double buffer switches which copy of the state is
  // live with it, for everyone holding the state's tensors (step/stage_program.h). REQUIRES: both
  // own their memory, of the same nbytes() from the same allocator, and no other thread uses either
  // meanwhile.
  static void SwapMemory(Storage& a, Storage& b);

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
