// StoragePool (core/storage_pool.h): recycled nodes for Storage objects — a node freed on one
// thread comes back to the threads that allocate, none is parked for good on a thread that only
// frees, and a thread's exit hands its nodes over.
#include "sluice/core/storage_pool.h"

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/tensor.h"

namespace sluice {
namespace {

constexpr int kList = StoragePool::kThreadNodes;

TEST(StoragePool, ANodeFreedIsTheNextTaken) {
  void* a = StoragePool::Take();
  StoragePool::Give(a);
  EXPECT_EQ(StoragePool::Take(), a);
  StoragePool::Give(a);
}

TEST(StoragePool, NodesAreDistinctAndAligned) {
  std::vector<void*> nodes;
  for (int i = 0; i < 3 * kList; ++i) nodes.push_back(StoragePool::Take());
  EXPECT_EQ(std::set<void*>(nodes.begin(), nodes.end()).size(), nodes.size());
  for (void* p : nodes) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % StoragePool::kNodeAlign, 0u);
    std::memset(p, 0xab, StoragePool::kNodeBytes);  // the whole node is the caller's
  }
  for (void* p : nodes) StoragePool::Give(p);
}

// A thread that only frees (the async GC worker) spills what passes its list to the process-wide
// list, and hands the rest over when it exits: the allocating thread takes them all back without
// a new slab.
TEST(StoragePool, NodesFreedOnAnotherThreadComeBack) {
  constexpr int kNodes = 10 * kList;
  std::vector<void*> nodes;
  for (int i = 0; i < kNodes; ++i) nodes.push_back(StoragePool::Take());
  const int64_t global_before = StoragePool::GlobalFreeNodes();
  std::thread freer([&] {
    for (void* p : nodes) StoragePool::Give(p);
    // Everything past the thread's own list went to the process-wide list already.
    EXPECT_GE(StoragePool::GlobalFreeNodes() - global_before, kNodes - kList);
  });
  freer.join();
  EXPECT_GE(StoragePool::GlobalFreeNodes() - global_before, kNodes) << "the exit handed over";
  const int64_t slabs = StoragePool::SlabsAllocated();
  std::vector<void*> again;
  for (int i = 0; i < kNodes; ++i) again.push_back(StoragePool::Take());
  EXPECT_EQ(StoragePool::SlabsAllocated(), slabs) << "taken back, not allocated anew";
  for (void* p : again) StoragePool::Give(p);
}

// Storages made on one thread and destroyed on another, both ways at once, for a while: the pool
// does not grow with the traffic (and ThreadSanitizer sees no race).
TEST(StoragePool, StoragesCrossingThreadsDoNotGrowThePool) {
  CachingAllocator alloc;
  auto ping_pong = [&](int rounds) {
    std::vector<std::shared_ptr<Storage>> a(200), b(200);
    for (int r = 0; r < rounds; ++r) {
      for (auto& s : a) s = Storage::Create(alloc, 256);
      std::thread other([&] {
        for (auto& s : b) s = Storage::Create(alloc, 256);
        for (auto& s : a) s.reset();  // a's storages die on this thread
      });
      other.join();
      for (auto& s : b) s.reset();  // b's on this one
    }
  };
  ping_pong(3);
  const int64_t slabs = StoragePool::SlabsAllocated();
  ping_pong(30);
  // 30 rounds make and free 12,000 storages; a pool that parked the frees would need 375 slabs.
  EXPECT_LE(StoragePool::SlabsAllocated() - slabs, 4);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
}

}  // namespace
}  // namespace sluice
