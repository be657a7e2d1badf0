// The executor allocates nothing on the heap per instruction in steady state: every run mode and
// GC mode — async hand-over and the worker included — makes exactly the heap allocations of the
// tensors themselves (Storage::Create) plus a per-run constant. Counted by replacing the global
// operator new in this test binary.
#include <atomic>
#include <cstdlib>
#include <new>

#include <gtest/gtest.h>

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

// Heap allocations (all threads) during one run, after warm-up runs. The system allocator keeps no
// bookkeeping on the heap (a caching allocator's tables grow now and then), so the count is exact.
int64_t AllocationsPerRun(const Program& program, RunMode mode, GcMode gc) {
  SystemAllocator alloc;
  Executable exe(program, {.allocator = &alloc, .mode = mode, .gc = gc, .threads = 2});
  Scope scope = testing::RandomScope(program, 1);
  for (int warm = 0; warm < 3; ++warm) exe.Run(scope);
  const int64_t before = g_heap_allocations.load();
  RunStats s = exe.Run(scope);
  const int64_t during = g_heap_allocations.load() - before;
  if (gc == GcMode::kAsync && mode == RunMode::kTrace) {
    EXPECT_GT(s.async_pending_peak_bytes, 0);  // handed over
  }
  return during;
}

TEST(HeapAllocations, TheExecutorAddsNonePerInstruction) {
  for (int n : {50, 100}) {
    Program program = testing::AddChainProgram(n, kFloats);
    const int64_t reference = AllocationsPerRun(program, RunMode::kTrace, GcMode::kSync);
    for (RunMode mode : {RunMode::kTrace, RunMode::kParallel}) {
      for (GcMode gc : {GcMode::kNone, GcMode::kSync, GcMode::kAsync}) {
        EXPECT_EQ(AllocationsPerRun(program, mode, gc), reference)
            << n << " " << Name(mode) << "/" << Name(gc);
      }
    }
  }
  // And what a run allocates grows with the instructions only by what their tensors cost.
  const int64_t per_100 =
      AllocationsPerRun(testing::AddChainProgram(150, kFloats), RunMode::kTrace, GcMode::kAsync) -
      AllocationsPerRun(testing::AddChainProgram(50, kFloats), RunMode::kTrace, GcMode::kAsync);
  SystemAllocator alloc;
  const int64_t before = g_heap_allocations.load();
  for (int k = 0; k < 100; ++k) Tensor::Empty({kFloats}, DType::kF32, alloc);
  EXPECT_EQ(per_100, g_heap_allocations.load() - before);
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
