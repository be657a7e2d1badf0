// Memory statistics kept by every allocator instance (each pipeline stage has its own), and the
// two kinds of points a memory timeline is made of.
//
// "Allocated" counts the bytes callers requested (the sum of live requests), so that it can be
// compared exactly with a program's liveness lower bound. "Reserved" counts the bytes held from the
// operating system (chunks of a caching allocator, mapped pages of the system allocator); it is at
// least the allocated bytes, and a caching allocator keeps it after frees.
//
//   MemoryEvent   one allocation or free as the allocator saw it (MemoryStatsRecorder's optional
//                 timeline: every event, tagged by ScopedMemoryTag).
//   MemorySample  the allocated bytes read from Allocator::Stats() at a moment a runner chose
//                 (exec/run_trace.h: after an instruction's outputs were allocated, after a free).
//
// Thread-safety: MemoryStatsRecorder is not synchronized: the owning allocator calls it under its
// own lock. ScopedMemoryTag is per thread.
#pragma once

#include <cstdint>
#include <vector>

namespace sluice {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // live requested bytes now
  int64_t peak_allocated_bytes = 0;  // maximum of allocated_bytes since creation or ResetPeak()
  int64_t reserved_bytes = 0;        // bytes held from the OS now
  int64_t peak_reserved_bytes = 0;   // maximum of reserved_bytes since creation or ResetPeak()
  int64_t num_allocs = 0;            // successful Allocate calls
  int64_t num_frees = 0;             // Deallocate calls
  int64_t num_os_allocs = 0;         // times memory was obtained from the OS
  int64_t num_os_frees = 0;          // times memory was returned to the OS
};

// One point of the optional memory timeline: after an allocation (delta > 0) or a free (delta < 0).
struct MemoryEvent {
  int64_t time_ns;          // steady-clock nanoseconds since the recorder was created
  int64_t delta_bytes;      // +requested on allocation, -requested on free
  int64_t allocated_bytes;  // allocated_bytes after the event
  const char* tag;          // the innermost ScopedMemoryTag of the thread, or "" if none
};

// Allocated bytes at one moment. The time's origin is the owner's to state (a run's start for
// exec/run_trace.h); the clock is always core/clock.h's NowNs.
struct MemorySample {
  int64_t time_ns = 0;
  int64_t allocated_bytes = 0;
};

// Sets the tag recorded with timeline events made by this thread while the object lives.
// Tags must be string literals or otherwise outlive the timeline.
// Example: { ScopedMemoryTag tag("forward"); RunForward(); }
class ScopedMemoryTag {
 public:
  explicit ScopedMemoryTag(const char* tag);
  ~ScopedMemoryTag();
  ScopedMemoryTag(const ScopedMemoryTag&) = delete;
  ScopedMemoryTag& operator=(const ScopedMemoryTag&) = delete;
  static const char* Current();

 private:
  const char* previous_;
};

class MemoryStatsRecorder {
 public:
  MemoryStatsRecorder();

  void OnAllocate(int64_t requested_bytes);
  void OnFree(int64_t requested_bytes);
  // For an owner that counts allocated bytes itself (CachingAllocator: atomics, so that its
  // per-thread fast path needs no lock): the timeline event of an allocation (delta > 0) or a free
  // (delta < 0), given allocated_bytes after it. Touches no counter.
  void RecordEvent(int64_t delta_bytes, int64_t allocated_after);
  void OnReserve(int64_t bytes);    // memory obtained from the OS (a map)
  void OnUnreserve(int64_t bytes);  // memory returned to the OS (an unmap)
  // Reserved bytes that change without a map or an unmap (a caching allocator's region growing
  // into its address space, or its free tail trimmed): reserved_bytes only, no OS-call count.
  void OnGrow(int64_t bytes);
  void OnShrink(int64_t bytes);

  const MemoryStats& stats() const { return stats_; }
  void ResetPeak();

  // Timeline recording is off by default. Either call clears the events recorded so far.
  void EnableTimeline(bool on);
  const std::vector<MemoryEvent>& timeline() const { return timeline_; }

 private:
  void Record(int64_t delta) { RecordEvent(delta, stats_.allocated_bytes); }

  MemoryStats stats_;
  bool timeline_on_ = false;
  int64_t origin_ns_;
  std::vector<MemoryEvent> timeline_;
};

}  // namespace sluice
