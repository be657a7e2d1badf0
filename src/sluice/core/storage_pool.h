// StoragePool: recycled heap blocks for Storage objects, so that a tensor costs no malloc and no
// free in steady state. Storage::Create makes its object and shared_ptr control block in one node
// of this pool (std::allocate_shared with StorageNodeAllocator) instead of one make_shared block.
//
// How nodes move:
//   * Every node is kNodeBytes. Each thread keeps a LIFO list of free nodes, at most
//     kThreadNodes. Take pops the calling thread's list; Give pushes onto it. Neither locks.
//   * A Give onto a full list first moves kBatch nodes, as one chain, to a process-wide list of
//     chains (one mutex, taken once per kBatch frees). A Take from an empty list takes one chain
//     from there, and only when there is none allocates kBatch nodes with one operator new (a
//     slab). Slabs are never freed: a node is recycled for the life of the process (the pool
//     holds at most the peak number of live storages plus the threads' lists, ~100 bytes each).
//   * A thread's exit moves its list to the process-wide list.
// So a node freed on another thread — the async GC worker, a pipeline stage — comes back to the
// threads that allocate, a chain at a time: the worker's list fills up and spills, the executing
// thread's list runs dry and refills. Nothing is parked for good on a thread that only frees.
//
// Thread-safety: Take and Give may be called from any thread at any time, including during
// thread exit (after the thread's list is gone they go straight to the process-wide list).
// Counters are for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace sluice {

class StoragePool {
 public:
  static constexpr size_t kNodeBytes = 96;
  static constexpr size_t kNodeAlign = 16;
  static constexpr int kBatch = 32;
  static constexpr int kThreadNodes = 2 * kBatch;

  // A node of kNodeBytes, kNodeAlign-aligned. Throws std::bad_alloc when a slab cannot be had.
  static void* Take();
  // Returns a node from Take (of any thread).
  static void Give(void* node) noexcept;

  // Slabs allocated since the process started (each one operator new of kBatch nodes).
  static int64_t SlabsAllocated();
  // Free nodes in the process-wide list now.
  static int64_t GlobalFreeNodes();
};

// The allocator std::allocate_shared uses for a Storage: a node of the pool when the control block
// fits one (it does: storage.cc checks it at compile time), operator new otherwise.
template <typename T>
struct StorageNodeAllocator {
  using value_type = T;
  StorageNodeAllocator() = default;
  template <typename U>
  StorageNodeAllocator(const StorageNodeAllocator<U>&) {}  // NOLINT: rebinding converts

  static constexpr bool kPooled =
      sizeof(T) <= StoragePool::kNodeBytes && alignof(T) <= StoragePool::kNodeAlign;

  T* allocate(size_t n) {
    if (kPooled && n == 1) return static_cast<T*>(StoragePool::Take());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (kPooled && n == 1) return StoragePool::Give(p);
    ::operator delete(p);
  }
  template <typename U>
  bool operator==(const StorageNodeAllocator<U>&) const {
    return true;
  }
};

}  // namespace sluice
