// CachingAllocator's per-thread fast path (core/caching_allocator.h, "Per-thread fast path"):
// each thread's caches of parked blocks, one per allocator it used, found through two
// thread-locals; AllocateWithToken and DeallocateWithToken, which take no lock when the calling
// thread's cache serves them; and the caches' end, where a thread's exit meets its allocators'
// destruction under the registry lock.
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/caching_allocator_parts.h"
#include "sluice/core/mutex.h"

namespace sluice {

namespace caching_internal {

Mutex& CacheRegistryMutex() {
  static Mutex* const mu = new Mutex();  // never destroyed: threads may exit after static teardown
  return *mu;
}

}  // namespace caching_internal

namespace {

using caching_internal::CacheRegistryMutex;

// Set when this thread's LocalCaches is destroyed (a trivially destructible thread_local stays
// readable after that).
thread_local bool local_caches_gone = false;

// The cache this thread used last and its allocator's id (0: none), checked first by every fast
// call: plain thread-locals, read without the guard that the LocalCaches object (non-trivially
// destructible) puts on each access. Ids are never reused, so a stale pair never matches.
thread_local constinit uint64_t last_cache_id = 0;
thread_local constinit void* last_cache = nullptr;

}  // namespace

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

CachingAllocator::ThreadCache* CachingAllocator::LocalCache() {
  // Most threads use one allocator: two thread-local reads and a compare.
  if (last_cache_id == id_) return static_cast<ThreadCache*>(last_cache);
  return LocalCaches::Lookup(this);
}

void* CachingAllocator::AllocateWithToken(size_t bytes, uintptr_t* token) {
  if (options_.thread_cache && bytes - 1 < kMaxCachedBytes &&
      !timeline_on_.load(std::memory_order_relaxed)) {
    ThreadCache* cache = LocalCache();
    if (Block* block = cache != nullptr ? cache->Pop(RoundUp(bytes, kRoundBytes)) : nullptr) {
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
  if (options_.thread_cache && block != nullptr && bytes - 1 < kMaxCachedBytes &&
      block->ptr == ptr && block->size == RoundUp(bytes, kRoundBytes) &&
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

}  // namespace sluice
