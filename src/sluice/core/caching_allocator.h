// CachingAllocator: keeps memory obtained from the OS and hands it out again, so that the
// allocate/free churn of a training step costs tens of nanoseconds instead of an mmap, munmap and
// a page fault per page. It is the allocator sluice uses by default (DefaultAllocator()).
//
// How memory is organised:
//   * Memory comes from the OS in regions ("chunks"): one mmap of region_bytes (1 GiB) of address
//     space each, of which a prefix is in use (the chunk's size, a multiple of the
//     page size) and tiled by blocks, each either allocated (handed to a caller) or free (cached).
//     A chunk grows in place into its untouched address space, a page at a time, so reserved
//     bytes (the pages a run can have touched and not returned) follow the live bytes closely
//     instead of in steps of whole chunks; the address space beyond costs no memory.
//   * Rounding: every request is rounded up to a multiple of kRoundBytes (512 B). Chunks are
//     page-aligned and blocks start at multiples of 512 B inside them, so every pointer is aligned
//     to kAlignment (64 B), and to 512 B in fact.
//   * Two pools, so that small tensors do not fragment the free spans of large ones: small
//     (rounded size <= small_limit_bytes, 4 MiB by default) and large, each with chunks of its
//     own. A free block is split whenever the remainder is at least 512 B.
//   * Best fit: a request takes the smallest free block of its pool that holds it. Free blocks are
//     kept in size-class bins (exact per 512 B up to 2 MiB, then 16 bins per power of two) with a
//     bitmap of non-empty bins, so the search is a few bit scans plus, above 2 MiB, a walk of one
//     bin's list.
//   * Coalescing: a freed block merges at once with a free neighbour on either side, so a chunk
//     whose blocks are all free is a single free block again.
//   * Growth: when no free block fits, a chunk of the pool grows at its end (its free tail, if
//     any, is extended to the request, page-rounded); only when no chunk has the address space
//     left is a new region mapped (a request above region_bytes gets a region of its own size).
//     If the OS refuses (or the max_reserved_bytes budget would be exceeded), completely free
//     chunks are returned to the OS, free tails trimmed and the pages inside free blocks returned
//     first, and the growth retried once.
//   * Returned pages: the whole pages inside a free block can be given back to the OS
//     (madvise(MADV_DONTNEED): mapped still, no memory behind them) — under a budget when growing
//     or backing a block would cross it; by default when that would take reserved bytes past
//     (1 + reserved_headroom) x the most ever allocated, as many as it would pass it by; and in
//     ReleaseCached(). They are not reserved until a
//     block placed on them backs them again (counted at once; the OS faults them in, zeroed, on
//     first touch). So after a return, reserved bytes are exactly the pages under allocated blocks,
//     and a budget on reserved can be honoured whenever those pages fit: at most, per live block of
//     s rounded bytes, ceil((s + page - 512) / page) pages (PageSpanBytes).
//   * Steps (options.follow_last_step, with a headroom): a training step makes the same requests
//     every step, and returned pages that a later request of the step lands on fault in again.
//     So the locked path records each step's placements (chunk, pages covered, size) between two
//     ResetPeak calls (the engines call it at each step's start). While a step repeats the last
//     one's requests — the same sizes in the same order; the first difference ends it for the
//     step — the headroom's returns take the free pages that the last step's placements, replayed
//     from this point on (into the next step), cover last or never, instead of the first in
//     address order. And with any headroom, a request whose best fit lies on returned pages goes,
//     at a page boundary or either end of a free block of its pool, where it lies on the fewest
//     (the smallest such block first; the part before it stays free). On the one-stage batch-48
//     GPT this cut the pages faulted in again from 5.3 K to 0.3 K a step (docs/memory.md). A
//     small request that would still land on returned pages takes backed pages of a free
//     large-pool block when one holds it (a large request never goes small): on the
//     medium GPT under bf16 and cheap recompute the backward's f32 gradients of the small pool
//     otherwise faulted in 9.7 K pages a step beside the large pool's free activations.
//   * No heap allocation on the hot path: block descriptors come from a pooled arena and live
//     pointers are found through an open-addressing hash table; both only grow (rarely) and never
//     shrink, so a steady state of Allocate/Deallocate allocates nothing.
//   * Per-thread fast path (options.thread_cache, off by default; AllocateWithToken /
//     DeallocateWithToken, which Storage uses, take it when on): each
//     thread keeps, per allocator, a small cache of freed blocks of up to kMaxCachedBytes (64 KiB),
//     by size class (one per 512 B), at most kThreadCacheDepth blocks a class and
//     kMaxThreadCacheBytes (256 KiB) in all. A free with its token parks the block in the freeing
//     thread's cache; an allocation of that class on the thread takes it back — neither takes the
//     mutex nor touches the bins or the live map. A parked block stays allocated as far as the
//     chunks are concerned (in the live map, not coalesced) with requested 0; it returns to the
//     bins when its thread flushes the cache (FlushThreadCache, ReleaseCached from that thread,
//     thread exit). Blocks may be freed on any thread (the async GC worker, pipeline stages):
//     whichever thread frees a block parks it. The plain Allocate / Deallocate pair never uses the
//     caches. The token is the block's descriptor, so a fast free needs no lookup; it is checked
//     against the pointer and size, and a free that fails the check takes the locked path, which
//     reports it.
//
// Statistics: allocated_bytes is the exact sum of the live requests (not rounded) — parked blocks
// count as freed — kept with peak_allocated_bytes in atomics that both paths update, so they are
// exact across threads at every moment; reserved_bytes is the sum of the chunks' sizes (their
// used prefixes, not their address space) less their returned pages. num_allocs / num_frees count
// both paths. num_os_allocs / num_os_frees count region maps and unmaps (growing in place,
// trimming and returning pages are not OS calls that map or unmap, and count in reserved_bytes
// alone). While the
// timeline is on (EnableTimeline), every call takes the locked path, so every event is recorded.
//
// Thread-safety: all methods may be called from any thread at the same time. One mutex, mu_, guards
// the chunks, bins and live map (the fields say GUARDED_BY(mu_), the helpers that need it
// REQUIRES(mu_); clang checks both). mmap runs under the lock (growth is rare and mapping without
// touching is cheap); ReleaseCached() unmaps outside it (and trims tails and returns pages with
// madvise under it),
// the out-of-memory retry in Allocate under it. A thread cache is touched only by its thread,
// except when the thread exits or the allocator is destroyed: those two meet under one process-wide
// registry lock (taken before mu_), so a cache is flushed into a live allocator or dropped with a
// dead one, never both.
//
// Invariants (checked by CheckInvariants()):
//   * the blocks of a chunk tile it with no gap or overlap, and no two free blocks are adjacent;
//   * every free block is in exactly the bin of its size, every allocated block (held by a caller
//     or parked in a thread cache) in the live map;
//   * allocated_bytes == sum of live requests; reserved_bytes == sum of chunk sizes (each at most
//     its capacity, a multiple of the page size) less returned pages; a returned page lies inside
//     the used prefix and under no allocated block.
//
// Errors: Allocate throws InvalidArgument for 0 bytes or above kMaxAllocationBytes, and
// OutOfMemory (naming the request, the chunk and what is held) when no chunk can be mapped or
// the request would exceed max_allocated_bytes (naming the budget); the allocator is unchanged.
// Deallocate of a pointer this instance does not own, or with a size other than the one
// allocated, fails SLUICE_CHECK (InternalError) and leaves the allocator unchanged.
//
// Example:
//   CachingAllocator alloc;                     // 1 GiB regions, no budget
//   void* p = alloc.Allocate(1000);             // maps a region, reserves its first page,
//                                               // returns its first 1024 B
//   alloc.Deallocate(p, 1000);                  // cached: the chunk is one free block again
//   void* q = alloc.Allocate(1000);             // no OS call; q == p
//   alloc.Deallocate(q, 1000);
//   alloc.ReleaseCached();                      // unmaps the chunk; Stats().reserved_bytes == 0
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

struct CachingAllocatorOptions {
  // Requests whose rounded size is at most this are "small" (their own pool). A multiple of
  // kRoundBytes, at most 1 GiB. The default keeps a GPT's per-layer activations and the larger
  // transients of a recomputed block apart (docs/memory.md, "Reserved bytes").
  size_t small_limit_bytes = size_t{4} << 20;
  // Address space of one region (a chunk's capacity): a multiple of the page size between 64 KiB
  // and 1 TiB. Only what the chunk grows into counts as reserved.
  size_t region_bytes = size_t{1} << 30;
  // Upper bound on reserved_bytes (`--memory-budget`, a device-like memory budget): a growth (or
  // the backing of returned pages) past it first returns free chunks, tails and the pages inside
  // free blocks, then throws OutOfMemory; 0 means only the OS limits it.
  size_t max_reserved_bytes = 0;
  // Reserved bytes kept beyond the high-water mark of allocated bytes (the most allocated since
  // construction; ResetPeak leaves it), as a fraction of it. A growth, or the backing of returned
  // pages, that would take reserved_bytes past (1 + reserved_headroom) x that mark first returns
  // as many whole pages of free blocks as it would pass it by (not those the request lands on),
  // so reserved bytes stay within it wherever free blocks hold the pages (docs/memory.md,
  // "Reserved bytes"). 0 keeps free blocks' pages until a budget or ReleaseCached returns them.
  double reserved_headroom = 0.04;
  // With a headroom: place a request on backed pages rather than returned ones when a free block
  // has them, and choose the pages to return by the step before (the placements since the
  // previous ResetPeak), those it covered last or never, while this step repeats its requests
  // (see the top). false returns pages in address order and places by best fit alone (as before
  // issue 34's churn fix: the returned pages then fault in again every step).
  bool follow_last_step = true;
  // The per-thread fast path (see the top). Off by default: blocks parked in a thread's cache stay
  // allocated in their chunk, so its neighbours cannot coalesce and the chunks grow around them
  // (reserved +4% on the one-stage GPT, docs/memory.md). On, AllocateWithToken and
  // DeallocateWithToken skip the mutex for blocks of up to kMaxCachedBytes.
  bool thread_cache = false;
  // A model of an allocator, for forecasts (step/memory_replay.h): its regions are address ranges
  // nothing is mapped at, so any size costs neither memory nor address space, and the pointers it
  // hands out must never be read or written. Reserved bytes count exactly as in a real allocator.
  bool address_space_only = false;
  // Upper bound on allocated_bytes: an Allocate that would take the live
  // requested bytes above it throws OutOfMemory instead; 0 means no bound.
  size_t max_allocated_bytes = 0;
};

// A read-only picture of the allocator's chunks, for tests and debugging output.
struct CachingAllocatorSnapshot {
  struct Block {
    size_t offset;           // from the chunk's base
    size_t size;             // bytes the block spans (a multiple of kRoundBytes)
    size_t requested_bytes;  // what the caller asked for; 0 when free or parked in a thread cache
    bool allocated;
  };
  struct Chunk {
    uintptr_t base;
    size_t size;            // what the blocks tile
    size_t capacity;        // address space mapped
    size_t returned_bytes;  // pages of `size` returned to the OS: reserved is size - returned
    bool small_pool;
    std::vector<Block> blocks;  // in address order, tiling the chunk
  };
  std::vector<Chunk> chunks;  // in no particular order
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kRoundBytes = 512;
  // Per-thread fast path limits (see the top).
  static constexpr size_t kMaxCachedBytes = size_t{64} << 10;
  static constexpr int kThreadCacheDepth = 4;
  static constexpr size_t kMaxThreadCacheBytes = size_t{256} << 10;

  // The most bytes of whole pages a block of `bytes` (rounded to kRoundBytes, placed at any
  // multiple of kRoundBytes) lies on: what it can hold reserved once free blocks' pages are
  // returned. A forecast that sums it over the live blocks bounds the reserved bytes under a
  // budget whatever the order of frees (docs/memory.md, "Reserved bytes").
  static size_t PageSpanBytes(size_t bytes);

  // Throws InvalidArgument when the options are not as documented above.
  explicit CachingAllocator(CachingAllocatorOptions options = {});
  // Unmaps every chunk. Blocks still allocated become invalid (an allocator must outlive every
  // Storage it handed memory to).
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  // The per-thread fast path (see the top); errors as Allocate / Deallocate.
  void* AllocateWithToken(size_t bytes, uintptr_t* token) override;
  void DeallocateWithToken(void* ptr, size_t bytes, uintptr_t token) override;
  MemoryStats Stats() const override;
  void ResetPeak() override;
  void EnableTimeline(bool on) override;
  std::vector<MemoryEvent> Timeline() const override;
  std::string_view name() const override { return "caching"; }
  // A free goes back into a bin (tens of ns); memory returns to the OS only in ReleaseCached().
  FreeCost free_cost() const override { return FreeCost::kCheap; }

  // Returns the calling thread's cached blocks to the bins, then every completely free chunk to
  // the OS, the whole free pages at the end of every other chunk and those inside its free blocks
  // (madvise). Chunks holding an allocated block, or one parked in another thread's cache, stay.
  // Returns the number of reserved bytes returned.
  size_t ReleaseCached();
  // Returns the calling thread's cached blocks (of this allocator) to the bins.
  void FlushThreadCache();
  // Blocks parked in thread caches now (for tests).
  size_t NumThreadCachedBlocks() const;

  // Introspection (each takes the lock; cheap except Snapshot and CheckInvariants, which walk
  // every block).
  size_t NumChunks() const;
  size_t NumFreeBlocks() const;
  CachingAllocatorSnapshot Snapshot() const;
  // Bytes of returned pages backed again by a block placed on them since construction: what the
  // OS faulted in again (the cost of the headroom's returns).
  size_t BackedAgainBytes() const;
  // Whether this step (since the last ResetPeak) has so far made the same requests, in the same
  // order, as the step before it: the headroom's returns then follow that step's placements.
  bool FollowsLastStep() const;
  // Verifies the invariants listed at the top; fails SLUICE_CHECK on the first violation.
  void CheckInvariants() const;

  const CachingAllocatorOptions& options() const { return options_; }

 private:
  struct Block;       // a span of a chunk, allocated or free (defined in the .cc)
  struct Chunk;       // one OS mapping
  class Pool;         // free blocks of one pool in size-class bins
  class BlockMap;     // pointer -> allocated Block, open addressing
  class BlockArena;   // pooled storage for Block descriptors
  class ThreadCache;  // one thread's parked blocks of this allocator
  class LocalCaches;  // one thread's caches, of every allocator it used

  Pool& PoolFor(size_t rounded) REQUIRES(mu_);
  // The locked path of Allocate: the block handed out.
  Block* AllocateBlock(size_t bytes) EXCLUDES(mu_);
  // The calling thread's cache of this allocator, made (and registered) on first use; nullptr
  // when the thread has too many allocators' caches already.
  ThreadCache* LocalCache();
  // Returns a cache's blocks to the bins; with `retire`, also folds its counters in and forgets it.
  void DrainCache(ThreadCache* cache, bool retire) REQUIRES(mu_);
  // allocated_bytes += bytes and returns the new value, unless that would pass
  // max_allocated_bytes (then -1, unchanged). The caller raises the peak once the request holds.
  int64_t Account(size_t bytes);
  void NotePeak(int64_t allocated);
  [[noreturn]] void ThrowOverBudget(size_t bytes) const;
  // A free block (not in the pool) of at least `rounded` bytes at the end of a grown or new chunk;
  // throws OutOfMemory when neither can be had.
  Block* Grow(Pool& pool, size_t rounded, size_t requested) REQUIRES(mu_);
  // Grows a chunk of `pool` in place; nullptr when none has the room (or the budget).
  Block* GrowChunk(Pool& pool, size_t rounded) REQUIRES(mu_);
  bool OverReservedBudget(size_t more) const REQUIRES(mu_);
  // The returned bytes (pages) under [ptr, ptr + size) of chunk `c`; with `back`, counts them as
  // reserved again (a block is being placed on them: they fault in on first touch).
  size_t ReturnedUnder(Chunk* c, const char* ptr, size_t size, bool back) REQUIRES(mu_);
  // Gives the whole pages inside free blocks back to the OS (madvise), counted as not reserved
  // until a block placed on them backs them again, until `want` bytes are returned; returns the
  // bytes. Spared: block_bytes of `block` from block_offset, and the free tails of the chunks of
  // `tails_of`.
  struct Spared {
    const Block* block = nullptr;
    size_t block_offset = 0;  // the spared bytes of `block` start here
    size_t block_bytes = 0;
    const Pool* tails_of = nullptr;
  };
  size_t ReturnFreePages(size_t want, const Spared& spared) REQUIRES(mu_);
  size_t ReturnFreePages() REQUIRES(mu_);  // all of them
  // Returns pages [first_page, end_page) of chunk `c`, all backed and under no allocated block;
  // returns their bytes.
  size_t ReturnPages(Chunk* c, size_t first_page, size_t end_page) REQUIRES(mu_);
  // As ReturnFreePages(want, spared), choosing the pages the last step's placements, replayed
  // from this point of the step on, cover last or never (see the top).
  size_t ReturnColdestPages(size_t want, const Spared& spared) REQUIRES(mu_);
  // Drops the recorded steps (a chunk they name is going).
  void ForgetSteps() REQUIRES(mu_);
  // options.reserved_headroom: before a request of `rounded` bytes (of `allocated` live bytes, the
  // request included) is placed at offset `at` of free `block`, or grows `pool` (block ==
  // nullptr), returns the free pages it would take the reserved bytes past the headroom by.
  void KeepWithinHeadroom(const Pool& pool, const Block* block, size_t at, size_t rounded,
                          int64_t allocated) REQUIRES(mu_);
  // The free blocks in the order a walk of chunks_ and of each chunk's blocks meets them, found
  // through the pools' bins: a step of a deep model holds thousands of allocated blocks between
  // a few free ones, and walking those made each headroom return linear in the live blocks (a
  // forecast quadratic in the layers). The vector is scratch, valid until the next call.
  const std::vector<Block*>& FreeBlocksInWalkOrder() REQUIRES(mu_);
  // The pages [first, end) of `b` that `spared` keeps ({0, 0} for another block).
  static std::pair<size_t, size_t> SparedPages(const Spared& spared, const Block* b);
  // For a request of `rounded` bytes whose best fit `*block` lies on returned pages: the free
  // block of `pool` and the offset in it (returned) where it lies on the fewest returned pages,
  // the smallest such block first; `*block` becomes that block.
  size_t FindBackedWindow(const Pool& pool, size_t rounded, Block** block) REQUIRES(mu_);
  [[noreturn]] void ThrowReservedOver(size_t size, size_t requested, int error) const REQUIRES(mu_);
  // Gives the whole free pages at the end of each chunk back to the OS; returns the bytes.
  size_t TrimFreeTails() REQUIRES(mu_);
  void Split(Pool& pool, Block* block, size_t rounded) REQUIRES(mu_);
  void FreeBlock(Block* block) REQUIRES(mu_);
  // Detaches completely free chunks; the caller unmaps them after dropping mu_ (or under it).
  std::vector<Chunk*> DetachFreeChunks() REQUIRES(mu_);
  static void UnmapChunks(const std::vector<Chunk*>& chunks);

  const CachingAllocatorOptions options_;  // immutable after construction

  mutable Mutex mu_;
  std::unique_ptr<Pool> small_pool_ GUARDED_BY(mu_);   // blocks of small-pool chunks
  std::unique_ptr<Pool> large_pool_ GUARDED_BY(mu_);   // blocks of large-pool chunks
  std::unique_ptr<BlockMap> live_ GUARDED_BY(mu_);     // every allocated block by pointer
  std::unique_ptr<BlockArena> arena_ GUARDED_BY(mu_);  // spare Block descriptors
  Chunk* chunks_ GUARDED_BY(mu_) = nullptr;            // all chunks, intrusive list
  size_t num_chunks_ GUARDED_BY(mu_) = 0;
  uint64_t next_chunk_serial_ GUARDED_BY(mu_) = 0;
  std::vector<Block*> walk_scratch_ GUARDED_BY(mu_);  // FreeBlocksInWalkOrder's; only grows
  // Reserved bytes, OS calls and the timeline; allocated bytes are the atomics below.
  MemoryStatsRecorder recorder_ GUARDED_BY(mu_);
  std::vector<ThreadCache*> caches_ GUARDED_BY(mu_);  // live thread caches of this allocator
  int64_t num_allocs_ GUARDED_BY(mu_) = 0;            // locked path, plus retired caches' counts
  int64_t num_frees_ GUARDED_BY(mu_) = 0;
  // The locked path's placements since the last step boundary (ResetPeak), in order, and those of
  // the step before, which predict which free pages are needed next (ReturnColdestPages).
  struct Placement {
    Chunk* chunk;
    uint32_t first_page, end_page;  // the pages the block covers
    uint32_t granules;              // its size in kRoundBytes: what a step must repeat
  };
  static constexpr size_t kMaxStepPlacements = size_t{1} << 18;
  std::vector<Placement> step_placements_ GUARDED_BY(mu_);
  std::vector<Placement> last_step_ GUARDED_BY(mu_);
  bool step_overflow_ GUARDED_BY(mu_) = false;  // this step passed kMaxStepPlacements
  // This step has made the last step's requests so far (same sizes, in the same order).
  bool follows_last_step_ GUARDED_BY(mu_) = false;
  size_t backed_again_bytes_ GUARDED_BY(mu_) = 0;

  // Updated by both paths without mu_: exact sums in one modification order.
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_allocated_{0};
  std::atomic<int64_t> high_water_{0};    // peak_allocated_ that ResetPeak leaves alone
  std::atomic<bool> timeline_on_{false};  // mirrors the recorder's: the fast path stands aside
  const uint64_t id_;                     // unique per instance, never reused (thread caches' key)
};

}  // namespace sluice
