// The private parts of CachingAllocator (core/caching_allocator.h), shared by its three files;
// not part of the public API:
//   caching_allocator.cc               the locked path: chunks, best fit, split and coalesce,
//                                      the budgets, Stats
//   caching_allocator_thread_cache.cc  the per-thread fast path (AllocateWithToken and
//                                      DeallocateWithToken) and the caches' lifetime
//   caching_allocator_checks.cc        introspection for tests: Snapshot, CheckInvariants, counts
// This file holds the data structures they share: Block and Chunk descriptors, a pool's
// size-class bins (Pool), the map of live pointers (BlockMap), the descriptor arena (BlockArena)
// and one thread's parked blocks (ThreadCache), and the byte accounting both paths share (Account,
// NotePeak: inline, as they were when one file held both paths). None has a lock of its own: Pool,
// BlockMap and BlockArena are used under the allocator's mu_, a ThreadCache's stacks by its thread
// alone.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/core/mutex.h"

namespace sluice {

namespace caching_internal {

inline constexpr int kRoundLog2 = 9;
static_assert(size_t{1} << kRoundLog2 == CachingAllocator::kRoundBytes);
static_assert(CachingAllocator::kRoundBytes % kAlignment == 0);

// Guards the meeting of a thread cache's thread (exiting) and its allocator (being destroyed);
// taken before any allocator's mu_.
Mutex& CacheRegistryMutex();

}  // namespace caching_internal

// A span of a chunk. Descriptors live in the BlockArena, never in the chunk's own memory, so a
// caller's bytes are all its own.
struct CachingAllocator::Block {
  char* ptr;
  size_t size;  // multiple of kRoundBytes
  // The caller's byte count while a caller holds the block; 0 while free or parked in a thread
  // cache. Atomic: the fast path writes it without mu_ (ptr and size do not change while the
  // block is allocated, so the fast path reads them plainly).
  std::atomic<size_t> requested;
  Chunk* chunk;
  Block* prev;  // address-order neighbours inside the chunk (nullptr at its ends)
  Block* next;
  Block* prev_free;  // bin list while free; next_free also links the arena's spares
  Block* next_free;
  bool allocated;  // held by a caller or parked in a thread cache

  void InitFree(char* p, size_t s, Chunk* c, Block* before, Block* after) {
    ptr = p;
    size = s;
    requested.store(0, std::memory_order_relaxed);
    chunk = c;
    prev = before;
    next = after;
    prev_free = next_free = nullptr;
    allocated = false;
  }
};

// One OS mapping (a region): `capacity` bytes of address space, of which the first `size` are in
// use and tiled by blocks; the rest is untouched address space the chunk grows into. Of the used
// prefix, the pages in `returned` were given back to the OS (madvise) from inside free blocks and
// are not reserved until a block placed on them backs them again: the chunk reserves
// size - returned_pages pages. `first` is the block at `base`; it is never recycled while the
// chunk lives, because coalescing always keeps the lower-address descriptor. `last` is the block
// that ends at base + size.
struct CachingAllocator::Chunk {
  char* base;
  size_t size;      // in use: a multiple of the page size, at most capacity
  size_t capacity;  // mapped address space
  bool small_pool;
  bool mapped;  // false: an address_space_only allocator's range, never mapped (nothing to unmap)
  Block* first;
  Block* last;
  Chunk* prev;  // list of all chunks (CachingAllocator::chunks_)
  Chunk* next;
  // Made after every chunk of a lower serial: chunks_ lists chunks by falling serial.
  uint64_t serial = 0;
  // Bit i set: page i of the used prefix is returned. Grown on the first return that needs it;
  // pages past its end are backed.
  std::vector<uint64_t> returned = {};
  size_t returned_pages = 0;  // the bits set
  // Scratch of ReturnColdestPages: bit i set for a page it may return.
  std::vector<uint64_t> candidates = {};

  bool Returned(size_t page) const {
    return page / 64 < returned.size() && ((returned[page / 64] >> (page % 64)) & 1) != 0;
  }
  // The returned pages among pages [first, last): counts them and, with `clear`, backs them.
  size_t CountReturned(size_t first_page, size_t end_page, bool clear) {
    size_t n = 0;
    end_page = std::min(end_page, returned.size() * 64);
    for (size_t page = first_page; page < end_page;) {
      const size_t word = page / 64, bit = page % 64;
      const size_t take = std::min<size_t>(64 - bit, end_page - page);
      const uint64_t mask = (take == 64 ? ~uint64_t{0} : ((uint64_t{1} << take) - 1)) << bit;
      n += static_cast<size_t>(std::popcount(returned[word] & mask));
      if (clear) returned[word] &= ~mask;
      page += take;
    }
    if (clear) returned_pages -= n;
    return n;
  }
};

// The free blocks of one pool: intrusive LIFO lists per size class plus a two-level bitmap of the
// non-empty classes, so finding the first non-empty class at or above a size is two bit scans.
class CachingAllocator::Pool {
 public:
  // Size classes, in units of 512 B ("granules"): one exact bin per granule count below 4096
  // (2 MiB), then 16 bins per power of two up to 2^31 granules (1 TiB, the largest possible block).
  static constexpr int kExactBins = 4096;
  static constexpr int kExactLog2 = 12;
  static constexpr int kSubBinsLog2 = 4;
  static constexpr int kMaxGranuleLog2 = 31;
  static constexpr int kNumBins =
      kExactBins + (kMaxGranuleLog2 - kExactLog2 + 1) * (1 << kSubBinsLog2);
  static constexpr int kBitmapWords = (kNumBins + 63) / 64;
  static constexpr int kSummaryWords = (kBitmapWords + 63) / 64;

  // The bin of a free block of `size` bytes (a multiple of kRoundBytes).
  static int BinOf(size_t size) {
    const size_t granules = size >> caching_internal::kRoundLog2;
    if (granules < kExactBins) return static_cast<int>(granules);
    const int log2 = std::bit_width(granules) - 1;
    const int sub = static_cast<int>(granules >> (log2 - kSubBinsLog2)) & ((1 << kSubBinsLog2) - 1);
    return kExactBins + ((log2 - kExactLog2) << kSubBinsLog2) + sub;
  }

  Pool(bool small_pool, size_t min_split_remainder)
      : small_pool_(small_pool), min_split_remainder_(min_split_remainder) {}

  bool small_pool() const { return small_pool_; }
  size_t min_split_remainder() const { return min_split_remainder_; }
  size_t num_free_blocks() const { return num_free_blocks_; }

  void Insert(Block* block) {
    const int bin = BinOf(block->size);
    block->prev_free = nullptr;
    block->next_free = heads_[bin];
    if (heads_[bin] != nullptr) {
      heads_[bin]->prev_free = block;
    } else {
      SetBit(bin);
    }
    heads_[bin] = block;
    ++num_free_blocks_;
  }

  void Remove(Block* block) {
    if (block->prev_free != nullptr) {
      block->prev_free->next_free = block->next_free;
    } else {
      const int bin = BinOf(block->size);
      heads_[bin] = block->next_free;
      if (heads_[bin] == nullptr) ClearBit(bin);
    }
    if (block->next_free != nullptr) block->next_free->prev_free = block->prev_free;
    --num_free_blocks_;
  }

  // The smallest free block of at least `size` bytes, or nullptr. Does not remove it.
  Block* FindBestFit(size_t size) const {
    const int bin = BinOf(size);
    if (bin >= kExactBins) {
      // A ranged bin may hold blocks smaller than `size`; the best fitting one here beats any
      // block of a higher bin.
      Block* best = SmallestAtLeast(heads_[bin], size);
      if (best != nullptr) return best;
    }
    const int found = FirstNonEmptyBin(bin >= kExactBins ? bin + 1 : bin);
    if (found < 0) return nullptr;
    if (found < kExactBins) return heads_[found];  // every block of an exact bin fits exactly
    return SmallestAtLeast(heads_[found], size);
  }

  // Calls f(block) for every free block of at least `size` bytes, and for the smaller ones that
  // share the first ranged bin with them, in no particular order; visits the non-empty bins alone
  // (a few bit scans each), never the allocated blocks between the free ones.
  template <typename F>
  void ForEachFrom(size_t size, F f) const {
    for (int bin = FirstNonEmptyBin(BinOf(size)); bin >= 0; bin = FirstNonEmptyBin(bin + 1)) {
      for (Block* b = heads_[bin]; b != nullptr; b = b->next_free) f(b);
    }
  }

  // For CheckInvariants and Snapshot: calls f(bin, block) for every free block.
  template <typename F>
  void ForEach(F f) const {
    for (int bin = 0; bin < kNumBins; ++bin) {
      const bool bit = (words_[bin >> 6] >> (bin & 63)) & 1;
      SLUICE_CHECK(bit == (heads_[bin] != nullptr), "bitmap disagrees with bin {}", bin);
      size_t steps = 0;
      for (Block* b = heads_[bin]; b != nullptr; b = b->next_free) {
        SLUICE_CHECK(++steps <= num_free_blocks_, "bin {} list is cyclic", bin);
        f(bin, b);
      }
    }
    for (int w = 0; w < kBitmapWords; ++w) {
      const bool bit = (summary_[w >> 6] >> (w & 63)) & 1;
      SLUICE_CHECK(bit == (words_[w] != 0), "summary bitmap disagrees with word {}", w);
    }
  }

 private:
  static Block* SmallestAtLeast(Block* head, size_t size) {
    Block* best = nullptr;
    for (Block* b = head; b != nullptr; b = b->next_free) {
      if (b->size >= size && (best == nullptr || b->size < best->size)) {
        best = b;
        if (b->size == size) break;
      }
    }
    return best;
  }

  int FirstNonEmptyBin(int from) const {
    if (from >= kNumBins) return -1;
    int word = from >> 6;
    const uint64_t bits = words_[word] & (~uint64_t{0} << (from & 63));
    if (bits != 0) return (word << 6) + std::countr_zero(bits);
    ++word;
    for (int s = word >> 6; s < kSummaryWords; ++s) {
      uint64_t summary = summary_[s];
      if (s == (word >> 6)) summary &= ~uint64_t{0} << (word & 63);
      if (summary != 0) {
        const int w = (s << 6) + std::countr_zero(summary);
        return (w << 6) + std::countr_zero(words_[w]);
      }
    }
    return -1;
  }

  void SetBit(int bin) {
    words_[bin >> 6] |= uint64_t{1} << (bin & 63);
    summary_[bin >> 12] |= uint64_t{1} << ((bin >> 6) & 63);
  }

  void ClearBit(int bin) {
    uint64_t& word = words_[bin >> 6];
    word &= ~(uint64_t{1} << (bin & 63));
    if (word == 0) summary_[bin >> 12] &= ~(uint64_t{1} << ((bin >> 6) & 63));
  }

  const bool small_pool_;
  const size_t min_split_remainder_;
  size_t num_free_blocks_ = 0;
  Block* heads_[kNumBins] = {};
  uint64_t words_[kBitmapWords] = {};     // bit b set iff heads_[b] != nullptr
  uint64_t summary_[kSummaryWords] = {};  // bit w set iff words_[w] != 0
};

// Pointer -> allocated Block. Open addressing with linear probing and backward-shift deletion
// (no tombstones); grows to keep the load at most 1/2 and never shrinks, so steady-state inserts
// and erases allocate nothing.
class CachingAllocator::BlockMap {
 public:
  BlockMap() { Rehash(10); }

  size_t size() const { return size_; }

  // Makes room for one more entry, so that Insert cannot fail.
  void ReserveOneMore() {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(std::bit_width(slots_.size()));
  }

  void Insert(Block* block) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(block->ptr);
    size_t i = Home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, block};
    ++size_;
  }

  Block* Find(const void* ptr) const {
    const uintptr_t key = reinterpret_cast<uintptr_t>(ptr);
    if (key == 0) return nullptr;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].block;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  void Erase(const void* ptr) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(ptr);
    size_t hole = Home(key);
    while (slots_[hole].key != key) hole = (hole + 1) & mask_;
    // Shift later members of the probe run back into the hole when their home allows it.
    for (size_t j = (hole + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const size_t home = Home(slots_[j].key);
      // Entry j may move to `hole` iff its home is not cyclically inside (hole, j].
      const bool home_in_between =
          hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!home_in_between) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = {0, nullptr};
    --size_;
  }

 private:
  struct Slot {
    uintptr_t key;  // the block's pointer; 0 for an empty slot
    Block* block;
  };

  size_t Home(uintptr_t key) const {
    return static_cast<size_t>(((key >> caching_internal::kRoundLog2) * 0x9E3779B97F4A7C15ull) >>
                               shift_);
  }

  void Rehash(int log2_capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(size_t{1} << log2_capacity, Slot{0, nullptr});
    mask_ = slots_.size() - 1;
    shift_ = 64 - log2_capacity;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != 0) Insert(s.block);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Block descriptors, allocated in slabs and recycled through a free list; freed only with the
// allocator.
class CachingAllocator::BlockArena {
 public:
  // Makes sure `n` descriptors can be taken without allocating.
  void Reserve(size_t n) {
    while (num_spare_ < n) {
      slabs_.push_back(std::make_unique<Block[]>(kSlabBlocks));
      Block* slab = slabs_.back().get();
      for (size_t i = 0; i < kSlabBlocks; ++i) Give(&slab[i]);
    }
  }

  Block* Take() {
    SLUICE_CHECK(spare_ != nullptr, "block arena used without Reserve");
    Block* b = spare_;
    spare_ = b->next_free;
    --num_spare_;
    return b;
  }

  void Give(Block* b) {
    b->next_free = spare_;
    spare_ = b;
    ++num_spare_;
  }

 private:
  static constexpr size_t kSlabBlocks = 256;
  std::vector<std::unique_ptr<Block[]>> slabs_;
  Block* spare_ = nullptr;
  size_t num_spare_ = 0;
};

// One thread's parked blocks of one allocator: a LIFO stack per size class. Only its thread pushes
// and pops; `owner` and the counters are read by others (see the top of the header).
class CachingAllocator::ThreadCache {
 public:
  static constexpr int kClasses = static_cast<int>(kMaxCachedBytes / kRoundBytes);

  ThreadCache(CachingAllocator* allocator, uint64_t allocator_id)
      : owner(allocator), id(allocator_id) {}

  // A parked block of exactly `rounded` bytes, or nullptr.
  Block* Pop(size_t rounded) {
    Stack& stack = stacks_[rounded / kRoundBytes - 1];
    if (stack.count == 0) return nullptr;
    bytes_ -= rounded;
    return stack.blocks[--stack.count];
  }

  // Parks `block` (of at most kMaxCachedBytes); false when its class or the cache is full.
  bool Push(Block* block) {
    Stack& stack = stacks_[block->size / kRoundBytes - 1];
    if (stack.count == kThreadCacheDepth || bytes_ + block->size > kMaxThreadCacheBytes) {
      return false;
    }
    stack.blocks[stack.count++] = block;
    bytes_ += block->size;
    return true;
  }

  // Any parked block, or nullptr when the cache is empty.
  Block* PopAny() {
    for (Stack& stack : stacks_) {
      if (stack.count > 0) {
        Block* block = stack.blocks[--stack.count];
        bytes_ -= block->size;
        return block;
      }
    }
    return nullptr;
  }

  // Counts of this cache's thread, written by it alone (a relaxed load and store, no
  // read-modify-write) and summed by Stats().
  static void Bump(std::atomic<int64_t>& counter) {
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  std::atomic<CachingAllocator*> owner;  // set to nullptr under the registry lock when it dies
  const uint64_t id;                     // the owner's id_
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_frees{0};

 private:
  struct Stack {
    int count = 0;
    Block* blocks[kThreadCacheDepth];
  };
  Stack stacks_[kClasses];
  size_t bytes_ = 0;  // parked bytes, at most kMaxThreadCacheBytes
};

// The accounting of allocated bytes, shared by the locked path and the per-thread fast path (and
// inline in both: it is most of the fast path's work).
inline int64_t CachingAllocator::Account(size_t bytes) {
  const auto delta = static_cast<int64_t>(bytes);
  if (options_.max_allocated_bytes == 0) {
    return allocated_.fetch_add(delta, std::memory_order_relaxed) + delta;
  }
  const auto budget = static_cast<int64_t>(options_.max_allocated_bytes);
  int64_t before = allocated_.load(std::memory_order_relaxed);
  do {
    if (before + delta > budget) return -1;
  } while (!allocated_.compare_exchange_weak(before, before + delta, std::memory_order_relaxed));
  return before + delta;
}

inline void CachingAllocator::NotePeak(int64_t allocated) {
  for (std::atomic<int64_t>* mark : {&peak_allocated_, &high_water_}) {
    int64_t peak = mark->load(std::memory_order_relaxed);
    while (allocated > peak &&
           !mark->compare_exchange_weak(peak, allocated, std::memory_order_relaxed)) {
    }
  }
}

}  // namespace sluice
