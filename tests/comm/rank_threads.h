// Helpers of the comm tests: one thread per rank, one allocator per rank.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/comm/local.h"
#include "sluice/core/caching_allocator.h"

namespace sluice::testing {

// Runs fn(rank) on its own thread for every rank of `world`, joins them all, and rethrows the
// first exception any of them threw (on this thread).
inline void RunRanks(LocalWorld& world, const std::function<void(int rank)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// One CachingAllocator per rank, as each pipeline stage has its own.
struct RankAllocators {
  explicit RankAllocators(int size) {
    for (int r = 0; r < size; ++r) allocators.push_back(std::make_unique<CachingAllocator>());
  }
  CachingAllocator& operator[](int rank) { return *allocators[rank]; }
  // Every byte handed out has come back.
  void ExpectAllFreed() const {
    for (size_t r = 0; r < allocators.size(); ++r) {
      EXPECT_EQ(allocators[r]->Stats().allocated_bytes, 0) << "rank " << r;
    }
  }
  std::vector<std::unique_ptr<CachingAllocator>> allocators;
};

}  // namespace sluice::testing
