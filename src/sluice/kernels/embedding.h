// Embedding lookup and its gradient.
//
//   forward   out[n, :] = table[ids[n], :]          ids [N] (any shape, N = numel),
//                                                   table [vocab, C], out [N, C]
//   grad      dtable = zeros [vocab, C]; for n = 0..N−1 in order: dtable[ids[n], :] += dy[n, :]
//
// The gradient is a scatter-add in token order, so repeated ids accumulate in the same order on
// every run: results are deterministic (bitwise) for a given input.
// Ids are int32_t or int64_t (I), values float or double (T). Outputs must not alias inputs.
//
// Failure modes: an id outside [0, vocab) throws InvalidArgument naming the id, its position and
// vocab (forward and grad alike); the kernel has written part of its output by then.
// *Reference: element by element. *Fast: one memcpy / one vectorizable add per row.
// Thread-safety: plain functions over caller-owned memory.
//
// Example:
//   // ids [B, T] -> x [B, T, C]
//   kernels::EmbeddingFast<float, int64_t>(ids, table, x, B * T, vocab, C);
#pragma once

#include <cstdint>

namespace sluice::kernels {

template <typename T, typename I>
void EmbeddingReference(const I* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t c);
template <typename T, typename I>
void EmbeddingFast(const I* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t c);

// dtable [vocab, C] (overwritten) from ids [N] and dy [N, C].
template <typename T, typename I>
void EmbeddingGradReference(const I* ids, const T* dy, T* dtable, int64_t n, int64_t vocab,
                            int64_t c);
template <typename T, typename I>
void EmbeddingGradFast(const I* ids, const T* dy, T* dtable, int64_t n, int64_t vocab, int64_t c);

// Throws InvalidArgument unless 0 <= id < vocab: "embedding id 57 at position 3 is out of range:
// vocab = 50 (valid: 0 to 49)", `what` being "embedding id".
void CheckIndex(const char* what, int64_t id, int64_t position, int64_t vocab);

}  // namespace sluice::kernels
