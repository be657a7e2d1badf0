// CachingAllocator's introspection, for tests and debugging output: counts, a Snapshot of every
// chunk's blocks, and CheckInvariants, which walks every block against the invariants the header
// lists. Each takes mu_ and changes nothing.
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdint>

#include <fmt/format.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/caching_allocator_parts.h"
#include "sluice/core/error.h"
#include "sluice/core/mutex.h"

namespace sluice {

size_t CachingAllocator::NumThreadCachedBlocks() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const Chunk* c = chunks_; c != nullptr; c = c->next) {
    for (const Block* b = c->first; b != nullptr; b = b->next) {
      n += b->allocated && b->requested.load(std::memory_order_relaxed) == 0;
    }
  }
  return n;
}

size_t CachingAllocator::NumChunks() const {
  MutexLock lock(&mu_);
  return num_chunks_;
}

size_t CachingAllocator::NumFreeBlocks() const {
  MutexLock lock(&mu_);
  return small_pool_->num_free_blocks() + large_pool_->num_free_blocks();
}

CachingAllocatorSnapshot CachingAllocator::Snapshot() const {
  MutexLock lock(&mu_);
  CachingAllocatorSnapshot snapshot;
  for (const Chunk* c = chunks_; c != nullptr; c = c->next) {
    auto& chunk = snapshot.chunks.emplace_back();
    chunk.base = reinterpret_cast<uintptr_t>(c->base);
    chunk.size = c->size;
    chunk.capacity = c->capacity;
    chunk.returned_bytes = c->returned_pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    chunk.small_pool = c->small_pool;
    for (const Block* b = c->first; b != nullptr; b = b->next) {
      chunk.blocks.push_back({static_cast<size_t>(b->ptr - c->base), b->size,
                              b->requested.load(std::memory_order_relaxed), b->allocated});
    }
  }
  return snapshot;
}

void CachingAllocator::CheckInvariants() const {
  MutexLock lock(&mu_);
  int64_t reserved = 0;
  int64_t requested = 0;
  size_t num_chunks = 0;
  size_t num_allocated = 0;
  size_t num_free[2] = {0, 0};  // [small_pool]
  for (const Chunk* c = chunks_; c != nullptr; c = c->next) {
    SLUICE_CHECK(++num_chunks <= num_chunks_, "chunk list longer than num_chunks_");
    SLUICE_CHECK(c->next == nullptr || c->next->prev == c, "chunk list links broken");
    SLUICE_CHECK(c->first != nullptr && c->first->ptr == c->base && c->first->prev == nullptr,
                 "chunk {} does not start with its first block", fmt::ptr(c->base));
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    reserved += static_cast<int64_t>(c->size - c->returned_pages * page);
    size_t returned = 0;
    for (const uint64_t word : c->returned) returned += static_cast<size_t>(std::popcount(word));
    SLUICE_CHECK(returned == c->returned_pages, "chunk {}: {} pages returned, counter says {}",
                 fmt::ptr(c->base), returned, c->returned_pages);
    for (size_t p = c->size / page; p < c->returned.size() * 64; ++p) {
      SLUICE_CHECK(!c->Returned(p), "chunk {}: page {} returned past its used {} bytes",
                   fmt::ptr(c->base), p, c->size);
    }
    char* expected = c->base;
    for (const Block* b = c->first; b != nullptr; b = b->next) {
      SLUICE_CHECK(b->chunk == c && b->ptr == expected, "block {} is not where its chunk says",
                   fmt::ptr(b->ptr));
      SLUICE_CHECK(b->size > 0 && b->size % kRoundBytes == 0, "block size {} not a multiple of {}",
                   b->size, kRoundBytes);
      SLUICE_CHECK(b->next == nullptr || b->next->prev == b, "block links broken");
      if (b->allocated) {
        ++num_allocated;
        const size_t r = b->requested.load(std::memory_order_relaxed);  // 0: parked
        requested += static_cast<int64_t>(r);
        SLUICE_CHECK(RoundUp(r, kRoundBytes) <= b->size && (r > 0 || b->size <= kMaxCachedBytes),
                     "allocated block of {} bytes holds a request of {}", b->size, r);
        SLUICE_CHECK(live_->Find(b->ptr) == b, "allocated block {} missing from the live map",
                     fmt::ptr(b->ptr));
        const auto offset = static_cast<size_t>(b->ptr - c->base);
        for (size_t p = offset / page; p * page < offset + b->size; ++p) {
          SLUICE_CHECK(!c->Returned(p), "allocated block {} lies on returned page {}",
                       fmt::ptr(b->ptr), p);
        }
      } else {
        ++num_free[c->small_pool];
        SLUICE_CHECK(b->next == nullptr || b->next->allocated,
                     "adjacent free blocks at {} were not coalesced", fmt::ptr(b->ptr));
      }
      expected += b->size;
    }
    SLUICE_CHECK(expected == c->base + c->size, "blocks do not tile chunk {}", fmt::ptr(c->base));
    SLUICE_CHECK(c->last != nullptr && c->last->next == nullptr &&
                     c->last->ptr + c->last->size == c->base + c->size,
                 "chunk {} does not end with its last block", fmt::ptr(c->base));
    SLUICE_CHECK(c->size <= c->capacity, "chunk {} uses {} bytes of its {}", fmt::ptr(c->base),
                 c->size, c->capacity);
  }
  SLUICE_CHECK(num_chunks == num_chunks_, "num_chunks_ = {} but {} chunks listed", num_chunks_,
               num_chunks);
  SLUICE_CHECK(num_allocated == live_->size(), "live map holds {} blocks, chunks {}", live_->size(),
               num_allocated);
  const MemoryStats& stats = recorder_.stats();
  SLUICE_CHECK(stats.reserved_bytes == reserved, "reserved_bytes {} != chunk total {}",
               stats.reserved_bytes, reserved);
  const int64_t allocated = allocated_.load(std::memory_order_relaxed);
  SLUICE_CHECK(allocated == requested, "allocated_bytes {} != live requests {}", allocated,
               requested);
  for (const Pool* pool : {small_pool_.get(), large_pool_.get()}) {
    size_t listed = 0;
    pool->ForEach([&](int bin, const Block* b) {
      ++listed;
      SLUICE_CHECK(!b->allocated && b->chunk->small_pool == pool->small_pool(),
                   "bin {} holds a block that is allocated or of the other pool", bin);
      SLUICE_CHECK(Pool::BinOf(b->size) == bin, "block of {} bytes filed in bin {}", b->size, bin);
      SLUICE_CHECK(b->next_free == nullptr || b->next_free->prev_free == b, "bin links broken");
    });
    SLUICE_CHECK(listed == pool->num_free_blocks() && listed == num_free[pool->small_pool()],
                 "{} pool: {} blocks in bins, counter says {}, chunks hold {} free",
                 pool->small_pool() ? "small" : "large", listed, pool->num_free_blocks(),
                 num_free[pool->small_pool()]);
  }
}

}  // namespace sluice
