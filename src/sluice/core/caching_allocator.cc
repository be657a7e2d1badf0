#include "sluice/core/caching_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "sluice/core/caching_allocator_parts.h"
#include "sluice/core/error.h"

namespace sluice {

namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::atomic<uint64_t> next_allocator_id{1};

// The ranges an address_space_only allocator hands out: addresses no mapping ever has (above the
// 47-bit user space), unique in the process, never touched. Nothing is mapped, so a forecast of
// any size costs neither memory nor address space (ulimit -v).
std::atomic<uintptr_t> next_unmapped_range{uintptr_t{1} << 48};

}  // namespace

CachingAllocator::CachingAllocator(CachingAllocatorOptions options)
    : options_(options), id_(next_allocator_id.fetch_add(1, std::memory_order_relaxed)) {
  const size_t small = options_.small_limit_bytes;
  if (!(options_.reserved_headroom >= 0) || !std::isfinite(options_.reserved_headroom)) {
    throw InvalidArgument(fmt::format(
        "caching allocator: reserved_headroom = {} must be a finite fraction of at least 0 (0 "
        "keeps free blocks' pages); the default is 0.04",
        options_.reserved_headroom));
  }
  if (small < kRoundBytes || small > (size_t{1} << 30) || small % kRoundBytes != 0) {
    throw InvalidArgument(fmt::format(
        "caching allocator: small_limit_bytes = {} must be a multiple of {} between {} and 1 GiB; "
        "the default is 1 MiB",
        small, kRoundBytes, kRoundBytes));
  }
  const size_t region = options_.region_bytes;
  if (region < (size_t{64} << 10) || region > (size_t{1} << 40) || region % PageSize() != 0) {
    throw InvalidArgument(fmt::format(
        "caching allocator: region_bytes = {} must be a multiple of the page size ({} bytes) "
        "between 64 KiB and 1 TiB; the default is 1 GiB",
        region, PageSize()));
  }
  small_pool_ = std::make_unique<Pool>(/*small_pool=*/true, kRoundBytes);
  large_pool_ = std::make_unique<Pool>(/*small_pool=*/false, kRoundBytes);
  live_ = std::make_unique<BlockMap>();
  arena_ = std::make_unique<BlockArena>();
}

CachingAllocator::~CachingAllocator() {
  {
    // Threads still holding a cache of this allocator drop it (and its blocks) instead of
    // flushing it here.
    MutexLock registry(&caching_internal::CacheRegistryMutex());
    MutexLock lock(&mu_);
    for (ThreadCache* cache : caches_) cache->owner.store(nullptr, std::memory_order_release);
    caches_.clear();
  }
  for (Chunk* c = chunks_; c != nullptr;) {
    Chunk* next = c->next;
    if (c->mapped) munmap(c->base, c->capacity);  // nothing useful to do on failure here
    delete c;
    c = next;
  }
}

CachingAllocator::Pool& CachingAllocator::PoolFor(size_t rounded) {
  return rounded <= options_.small_limit_bytes ? *small_pool_ : *large_pool_;
}

void CachingAllocator::ThrowOverBudget(size_t bytes) const {
  const auto held = static_cast<size_t>(allocated_.load(std::memory_order_relaxed));
  throw OutOfMemory(
      fmt::format("allocating {} bytes would hold {} bytes, over the memory budget of {} bytes",
                  bytes, held + bytes, options_.max_allocated_bytes));
}

size_t CachingAllocator::PageSpanBytes(size_t bytes) {
  const size_t page = PageSize();
  const size_t rounded = RoundUp(bytes, kRoundBytes);
  // Starting kRoundBytes short of a page boundary, the most it can cross.
  return RoundUp(rounded + page - kRoundBytes, page);
}

void* CachingAllocator::Allocate(size_t bytes) { return AllocateBlock(bytes)->ptr; }

CachingAllocator::Block* CachingAllocator::AllocateBlock(size_t bytes) {
  ValidateAllocationSize(bytes, name());
  const size_t rounded = RoundUp(bytes, kRoundBytes);
  MutexLock lock(&mu_);
  const int64_t allocated = Account(bytes);
  if (allocated < 0) ThrowOverBudget(bytes);
  Block* block = nullptr;
  try {
    // Everything that could allocate happens first, so a failure leaves no half-made change.
    arena_->Reserve(3);
    live_->ReserveOneMore();
    const bool follow = options_.reserved_headroom != 0 && options_.follow_last_step;
    const bool record = follow && !step_overflow_;
    if (record && step_placements_.size() == step_placements_.capacity()) {
      if (step_placements_.size() == kMaxStepPlacements) {
        step_overflow_ = true;
      } else {
        step_placements_.reserve(std::min(kMaxStepPlacements, 2 * step_placements_.size() + 64));
      }
    }
    const auto granules = static_cast<uint32_t>(rounded / kRoundBytes);
    const size_t tick = step_placements_.size();
    if (follows_last_step_ &&
        (tick >= last_step_.size() || last_step_[tick].granules != granules)) {
      follows_last_step_ = false;  // not the last step's requests: its placements predict nothing
    }
    Pool* chosen = &PoolFor(rounded);
    block = chosen->FindBestFit(rounded);
    // Where in `block` the request goes: its start, unless that lies on returned pages and
    // backed ones fit it elsewhere (see the top).
    size_t at = 0;
    if (block != nullptr && follow &&
        ReturnedUnder(block->chunk, block->ptr, rounded, /*back=*/false) != 0) {
      at = FindBackedWindow(*chosen, rounded, &block);
    }
    // A small request whose place in its own pool lies on returned pages goes where a free block
    // of the large pool has backed pages for it instead: the holes of either pool are reused
    // before returned pages are faulted in again (see the top).
    if (follow && chosen == small_pool_.get() && block != nullptr &&
        ReturnedUnder(block->chunk, block->ptr + at, rounded, /*back=*/false) != 0) {
      Block* large = large_pool_->FindBestFit(rounded);
      size_t large_at = 0;
      if (large != nullptr &&
          ReturnedUnder(large->chunk, large->ptr, rounded, /*back=*/false) != 0) {
        large_at = FindBackedWindow(*large_pool_, rounded, &large);
      }
      if (large != nullptr &&
          ReturnedUnder(large->chunk, large->ptr + large_at, rounded, /*back=*/false) == 0) {
        chosen = large_pool_.get();
        block = large;
        at = large_at;
      }
    }
    Pool& pool = *chosen;
    KeepWithinHeadroom(pool, block, at, rounded, allocated);
    if (block != nullptr && block->chunk->returned_pages != 0 &&
        OverReservedBudget(ReturnedUnder(block->chunk, block->ptr + at, rounded, /*back=*/false))) {
      // Backing the block's returned pages would cross the budget: return every free block's
      // pages first (this one's too), then back what the request covers.
      ReturnFreePages();
      const size_t back = ReturnedUnder(block->chunk, block->ptr + at, rounded, /*back=*/false);
      if (OverReservedBudget(back)) ThrowReservedOver(back, bytes, /*error=*/0);
    }
    if (block != nullptr) {
      pool.Remove(block);
      if (at != 0) {  // the part before the window stays free
        Block* rest = arena_->Take();
        rest->InitFree(block->ptr + at, block->size - at, block->chunk, block, block->next);
        if (block->next != nullptr) block->next->prev = rest;
        block->next = rest;
        if (block->chunk->last == block) block->chunk->last = rest;
        block->size = at;
        pool.Insert(block);
        block = rest;
      }
    } else {
      block = Grow(pool, rounded, bytes);
    }
    Split(pool, block, rounded);
    if (block->chunk->returned_pages != 0) ReturnedUnder(block->chunk, block->ptr, rounded, true);
    if (record && !step_overflow_) {
      const size_t page = PageSize();
      const auto offset = static_cast<size_t>(block->ptr - block->chunk->base);
      step_placements_.push_back({block->chunk, static_cast<uint32_t>(offset / page),
                                  static_cast<uint32_t>((offset + rounded + page - 1) / page),
                                  granules});
    }
  } catch (...) {
    allocated_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    throw;
  }
  block->allocated = true;
  block->requested.store(bytes, std::memory_order_relaxed);
  live_->Insert(block);
  NotePeak(allocated);  // only now: a failed request leaves the peak as it was
  ++num_allocs_;
  recorder_.RecordEvent(static_cast<int64_t>(bytes), allocated);
  return block;
}

CachingAllocator::Block* CachingAllocator::GrowChunk(Pool& pool, size_t rounded) {
  for (Chunk* c = chunks_; c != nullptr; c = c->next) {
    if (c->small_pool != pool.small_pool()) continue;
    Block* tail = c->last;
    // The free tail is in the pool and best fit found nothing: it is smaller than `rounded`.
    const size_t free_tail = tail->allocated ? 0 : tail->size;
    const size_t grow = RoundUp(rounded - free_tail, PageSize());
    if (c->capacity - c->size < grow) continue;
    // The tail's returned pages are backed again too, when the request is placed (AllocateBlock).
    const size_t back = free_tail == 0 ? 0 : ReturnedUnder(c, tail->ptr, free_tail, false);
    if (OverReservedBudget(grow + back)) continue;
    const size_t old_size = c->size;
    c->size += grow;
    recorder_.OnGrow(static_cast<int64_t>(grow));
    if (free_tail != 0) {
      pool.Remove(tail);
      tail->size += grow;
      return tail;
    }
    Block* block = arena_->Take();
    block->InitFree(c->base + old_size, grow, c, tail, nullptr);
    tail->next = block;
    c->last = block;
    return block;
  }
  return nullptr;
}

void CachingAllocator::KeepWithinHeadroom(const Pool& pool, const Block* block, size_t at,
                                          size_t rounded, int64_t allocated) {
  if (options_.reserved_headroom == 0) return;
  // What placing the request adds: the returned pages under the part of `block` it covers, or a
  // growth of at most its size (less when a free tail is extended).
  const size_t more = block != nullptr
                          ? ReturnedUnder(block->chunk, block->ptr + at, rounded, /*back=*/false)
                          : RoundUp(rounded, PageSize());
  if (more == 0) return;
  const auto mark =
      static_cast<double>(std::max(allocated, high_water_.load(std::memory_order_relaxed)));
  const auto limit = static_cast<int64_t>(mark * (1 + options_.reserved_headroom));
  const int64_t over = recorder_.stats().reserved_bytes + static_cast<int64_t>(more) - limit;
  if (over <= 0) return;
  // Spared: what the request lands on — the covered part of `block`, or the free tails of the
  // pool's chunks, which growth extends (their pages returned would only be backed again).
  const Spared spared{.block = block,
                      .block_offset = at,
                      .block_bytes = rounded,
                      .tails_of = block ? nullptr : &pool};
  if (follows_last_step_) {
    ReturnColdestPages(static_cast<size_t>(over), spared);
  } else {
    ReturnFreePages(static_cast<size_t>(over), spared);
  }
}

bool CachingAllocator::OverReservedBudget(size_t more) const {
  return options_.max_reserved_bytes != 0 &&
         static_cast<size_t>(recorder_.stats().reserved_bytes) + more > options_.max_reserved_bytes;
}

size_t CachingAllocator::ReturnedUnder(Chunk* c, const char* ptr, size_t size, bool back) {
  if (c->returned_pages == 0) return 0;
  const auto offset = static_cast<size_t>(ptr - c->base);
  const size_t page = PageSize();
  const size_t n = c->CountReturned(offset / page, (offset + size + page - 1) / page, back);
  if (back && n != 0) {
    recorder_.OnGrow(static_cast<int64_t>(n * page));
    backed_again_bytes_ += n * page;
  }
  return n * page;
}

size_t CachingAllocator::ReturnFreePages() {
  return ReturnFreePages(std::numeric_limits<size_t>::max(), Spared{});
}

size_t CachingAllocator::ReturnFreePages(size_t want, const Spared& spared) {
  const size_t page = PageSize();
  size_t bytes = 0;
  for (Block* b : FreeBlocksInWalkOrder()) {
    if (bytes >= want) break;
    Chunk* c = b->chunk;
    const bool spare_tail =
        spared.tails_of != nullptr && c->small_pool == spared.tails_of->small_pool();
    if (spare_tail && b == c->last) continue;
    const auto offset = static_cast<size_t>(b->ptr - c->base);
    const size_t begin = RoundUp(offset, page) / page;
    const size_t end = (offset + b->size) / page;
    if (begin >= end) continue;
    // The pages the request lands on, when it lands in this block.
    const std::pair<size_t, size_t> kept = SparedPages(spared, b);
    const auto keep = [&](size_t p) {
      return c->Returned(p) || (p >= kept.first && p < kept.second);
    };
    // Runs of backed pages, one madvise each; the counts follow each run, so that a failure
    // leaves them exact.
    for (size_t p = begin; p < end && bytes < want;) {
      if (keep(p)) {
        ++p;
        continue;
      }
      size_t q = p;
      while (q < end && !keep(q) && bytes + (q - p) * page < want) ++q;
      bytes += ReturnPages(c, p, q);
      p = q;
    }
  }
  return bytes;
}

std::pair<size_t, size_t> CachingAllocator::SparedPages(const Spared& spared, const Block* b) {
  if (b != spared.block) return {0, 0};
  const size_t page = PageSize();
  const auto begin = static_cast<size_t>(b->ptr - b->chunk->base) + spared.block_offset;
  return {begin / page, (begin + spared.block_bytes + page - 1) / page};
}

const std::vector<CachingAllocator::Block*>& CachingAllocator::FreeBlocksInWalkOrder() {
  walk_scratch_.clear();
  // The lock analysis does not see that the lambda runs here, under mu_.
  std::vector<Block*>* blocks = &walk_scratch_;
  for (const Pool* pool : {small_pool_.get(), large_pool_.get()}) {
    pool->ForEachFrom(0, [blocks](Block* b) { blocks->push_back(b); });
  }
  std::sort(walk_scratch_.begin(), walk_scratch_.end(), [](const Block* a, const Block* b) {
    return a->chunk != b->chunk ? a->chunk->serial > b->chunk->serial : a->ptr < b->ptr;
  });
  return walk_scratch_;
}

size_t CachingAllocator::FindBackedWindow(const Pool& pool, size_t rounded, Block** block) {
  const size_t page = PageSize();
  // The window chosen is the one a walk of the chunks (chunks_ order) and of each chunk's blocks
  // (address order) would keep, trying each block's starts in order, taking a window only when it
  // lies on fewer returned pages than the best so far, or as few in a smaller block (so the best
  // fit `*block` at its start wins ties), and ending with the chunk where a window on none turned
  // up. In any order of the blocks that is:
  //   - a window on no returned page, when there is one: in the first chunk walked that has one,
  //     the smallest block with one, the lowest address, its first such start;
  //   - otherwise the fewest returned pages, the smallest block, `*block` at its start on a tie,
  //     then the first chunk walked, the lowest address, the first start.
  // So the pool's free blocks come straight from its bins, unsorted: a deep model's step leaves
  // hundreds, and sorting them per search cost more than searching them.
  struct Window {
    const Block* block;
    size_t cost;  // returned pages under it
    size_t offset;
  };
  const auto walked_first = [](const Block* a, const Block* b) {
    return a->chunk != b->chunk ? a->chunk->serial > b->chunk->serial : a->ptr < b->ptr;
  };
  Window best{*block, ReturnedUnder((*block)->chunk, (*block)->ptr, rounded, false) / page, 0};
  bool best_is_fit = true;     // best is still `*block` at its start
  Window none{nullptr, 0, 0};  // the window on no returned page, once one is found
  pool.ForEachFrom(rounded, [&](const Block* b) {
    if (b->size < rounded) return;
    Chunk* c = b->chunk;
    if (none.block != nullptr) {  // only a window on none walked before it can win
      const Block* n = none.block;
      if (c != n->chunk ? c->serial < n->chunk->serial
                        : b->size > n->size || (b->size == n->size && b->ptr > n->ptr)) {
        return;
      }
    }
    // The window's cost changes only where an end crosses a page boundary: try each start at
    // one, and the block's two ends. The window's pages [first, end) only move forward, so its
    // count is kept by the pages that leave and enter it: linear in the block's pages.
    const auto base = static_cast<size_t>(b->ptr - c->base);
    const size_t last = b->size - rounded;
    size_t first = base / page, end = (base + rounded + page - 1) / page;
    size_t n = c->CountReturned(first, end, false);
    for (size_t at = 0;;) {
      const size_t new_first = (base + at) / page;
      const size_t new_end = (base + at + rounded + page - 1) / page;
      for (; first < new_first; ++first) n -= c->Returned(first) ? 1 : 0;
      for (; end < new_end; ++end) n += c->Returned(end) ? 1 : 0;
      if (n == 0) {
        // Its first start on none; no later start of this block can win.
        const Block* had = none.block;
        if (had == nullptr || (c != had->chunk ? c->serial > had->chunk->serial
                                               : b->size < had->size ||
                                                     (b->size == had->size && b->ptr < had->ptr))) {
          none = {b, 0, at};
        }
        return;
      }
      if (none.block == nullptr &&
          (n < best.cost ||
           (n == best.cost &&
            (b->size < best.block->size ||
             (b->size == best.block->size && !best_is_fit &&
              (b == best.block ? at < best.offset : walked_first(b, best.block))))))) {
        best = {b, n, at};
        best_is_fit = false;
      }
      if (at == last) return;
      at = std::min(last, RoundUp(base + at + 1, page) - base);
    }
  });
  const Window& chosen = none.block != nullptr ? none : best;
  *block = const_cast<Block*>(chosen.block);
  return chosen.offset;
}

size_t CachingAllocator::ReturnPages(Chunk* c, size_t first_page, size_t end_page) {
  const size_t page = PageSize();
  const size_t run = (end_page - first_page) * page;
  if (c->returned.size() * 64 < end_page) c->returned.resize((end_page + 63) / 64, 0);
  if (c->mapped) {
    const int rc = madvise(c->base + first_page * page, run, MADV_DONTNEED);
    SLUICE_CHECK(rc == 0, "caching allocator: madvise of {} bytes failed: {}", run,
                 std::strerror(errno));
  }
  for (size_t i = first_page; i < end_page; ++i) c->returned[i / 64] |= uint64_t{1} << (i % 64);
  c->returned_pages += end_page - first_page;
  recorder_.OnShrink(static_cast<int64_t>(run));
  return run;
}

size_t CachingAllocator::ReturnColdestPages(size_t want, const Spared& spared) {
  const size_t page = PageSize();
  // The candidates: the backed whole pages inside free blocks, less the spared ones.
  size_t count = 0;
  for (Chunk* c = chunks_; c != nullptr; c = c->next) {
    c->candidates.assign((c->size / page + 63) / 64, 0);
  }
  for (Block* b : FreeBlocksInWalkOrder()) {
    Chunk* c = b->chunk;
    const bool spare_tail =
        spared.tails_of != nullptr && c->small_pool == spared.tails_of->small_pool();
    if (spare_tail && b == c->last) continue;
    const auto offset = static_cast<size_t>(b->ptr - c->base);
    const auto [spare_begin, spare_end] = SparedPages(spared, b);
    for (size_t p = RoundUp(offset, page) / page; p < (offset + b->size) / page; ++p) {
      if (c->Returned(p) || (p >= spare_begin && p < spare_end)) continue;
      c->candidates[p / 64] |= uint64_t{1} << (p % 64);
      ++count;
    }
  }
  const size_t need = (want + page - 1) / page;
  // Drop, in the order the last step placed its blocks from this point of the step on (and on
  // into the next step), the candidates each placement covers, while more than `need` remain:
  // those left are needed last, or not at all. `stop` is the placement that would leave fewer;
  // its pages go last.
  const Placement* stop = nullptr;
  const size_t now = step_placements_.size(), n = last_step_.size();
  for (size_t i = 0; i < n && count > need; ++i) {
    const Placement& placed = last_step_[(now + i) % n];
    std::vector<uint64_t>& bits = placed.chunk->candidates;
    const size_t end = std::min<size_t>(placed.end_page, bits.size() * 64);
    size_t covered = 0;
    for (size_t p = placed.first_page; p < end; ++p) covered += (bits[p / 64] >> (p % 64)) & 1;
    if (count - covered < need) {
      stop = &placed;
      break;
    }
    for (size_t p = placed.first_page; p < end; ++p) bits[p / 64] &= ~(uint64_t{1} << (p % 64));
    count -= covered;
  }
  const auto stopped = [&](const Chunk* c, size_t p) {
    return stop != nullptr && stop->chunk == c && p >= stop->first_page && p < stop->end_page;
  };
  size_t bytes = 0;
  for (const bool last : {false, true}) {
    for (Chunk* c = chunks_; c != nullptr && bytes < want; c = c->next) {
      const size_t pages = c->candidates.size() * 64;
      const auto candidate = [&](size_t p) {
        return ((c->candidates[p / 64] >> (p % 64)) & 1) != 0 && stopped(c, p) == last &&
               !c->Returned(p);
      };
      for (size_t p = 0; p < pages && bytes < want;) {
        if (!candidate(p)) {
          ++p;
          continue;
        }
        size_t q = p;
        while (q < pages && candidate(q) && bytes + (q - p) * page < want) ++q;
        bytes += ReturnPages(c, p, q);
        p = q;
      }
    }
  }
  return bytes;
}

void CachingAllocator::ThrowReservedOver(size_t size, size_t requested, int error) const {
  const MemoryStats& s = recorder_.stats();
  const std::string reason =
      error != 0 ? fmt::format("the OS refused to map it ({})", std::strerror(error))
                 : fmt::format(
                       "it would take the reserved bytes over the memory budget "
                       "(max_reserved_bytes = {})",
                       options_.max_reserved_bytes);
  throw OutOfMemory(
      fmt::format("caching allocator: cannot obtain {} bytes for a request of {} bytes: {}; "
                  "{} bytes are reserved and {} bytes allocated after returning free memory",
                  size, requested, reason, s.reserved_bytes,
                  // AllocateBlock accounted the request before placing it: it is not held.
                  allocated_.load(std::memory_order_relaxed) - static_cast<int64_t>(requested)));
}

CachingAllocator::Block* CachingAllocator::Grow(Pool& pool, size_t rounded, size_t requested) {
  const size_t size = RoundUp(rounded, PageSize());
  auto chunk = std::make_unique<Chunk>();  // before mmap, so a failure here leaks no mapping
  void* base = MAP_FAILED;
  size_t capacity = 0;
  int error = 0;
  // Second attempt after returning the cache to the OS; unmapping under the lock is fine on
  // this already slow path.
  for (int attempt = 0; attempt < 2 && base == MAP_FAILED; ++attempt) {
    if (attempt == 1) {
      UnmapChunks(DetachFreeChunks());
      TrimFreeTails();
      ReturnFreePages();
    }
    if (Block* grown = GrowChunk(pool, rounded); grown != nullptr) return grown;
    error = 0;
    if (OverReservedBudget(size)) continue;
    // A new region: address space only; pages are touched as blocks are used. When
    // the OS refuses a whole region, the request alone.
    for (const size_t want : {std::max(options_.region_bytes, size), size}) {
      capacity = want;
      if (options_.address_space_only) {
        base = reinterpret_cast<void*>(next_unmapped_range.fetch_add(
            RoundUp(want, PageSize()) + PageSize(), std::memory_order_relaxed));
      } else {
        base = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      }
      if (base != MAP_FAILED) break;
      error = errno;
    }
  }
  if (base == MAP_FAILED) ThrowReservedOver(size, requested, error);
  *chunk = Chunk{static_cast<char*>(base),
                 size,
                 capacity,
                 pool.small_pool(),
                 /*mapped=*/!options_.address_space_only,
                 nullptr,
                 nullptr,
                 nullptr,
                 chunks_};
  chunk->serial = next_chunk_serial_++;
  if (chunks_ != nullptr) chunks_->prev = chunk.get();
  chunks_ = chunk.release();
  ++num_chunks_;
  Block* block = arena_->Take();
  block->InitFree(chunks_->base, size, chunks_, nullptr, nullptr);
  chunks_->first = chunks_->last = block;
  recorder_.OnReserve(static_cast<int64_t>(size));
  return block;
}

void CachingAllocator::Split(Pool& pool, Block* block, size_t rounded) {
  const size_t remainder = block->size - rounded;
  if (remainder == 0 || remainder < pool.min_split_remainder()) return;
  Block* rest = arena_->Take();
  rest->InitFree(block->ptr + rounded, remainder, block->chunk, block, block->next);
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  if (block->chunk->last == block) block->chunk->last = rest;
  block->size = rounded;
  pool.Insert(rest);
}

void CachingAllocator::Deallocate(void* ptr, size_t bytes) {
  MutexLock lock(&mu_);
  Block* block = live_->Find(ptr);
  SLUICE_CHECK(block != nullptr,
               "caching allocator: Deallocate({}, {} bytes) of a pointer it does not own (never "
               "allocated by this instance, or already freed)",
               fmt::ptr(ptr), bytes);
  const size_t requested = block->requested.load(std::memory_order_relaxed);
  SLUICE_CHECK(requested != 0,
               "caching allocator: Deallocate({}, {} bytes) of a block already freed (it is parked "
               "in a thread's cache)",
               fmt::ptr(ptr), bytes);
  SLUICE_CHECK(requested == bytes,
               "caching allocator: Deallocate({}, {} bytes) of a block allocated with {} bytes",
               fmt::ptr(ptr), bytes, requested);
  live_->Erase(ptr);
  const int64_t after =
      allocated_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed) -
      static_cast<int64_t>(bytes);
  ++num_frees_;
  recorder_.RecordEvent(-static_cast<int64_t>(bytes), after);
  FreeBlock(block);
}

void CachingAllocator::FreeBlock(Block* block) {
  Pool& pool = block->chunk->small_pool ? *small_pool_ : *large_pool_;
  block->allocated = false;
  block->requested.store(0, std::memory_order_relaxed);
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    pool.Remove(next);
    block->size += next->size;
    block->next = next->next;
    if (block->chunk->last == next) block->chunk->last = block;
    if (next->next != nullptr) next->next->prev = block;
    arena_->Give(next);
  }
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    pool.Remove(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->chunk->last == block) block->chunk->last = prev;
    if (block->next != nullptr) block->next->prev = prev;
    arena_->Give(block);
    block = prev;
  }
  pool.Insert(block);
}

std::vector<CachingAllocator::Chunk*> CachingAllocator::DetachFreeChunks() {
  std::vector<Chunk*> detached;
  for (Chunk* c = chunks_; c != nullptr;) {
    Chunk* next = c->next;
    Block* only = c->first;
    if (!only->allocated && only->next == nullptr) {
      (c->small_pool ? *small_pool_ : *large_pool_).Remove(only);
      arena_->Give(only);
      (c->prev != nullptr ? c->prev->next : chunks_) = c->next;
      if (c->next != nullptr) c->next->prev = c->prev;
      --num_chunks_;
      ForgetSteps();  // their placements name this chunk
      recorder_.OnUnreserve(static_cast<int64_t>(c->size - c->returned_pages * PageSize()));
      detached.push_back(c);
    }
    c = next;
  }
  return detached;
}

size_t CachingAllocator::TrimFreeTails() {
  size_t trimmed = 0;
  for (Chunk* c = chunks_; c != nullptr; c = c->next) {
    Block* tail = c->last;
    if (tail->allocated || tail == c->first) continue;  // a wholly free chunk is DetachFreeChunks'
    const size_t keep = RoundUp(static_cast<size_t>(tail->ptr - c->base), PageSize());
    if (keep >= c->size) continue;
    const size_t cut = c->size - keep;
    // Of them, those returned already are not reserved; the chunk grows into them backed.
    const size_t returned =
        c->CountReturned(keep / PageSize(), c->size / PageSize(), /*clear=*/true) * PageSize();
    // The pages stay mapped (the chunk may grow into them again) but their memory goes back.
    if (c->mapped) {
      const int rc = madvise(c->base + keep, cut, MADV_DONTNEED);
      SLUICE_CHECK(rc == 0, "caching allocator: madvise of {} bytes failed: {}", cut,
                   std::strerror(errno));
    }
    Pool& pool = c->small_pool ? *small_pool_ : *large_pool_;
    pool.Remove(tail);
    if (tail->ptr == c->base + keep) {
      c->last = tail->prev;
      c->last->next = nullptr;
      arena_->Give(tail);
    } else {
      tail->size -= cut;
      pool.Insert(tail);
    }
    c->size = keep;
    recorder_.OnShrink(static_cast<int64_t>(cut - returned));
    trimmed += cut - returned;
  }
  return trimmed;
}

void CachingAllocator::UnmapChunks(const std::vector<Chunk*>& chunks) {
  for (Chunk* c : chunks) {
    const int rc = c->mapped ? munmap(c->base, c->capacity) : 0;
    const int error = errno;
    const size_t size = c->capacity;
    delete c;
    SLUICE_CHECK(rc == 0, "caching allocator: munmap of a {}-byte chunk failed: {}", size,
                 std::strerror(error));
  }
}

size_t CachingAllocator::ReleaseCached() {
  ThreadCache* cache = LocalCache();
  std::vector<Chunk*> detached;
  size_t bytes = 0;
  {
    MutexLock lock(&mu_);
    if (cache != nullptr) DrainCache(cache, /*retire=*/false);
    detached = DetachFreeChunks();
    bytes = TrimFreeTails() + ReturnFreePages();
  }
  for (const Chunk* c : detached) bytes += c->size - c->returned_pages * PageSize();
  UnmapChunks(detached);
  return bytes;
}

MemoryStats CachingAllocator::Stats() const {
  MutexLock lock(&mu_);
  MemoryStats stats = recorder_.stats();
  stats.allocated_bytes = allocated_.load(std::memory_order_relaxed);
  stats.peak_allocated_bytes = peak_allocated_.load(std::memory_order_relaxed);
  stats.num_allocs = num_allocs_;
  stats.num_frees = num_frees_;
  for (const ThreadCache* cache : caches_) {
    stats.num_allocs += cache->num_allocs.load(std::memory_order_relaxed);
    stats.num_frees += cache->num_frees.load(std::memory_order_relaxed);
  }
  return stats;
}

void CachingAllocator::ResetPeak() {
  MutexLock lock(&mu_);
  // A step boundary: the step that ends predicts the next, unless it was too long to record.
  last_step_.swap(step_placements_);
  step_placements_.clear();
  if (step_overflow_) last_step_.clear();
  step_overflow_ = false;
  follows_last_step_ = !last_step_.empty();
  recorder_.ResetPeak();
  peak_allocated_.store(allocated_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void CachingAllocator::ForgetSteps() {
  step_placements_.clear();
  last_step_.clear();
  follows_last_step_ = false;
}

size_t CachingAllocator::BackedAgainBytes() const {
  MutexLock lock(&mu_);
  return backed_again_bytes_;
}

bool CachingAllocator::FollowsLastStep() const {
  MutexLock lock(&mu_);
  return follows_last_step_;
}

void CachingAllocator::EnableTimeline(bool on) {
  MutexLock lock(&mu_);
  recorder_.EnableTimeline(on);
  timeline_on_.store(on, std::memory_order_relaxed);
}

std::vector<MemoryEvent> CachingAllocator::Timeline() const {
  MutexLock lock(&mu_);
  return recorder_.timeline();
}

}  // namespace sluice
