#include "sluice/core/caching_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

namespace {

constexpr size_t kRound = CachingAllocator::kRoundBytes;
constexpr int kRoundLog2 = 9;
static_assert(size_t{1} << kRoundLog2 == kRound);
static_assert(kRound % kAlignment == 0);

// Size classes, in units of 512 B ("granules"): one exact bin per granule count below 4096
// (2 MiB), then 16 bins per power of two up to 2^31 granules (1 TiB, the largest possible block).
constexpr int kExactBins = 4096;
constexpr int kExactLog2 = 12;
constexpr int kSubBinsLog2 = 4;
constexpr int kMaxGranuleLog2 = 31;
constexpr int kNumBins = kExactBins + (kMaxGranuleLog2 - kExactLog2 + 1) * (1 << kSubBinsLog2);
constexpr int kBitmapWords = (kNumBins + 63) / 64;
constexpr int kSummaryWords = (kBitmapWords + 63) / 64;

int BinOf(size_t size) {
  const size_t granules = size >> kRoundLog2;
  if (granules < kExactBins) return static_cast<int>(granules);
  const int log2 = std::bit_width(granules) - 1;
  const int sub = static_cast<int>(granules >> (log2 - kSubBinsLog2)) & ((1 << kSubBinsLog2) - 1);
  return kExactBins + ((log2 - kExactLog2) << kSubBinsLog2) + sub;
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Guards the meeting of a thread cache's thread (exiting) and its allocator (being destroyed);
// taken before any allocator's mu_.
Mutex& CacheRegistryMutex() {
  static Mutex* const mu = new Mutex();  // never destroyed: threads may exit after static teardown
  return *mu;
}

std::atomic<uint64_t> next_allocator_id{1};

// Set when this thread's LocalCaches is destroyed (a trivially destructible thread_local stays
// readable after that).
thread_local bool local_caches_gone = false;

// The cache this thread used last and its allocator's id (0: none), checked first by every fast
// call: plain thread-locals, read without the guard that the LocalCaches object (non-trivially
// destructible) puts on each access. Ids are never reused, so a stale pair never matches.
thread_local constinit uint64_t last_cache_id = 0;
thread_local constinit void* last_cache = nullptr;

}  // namespace

// A span of a chunk. Descriptors live in the BlockArena, never in the chunk's own memory, so a
// caller's bytes are all its own.
struct CachingAllocator::Block {
  char* ptr;
  size_t size;  // multiple of kRound
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

// One OS mapping. `first` is the block at `base`; it is never recycled while the chunk lives,
// because coalescing always keeps the lower-address descriptor.
struct CachingAllocator::Chunk {
  char* base;
  size_t size;
  bool small_pool;
  Block* first;
  Chunk* prev;  // list of all chunks (CachingAllocator::chunks_)
  Chunk* next;
};

// The free blocks of one pool: intrusive LIFO lists per size class plus a two-level bitmap of the
// non-empty classes, so finding the first non-empty class at or above a size is two bit scans.
class CachingAllocator::Pool {
 public:
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
    return static_cast<size_t>(((key >> kRoundLog2) * 0x9E3779B97F4A7C15ull) >> shift_);
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
  static constexpr int kClasses = static_cast<int>(kMaxCachedBytes / kRound);

  ThreadCache(CachingAllocator* allocator, uint64_t allocator_id)
      : owner(allocator), id(allocator_id) {}

  // A parked block of exactly `rounded` bytes, or nullptr.
  Block* Pop(size_t rounded) {
    Stack& stack = stacks_[rounded / kRound - 1];
    if (stack.count == 0) return nullptr;
    bytes_ -= rounded;
    return stack.blocks[--stack.count];
  }

  // Parks `block` (of at most kMaxCachedBytes); false when its class or the cache is full.
  bool Push(Block* block) {
    Stack& stack = stacks_[block->size / kRound - 1];
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

// The caches of one thread, one per allocator it used; the thread's exit flushes them into their
// allocators (if alive) and deletes them.
class CachingAllocator::LocalCaches {
 public:
  // At most this many allocators' caches per thread; beyond it, the locked path.
  static constexpr size_t kMaxCaches = 16;

  ~LocalCaches() {
    local_caches_gone = true;
    last_cache_id = 0;
    last_cache = nullptr;
    MutexLock registry(&CacheRegistryMutex());
    for (ThreadCache* cache : caches_) {
      CachingAllocator* owner = cache->owner.load(std::memory_order_acquire);
      if (owner != nullptr) {
        MutexLock lock(&owner->mu_);
        owner->DrainCache(cache, /*retire=*/true);
      }
      delete cache;
    }
  }

  // The calling thread's cache of `allocator`, made (and registered) on first use; nullptr after
  // the thread's caches are gone or when it has kMaxCaches already. Remembers it as the last used.
  [[gnu::noinline]] static ThreadCache* Lookup(CachingAllocator* allocator) {
    // Storages destroyed by thread-local or static objects after this thread's caches are gone
    // take the locked path.
    if (local_caches_gone) return nullptr;
    thread_local LocalCaches local;
    ThreadCache* cache = local.Find(allocator->id_);
    if (cache == nullptr) cache = local.Make(allocator);
    if (cache != nullptr) {
      last_cache_id = cache->id;
      last_cache = cache;
    }
    return cache;
  }

  ThreadCache* Find(uint64_t id) {
    for (ThreadCache* cache : caches_) {
      if (cache->id == id) return cache;
    }
    return nullptr;
  }

  ThreadCache* Make(CachingAllocator* allocator) {
    MutexLock registry(&CacheRegistryMutex());
    // Forget the caches of allocators that are gone (their blocks went with them).
    std::erase_if(caches_, [](ThreadCache* cache) {
      if (cache->owner.load(std::memory_order_acquire) != nullptr) return false;
      if (last_cache == cache) {
        last_cache_id = 0;
        last_cache = nullptr;
      }
      delete cache;
      return true;
    });
    if (caches_.size() >= kMaxCaches) return nullptr;
    auto cache = std::make_unique<ThreadCache>(allocator, allocator->id_);
    {
      MutexLock lock(&allocator->mu_);
      allocator->caches_.push_back(cache.get());
    }
    caches_.push_back(cache.get());
    return cache.release();
  }

 private:
  std::vector<ThreadCache*> caches_;
};

CachingAllocator::CachingAllocator(CachingAllocatorOptions options)
    : options_(options), id_(next_allocator_id.fetch_add(1, std::memory_order_relaxed)) {
  const size_t chunk = options_.chunk_bytes;
  if (!std::has_single_bit(chunk) || chunk < (size_t{64} << 10) || chunk > (size_t{1} << 30) ||
      chunk % PageSize() != 0) {
    throw InvalidArgument(fmt::format(
        "caching allocator: chunk_bytes = {} must be a power of two between 64 KiB and 1 GiB and "
        "a multiple of the page size ({} bytes); the default is 2 MiB",
        chunk, PageSize()));
  }
  small_pool_ = std::make_unique<Pool>(/*small_pool=*/true, kRound);
  large_pool_ = std::make_unique<Pool>(/*small_pool=*/false, chunk / 2);
  live_ = std::make_unique<BlockMap>();
  arena_ = std::make_unique<BlockArena>();
}

CachingAllocator::~CachingAllocator() {
  {
    // Threads still holding a cache of this allocator drop it (and its blocks) instead of
    // flushing it here.
    MutexLock registry(&CacheRegistryMutex());
    MutexLock lock(&mu_);
    for (ThreadCache* cache : caches_) cache->owner.store(nullptr, std::memory_order_release);
    caches_.clear();
  }
  for (Chunk* c = chunks_; c != nullptr;) {
    Chunk* next = c->next;
    munmap(c->base, c->size);  // nothing useful to do on failure in a destructor
    delete c;
    c = next;
  }
}

CachingAllocator::Pool& CachingAllocator::PoolFor(size_t rounded) {
  return rounded <= options_.chunk_bytes / 2 ? *small_pool_ : *large_pool_;
}

int64_t CachingAllocator::Account(size_t bytes) {
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

void CachingAllocator::NotePeak(int64_t allocated) {
  int64_t peak = peak_allocated_.load(std::memory_order_relaxed);
  while (allocated > peak &&
         !peak_allocated_.compare_exchange_weak(peak, allocated, std::memory_order_relaxed)) {
  }
}

void CachingAllocator::ThrowOverBudget(size_t bytes) const {
  const auto held = static_cast<size_t>(allocated_.load(std::memory_order_relaxed));
  throw OutOfMemory(
      fmt::format("allocating {} bytes would hold {} bytes, over the memory budget of {} bytes",
                  bytes, held + bytes, options_.max_allocated_bytes));
}

void* CachingAllocator::Allocate(size_t bytes) { return AllocateBlock(bytes)->ptr; }

CachingAllocator::Block* CachingAllocator::AllocateBlock(size_t bytes) {
  ValidateAllocationSize(bytes, name());
  const size_t rounded = RoundUp(bytes, kRound);
  MutexLock lock(&mu_);
  const int64_t allocated = Account(bytes);
  if (allocated < 0) ThrowOverBudget(bytes);
  Block* block = nullptr;
  try {
    // Everything that could allocate happens first, so a failure leaves no half-made change.
    arena_->Reserve(2);
    live_->ReserveOneMore();
    Pool& pool = PoolFor(rounded);
    block = pool.FindBestFit(rounded);
    if (block != nullptr) {
      pool.Remove(block);
    } else {
      block = MapChunk(pool, rounded, bytes);
    }
    Split(pool, block, rounded);
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

inline CachingAllocator::ThreadCache* CachingAllocator::LocalCache() {
  // Most threads use one allocator: two thread-local reads and a compare.
  if (last_cache_id == id_) return static_cast<ThreadCache*>(last_cache);
  return LocalCaches::Lookup(this);
}

void* CachingAllocator::AllocateWithToken(size_t bytes, uintptr_t* token) {
  if (bytes - 1 < kMaxCachedBytes && !timeline_on_.load(std::memory_order_relaxed)) {
    ThreadCache* cache = LocalCache();
    if (Block* block = cache != nullptr ? cache->Pop(RoundUp(bytes, kRound)) : nullptr) {
      const int64_t allocated = Account(bytes);
      if (allocated < 0) {
        cache->Push(block);
        ThrowOverBudget(bytes);
      }
      NotePeak(allocated);
      block->requested.store(bytes, std::memory_order_relaxed);
      ThreadCache::Bump(cache->num_allocs);
      *token = reinterpret_cast<uintptr_t>(block);
      return block->ptr;
    }
  }
  Block* block = AllocateBlock(bytes);
  *token = reinterpret_cast<uintptr_t>(block);
  return block->ptr;
}

void CachingAllocator::DeallocateWithToken(void* ptr, size_t bytes, uintptr_t token) {
  auto* block = reinterpret_cast<Block*>(token);
  // The token is checked against what it claims; anything else (a wrong size, a double free, a
  // block not from this path) goes the locked way, which reports it.
  if (block != nullptr && bytes - 1 < kMaxCachedBytes && block->ptr == ptr &&
      block->size == RoundUp(bytes, kRound) &&
      block->requested.load(std::memory_order_relaxed) == bytes &&
      !timeline_on_.load(std::memory_order_relaxed)) {
    ThreadCache* cache = LocalCache();
    if (cache != nullptr && cache->Push(block)) {
      block->requested.store(0, std::memory_order_relaxed);
      allocated_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
      ThreadCache::Bump(cache->num_frees);
      return;
    }
  }
  Deallocate(ptr, bytes);
}

void CachingAllocator::DrainCache(ThreadCache* cache, bool retire) {
  while (Block* block = cache->PopAny()) {
    live_->Erase(block->ptr);
    FreeBlock(block);
  }
  if (!retire) return;
  num_allocs_ += cache->num_allocs.load(std::memory_order_relaxed);
  num_frees_ += cache->num_frees.load(std::memory_order_relaxed);
  std::erase(caches_, cache);
}

void CachingAllocator::FlushThreadCache() {
  ThreadCache* cache = LocalCache();
  if (cache == nullptr) return;
  MutexLock lock(&mu_);
  DrainCache(cache, /*retire=*/false);
}

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

CachingAllocator::Block* CachingAllocator::MapChunk(Pool& pool, size_t rounded, size_t requested) {
  const size_t chunk_size =
      pool.small_pool() ? options_.chunk_bytes : RoundUp(rounded, options_.chunk_bytes);
  const auto over_budget = [&]() REQUIRES(mu_) {
    return options_.max_reserved_bytes != 0 &&
           static_cast<size_t>(recorder_.stats().reserved_bytes) + chunk_size >
               options_.max_reserved_bytes;
  };
  auto chunk = std::make_unique<Chunk>();  // before mmap, so a failure here leaks no mapping
  void* base = MAP_FAILED;
  int error = 0;
  // Second attempt after returning the cache to the OS; unmapping under the lock is fine on
  // this already slow path.
  for (int attempt = 0; attempt < 2 && base == MAP_FAILED; ++attempt) {
    if (attempt == 1) UnmapChunks(DetachFreeChunks());
    error = 0;
    if (over_budget()) continue;
    base = mmap(nullptr, chunk_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) error = errno;
  }
  if (base == MAP_FAILED) {
    const MemoryStats& s = recorder_.stats();
    const std::string reason =
        error != 0
            ? fmt::format("the OS refused to map it ({})", std::strerror(error))
            : fmt::format("it would exceed max_reserved_bytes = {}", options_.max_reserved_bytes);
    throw OutOfMemory(fmt::format(
        "caching allocator: cannot obtain a chunk of {} bytes for a request of {} bytes: {}; "
        "{} bytes are reserved and {} bytes allocated after returning free chunks",
        chunk_size, requested, reason, s.reserved_bytes,
        allocated_.load(std::memory_order_relaxed)));
  }
  *chunk =
      Chunk{static_cast<char*>(base), chunk_size, pool.small_pool(), nullptr, nullptr, chunks_};
  if (chunks_ != nullptr) chunks_->prev = chunk.get();
  chunks_ = chunk.release();
  ++num_chunks_;
  Block* block = arena_->Take();
  block->InitFree(chunks_->base, chunk_size, chunks_, nullptr, nullptr);
  chunks_->first = block;
  recorder_.OnReserve(static_cast<int64_t>(chunk_size));
  return block;
}

void CachingAllocator::Split(Pool& pool, Block* block, size_t rounded) {
  const size_t remainder = block->size - rounded;
  if (remainder == 0 || remainder < pool.min_split_remainder()) return;
  Block* rest = arena_->Take();
  rest->InitFree(block->ptr + rounded, remainder, block->chunk, block, block->next);
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
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
    if (next->next != nullptr) next->next->prev = block;
    arena_->Give(next);
  }
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    pool.Remove(prev);
    prev->size += block->size;
    prev->next = block->next;
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
      recorder_.OnUnreserve(static_cast<int64_t>(c->size));
      detached.push_back(c);
    }
    c = next;
  }
  return detached;
}

void CachingAllocator::UnmapChunks(const std::vector<Chunk*>& chunks) {
  for (Chunk* c : chunks) {
    const int rc = munmap(c->base, c->size);
    const int error = errno;
    const size_t size = c->size;
    delete c;
    SLUICE_CHECK(rc == 0, "caching allocator: munmap of a {}-byte chunk failed: {}", size,
                 std::strerror(error));
  }
}

size_t CachingAllocator::ReleaseCached() {
  ThreadCache* cache = LocalCache();
  std::vector<Chunk*> detached;
  {
    MutexLock lock(&mu_);
    if (cache != nullptr) DrainCache(cache, /*retire=*/false);
    detached = DetachFreeChunks();
  }
  size_t bytes = 0;
  for (const Chunk* c : detached) bytes += c->size;
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
  recorder_.ResetPeak();
  peak_allocated_.store(allocated_.load(std::memory_order_relaxed), std::memory_order_relaxed);
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
    reserved += static_cast<int64_t>(c->size);
    char* expected = c->base;
    for (const Block* b = c->first; b != nullptr; b = b->next) {
      SLUICE_CHECK(b->chunk == c && b->ptr == expected, "block {} is not where its chunk says",
                   fmt::ptr(b->ptr));
      SLUICE_CHECK(b->size > 0 && b->size % kRound == 0, "block size {} not a multiple of {}",
                   b->size, kRound);
      SLUICE_CHECK(b->next == nullptr || b->next->prev == b, "block links broken");
      if (b->allocated) {
        ++num_allocated;
        const size_t r = b->requested.load(std::memory_order_relaxed);  // 0: parked
        requested += static_cast<int64_t>(r);
        SLUICE_CHECK(RoundUp(r, kRound) <= b->size && (r > 0 || b->size <= kMaxCachedBytes),
                     "allocated block of {} bytes holds a request of {}", b->size, r);
        SLUICE_CHECK(live_->Find(b->ptr) == b, "allocated block {} missing from the live map",
                     fmt::ptr(b->ptr));
      } else {
        ++num_free[c->small_pool];
        SLUICE_CHECK(b->next == nullptr || b->next->allocated,
                     "adjacent free blocks at {} were not coalesced", fmt::ptr(b->ptr));
      }
      expected += b->size;
    }
    SLUICE_CHECK(expected == c->base + c->size, "blocks do not tile chunk {}", fmt::ptr(c->base));
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
      SLUICE_CHECK(BinOf(b->size) == bin, "block of {} bytes filed in bin {}", b->size, bin);
      SLUICE_CHECK(b->next_free == nullptr || b->next_free->prev_free == b, "bin links broken");
    });
    SLUICE_CHECK(listed == pool->num_free_blocks() && listed == num_free[pool->small_pool()],
                 "{} pool: {} blocks in bins, counter says {}, chunks hold {} free",
                 pool->small_pool() ? "small" : "large", listed, pool->num_free_blocks(),
                 num_free[pool->small_pool()]);
  }
}

}  // namespace sluice
