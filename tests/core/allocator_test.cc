// Tests of CachingAllocator (and the shared Allocator contract on SystemAllocator): disjoint
// blocks, exact statistics, best fit, splitting and coalescing, returning memory to the OS,
// cross-thread frees, errors for bad input.
#include "sluice/core/caching_allocator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <unistd.h>

#include "sluice/core/error.h"
#include "sluice/core/system_allocator.h"

namespace sluice {
namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A live block of the randomized tests: its memory holds `id` in every word (and its low byte in
// the tail), so a block that another one overwrote is noticed before it is freed.
struct LiveBlock {
  char* ptr;
  size_t bytes;
  uint64_t id;
};

void Fill(const LiveBlock& b) {
  const size_t words = b.bytes / 8;
  auto* w = reinterpret_cast<uint64_t*>(b.ptr);
  for (size_t i = 0; i < words; ++i) w[i] = b.id;
  std::memset(b.ptr + words * 8, static_cast<int>(b.id & 0xff), b.bytes - words * 8);
}

bool Intact(const LiveBlock& b) {
  const size_t words = b.bytes / 8;
  const auto* w = reinterpret_cast<const uint64_t*>(b.ptr);
  for (size_t i = 0; i < words; ++i) {
    if (w[i] != b.id) return false;
  }
  for (size_t i = words * 8; i < b.bytes; ++i) {
    if (static_cast<unsigned char>(b.ptr[i]) != (b.id & 0xff)) return false;
  }
  return true;
}

// Removes a block chosen at random from `live` (the last takes its place) and returns it.
LiveBlock TakeRandom(std::vector<LiveBlock>& live, std::mt19937_64& rng) {
  const size_t index = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
  const LiveBlock b = live[index];
  live[index] = live.back();
  live.pop_back();
  return b;
}

// Mostly small requests, some medium, a few large (up to 6 MiB), all sizes odd-ish.
size_t RandomSize(std::mt19937_64& rng) {
  const int kind = std::uniform_int_distribution<int>(0, 99)(rng);
  if (kind < 70) return std::uniform_int_distribution<size_t>(1, 4 * KiB)(rng);
  if (kind < 94) return std::uniform_int_distribution<size_t>(4 * KiB, MiB + 4 * KiB)(rng);
  return std::uniform_int_distribution<size_t>(MiB, 6 * MiB)(rng);
}

class CachingAllocatorRandomTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(CachingAllocatorRandomTest, BlocksStayDisjointAndStatsExact) {
  CachingAllocator alloc;
  std::mt19937_64 rng(GetParam());
  std::vector<LiveBlock> live;
  std::map<uintptr_t, uintptr_t> intervals;  // start -> end of every live block
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  uint64_t next_id = 1;

  const auto free_one = [&](size_t index) {
    const LiveBlock b = live[index];
    ASSERT_TRUE(Intact(b)) << "block " << b.id << " of " << b.bytes << " bytes was overwritten";
    live[index] = live.back();
    live.pop_back();
    intervals.erase(reinterpret_cast<uintptr_t>(b.ptr));
    alloc.Deallocate(b.ptr, b.bytes);
    live_bytes -= static_cast<int64_t>(b.bytes);
  };

  for (int step = 0; step < 3000; ++step) {
    const bool allocate = live.empty() || std::uniform_int_distribution<int>(0, 99)(rng) < 55;
    if (allocate) {
      const size_t bytes = RandomSize(rng);
      auto* ptr = static_cast<char*>(alloc.Allocate(bytes));
      ASSERT_EQ(reinterpret_cast<uintptr_t>(ptr) % kAlignment, 0u) << bytes << " bytes";
      const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
      const uintptr_t end = start + bytes;
      auto after = intervals.lower_bound(start);
      ASSERT_TRUE(after == intervals.end() || after->first >= end) << "overlaps the next block";
      ASSERT_TRUE(after == intervals.begin() || std::prev(after)->second <= start)
          << "overlaps the previous block";
      intervals.emplace(start, end);
      live.push_back({ptr, bytes, next_id++});
      Fill(live.back());
      live_bytes += static_cast<int64_t>(bytes);
      peak_bytes = std::max(peak_bytes, live_bytes);
    } else {
      free_one(std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng));
    }
    const MemoryStats s = alloc.Stats();
    ASSERT_EQ(s.allocated_bytes, live_bytes) << "step " << step;
    ASSERT_EQ(s.peak_allocated_bytes, peak_bytes) << "step " << step;
    ASSERT_GE(s.reserved_bytes, s.allocated_bytes);
    if (step % 16 == 0) alloc.CheckInvariants();
  }

  while (!live.empty()) free_one(std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng));
  alloc.CheckInvariants();
  const CachingAllocatorSnapshot snapshot = alloc.Snapshot();
  ASSERT_FALSE(snapshot.chunks.empty());
  for (const auto& chunk : snapshot.chunks) {
    ASSERT_EQ(chunk.blocks.size(), 1u) << "chunk of " << chunk.size << " bytes not coalesced";
    EXPECT_FALSE(chunk.blocks[0].allocated);
    EXPECT_EQ(chunk.blocks[0].size, chunk.size);
  }
  EXPECT_EQ(alloc.NumFreeBlocks(), alloc.NumChunks());
  const MemoryStats before = alloc.Stats();
  EXPECT_EQ(before.allocated_bytes, 0);
  EXPECT_EQ(before.num_allocs, before.num_frees);
  EXPECT_EQ(alloc.ReleaseCached(), static_cast<size_t>(before.reserved_bytes));
  const MemoryStats after = alloc.Stats();
  EXPECT_EQ(after.reserved_bytes, 0);
  EXPECT_EQ(after.num_os_frees, after.num_os_allocs);
  EXPECT_EQ(alloc.NumChunks(), 0u);
  alloc.CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(Seeds, CachingAllocatorRandomTest, ::testing::Values(1, 2, 3, 2024));

// The bytes of whole pages under the allocated blocks of a snapshot: what a chunk reserves once
// every free block's pages are returned.
size_t PagesUnderAllocatedBlocks(const CachingAllocatorSnapshot& snapshot) {
  size_t bytes = 0;
  for (const auto& chunk : snapshot.chunks) {
    size_t covered_to = 0;  // pages below this offset are counted
    for (const auto& b : chunk.blocks) {
      if (!b.allocated) continue;
      const size_t first = std::max(b.offset / kPage * kPage, covered_to);
      const size_t end = (b.offset + b.size + kPage - 1) / kPage * kPage;
      if (end > first) bytes += end - first;
      covered_to = std::max(covered_to, end);
    }
  }
  return bytes;
}

// Under a reserved budget, random requests: whenever the page spans of the live blocks and the
// request (PageSpanBytes, what the forecast sums) fit the budget, the request succeeds, whatever
// the holes; reserved never passes the budget; returned pages are backed again on reuse and no
// live block's bytes change when its neighbours' pages are returned.
TEST_P(CachingAllocatorRandomTest, ABudgetHoldsWheneverThePageSpansFit) {
  const size_t budget = 24 * MiB;
  CachingAllocator alloc({.max_reserved_bytes = budget});
  std::mt19937_64 rng(GetParam());
  std::vector<LiveBlock> live;
  size_t spans = 0;  // sum of PageSpanBytes over the live blocks
  uint64_t next_id = 1;
  int refused = 0, returned = 0;
  for (int step = 0; step < 4000; ++step) {
    const bool allocate = live.empty() || std::uniform_int_distribution<int>(0, 99)(rng) < 52;
    if (allocate) {
      const size_t bytes = RandomSize(rng);
      const size_t span = CachingAllocator::PageSpanBytes(bytes);
      const int64_t returned_before = alloc.Stats().reserved_bytes;
      try {
        auto* ptr = static_cast<char*>(alloc.Allocate(bytes));
        live.push_back({ptr, bytes, next_id++});
        Fill(live.back());
        spans += span;
        returned += alloc.Stats().reserved_bytes < returned_before;
      } catch (const OutOfMemory& e) {
        ASSERT_GT(spans + span, budget) << "step " << step << ": " << bytes
                                        << " bytes refused though the page spans fit: " << e.what();
        ++refused;
      }
    } else {
      const LiveBlock b = TakeRandom(live, rng);
      ASSERT_TRUE(Intact(b)) << "block " << b.id << " of " << b.bytes << " bytes was overwritten";
      alloc.Deallocate(b.ptr, b.bytes);
      spans -= CachingAllocator::PageSpanBytes(b.bytes);
    }
    const MemoryStats s = alloc.Stats();
    ASSERT_LE(s.reserved_bytes, static_cast<int64_t>(budget)) << "step " << step;
    ASSERT_LE(s.peak_reserved_bytes, static_cast<int64_t>(budget)) << "step " << step;
    if (step % 16 == 0) alloc.CheckInvariants();
  }
  // The budget was pressed both ways: pages returned to place requests, requests refused.
  EXPECT_GT(returned, 0);
  EXPECT_GT(refused, 0);
  for (const LiveBlock& b : live) {
    ASSERT_TRUE(Intact(b)) << "block " << b.id;
    alloc.Deallocate(b.ptr, b.bytes);
  }
  alloc.CheckInvariants();
}

// Random requests of whole pages (so every block lies on whole pages and a free block's pages
// can all be returned), freed in random order: reserved bytes never pass (1 + reserved_headroom)
// times the most bytes allocated so far, and blocks keep their bytes while their neighbours'
// pages come and go. Without the headroom (0) the same requests leave holes that pass it.
TEST_P(CachingAllocatorRandomTest, ReservedStaysWithinTheHeadroomOfTheHighWaterMark) {
  const auto run = [&](double headroom) {
    CachingAllocator alloc({.reserved_headroom = headroom});
    std::mt19937_64 rng(GetParam());
    std::vector<LiveBlock> live;
    uint64_t next_id = 1;
    double worst = 0;  // the largest reserved / high-water mark seen
    for (int step = 0; step < 3000; ++step) {
      if (live.empty() || std::uniform_int_distribution<int>(0, 99)(rng) < 52) {
        const int kind = std::uniform_int_distribution<int>(0, 99)(rng);
        const size_t pages = kind < 90 ? std::uniform_int_distribution<size_t>(1, 64)(rng)
                                       : std::uniform_int_distribution<size_t>(256, 1536)(rng);
        auto* ptr = static_cast<char*>(alloc.Allocate(pages * kPage));
        live.push_back({ptr, pages * kPage, next_id++});
        Fill(live.back());
      } else {
        const LiveBlock b = TakeRandom(live, rng);
        EXPECT_TRUE(Intact(b)) << "block " << b.id << " of " << b.bytes << " bytes";
        alloc.Deallocate(b.ptr, b.bytes);
      }
      // Stats().peak_allocated_bytes is the high-water mark: nothing resets it here.
      const MemoryStats s = alloc.Stats();
      worst = std::max(worst, static_cast<double>(s.reserved_bytes) /
                                  static_cast<double>(s.peak_allocated_bytes));
      if (step % 64 == 0) alloc.CheckInvariants();
    }
    for (const LiveBlock& b : live) {
      EXPECT_TRUE(Intact(b)) << "block " << b.id;
      alloc.Deallocate(b.ptr, b.bytes);
    }
    alloc.CheckInvariants();
    return worst;
  };
  const double headroom = CachingAllocatorOptions{}.reserved_headroom;
  EXPECT_GT(headroom, 0.0);
  EXPECT_LE(run(headroom), 1 + headroom);
  EXPECT_GT(run(0.0), 1 + headroom) << "the requests leave no holes to return: the test is moot";
}

// Four blocks of q bytes allocated in a row, b and d filled with 0x5b and 0x5d, a and c freed: two
// holes of q between live blocks.
struct TwoHoles {
  char* a;
  char* b;
  char* c;
  char* d;
};
TwoHoles MakeTwoHoles(CachingAllocator& alloc, size_t q) {
  TwoHoles h{};
  for (char** p : {&h.a, &h.b, &h.c, &h.d}) *p = static_cast<char*>(alloc.Allocate(q));
  std::memset(h.b, 0x5b, q);
  std::memset(h.d, 0x5d, q);
  alloc.Deallocate(h.a, q);
  alloc.Deallocate(h.c, q);
  return h;
}

// The headroom after ResetPeak: the high-water mark is the most ever allocated, not this step's,
// so a step that starts low keeps the pages of the last step's peak within it.
TEST(CachingAllocator, HolesPastTheHeadroomGiveBackTheirPagesBeforeGrowing) {
  const size_t q = 256 * KiB;
  for (const double headroom : {0.0, 0.04}) {
    SCOPED_TRACE(fmt::format("reserved_headroom {}", headroom));
    CachingAllocator alloc({.reserved_headroom = headroom});
    const auto [a, b, c, d] = MakeTwoHoles(alloc, q);  // the high-water mark is 4q
    alloc.ResetPeak();
    char* e = static_cast<char*>(alloc.Allocate(300 * KiB));  // fits no hole: the chunk grows
    EXPECT_EQ(e, d + q);
    const int64_t reserved = alloc.Stats().reserved_bytes;
    const int64_t grown = static_cast<int64_t>(4 * q + (300 * KiB + kPage - 1) / kPage * kPage);
    if (headroom == 0) {
      EXPECT_EQ(reserved, grown);  // the holes keep their pages
    } else {
      // As many of the holes' pages as growing passes 1.04 x 4q by went back first.
      EXPECT_LE(static_cast<double>(reserved), 1.04 * static_cast<double>(4 * q));
      EXPECT_GT(alloc.Snapshot().chunks.at(0).returned_bytes, 0u);
      EXPECT_LT(alloc.Snapshot().chunks.at(0).returned_bytes, 2 * q);  // not every page
    }
    EXPECT_TRUE(std::all_of(b, b + q, [](char x) { return x == 0x5b; }));
    EXPECT_TRUE(std::all_of(d, d + q, [](char x) { return x == 0x5d; }));
    std::memset(e, 0x7e, 300 * KiB);
    alloc.CheckInvariants();
    for (auto [p, n] : {std::pair{b, q}, {d, q}, {e, 300 * KiB}}) alloc.Deallocate(p, n);
    alloc.CheckInvariants();
  }
}

// One training step's requests, the same every step (shapes are static): allocations of random
// sizes (sub-page, pages, and a few large ones), each freed at a random later point of the step or
// at its end. `size` 0 frees op `freed`.
struct StepOp {
  size_t size;
  size_t freed;
};

std::vector<StepOp> RandomStep(uint64_t seed, int allocations) {
  std::mt19937_64 rng(seed);
  std::vector<StepOp> ops;
  std::vector<size_t> live;  // indices into ops
  for (int i = 0; i < allocations; ++i) {
    // A forward that grows, then a backward that shrinks, as a training step's memory does.
    const int free_percent = i < allocations / 2 ? 30 : 70;
    while (!live.empty() && std::uniform_int_distribution<int>(0, 99)(rng) < free_percent) {
      const size_t k = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
      ops.push_back({0, live[k]});
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const int kind = std::uniform_int_distribution<int>(0, 99)(rng);
    const size_t size = kind < 30   ? std::uniform_int_distribution<size_t>(1, 4 * KiB)(rng)
                        : kind < 92 ? std::uniform_int_distribution<size_t>(1, 48)(rng) * kPage
                                    : std::uniform_int_distribution<size_t>(256, 1024)(rng) * kPage;
    live.push_back(ops.size());
    ops.push_back({size, 0});
  }
  for (const size_t k : live) ops.push_back({0, k});
  return ops;
}

struct StepsRun {
  std::vector<size_t> backed_again;  // bytes of returned pages backed again, per step
  std::vector<bool> followed;        // FollowsLastStep() at each step's end
  double worst = 0;                  // the largest reserved / high-water mark seen
};

// Runs `steps` steps of `ops` (ResetPeak at each start, as the engines do) beside a few blocks
// held throughout (parameters), checking every block's bytes; `odd` replaces the step's requests
// on that step (-1: none).
StepsRun RunSteps(CachingAllocatorOptions options, const std::vector<StepOp>& ops, int steps,
                  int odd = -1, const std::vector<StepOp>& odd_ops = {}) {
  CachingAllocator alloc(options);
  StepsRun out;
  std::vector<LiveBlock> held;
  for (const size_t size : {3 * kPage, 40 * KiB, 100 * kPage}) {
    held.push_back({static_cast<char*>(alloc.Allocate(size)), size, held.size() + 1});
    Fill(held.back());
  }
  uint64_t next_id = 100;
  size_t before = 0;
  int64_t high_water = 0;
  for (int step = 0; step < steps; ++step) {
    alloc.ResetPeak();
    const std::vector<StepOp>& these = step == odd ? odd_ops : ops;
    std::vector<LiveBlock> live(these.size());
    for (size_t i = 0; i < these.size(); ++i) {
      if (these[i].size == 0) {
        const LiveBlock& b = live[these[i].freed];
        EXPECT_TRUE(Intact(b)) << "step " << step << " block " << b.id;
        alloc.Deallocate(b.ptr, b.bytes);
      } else {
        live[i] = {static_cast<char*>(alloc.Allocate(these[i].size)), these[i].size, next_id++};
        Fill(live[i]);
      }
      // The high-water mark: the most allocated since the start (ResetPeak starts each step's
      // peak afresh).
      const MemoryStats s = alloc.Stats();
      high_water = std::max(high_water, s.allocated_bytes);
      out.worst = std::max(out.worst,
                           static_cast<double>(s.reserved_bytes) / static_cast<double>(high_water));
    }
    out.followed.push_back(alloc.FollowsLastStep());
    out.backed_again.push_back(alloc.BackedAgainBytes() - before);
    before = alloc.BackedAgainBytes();
    alloc.CheckInvariants();
  }
  for (const LiveBlock& b : held) {
    EXPECT_TRUE(Intact(b)) << "held block " << b.id;
    alloc.Deallocate(b.ptr, b.bytes);
  }
  alloc.CheckInvariants();
  return out;
}

// The churn of the headroom: a step that repeats the last one's requests places them on backed
// pages where a free block has them and returns the pages the last step needed last or never, so
// after the first steps far fewer returned pages fault in again each step than when the pages
// go back in address order (follow_last_step = false, as before), within the same headroom. Summed
// over the seeds: on some a step that had no churn gets a little (a window moves the layout), on
// others tens of MB a step go (docs/memory.md, "The churn of the headroom").
TEST(CachingAllocator, RepeatedStepsBackFewerReturnedPages) {
  constexpr int kSteps = 8;
  const double headroom = CachingAllocatorOptions{}.reserved_headroom;
  size_t follow_late = 0, address_late = 0;  // steps 3 on: the steady state
  for (const uint64_t seed : {1, 2, 3, 2024}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    const std::vector<StepOp> ops = RandomStep(seed, 400);
    const StepsRun follow = RunSteps({}, ops, kSteps);
    const StepsRun address_order = RunSteps({.follow_last_step = false}, ops, kSteps);
    EXPECT_LE(follow.worst, 1 + headroom);
    EXPECT_LE(address_order.worst, 1 + headroom);
    // The first step has no step before it; every later one repeats it.
    EXPECT_FALSE(follow.followed[0]);
    for (int step = 1; step < kSteps; ++step) EXPECT_TRUE(follow.followed[step]) << step;
    for (const bool f : address_order.followed) EXPECT_FALSE(f);
    for (int step = 3; step < kSteps; ++step) {
      follow_late += follow.backed_again[step];
      address_late += address_order.backed_again[step];
    }
  }
  EXPECT_GT(address_late, 0u) << "no page was returned and reused: the test is moot";
  EXPECT_LT(follow_late * 4, address_late)
      << "backed again from step 3 on: " << follow_late << " vs " << address_late;
}

// The fallback: a step whose requests differ from the last one's (another size at some point)
// stops following it there and returns pages in address order for the rest of the step, within
// the headroom still; the step after it follows it (its requests are what came last), and the
// one after that the usual step again.
TEST(CachingAllocator, AStepThatDiffersFromTheLastFallsBackToAddressOrder) {
  const std::vector<StepOp> ops = RandomStep(7, 300);
  std::vector<StepOp> odd = ops;
  for (StepOp& op : odd) {
    if (op.size > 2 * kPage) {
      op.size += kPage;  // the first allocation of more than two pages: one page more
      break;
    }
  }
  const StepsRun run = RunSteps({}, ops, 6, /*odd=*/3, odd);
  EXPECT_LE(run.worst, 1 + CachingAllocatorOptions{}.reserved_headroom);
  const std::vector<bool> expected = {false, true, true, false, false, true};
  EXPECT_EQ(run.followed, expected);
  // Without a headroom nothing is recorded or followed.
  const StepsRun none = RunSteps({.reserved_headroom = 0}, ops, 3);
  EXPECT_EQ(none.followed, std::vector<bool>(3, false));
  EXPECT_EQ(none.backed_again, std::vector<size_t>(3, 0));
}

// Unmapping a chunk forgets the recorded steps (their placements name it): the next step has
// nothing to follow.
TEST(CachingAllocator, ReleasingChunksForgetsTheLastStep) {
  CachingAllocator alloc;
  for (int step = 0; step < 2; ++step) {
    alloc.ResetPeak();
    void* p = alloc.Allocate(64 * KiB);
    alloc.Deallocate(p, 64 * KiB);
  }
  alloc.ResetPeak();
  void* p = alloc.Allocate(64 * KiB);
  EXPECT_TRUE(alloc.FollowsLastStep());
  alloc.Deallocate(p, 64 * KiB);
  EXPECT_GT(alloc.ReleaseCached(), 0u);
  EXPECT_EQ(alloc.NumChunks(), 0u);
  EXPECT_FALSE(alloc.FollowsLastStep());
  alloc.ResetPeak();
  p = alloc.Allocate(64 * KiB);
  EXPECT_FALSE(alloc.FollowsLastStep());
  alloc.Deallocate(p, 64 * KiB);
}

TEST(CachingAllocator, ANegativeOrInfiniteHeadroomIsRefused) {
  for (const double headroom :
       {-0.01, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    try {
      CachingAllocator alloc({.reserved_headroom = headroom});
      FAIL() << headroom << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("reserved_headroom"), std::string::npos) << e.what();
    }
  }
}

TEST(CachingAllocator, EveryPointerIsAlignedTo64) {
  CachingAllocator alloc;
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{63}, size_t{64}, size_t{65}, size_t{511},
                       size_t{513}, size_t{4097}, MiB - 1, MiB + 1, 3 * MiB + 7}) {
    for (int i = 0; i < 3; ++i) {
      void* p = alloc.Allocate(bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kAlignment, 0u) << bytes << " bytes";
      blocks.emplace_back(p, bytes);
    }
  }
  for (auto [p, bytes] : blocks) alloc.Deallocate(p, bytes);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, ReusesCachedMemoryWithoutTheOs) {
  CachingAllocator alloc;
  void* p = alloc.Allocate(1000);
  alloc.Deallocate(p, 1000);
  void* q = alloc.Allocate(1000);
  EXPECT_EQ(q, p) << "the freed block should be handed out again";
  alloc.Deallocate(q, 1000);
  EXPECT_EQ(alloc.Stats().num_os_allocs, 1);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(kPage));
}

TEST(CachingAllocator, ChunksGrowInPlaceByPages) {
  CachingAllocator alloc({.small_limit_bytes = MiB});
  void* small = alloc.Allocate(MiB);  // rounded 1 MiB: small pool, a region of which 1 MiB is used
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(MiB));
  void* large = alloc.Allocate(MiB + 1);  // large pool: a region of its own, one page more
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(2 * MiB + kPage));
  // The large chunk's free tail (a page less 512 B) is extended to 3 MiB in place.
  void* larger = alloc.Allocate(3 * MiB);
  EXPECT_EQ(static_cast<char*>(larger), static_cast<char*>(large) + MiB + 512);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(5 * MiB + kPage));
  EXPECT_EQ(alloc.Stats().allocated_bytes, static_cast<int64_t>(5 * MiB + 1));
  EXPECT_EQ(alloc.NumChunks(), 2u);
  for (const auto& chunk : alloc.Snapshot().chunks) {
    EXPECT_EQ(chunk.small_pool, chunk.blocks[0].requested_bytes == MiB);
    EXPECT_EQ(chunk.capacity, alloc.options().region_bytes);
  }
  alloc.Deallocate(small, MiB);
  alloc.Deallocate(large, MiB + 1);
  alloc.Deallocate(larger, 3 * MiB);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, ANewRegionOnlyWhenNoChunkHasRoom) {
  CachingAllocator alloc({.small_limit_bytes = 4 * KiB, .region_bytes = 64 * KiB});
  void* a = alloc.Allocate(40 * KiB);
  void* b = alloc.Allocate(20 * KiB);  // fits the first region's remaining 24 KiB
  EXPECT_EQ(alloc.NumChunks(), 1u);
  void* c = alloc.Allocate(20 * KiB);  // does not: a second region
  EXPECT_EQ(alloc.NumChunks(), 2u);
  void* d = alloc.Allocate(100 * KiB);  // above region_bytes: a region of exactly its size
  EXPECT_EQ(alloc.NumChunks(), 3u);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(180 * KiB));
  bool found = false;
  for (const auto& chunk : alloc.Snapshot().chunks) {
    if (chunk.size == 100 * KiB) found = chunk.capacity == 100 * KiB;
  }
  EXPECT_TRUE(found);
  alloc.Deallocate(a, 40 * KiB);
  alloc.Deallocate(b, 20 * KiB);
  alloc.Deallocate(c, 20 * KiB);
  alloc.Deallocate(d, 100 * KiB);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, LargeBlocksSplitAtAnyRemainder) {
  CachingAllocator alloc;
  void* big = alloc.Allocate(64 * MiB);
  alloc.Deallocate(big, 64 * MiB);
  // 16 MiB from the free 64 MiB chunk: split, the 48 MiB remainder stays free.
  void* a = alloc.Allocate(16 * MiB);
  EXPECT_EQ(a, big);
  EXPECT_EQ(alloc.Stats().num_os_allocs, 1);
  auto chunks = alloc.Snapshot().chunks;
  ASSERT_EQ(chunks.size(), 1u);
  ASSERT_EQ(chunks[0].blocks.size(), 2u);
  EXPECT_EQ(chunks[0].blocks[1].size, 48 * MiB);
  alloc.Deallocate(a, 16 * MiB);
  // 63.5 MiB leaves 0.5 MiB, which stays free for the next request rather than wasted inside.
  void* b = alloc.Allocate(63 * MiB + 512 * KiB);
  chunks = alloc.Snapshot().chunks;
  ASSERT_EQ(chunks[0].blocks.size(), 2u);
  EXPECT_EQ(chunks[0].blocks[0].size, 63 * MiB + 512 * KiB);
  EXPECT_FALSE(chunks[0].blocks[1].allocated);
  EXPECT_EQ(alloc.Stats().allocated_bytes, static_cast<int64_t>(63 * MiB + 512 * KiB));
  alloc.Deallocate(b, 63 * MiB + 512 * KiB);
}

TEST(CachingAllocator, PicksTheBestFittingFreeBlock) {
  CachingAllocator alloc;
  // One small chunk laid out as a(4K) b(8K) c(4K) d(16K) e(4K) rest; b and d are freed and,
  // fenced by allocated neighbours, stay separate holes.
  void* a = alloc.Allocate(4 * KiB);
  void* b = alloc.Allocate(8 * KiB);
  void* c = alloc.Allocate(4 * KiB);
  void* d = alloc.Allocate(16 * KiB);
  void* e = alloc.Allocate(4 * KiB);
  ASSERT_EQ(alloc.NumChunks(), 1u);
  alloc.Deallocate(d, 16 * KiB);
  alloc.Deallocate(b, 8 * KiB);
  EXPECT_EQ(alloc.Allocate(6 * KiB), b) << "8K is the best fit for 6K, not 16K or the rest";
  EXPECT_EQ(alloc.Allocate(12 * KiB), d);
  EXPECT_EQ(alloc.NumChunks(), 1u);
  alloc.CheckInvariants();
  // The 6K request left a 2K hole after b; d's 12K left a 4K hole.
  const std::vector<std::pair<void*, size_t>> blocks = {
      {a, 4 * KiB}, {b, 6 * KiB}, {c, 4 * KiB}, {d, 12 * KiB}, {e, 4 * KiB}};
  for (auto [p, bytes] : blocks) alloc.Deallocate(p, bytes);
  EXPECT_EQ(alloc.NumFreeBlocks(), 1u);
}

TEST(CachingAllocator, FreeCoalescesWithBothNeighbours) {
  CachingAllocator alloc;
  void* a = alloc.Allocate(1000);
  void* b = alloc.Allocate(2000);
  void* c = alloc.Allocate(3000);
  alloc.Deallocate(a, 1000);
  alloc.Deallocate(c, 3000);  // merges with the chunk's free tail
  EXPECT_EQ(alloc.NumFreeBlocks(), 2u);
  alloc.Deallocate(b, 2000);  // merges with a on the left and the tail on the right
  EXPECT_EQ(alloc.NumFreeBlocks(), 1u);
  const auto chunks = alloc.Snapshot().chunks;
  ASSERT_EQ(chunks.size(), 1u);
  ASSERT_EQ(chunks[0].blocks.size(), 1u);
  EXPECT_EQ(chunks[0].blocks[0].size, chunks[0].size);
  EXPECT_EQ(chunks[0].size, RoundUp(6 * KiB, kPage));
  alloc.CheckInvariants();
}

TEST(CachingAllocator, ReleaseCachedKeepsChunksInUse) {
  CachingAllocator alloc;
  void* kept = alloc.Allocate(100);
  void* big = alloc.Allocate(10 * MiB);
  alloc.Deallocate(big, 10 * MiB);
  EXPECT_EQ(alloc.ReleaseCached(), 10 * MiB);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(kPage));
  EXPECT_EQ(alloc.NumChunks(), 1u);
  alloc.Deallocate(kept, 100);
  EXPECT_EQ(alloc.ReleaseCached(), kPage);
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
  EXPECT_EQ(alloc.Stats().num_os_frees, 2);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, ReleaseCachedTrimsFreeTails) {
  CachingAllocator alloc;
  void* kept = alloc.Allocate(kPage);
  void* tail = alloc.Allocate(64 * KiB);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(kPage + 64 * KiB));
  alloc.Deallocate(tail, 64 * KiB);
  EXPECT_EQ(alloc.ReleaseCached(), 64 * KiB);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(kPage));
  alloc.CheckInvariants();
  // The chunk grows into the returned pages again.
  void* again = alloc.Allocate(64 * KiB);
  EXPECT_EQ(again, tail);
  std::memset(again, 1, 64 * KiB);
  EXPECT_EQ(alloc.NumChunks(), 1u);
  alloc.Deallocate(again, 64 * KiB);
  alloc.Deallocate(kept, kPage);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, ResetPeakRestartsFromCurrentValues) {
  CachingAllocator alloc({.small_limit_bytes = MiB});
  void* a = alloc.Allocate(3 * MiB);
  void* b = alloc.Allocate(100);
  alloc.Deallocate(a, 3 * MiB);
  MemoryStats s = alloc.Stats();
  EXPECT_EQ(s.peak_allocated_bytes, static_cast<int64_t>(3 * MiB + 100));
  EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(3 * MiB + kPage));
  alloc.ReleaseCached();
  alloc.ResetPeak();
  s = alloc.Stats();
  EXPECT_EQ(s.peak_allocated_bytes, 100);
  EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(kPage));
  void* c = alloc.Allocate(50);
  alloc.Deallocate(c, 50);
  EXPECT_EQ(alloc.Stats().peak_allocated_bytes, 150);
  alloc.Deallocate(b, 100);
  EXPECT_EQ(alloc.Stats().peak_allocated_bytes, 150);
}

TEST(CachingAllocator, InstancesKeepIndependentStats) {
  CachingAllocator first;
  CachingAllocator second;
  void* p = first.Allocate(123);
  void* q = second.Allocate(4 * MiB);
  EXPECT_EQ(first.Stats().allocated_bytes, 123);
  EXPECT_EQ(second.Stats().allocated_bytes, static_cast<int64_t>(4 * MiB));
  EXPECT_EQ(first.Stats().reserved_bytes, static_cast<int64_t>(kPage));
  EXPECT_EQ(second.Stats().reserved_bytes, static_cast<int64_t>(4 * MiB));
  EXPECT_THROW(second.Deallocate(p, 123), InternalError) << "p belongs to the first instance";
  first.Deallocate(p, 123);
  second.Deallocate(q, 4 * MiB);
  EXPECT_EQ(first.Stats().num_allocs, 1);
  EXPECT_EQ(second.Stats().num_frees, 1);
}

TEST(CachingAllocator, TimelineRecordsTaggedEvents) {
  CachingAllocator alloc;
  void* before = alloc.Allocate(7);  // not recorded: the timeline is off
  alloc.EnableTimeline(true);
  void* p;
  {
    ScopedMemoryTag tag("forward");
    p = alloc.Allocate(100);
  }
  {
    ScopedMemoryTag tag("backward");
    alloc.Deallocate(p, 100);
  }
  alloc.Deallocate(before, 7);
  const std::vector<MemoryEvent> events = alloc.Timeline();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].delta_bytes, 100);
  EXPECT_EQ(events[0].allocated_bytes, 107);
  EXPECT_STREQ(events[0].tag, "forward");
  EXPECT_EQ(events[1].delta_bytes, -100);
  EXPECT_STREQ(events[1].tag, "backward");
  EXPECT_EQ(events[2].delta_bytes, -7);
  EXPECT_EQ(events[2].allocated_bytes, 0);
  EXPECT_STREQ(events[2].tag, "");
  EXPECT_LE(events[0].time_ns, events[2].time_ns);
  alloc.EnableTimeline(false);
  EXPECT_TRUE(alloc.Timeline().empty());
}

// One thread allocates and hands blocks through a queue to another that frees them, as the
// asynchronous garbage collector does. Clean under ThreadSanitizer.
TEST(CachingAllocator, OneThreadAllocatesAnotherFrees) {
  CachingAllocator alloc;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<LiveBlock> queue;  // guarded by mu
  bool done = false;            // guarded by mu
  constexpr int kBlocks = 4000;
  bool all_intact = true;  // written by the consumer only, read after join

  std::thread consumer([&] {
    for (;;) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !queue.empty() || done; });
      if (queue.empty()) return;
      const LiveBlock b = queue.front();
      queue.pop_front();
      lock.unlock();
      all_intact = all_intact && Intact(b);
      alloc.Deallocate(b.ptr, b.bytes);
    }
  });
  std::mt19937_64 rng(7);
  for (int i = 0; i < kBlocks; ++i) {
    const size_t bytes = std::uniform_int_distribution<int>(0, 9)(rng) == 0
                             ? std::uniform_int_distribution<size_t>(MiB, 3 * MiB)(rng)
                             : std::uniform_int_distribution<size_t>(1, 8 * KiB)(rng);
    LiveBlock b{static_cast<char*>(alloc.Allocate(bytes)), bytes, static_cast<uint64_t>(i + 1)};
    Fill(b);
    {
      std::lock_guard lock(mu);
      queue.push_back(b);
    }
    cv.notify_one();
    if (i % 256 == 0) (void)alloc.Stats();  // reading stats while the other thread frees
  }
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_one();
  consumer.join();
  EXPECT_TRUE(all_intact);
  const MemoryStats s = alloc.Stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.num_allocs, kBlocks);
  EXPECT_EQ(s.num_frees, kBlocks);
  alloc.CheckInvariants();
  alloc.ReleaseCached();
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
}

TEST(CachingAllocator, ManyThreadsAllocateAndFreeConcurrently) {
  CachingAllocator alloc;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&alloc, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<std::pair<void*, size_t>> mine;
      for (int i = 0; i < 2000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const size_t bytes = std::uniform_int_distribution<size_t>(1, 64 * KiB)(rng);
          mine.emplace_back(alloc.Allocate(bytes), bytes);
        } else {
          alloc.Deallocate(mine.back().first, mine.back().second);
          mine.pop_back();
        }
        if (i % 500 == 0) alloc.ReleaseCached();
      }
      for (auto [p, bytes] : mine) alloc.Deallocate(p, bytes);
    });
  }
  for (auto& t : threads) t.join();
  alloc.CheckInvariants();
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
}

TEST(CachingAllocator, BadSizesAreInvalidArgumentsAndLeaveItUsable) {
  CachingAllocator alloc;
  try {
    alloc.Allocate(0);
    FAIL() << "0 bytes accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "caching allocator: cannot allocate 0 bytes");
  }
  try {
    alloc.Allocate(size_t{1} << 62);
    FAIL() << "2^62 bytes accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("4611686018427387904 bytes exceeds the limit"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(alloc.Stats().num_allocs, 0);
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
  void* p = alloc.Allocate(10);
  alloc.Deallocate(p, 10);
  alloc.CheckInvariants();
}

TEST(SystemAllocator, BadSizesAreInvalidArgumentsAndLeaveItUsable) {
  SystemAllocator alloc;
  EXPECT_THROW(alloc.Allocate(0), InvalidArgument);
  EXPECT_THROW(alloc.Allocate(size_t{1} << 62), InvalidArgument);
  for (size_t bytes : {size_t{10}, 4 * MiB}) {
    void* p = alloc.Allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kAlignment, 0u);
    alloc.Deallocate(p, bytes);
  }
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.Stats().num_allocs, 2);
}

TEST(CachingAllocator, ForeignPointersAndWrongSizesFailChecksWithoutHarm) {
  CachingAllocator alloc;
  void* p = alloc.Allocate(100);
  int on_stack = 0;
  try {
    alloc.Deallocate(&on_stack, 4);
    FAIL() << "a foreign pointer was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("does not own"), std::string::npos) << e.what();
  }
  try {
    alloc.Deallocate(p, 99);
    FAIL() << "a wrong size was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("allocated with 100 bytes"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(alloc.Stats().allocated_bytes, 100);
  alloc.Deallocate(p, 100);
  EXPECT_THROW(alloc.Deallocate(p, 100), InternalError) << "double free";
  alloc.CheckInvariants();
  EXPECT_EQ(alloc.Stats().num_frees, 1);
}

TEST(CachingAllocator, BudgetIsEnforcedAfterReturningTheCache) {
  CachingAllocator alloc({.small_limit_bytes = MiB, .max_reserved_bytes = 4 * MiB});
  void* big = alloc.Allocate(4 * MiB);  // the whole budget
  try {
    alloc.Allocate(KiB);
    FAIL() << "the budget was exceeded";
  } catch (const OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(
        message.find(fmt::format("cannot obtain {} bytes for a request of 1024 bytes", kPage)),
        std::string::npos)
        << message;
    EXPECT_NE(message.find("max_reserved_bytes = 4194304"), std::string::npos) << message;
    // What is held, not counting the refused request.
    EXPECT_NE(message.find("4194304 bytes are reserved and 4194304 bytes allocated"),
              std::string::npos)
        << message;
  }
  alloc.Deallocate(big, 4 * MiB);
  void* small = alloc.Allocate(KiB);  // the free 4 MiB chunk is unmapped to make room
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(kPage));
  alloc.Deallocate(small, KiB);
  alloc.CheckInvariants();
}

// With the headroom (and the last step followed), a small request whose place in its own pool
// lies on returned pages takes backed pages of a free large-pool block instead: the holes of both
// pools are reused before returned pages are faulted in again. Without following steps, the pools
// stay apart and the request backs the small pool's returned pages.
TEST(CachingAllocator, ASmallRequestTakesAFreeLargeBlocksBackedPagesBeforeReturnedOnes) {
  for (const bool follow : {true, false}) {
    SCOPED_TRACE(follow);
    CachingAllocator alloc({.small_limit_bytes = MiB, .follow_last_step = follow});
    void* a = alloc.Allocate(512 * KiB);  // small pool, then b keeps its chunk
    void* b = alloc.Allocate(4 * KiB);
    void* big = alloc.Allocate(4 * MiB);  // large pool, then c keeps its chunk
    void* c = alloc.Allocate(2 * MiB);
    alloc.Deallocate(a, 512 * KiB);
    alloc.Deallocate(big, 4 * MiB);
    alloc.ReleaseCached();                    // both free blocks' pages go back to the OS
    EXPECT_EQ(alloc.Allocate(4 * MiB), big);  // backs the large block's pages again
    alloc.Deallocate(big, 4 * MiB);
    const int64_t reserved = alloc.Stats().reserved_bytes;
    void* small = alloc.Allocate(256 * KiB);
    if (follow) {
      EXPECT_EQ(small, big);
      EXPECT_EQ(alloc.Stats().reserved_bytes, reserved);  // nothing backed again
    } else {
      EXPECT_EQ(small, a);
      EXPECT_EQ(alloc.Stats().reserved_bytes, reserved + static_cast<int64_t>(256 * KiB));
    }
    alloc.CheckInvariants();
    alloc.Deallocate(small, 256 * KiB);
    alloc.CheckInvariants();
    // Freed, the block coalesces back into the large pool's free 4 MiB: a large request fits it.
    EXPECT_EQ(alloc.Allocate(4 * MiB), big);
    alloc.Deallocate(big, 4 * MiB);
    alloc.Deallocate(b, 4 * KiB);
    alloc.Deallocate(c, 2 * MiB);
  }
}

// A budget met by holes: the pages inside free blocks go back to the OS (not reserved), the
// request is placed, and a block placed on returned pages backs them again. (Without the
// headroom, which would return some of them first: the budget's return alone.)
TEST(CachingAllocator, ABudgetReturnsTheHolesPagesBeforeGrowing) {
  const size_t q = 256 * KiB;
  CachingAllocator alloc({.max_reserved_bytes = 4 * q + 64 * KiB, .reserved_headroom = 0});
  const auto [a, b, c, d] = MakeTwoHoles(alloc, q);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(4 * q));
  // 300 KiB fits no hole and growing would cross the budget: the holes' pages go back first.
  char* e = static_cast<char*>(alloc.Allocate(300 * KiB));
  EXPECT_EQ(e, d + q);  // the chunk grew
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(2 * q + 300 * KiB));
  EXPECT_EQ(alloc.Snapshot().chunks.at(0).returned_bytes, 2 * q);
  alloc.CheckInvariants();
  EXPECT_TRUE(std::all_of(b, b + q, [](char x) { return x == 0x5b; }));  // the neighbours keep
  EXPECT_TRUE(std::all_of(d, d + q, [](char x) { return x == 0x5d; }));  // their bytes
  // A block placed on a hole backs its pages again: counted at once, written freely.
  char* again = static_cast<char*>(alloc.Allocate(q));
  EXPECT_TRUE(again == a || again == c);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(3 * q + 300 * KiB));
  std::memset(again, 0x7a, q);
  alloc.CheckInvariants();
  // The other hole's pages would cross the budget and nothing is left to return: refused, and
  // nothing changes.
  const MemoryStats before = alloc.Stats();
  try {
    alloc.Allocate(q);
    FAIL() << "the budget was exceeded";
  } catch (const OutOfMemory& err) {
    const std::string message = err.what();
    EXPECT_NE(message.find("cannot obtain 262144 bytes for a request of 262144 bytes: it would "
                           "take the reserved bytes over the memory budget"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(alloc.Stats().reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(alloc.Stats().allocated_bytes, before.allocated_bytes);
  alloc.CheckInvariants();
  for (auto [p, n] : {std::pair{again, q}, {b, q}, {d, q}, {e, 300 * KiB}}) alloc.Deallocate(p, n);
  alloc.CheckInvariants();
}

// ReleaseCached returns the pages inside free blocks too: reserved is then exactly the pages
// under allocated blocks, partial pages at a hole's edges included.
TEST(CachingAllocator, ReleaseCachedReturnsTheHolesPages) {
  CachingAllocator alloc;
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(alloc.Allocate(1000));  // 1 KiB blocks
  for (int i = 0; i < 64; ++i) {
    if (i % 16 >= 3) alloc.Deallocate(blocks[static_cast<size_t>(i)], 1000);  // keep 3 in 16
  }
  const size_t released = alloc.ReleaseCached();
  const CachingAllocatorSnapshot snapshot = alloc.Snapshot();
  const size_t under = PagesUnderAllocatedBlocks(snapshot);
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(under));
  EXPECT_EQ(released + under, 16 * kPage);
  EXPECT_GT(snapshot.chunks.at(0).returned_bytes, 0u);
  alloc.CheckInvariants();
  // Placed again on the returned pages: backed again, writable, counted.
  for (int i = 0; i < 64; ++i) {
    if (i % 16 >= 3) {
      blocks[static_cast<size_t>(i)] = alloc.Allocate(1000);
      std::memset(blocks[static_cast<size_t>(i)], i, 1000);
    }
  }
  EXPECT_EQ(alloc.Stats().reserved_bytes, static_cast<int64_t>(16 * kPage));
  alloc.CheckInvariants();
  for (void* p : blocks) alloc.Deallocate(p, 1000);
  EXPECT_EQ(alloc.ReleaseCached(), 16 * kPage);
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, PageSpanBytesIsTheMostPagesABlockCanLieOn) {
  EXPECT_EQ(CachingAllocator::PageSpanBytes(1), kPage);
  EXPECT_EQ(CachingAllocator::PageSpanBytes(512), kPage);
  EXPECT_EQ(CachingAllocator::PageSpanBytes(513), 2 * kPage);  // 1 KiB across a boundary
  EXPECT_EQ(CachingAllocator::PageSpanBytes(kPage), 2 * kPage);
  EXPECT_EQ(CachingAllocator::PageSpanBytes(64 * kPage), 65 * kPage);
}

TEST(CachingAllocator, AllocatedBytesBudgetRefusesAndChangesNothing) {
  CachingAllocator alloc({.max_allocated_bytes = 10000});
  void* a = alloc.Allocate(6000);
  void* b = alloc.Allocate(4000);  // exactly the budget
  const MemoryStats before = alloc.Stats();
  try {
    alloc.Allocate(1);
    FAIL() << "the budget was exceeded";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("over the memory budget of 10000 bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(alloc.Stats().allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(alloc.Stats().num_allocs, before.num_allocs);
  alloc.Deallocate(b, 4000);
  void* c = alloc.Allocate(4000);  // room again once memory is freed
  alloc.Deallocate(c, 4000);
  alloc.Deallocate(a, 6000);
  alloc.CheckInvariants();
}

TEST(CachingAllocator, OsRefusalIsOutOfMemory) {
  CachingAllocator alloc;
  try {
    void* p = alloc.Allocate(kMaxAllocationBytes);
    alloc.Deallocate(p, kMaxAllocationBytes);
    GTEST_SKIP() << "the OS granted 1 TiB of address space (overcommit); nothing to test";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("request of 1099511627776 bytes: the OS refused"),
              std::string::npos)
        << e.what();
  }
  void* p = alloc.Allocate(10);
  alloc.Deallocate(p, 10);
}

TEST(CachingAllocator, BadOptionsAreInvalidArguments) {
  EXPECT_THROW(CachingAllocator({.small_limit_bytes = 1000}), InvalidArgument);
  EXPECT_THROW(CachingAllocator({.region_bytes = 4 * KiB}), InvalidArgument);
  EXPECT_THROW(CachingAllocator({.region_bytes = 64 * KiB + 1}), InvalidArgument);
  CachingAllocator small_limit({.small_limit_bytes = 32 * KiB});
  void* p = small_limit.Allocate(40 * KiB);  // above the limit: the large pool
  EXPECT_EQ(small_limit.Stats().reserved_bytes, static_cast<int64_t>(40 * KiB));
  EXPECT_FALSE(small_limit.Snapshot().chunks.at(0).small_pool);
  small_limit.Deallocate(p, 40 * KiB);
}

TEST(DefaultAllocator, IsAProcessWideCachingAllocator) {
  Allocator& a = DefaultAllocator();
  EXPECT_EQ(&a, &DefaultAllocator());
  EXPECT_EQ(a.name(), "caching");
}

}  // namespace
}  // namespace sluice
