// RunTrace: what happened during one run, thread by thread, for timelines (io/chrome_trace.h
// turns it into a Chrome/Perfetto trace). Filled by Executable::Run when given one.
//
// Times are nanoseconds since origin_ns (a core/clock.h NowNs reading taken when the run started).
// threads[0 .. executors-1] are the executing threads ("executor 0" is the caller); with async GC
// the last entry is the GC worker. Memory samples are the executable allocator's allocated bytes
// after an instruction's outputs were allocated, after a release, and (worker) after each batch.
//
// Thread-safety: each ThreadTrace is written by its own thread during the run; read it after Run
// returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/core/memory_stats.h"

namespace sluice {

struct InstructionSpan {
  int32_t instruction = -1;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

// Freeing work: on an executing thread (sync; async hand-over) or on the GC worker.
struct GcSpan {
  int32_t instruction = -1;  // whose free list
  int32_t storages = 0;      // released (executor: a static plan's arena values count, bytes not)
  int64_t bytes = 0;         // returned to the allocator (or handed to the worker)
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

struct ThreadTrace {
  std::string name;
  bool gc_worker = false;  // the async GC worker (its gc spans are destructions)
  std::vector<InstructionSpan> instructions;
  std::vector<GcSpan> gc;
  std::vector<MemorySample> memory;
};

struct RunTrace {
  int64_t origin_ns = 0;
  std::vector<ThreadTrace> threads;
};

}  // namespace sluice
