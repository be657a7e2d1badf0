// Intra-op parallelism for the non-GEMM kernels: ParallelFor splits a kernel's rows into chunks
// and runs them on the process's one intra-op ThreadPool (core/thread_pool.h).
//
// Chunks are fixed by the work alone — ChunkRows(cost_per_row) and the caller's row count,
// never the thread count — and each chunk is computed by the same code whichever thread takes it,
// so a kernel's results are bitwise identical at 1, 2 or any number of threads. A kernel that
// reduces over rows keeps one partial per chunk and adds the partials in chunk order afterwards
// (ParallelSum), which is again independent of the thread count.
//
// How the threads share the cores (docs/executor.md, "Intra-op threads"):
//   * SetIntraOpThreads(n) sizes the pool: n members, the calling thread being member 0, so n − 1
//     workers that sleep on a condition variable between jobs. step/stage_program.h's
//     ShareIntraOpThreads calls it with the same count it gives OpenBLAS: a process's kernels run
//     on at most n threads at a time, GEMM (OpenBLAS's own pool) or the rest (this pool), never
//     both, because one rank runs one instruction at a time.
//   * A ParallelFor from a thread that is already running a pool job (a member of a parallel
//     interpreter run or of this pool) runs its chunks on the caller: no nesting, no
//     oversubscription. So does one issued while another thread holds the pool (ranks of a
//     pipeline in one process share it; the first to come uses it, the others run serially).
//   * Work below one chunk's worth runs on the caller: waking a worker costs microseconds.
//
// Thread-safety: ParallelFor may be called from any thread at any time. SetIntraOpThreads must not
// race with running kernels (it replaces the pool); engines call it once before running. fn runs
// concurrently on disjoint chunks and must write only its chunk's outputs. An exception thrown by
// fn on any thread is rethrown on the caller after every chunk has finished or been skipped.
//
// Example:
//   // y, x [rows, cols]: one row per iteration, chunks of ~kChunkCost element operations.
//   ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) Row(x + r * cols, y + r * cols, cols);
//   });
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace sluice::kernels {

// Element operations per chunk, roughly: enough that a chunk takes a few microseconds, so that
// handing it to another thread pays.
inline constexpr int64_t kChunkCost = 16384;

// Sets the process's intra-op threads (1 ≤ threads ≤ ThreadPool::kMaxThreads, InvalidArgument
// otherwise); 1 runs every kernel on its calling thread (the initial state).
void SetIntraOpThreads(int threads);
int IntraOpThreads();

// Rows per chunk for rows that cost `cost_per_row` element operations each (≥ 1 row).
inline int64_t ChunkRows(int64_t cost_per_row) {
  return std::max<int64_t>(1, kChunkCost / std::max<int64_t>(1, cost_per_row));
}

// Elements per chunk of a flat elementwise kernel: a multiple of 64, so that a chunk boundary is a
// vector boundary of every instruction set (the same elements meet the same vector code).
inline constexpr int64_t kChunkElements = kChunkCost;

namespace internal {
// Runs chunk(context, c) for every c in [0, chunks), on the pool when that is free and useful.
void RunChunks(int64_t chunks, void (*chunk)(void* context, int64_t c), void* context);
}  // namespace internal

// Calls fn(begin, end) for the chunks [k·chunk, min((k + 1)·chunk, n)) of [0, n), possibly
// concurrently (see the top of this file). chunk ≥ 1.
template <typename F>
void ParallelFor(int64_t n, int64_t chunk, F&& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  struct Context {
    std::remove_reference_t<F>* fn;
    int64_t n, chunk;
  } context{&fn, n, chunk};
  internal::RunChunks(
      chunks,
      [](void* p, int64_t c) {
        auto* ctx = static_cast<Context*>(p);
        const int64_t begin = c * ctx->chunk;
        (*ctx->fn)(begin, std::min(begin + ctx->chunk, ctx->n));
      },
      &context);
}

// Σ over the chunks of [0, n) of partial(begin, end), the partials added in chunk order: the same
// sum at every thread count.
template <typename T, typename F>
T ParallelSum(int64_t n, int64_t chunk, F&& partial) {
  if (n <= 0) return T(0);
  chunk = std::max<int64_t>(1, chunk);
  std::vector<T> partials(static_cast<size_t>((n + chunk - 1) / chunk), T(0));
  ParallelFor(n, chunk,
              [&](int64_t begin, int64_t end) { partials[begin / chunk] = partial(begin, end); });
  T total = T(0);
  for (T p : partials) total += p;
  return total;
}

}  // namespace sluice::kernels
