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

#include <oneapi/dnnl/dnnl.hpp>

namespace sluice::kernels {

// The process's CPU engine.
const dnnl::engine& OneDnnEngine();

// The thread count SetOneDnnThreads (onednn_matmul.h) set: what every call runs on.
int OneDnnThreads();

// The calling thread's stream on OneDnnEngine(), with its OpenMP thread count set to
// SetOneDnnThreads' (onednn_matmul.h) when that changed: call it before running a primitive.
dnnl::stream& OneDnnThreadStream();

// The calling thread's own buffer of at least `bytes`, aligned to 64, grown to the largest asked
// for and kept for the thread's life (outside the executor's allocator and the memory forecast).
void* OneDnnThreadScratchpad(size_t bytes);

}  // namespace sluice::kernels
