// What sluice's oneDNN kernels share (onednn_matmul.h's products, onednn_conv.h's convolutions):
// the CPU engine, each calling thread's stream and OpenMP thread count, and the thread's fallback
// scratchpad. Internal to kernels/: it includes oneDNN's C++ API, which the public headers keep
// out.
//
// Thread-safety: every function may be called from any thread. The engine is made once and never
// destroyed (kernels may run during static teardown); streams, thread counts and scratchpads are
// per calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>

#include "sluice/core/mutex.h"

namespace sluice::kernels {

// The process's CPU engine.
const dnnl::engine& OneDnnEngine();

// The thread count SetOneDnnThreads (onednn_matmul.h) set: what every call runs on.
int OneDnnThreads();

// The calling thread's stream on OneDnnEngine(), with its OpenMP thread count set to `threads`
// (default: SetOneDnnThreads' count) when that changed: call it before running a primitive.
dnnl::stream& OneDnnThreadStream(int threads);
inline dnnl::stream& OneDnnThreadStream() { return OneDnnThreadStream(OneDnnThreads()); }

// The calling thread's own buffer of at least `bytes`, aligned to 64, grown to the largest asked
// for and kept for the thread's life (outside the executor's allocator and the memory forecast).
void* OneDnnThreadScratchpad(size_t bytes);

// A process-wide cache of made primitives (Entry) by their problem (Key, ordered by <): oneDNN
// JIT-compiles a primitive per problem, far slower than running it, so each is made once. Made
// outside the lock: two threads racing on a new key both make one and the first insert wins.
//
// Every key holds the OpenMP thread count its primitives run on, and Get makes them under that
// count: a primitive divides its work, and sizes its scratchpad (a buffer per thread), for the
// threads OpenMP offers the thread that makes it — the process's default (OMP_NUM_THREADS, else
// every core) on a thread that never set one — not for the threads it will run on. Made for more
// than it runs on, its scratchpad (which the memory forecast counts) grows with the machine's
// cores and a convolution's threads wait at a barrier for threads that never come; made for fewer,
// a matmul runs on fewer (oneDNN's matmul takes the lesser count) and a convolution's threads may
// split one part between two (onednn_conv.cc).
template <typename Key, typename Entry>
class OneDnnCache {
 public:
  // The entry of `key`, made by make() (returning std::shared_ptr<const Entry>) when absent,
  // under `threads` OpenMP threads (key's count; the calling thread's count stays so after).
  template <typename Make>
  std::shared_ptr<const Entry> Get(const Key& key, int threads, Make&& make) {
    {
      MutexLock lock(&mutex_);
      auto it = entries_.find(key);
      if (it != entries_.end()) return it->second;
    }
    OneDnnThreadStream(threads);
    std::shared_ptr<const Entry> made = make();
    MutexLock lock(&mutex_);
    return entries_.emplace(key, std::move(made)).first->second;
  }

  int64_t size() {
    MutexLock lock(&mutex_);
    return static_cast<int64_t>(entries_.size());
  }

 private:
  Mutex mutex_;
  std::map<Key, std::shared_ptr<const Entry>> entries_ GUARDED_BY(mutex_);
};

}  // namespace sluice::kernels
