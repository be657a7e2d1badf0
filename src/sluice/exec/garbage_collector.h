// Garbage collection of freed storages: where the memory of a dead value goes back to its
// allocator. The interpreter decides *what* dies after each instruction (exec/analysis.h); this
// file decides *which thread* pays for the destruction.
//
// GC modes (GcMode):
//   kNone   nothing is freed during a run; intermediates are released when the run ends.
//   kSync   the executing thread releases each free list right after the instruction.
//   kAsync  the executing thread detaches the storages of the free list into a GarbageBatch and
//           hands the batch to one worker thread (AsyncGarbageCollector) that only destroys them.
//   kAuto   the default: kSync or kAsync, chosen per executable by ResolveGcMode from what a free
//           costs its allocator (Allocator::free_cost()). A cheap free (CachingAllocator: tens
//           of ns, a block back into a bin) is done in place — async would only delay it, and a
//           starved worker (pipeline stages sharing cores) lets freed memory pile up and raises
//           every stage's peak (docs/benchmarks.md, "GC modes on pipeline stages"). An expensive
//           free (SystemAllocator: munmap) goes to the worker, within the async bound below.
//
// The default's memory promise: where auto resolves to sync (every allocator sluice trains with),
// peaks are exactly sync's — allocated and reserved, whatever the thread count and machine load;
// the allowance is zero. Where it resolves to async, the async bound below holds.
//
// AsyncGarbageCollector, and how it avoids the upstream async GC's failures:
//   * The queue is a bounded single-producer/single-consumer ring of batch pointers
//     (moodycamel::BlockingReaderWriterCircularBuffer), allocated once; nothing grows while the
//     worker reads it.
//   * A batch is a fixed-capacity array of storage handles that the caller preallocates (one per
//     instruction), so handing over allocates nothing on the heap.
//   * The idle worker sleeps: the queue's semaphore spins briefly (~1k polls) and then blocks in
//   the
//     kernel; there is no yield loop.
//   * Back-pressure: Submit refuses (returns false) when the queue is full or when the bytes
//     handed over and not yet destroyed would exceed max_pending_bytes; the caller then destroys
//     the batch itself. So memory waiting for the worker never exceeds max_pending_bytes.
//   * Drain barrier: Drain() enqueues a fence and blocks until the worker reaches it, so every
//     batch submitted before is destroyed when Drain returns (memory statistics are exact).
//   * The worker exits only when it dequeues the shutdown marker that the destructor enqueues
//     behind everything else: shutdown destroys everything still queued, then joins.
//   * Errors raised on the worker (by a GcListener) are captured and rethrown by the next Drain()
//     on the caller's thread; the worker keeps destroying batches.
//
// Memory bound (trace runs): at any moment allocated(async) = allocated(sync at the same point of
// the program) + bytes pending in the queue, hence
//     peak(async) ≤ peak(sync) + async_pending_peak ≤ peak(sync) + max_pending_bytes.
//
// Thread-safety: Submit from one producer thread at a time — the single executing thread of a
// trace run, or, with multi_producer = true, any thread (a mutex then serializes producers so the
// ring stays single-producer). Drain, SetListener and TakePendingPeak from the owning (caller)
// thread while no Submit runs. The worker touches only the batches it dequeues, the listener and
// the atomic counters. The producer side's fields are GUARDED_BY(producer_mu_), which is locked
// only with multi_producer = true; a single producer holds it by the contract above (MutexLockIf
// in core/mutex.h). The worker's error is GUARDED_BY(error_mu_). clang checks both.
//
// Example:
//   AsyncGarbageCollector gc({.queue_batches = 256, .max_pending_bytes = 1 << 30});
//   GarbageBatch batch(handles);                     // handles: preallocated span of shared_ptr
//   batch.Add(tensor.DetachStorage());
//   if (!gc.Submit(&batch)) batch.Destroy();         // back-pressure: free here
//   gc.Drain();                                      // everything submitted is destroyed
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <semaphore>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include <readerwriterqueue/readerwritercircularbuffer.h>

#include "sluice/core/allocator.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/mutex.h"
#include "sluice/core/storage.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

enum class GcMode : uint8_t { kNone, kSync, kAsync, kAuto };

inline constexpr EnumEntry<GcMode> kGcModeNames[] = {
    {GcMode::kAuto, "auto"},
    {GcMode::kNone, "none"},
    {GcMode::kSync, "sync"},
    {GcMode::kAsync, "async"},
};
static_assert(IsCompleteEnumTable(kGcModeNames));

// The mode's name in kGcModeNames, and back (nullopt for any other text).
std::string_view Name(GcMode mode);
std::optional<GcMode> ParseGcMode(std::string_view name);

// The mode a run with `requested` uses on `allocator`: kAuto becomes kSync where the allocator's
// free is cheap and kAsync where it is expensive; any other mode is itself.
GcMode ResolveGcMode(GcMode requested, const Allocator& allocator);
// For reports: "auto (sync)" when `requested` is kAuto, else the name of `resolved`.
std::string DescribeGcMode(GcMode requested, GcMode resolved);

// Storages to destroy together. The handle array is owned by whoever built the batch; a submitted
// batch belongs to the collector until the next Drain() returns.
class GarbageBatch {
 public:
  GarbageBatch() = default;
  explicit GarbageBatch(std::span<std::shared_ptr<Storage>> handles, int32_t tag = -1)
      : handles_(handles), tag_(tag) {}

  // Takes one more handle; SLUICE_CHECK fails beyond the capacity.
  void Add(std::shared_ptr<Storage> storage);
  // Drops every handle (the storages die here unless referenced elsewhere) and empties the batch.
  void Destroy();

  bool empty() const { return count_ == 0; }
  int32_t count() const { return count_; }
  int64_t bytes() const { return bytes_; }
  int32_t tag() const { return tag_; }  // the instruction that produced the garbage, for traces

 private:
  std::span<std::shared_ptr<Storage>> handles_;
  int32_t count_ = 0;
  int64_t bytes_ = 0;
  int32_t tag_ = -1;
};

// Observes the worker (for traces): called on the worker thread after each batch is destroyed.
// Times are steady-clock nanoseconds. An exception thrown here is rethrown by the next Drain().
class GcListener {
 public:
  virtual ~GcListener() = default;
  virtual void OnBatchDestroyed(int32_t tag, int32_t storages, int64_t bytes, int64_t begin_ns,
                                int64_t end_ns) = 0;
};

struct AsyncGcOptions {
  size_t queue_batches = 1024;                   // ring capacity in batches (at least 1)
  int64_t max_pending_bytes = int64_t{1} << 30;  // 1 GiB; 0 makes every free synchronous
  // The interpreter frees a batch smaller than this itself instead of handing it over: handing
  // over costs a queue slot and, when the worker sleeps, a wake-up (about a microsecond), more than
  // freeing a few small buffers. 0 hands over everything.
  int64_t min_batch_bytes = int64_t{64} << 10;
};

class AsyncGarbageCollector {
 public:
  // Starts the worker. Throws InvalidArgument for queue_batches == 0 or negative max_pending_bytes.
  explicit AsyncGarbageCollector(AsyncGcOptions options = {}, bool multi_producer = false);
  // Destroys everything still queued, then joins the worker. Errors not yet drained are dropped.
  ~AsyncGarbageCollector();
  AsyncGarbageCollector(const AsyncGarbageCollector&) = delete;
  AsyncGarbageCollector& operator=(const AsyncGarbageCollector&) = delete;

  // Hands `batch` to the worker; false (nothing handed) when the queue or the byte budget is full.
  bool Submit(GarbageBatch* batch);
  // Returns once every batch submitted so far is destroyed; rethrows the first worker error since
  // the previous Drain.
  void Drain();

  // The listener stays in effect until changed; only between Drain() and the next Submit().
  void SetListener(GcListener* listener) { listener_.store(listener, std::memory_order_release); }

  const AsyncGcOptions& options() const { return options_; }
  // Bytes handed over and not yet destroyed (a snapshot).
  int64_t pending_bytes() const { return pending_bytes_.load(std::memory_order_acquire); }
  // The largest pending_bytes seen by Submit since the previous call; resets it.
  int64_t TakePendingPeak();
  // Batches the worker has destroyed since it started.
  int64_t batches_destroyed() const { return batches_destroyed_.load(std::memory_order_acquire); }

 private:
  void WorkerLoop();
  void Destroy(GarbageBatch* batch);

  const AsyncGcOptions options_;
  const bool multi_producer_;
  moodycamel::BlockingReaderWriterCircularBuffer<GarbageBatch*> queue_;
  GarbageBatch fence_;     // marker: the worker signals drained_ when it dequeues it
  GarbageBatch shutdown_;  // marker: the worker exits when it dequeues it
  std::binary_semaphore drained_{0};

  // Serializes Submit when multi_producer_; with a single producer, that thread's exclusive use
  // guards the producer side instead (see Thread-safety above).
  Mutex producer_mu_;
  int64_t pending_peak_ GUARDED_BY(producer_mu_) = 0;
  bool submitted_since_drain_ GUARDED_BY(producer_mu_) = false;
  std::atomic<int64_t> pending_bytes_{0};  // + by producers, - by the worker
  std::atomic<int64_t> batches_destroyed_{0};
  std::atomic<GcListener*> listener_{nullptr};

  Mutex error_mu_;
  // The first listener error since the last Drain.
  std::exception_ptr error_ GUARDED_BY(error_mu_);

  std::thread worker_;  // last: started when everything above exists
};

}  // namespace sluice
