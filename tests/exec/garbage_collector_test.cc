// The async garbage collector on its own: hand-over, drain barrier, back-pressure, the worker's
// lifetime (never exits early, shutdown mid-queue frees everything) and error propagation; and what
// the auto mode resolves to for each allocator.
#include "sluice/exec/garbage_collector.h"

#include <chrono>
#include <semaphore>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/core/system_allocator.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// Batches of `per_batch` storages of `bytes` each, with their handle arrays.
struct Garbage {
  std::vector<std::shared_ptr<Storage>> handles;
  std::vector<GarbageBatch> batches;

  Garbage(Allocator& alloc, int num_batches, int per_batch, size_t bytes)
      : handles(static_cast<size_t>(num_batches * per_batch)) {
    batches.reserve(num_batches);
    for (int b = 0; b < num_batches; ++b) {
      batches.emplace_back(
          std::span(handles).subspan(static_cast<size_t>(b * per_batch), per_batch), b);
      for (int k = 0; k < per_batch; ++k) batches.back().Add(Storage::Create(alloc, bytes));
    }
  }
};

// Observes the worker. With `gated`, the first call blocks until Open(): the test then knows the
// worker is parked inside it with the queue in a known state. Can also sleep or throw.
class TestListener final : public GcListener {
 public:
  bool gated = false;
  std::chrono::microseconds delay{0};
  int32_t throw_on_tag = -1;
  int calls = 0;  // worker-side; read after Drain or shutdown

  void WaitUntilParked() { parked_.acquire(); }
  void Open() { open_.release(); }

  void OnBatchDestroyed(int32_t tag, int32_t, int64_t, int64_t begin, int64_t end) override {
    EXPECT_LE(begin, end);
    if (gated && calls == 0) {
      parked_.release();
      open_.acquire();
    }
    ++calls;
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (tag == throw_on_tag) {
      throw std::runtime_error("listener failed on batch " + std::to_string(tag));
    }
  }

 private:
  std::binary_semaphore parked_{0}, open_{0};
};

TEST(AsyncGc, DrainReturnsWhenEverythingIsDestroyed) {
  SystemAllocator alloc;
  Garbage garbage(alloc, 16, 3, 1000);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 16 * 3 * 1000);
  AsyncGarbageCollector gc;
  for (GarbageBatch& b : garbage.batches) ASSERT_TRUE(gc.Submit(&b));
  gc.Drain();
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(gc.pending_bytes(), 0);
  EXPECT_EQ(gc.batches_destroyed(), 16);
  EXPECT_EQ(gc.TakePendingPeak() % 3000, 0);
  EXPECT_EQ(gc.TakePendingPeak(), 0);  // reset by the previous call
  for (const GarbageBatch& b : garbage.batches) EXPECT_TRUE(b.empty());
}

TEST(AsyncGc, BudgetRefusesAndTheCallerFrees) {
  SystemAllocator alloc;
  Garbage garbage(alloc, 4, 2, 1000);
  AsyncGarbageCollector gc({.queue_batches = 16, .max_pending_bytes = 3000});
  TestListener gate;
  gate.gated = true;
  gc.SetListener(&gate);
  ASSERT_TRUE(gc.Submit(&garbage.batches[0]));
  gate.WaitUntilParked();                        // batch 0 destroyed, worker parked
  ASSERT_TRUE(gc.Submit(&garbage.batches[1]));   // 2000 pending
  EXPECT_FALSE(gc.Submit(&garbage.batches[2]));  // 4000 would exceed 3000
  garbage.batches[2].Destroy();                  // back-pressure: freed by the caller
  gate.Open();
  gc.Drain();
  EXPECT_EQ(gc.TakePendingPeak(), 2000);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 2 * 1000);  // batch 3 was never handed over

  AsyncGarbageCollector never({.queue_batches = 4, .max_pending_bytes = 0});
  EXPECT_FALSE(never.Submit(&garbage.batches[3]));
}

TEST(AsyncGc, FullQueueRefuses) {
  SystemAllocator alloc;
  Garbage garbage(alloc, 5, 1, 100);
  AsyncGarbageCollector gc({.queue_batches = 2});
  TestListener gate;
  gate.gated = true;
  gc.SetListener(&gate);
  ASSERT_TRUE(gc.Submit(&garbage.batches[0]));
  gate.WaitUntilParked();
  EXPECT_TRUE(gc.Submit(&garbage.batches[1]));
  EXPECT_TRUE(gc.Submit(&garbage.batches[2]));
  EXPECT_FALSE(gc.Submit(&garbage.batches[3]));  // the ring holds two
  garbage.batches[3].Destroy();
  gate.Open();
  gc.Drain();
  EXPECT_TRUE(gc.Submit(&garbage.batches[4]));  // room again after the drain
  gc.Drain();
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
}

TEST(AsyncGc, WorkerNeverExitsEarly) {
  SystemAllocator alloc;
  AsyncGarbageCollector gc({.queue_batches = 4});
  for (int round = 0; round < 5; ++round) {
    // Idle long enough for the worker to stop spinning and block.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gc.Drain();  // nothing submitted: returns at once
    Garbage garbage(alloc, 3, 2, 4096);
    for (GarbageBatch& b : garbage.batches) ASSERT_TRUE(gc.Submit(&b));
    gc.Drain();
    EXPECT_EQ(alloc.Stats().allocated_bytes, 0) << "round " << round;
  }
  EXPECT_EQ(gc.batches_destroyed(), 15);
}

TEST(AsyncGc, ShutdownMidQueueFreesEverything) {
  SystemAllocator alloc;
  Garbage garbage(alloc, 32, 4, SystemAllocator::kMapThreshold);
  TestListener gate;
  gate.gated = true;
  std::thread opener;
  {
    AsyncGarbageCollector gc({.queue_batches = 64});
    gc.SetListener(&gate);
    for (GarbageBatch& b : garbage.batches) ASSERT_TRUE(gc.Submit(&b));
    gate.WaitUntilParked();  // 31 batches still queued behind the parked worker
    EXPECT_GE(alloc.Stats().allocated_bytes,
              int64_t{31 * 4} * static_cast<int64_t>(SystemAllocator::kMapThreshold));
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      gate.Open();
    });
  }  // no Drain: the destructor must finish the queue, then join
  opener.join();
  EXPECT_EQ(gate.calls, 32);
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
}

TEST(AsyncGc, WorkerErrorsSurfaceOnTheCallerAndTheWorkerGoesOn) {
  SystemAllocator alloc;
  Garbage garbage(alloc, 6, 1, 256);
  AsyncGarbageCollector gc;
  TestListener failing;
  failing.throw_on_tag = 2;
  gc.SetListener(&failing);
  for (int b = 0; b < 3; ++b) ASSERT_TRUE(gc.Submit(&garbage.batches[b]));
  try {
    gc.Drain();
    FAIL() << "expected the listener's error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("batch 2"));
  }
  EXPECT_EQ(alloc.Stats().allocated_bytes, 3 * 256);  // batches 0..2 destroyed all the same
  for (int b = 3; b < 6; ++b) ASSERT_TRUE(gc.Submit(&garbage.batches[b]));
  gc.Drain();  // the error was reported once
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(failing.calls, 6);
}

TEST(AsyncGc, MultipleProducers) {
  SystemAllocator alloc;
  constexpr int kThreads = 4, kBatches = 50;
  std::vector<Garbage> garbage;
  for (int t = 0; t < kThreads; ++t) garbage.emplace_back(alloc, kBatches, 2, 512);
  AsyncGarbageCollector gc({.queue_batches = 8}, /*multi_producer=*/true);
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (GarbageBatch& b : garbage[t].batches) {
        if (!gc.Submit(&b)) b.Destroy();
      }
    });
  }
  for (std::thread& p : producers) p.join();
  gc.Drain();
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
}

TEST(AsyncGc, RejectsBadOptions) {
  EXPECT_THROW(AsyncGarbageCollector({.queue_batches = 0}), InvalidArgument);
  EXPECT_THROW(AsyncGarbageCollector({.max_pending_bytes = -1}), InvalidArgument);
}

TEST(GarbageBatch, ChecksCapacity) {
  SystemAllocator alloc;
  std::vector<std::shared_ptr<Storage>> handles(1);
  GarbageBatch batch(handles, 7);
  batch.Add(Storage::Create(alloc, 100));
  EXPECT_EQ(batch.bytes(), 100);
  EXPECT_THROW(batch.Add(Storage::Create(alloc, 100)), InternalError);
  batch.Destroy();
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
}

TEST(GcMode, NamesRoundTrip) {
  for (GcMode m : {GcMode::kNone, GcMode::kSync, GcMode::kAsync, GcMode::kAuto}) {
    EXPECT_EQ(ParseGcMode(Name(m)), m);
  }
  EXPECT_EQ(Name(GcMode::kAuto), "auto");
  EXPECT_EQ(ParseGcMode("eager"), std::nullopt);
  EXPECT_EQ(EnumNames(kGcModeNames), "auto|none|sync|async");
}

// A free into the caching allocator is cheap: auto frees in place, so the default costs no memory.
// A SystemAllocator free of a large block is a munmap: auto hands it to the worker.
TEST(GcMode, AutoIsSyncWhereAFreeIsCheapAndAsyncWhereItIsExpensive) {
  CachingAllocator caching;
  SystemAllocator system;
  EXPECT_EQ(caching.free_cost(), FreeCost::kCheap);
  EXPECT_EQ(system.free_cost(), FreeCost::kExpensive);
  EXPECT_EQ(ResolveGcMode(GcMode::kAuto, caching), GcMode::kSync);
  EXPECT_EQ(ResolveGcMode(GcMode::kAuto, system), GcMode::kAsync);
  for (GcMode m : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
    EXPECT_EQ(ResolveGcMode(m, caching), m) << Name(m);
    EXPECT_EQ(ResolveGcMode(m, system), m) << Name(m);
  }
  EXPECT_EQ(DescribeGcMode(GcMode::kAuto, GcMode::kSync), "auto (sync)");
  EXPECT_EQ(DescribeGcMode(GcMode::kAuto, GcMode::kAsync), "auto (async)");
  EXPECT_EQ(DescribeGcMode(GcMode::kAsync, GcMode::kAsync), "async");
}

}  // namespace
}  // namespace sluice
