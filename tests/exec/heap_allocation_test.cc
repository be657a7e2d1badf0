// The executor allocates nothing on the heap per instruction in steady state: every run mode and
// GC mode — async hand-over and the worker included — makes exactly the same per-run constant of
// heap allocations besides the StoragePool's slabs (core/storage_pool.h), and the tensors
// themselves cost none: a Storage is a recycled pool node. Counted by replacing the global
// operator new in this test binary; the pool's slabs (one operator new each) are counted apart by
// the pool, and subtracted, because how many a run with an async GC worker needs depends on how
// far the worker lags — they are bounded instead (AsyncFreesComeBack...).
#include <atomic>
#include <cstdlib>
#include <new>

#include <gtest/gtest.h>

#include "sluice/core/storage_pool.h"
#include "sluice/core/system_allocator.h"
#include "sluice/exec/interpreter.h"
#include "test_programs.h"

namespace {
std::atomic<int64_t> g_heap_allocations{0};
}  // namespace

void* operator new(std::size_t bytes) {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace sluice {
namespace {

// 68 KiB buffers: above the async GC's min_batch_bytes (so every free is handed to the worker),
// below the system allocator's mmap threshold (so sanitizer builds stay fast).
constexpr int64_t kFloats = 17 * 1024;

// Heap allocations (all threads) during one run, after warm-up runs, less the StoragePool's slabs
// (returned apart in *slabs). The system allocator keeps no bookkeeping on the heap (a caching
// allocator's tables grow now and then), so the count is exact. Out of place by default: written
// in place, the add chain would allocate one buffer and free none (`in_place` checks that too).
int64_t AllocationsPerRun(const Program& program, RunMode mode, GcMode gc, int64_t* slabs,
                          bool timed = true, bool in_place = false) {
  SystemAllocator alloc;
  Executable exe(program, {.allocator = &alloc,
                           .mode = mode,
                           .gc = gc,
                           .threads = 2,
                           .in_place = in_place,
                           .measure_gc_time = timed});
  Scope scope = testing::RandomScope(program, 1);
  for (int warm = 0; warm < 3; ++warm) exe.Run(scope);
  const int64_t slabs_before = StoragePool::SlabsAllocated();
  const int64_t before = g_heap_allocations.load();
  RunStats s = exe.Run(scope);
  const int64_t during = g_heap_allocations.load() - before;
  *slabs = StoragePool::SlabsAllocated() - slabs_before;
  if (gc == GcMode::kAsync && mode == RunMode::kTrace && !in_place) {
    EXPECT_GT(s.async_pending_peak_bytes, 0);  // handed over
  }
  return during - *slabs;
}

TEST(HeapAllocations, TheExecutorAddsNonePerInstruction) {
  int64_t slabs = 0;
  const int64_t reference = AllocationsPerRun(testing::AddChainProgram(50, kFloats),
                                              RunMode::kTrace, GcMode::kSync, &slabs);
  EXPECT_EQ(slabs, 0) << "the default mode's storages are recycled nodes";
  for (int n : {50, 100}) {
    Program program = testing::AddChainProgram(n, kFloats);
    for (RunMode mode : {RunMode::kTrace, RunMode::kParallel}) {
      for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
        EXPECT_EQ(AllocationsPerRun(program, mode, gc, &slabs), reference)
            << n << " " << Name(mode) << "/" << Name(gc);
      }
    }
    // Untimed sync GC: the trace run's precomputed drops.
    EXPECT_EQ(AllocationsPerRun(program, RunMode::kTrace, GcMode::kSync, &slabs, false), reference)
        << n << " trace/sync/untimed";
    // Written in place: each output takes a handle on its input's storage, no allocation.
    for (RunMode mode : {RunMode::kTrace, RunMode::kParallel}) {
      for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
        EXPECT_EQ(AllocationsPerRun(program, mode, gc, &slabs, true, /*in_place=*/true), reference)
            << n << " " << Name(mode) << "/" << Name(gc) << " in place";
      }
    }
  }
  // A tensor itself costs no heap allocation once the pool holds a node for it.
  SystemAllocator alloc;
  for (int k = 0; k < 100; ++k) Tensor::Empty({kFloats}, DType::kF32, alloc);
  const int64_t before = g_heap_allocations.load();
  for (int k = 0; k < 100; ++k) Tensor::Empty({kFloats}, DType::kF32, alloc);
  EXPECT_EQ(g_heap_allocations.load() - before, 0);
}

// The async GC worker frees every storage of a run on its own thread; the nodes come back to the
// executing thread through the pool's process-wide list, so the pool never holds more nodes than
// the most that can be out of reach at once — both threads' lists (kThreadNodes each), every
// storage of a run pending on the worker and one chain in transit — whatever the number of runs.
// Were they parked on the worker, each run of 100 instructions would need 100 new nodes: 62 slabs
// over 20 runs.
TEST(HeapAllocations, AsyncFreesComeBackToTheExecutingThread) {
  constexpr int kInstructions = 100;
  const Program program = testing::AddChainProgram(kInstructions, kFloats);
  SystemAllocator alloc;
  // Out of place: written in place, the chain frees nothing for the worker to destroy.
  Executable exe(program, {.allocator = &alloc, .gc = GcMode::kAsync, .in_place = false});
  Scope scope = testing::RandomScope(program, 1);
  for (int warm = 0; warm < 3; ++warm) exe.Run(scope);
  const int64_t slabs = StoragePool::SlabsAllocated();
  for (int run = 0; run < 20; ++run) exe.Run(scope);
  const int64_t bound =
      (kInstructions + 2 * StoragePool::kThreadNodes + StoragePool::kBatch) / StoragePool::kBatch +
      2;
  EXPECT_LE(StoragePool::SlabsAllocated() - slabs, bound);
}

// Steady state: a static run's heap allocations do not grow with the planned values (a dynamic
// run's grow by one Storage per value).
TEST(HeapAllocations, AStaticPlanAddsNonePerPlannedValue) {
  auto per_run = [](int n) {
    const Program program = testing::AddChainProgram(n, 1024);
    SystemAllocator alloc;
    Executable exe(
        program,
        {.allocator = &alloc, .gc = GcMode::kSync, .memory_plan = MemoryPlanMode::kStatic});
    Scope scope = testing::RandomScope(program, 1);
    for (int warm = 0; warm < 2; ++warm) exe.Run(scope);
    const int64_t before = g_heap_allocations.load();
    exe.Run(scope);
    return g_heap_allocations.load() - before;
  };
  EXPECT_EQ(per_run(150), per_run(50));
}

}  // namespace
}  // namespace sluice
