// Tests of CachingAllocator's per-thread fast path (AllocateWithToken / DeallocateWithToken, which
// Storage uses): parked blocks are reused on their thread, statistics stay exact across threads,
// a block freed on another thread parks there, caches go back to the bins on flush, release and
// thread exit, an allocator may die while other threads hold caches of it, and bad frees are still
// reported. Clean under ThreadSanitizer.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <unistd.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/core/storage.h"

namespace sluice {
namespace {

constexpr size_t KiB = size_t{1} << 10;

struct Held {
  void* ptr;
  size_t bytes;
  uintptr_t token;
};

Held Take(CachingAllocator& alloc, size_t bytes) {
  Held h{nullptr, bytes, 0};
  h.ptr = alloc.AllocateWithToken(bytes, &h.token);
  return h;
}

void Give(CachingAllocator& alloc, const Held& h) {
  alloc.DeallocateWithToken(h.ptr, h.bytes, h.token);
}

TEST(ThreadCache, AFreedBlockIsParkedAndReusedByItsClass) {
  CachingAllocator alloc({.thread_cache = true});
  const Held a = Take(alloc, 1000);  // the locked path: nothing parked yet
  EXPECT_EQ(alloc.Stats().allocated_bytes, 1000);
  Give(alloc, a);
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 1u);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0) << "a parked block counts as freed";
  alloc.CheckInvariants();
  const Held b = Take(alloc, 1023);  // the same 1 KiB class: the parked block
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 0u);
  const Held c = Take(alloc, 1000);  // nothing parked of that class: a new block
  EXPECT_NE(c.ptr, a.ptr);
  const MemoryStats s = alloc.Stats();
  EXPECT_EQ(s.allocated_bytes, 2023);
  EXPECT_EQ(s.peak_allocated_bytes, 2023);
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_frees, 1);
  alloc.CheckInvariants();
  Give(alloc, b);
  alloc.Deallocate(c.ptr, c.bytes);  // the plain pair still works on a token block
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.Stats().num_frees, 3);
  alloc.CheckInvariants();
}

TEST(ThreadCache, LargeRequestsAndFullClassesTakeTheLockedPath) {
  CachingAllocator alloc({.thread_cache = true});
  const Held big = Take(alloc, CachingAllocator::kMaxCachedBytes + 1);
  Give(alloc, big);
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 0u);
  std::vector<Held> held;
  for (int i = 0; i < CachingAllocator::kThreadCacheDepth + 3; ++i)
    held.push_back(Take(alloc, 100));
  for (const Held& h : held) Give(alloc, h);
  EXPECT_EQ(alloc.NumThreadCachedBlocks(),
            static_cast<size_t>(CachingAllocator::kThreadCacheDepth));
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  alloc.CheckInvariants();
}

TEST(ThreadCache, ReleaseCachedAndFlushReturnParkedBlocks) {
  CachingAllocator alloc({.thread_cache = true});
  Give(alloc, Take(alloc, 300));
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 1u);
  alloc.FlushThreadCache();
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 0u);
  EXPECT_EQ(alloc.NumFreeBlocks(), 1u) << "the block coalesced with the rest of its chunk";
  Give(alloc, Take(alloc, 300));
  EXPECT_EQ(alloc.ReleaseCached(), static_cast<size_t>(sysconf(_SC_PAGESIZE)))
      << "the caller's parked block is flushed first";
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
  alloc.CheckInvariants();
}

TEST(ThreadCache, StoragesUseTheFastPath) {
  CachingAllocator alloc({.thread_cache = true});
  void* first;
  {
    auto s = Storage::Create(alloc, 256);
    first = s->data();
  }
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 1u);
  auto again = Storage::Create(alloc, 256);
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 256);
}

TEST(ThreadCache, BadFreesAreStillReported) {
  CachingAllocator alloc({.thread_cache = true});
  const Held a = Take(alloc, 100);
  try {
    alloc.DeallocateWithToken(a.ptr, 99, a.token);
    FAIL() << "a wrong size was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("allocated with 100 bytes"), std::string::npos)
        << e.what();
  }
  Give(alloc, a);  // parked
  try {
    Give(alloc, a);
    FAIL() << "a double free was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("already freed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.Stats().num_frees, 1);
  alloc.CheckInvariants();
}

TEST(ThreadCache, TheBudgetHoldsOnTheFastPath) {
  CachingAllocator alloc({.thread_cache = true, .max_allocated_bytes = 1000});
  Give(alloc, Take(alloc, 600));  // parked
  const Held kept = Take(alloc, 500);
  EXPECT_THROW(Take(alloc, 600), OutOfMemory);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 500);
  EXPECT_EQ(alloc.Stats().peak_allocated_bytes, 600);
  Give(alloc, kept);
  Give(alloc, Take(alloc, 1000));
  alloc.CheckInvariants();
}

TEST(ThreadCache, TheTimelineSeesEveryEvent) {
  CachingAllocator alloc({.thread_cache = true});
  Give(alloc, Take(alloc, 64));  // parked before the timeline starts
  alloc.EnableTimeline(true);
  const Held a = Take(alloc, 64);
  Give(alloc, a);
  const std::vector<MemoryEvent> events = alloc.Timeline();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].delta_bytes, 64);
  EXPECT_EQ(events[0].allocated_bytes, 64);
  EXPECT_EQ(events[1].allocated_bytes, 0);
  alloc.EnableTimeline(false);
}

// The async GC's pattern: one thread allocates, another frees (and parks the blocks in its own
// cache); allocated bytes are exact throughout, and the freeing thread's exit returns its cache.
TEST(ThreadCache, BlocksFreedOnAnotherThreadParkThereAndReturnAtItsExit) {
  CachingAllocator alloc({.thread_cache = true});
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Held> queue;  // guarded by mu
  bool done = false;       // guarded by mu
  constexpr int kBlocks = 3000;
  int64_t sent_bytes = 0;
  std::thread consumer([&] {
    for (;;) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !queue.empty() || done; });
      if (queue.empty()) return;
      const Held h = queue.front();
      queue.pop_front();
      lock.unlock();
      Give(alloc, h);
    }
  });
  std::mt19937_64 rng(11);
  for (int i = 0; i < kBlocks; ++i) {
    const Held h = Take(alloc, std::uniform_int_distribution<size_t>(1, 8 * KiB)(rng));
    sent_bytes += static_cast<int64_t>(h.bytes);
    {
      std::lock_guard lock(mu);
      queue.push_back(h);
    }
    cv.notify_one();
    if (i % 256 == 0) {
      const MemoryStats s = alloc.Stats();  // read while the other thread frees
      EXPECT_GE(s.allocated_bytes, 0);
      EXPECT_LE(s.allocated_bytes, sent_bytes);
    }
  }
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_one();
  consumer.join();
  const MemoryStats s = alloc.Stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.num_allocs, kBlocks);
  EXPECT_EQ(s.num_frees, kBlocks) << "the exited thread's counts are kept";
  EXPECT_EQ(alloc.NumThreadCachedBlocks(), 0u) << "the consumer's exit flushed its cache";
  alloc.CheckInvariants();
  alloc.ReleaseCached();
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
}

// Several threads allocate and free through their caches at once, some freeing each other's
// blocks; the allocated bytes and the peak are exact.
TEST(ThreadCache, AllocatedBytesStayExactAcrossThreads) {
  CachingAllocator alloc({.thread_cache = true});
  constexpr int kThreads = 4;
  std::mutex mu;
  std::vector<Held> shared;  // guarded by mu: blocks any thread may free
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(200 + t);
      std::vector<Held> mine;
      for (int i = 0; i < 3000; ++i) {
        const int what = std::uniform_int_distribution<int>(0, 9)(rng);
        if (what < 5 || mine.empty()) {
          mine.push_back(Take(alloc, std::uniform_int_distribution<size_t>(1, 70 * KiB)(rng)));
        } else if (what < 8) {
          Give(alloc, mine.back());
          mine.pop_back();
        } else if (what == 8) {
          std::lock_guard lock(mu);
          shared.push_back(mine.back());
          mine.pop_back();
        } else {
          Held h{};
          {
            std::lock_guard lock(mu);
            if (shared.empty()) continue;
            h = shared.back();
            shared.pop_back();
          }
          Give(alloc, h);
        }
      }
      for (const Held& h : mine) Give(alloc, h);
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t left = 0;
  for (const Held& h : shared) left += static_cast<int64_t>(h.bytes);
  EXPECT_EQ(alloc.Stats().allocated_bytes, left);
  alloc.CheckInvariants();
  for (const Held& h : shared) Give(alloc, h);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  alloc.CheckInvariants();
}

// A thread keeps a cache of an allocator that is destroyed before the thread exits: the cache is
// dropped with it, and the thread goes on with another allocator.
TEST(ThreadCache, AnAllocatorMayDieWhileAThreadHoldsItsCache) {
  std::mutex mu;
  std::condition_variable cv;
  int stage = 0;  // guarded by mu: 1 parked, 2 allocator gone
  auto alloc = std::make_unique<CachingAllocator>(CachingAllocatorOptions{.thread_cache = true});
  std::thread worker([&] {
    Give(*alloc, Take(*alloc, 200));  // parked in this thread's cache
    {
      std::lock_guard lock(mu);
      stage = 1;
    }
    cv.notify_all();
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return stage == 2; });
    lock.unlock();
    CachingAllocator next({.thread_cache = true});
    Give(next, Take(next, 200));
    Give(next, Take(next, 200));
    EXPECT_EQ(next.NumThreadCachedBlocks(), 1u);
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return stage == 1; });
  }
  EXPECT_EQ(alloc->NumThreadCachedBlocks(), 1u);
  EXPECT_EQ(alloc->Stats().allocated_bytes, 0);
  alloc.reset();
  {
    std::lock_guard lock(mu);
    stage = 2;
  }
  cv.notify_all();
  worker.join();
}

}  // namespace
}  // namespace sluice
