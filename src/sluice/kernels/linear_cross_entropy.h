// A linear head and its cross-entropy loss, chunk by chunk of tokens: the [N, vocab] logits and
// their gradient are never whole.
//
// Buffers: x [N, C] (N rows = tokens), w [vocab, C] (torch.nn.Linear's layout: the GPT's lm_head),
// targets [N] (int32_t or int64_t; kIgnoreTarget rows do not count), scratch [chunk, vocab]:
//   loss = CrossEntropy(x·wᵀ, targets)                      (kernels/cross_entropy.h)
//   dx   = dlogits·w,  dw = dlogitsᵀ·x,   dlogits = CrossEntropyGrad(x·wᵀ, targets, dloss)
// computed over chunks of `chunk` rows: a chunk's logits go into the scratch, the loss adds up its
// rows (in double, chunk after chunk), and the gradient turns the scratch into the chunk's dlogits
// in place, writes the chunk's rows of dx and adds the chunk's share into dw (the first chunk's
// GEMM with beta = 0, the later ones with beta = 1). The working set is the scratch, chunk·vocab
// values, instead of the logits and their gradient, 2·N·vocab.
//
// Why the gradient recomputes each chunk's logits rather than the forward computing dx and dw:
// the forward then keeps nothing but x (which the backward of the layer before needs anyway under
// every recompute policy), evaluation runs pay no gradient work, and a pipeline stage holding
// several micro-batches in flight does not hold a [vocab, C] dw for each. The price is the head's
// forward GEMM once more in the backward (2·N·C·vocab).
//
// Agreement with the unfused ops: each chunk's logits and dlogits are computed row by row as the
// unfused ops compute them; the loss sums the same row losses grouped by chunk (in double), and dw
// sums over the tokens chunk by chunk, a different rounding of the same sum
// (tests/step/fused_head_test.cc: the loss within 1e-6, every gradient within 1e-5 of its largest).
//
// *Reference: plain loops (products summed in T) and the reference cross-entropy rows. *Fast: GEMMs
// through CBLAS and the SIMD rows. Failure modes: a target outside [0, vocab) throws
// InvalidArgument naming the target, its row and vocab. Thread-safety: plain functions over
// caller-owned memory.
//
// Example:
//   const int64_t rows = kernels::LinearCrossEntropyChunk(N, C, vocab, 0);
//   std::vector<float> scratch(rows * vocab);
//   float loss = kernels::LinearCrossEntropyFast<float, int64_t>(x, w, targets, N, C, vocab, rows,
//                                                                scratch.data());
#pragma once

#include <cstdint>

namespace sluice::kernels {

// The rows per chunk for the attribute `chunk`: chunk itself (at most n) when positive; 0 sizes a
// chunk's logits like x, n·c values: ceil(n / ceil(vocab / c)) rows (Liger's rule), at least 1.
int64_t LinearCrossEntropyChunk(int64_t n, int64_t c, int64_t vocab, int64_t chunk);

template <typename T, typename I>
T LinearCrossEntropyReference(const T* x, const T* w, const I* targets, int64_t n, int64_t c,
                              int64_t vocab, int64_t chunk, T* scratch);
template <typename T, typename I>
T LinearCrossEntropyFast(const T* x, const T* w, const I* targets, int64_t n, int64_t c,
                         int64_t vocab, int64_t chunk, T* scratch);

// dx [N, C] and dw [vocab, C], both overwritten, for the upstream gradient dloss of the mean loss.
template <typename T, typename I>
void LinearCrossEntropyGradReference(const T* x, const T* w, const I* targets, T dloss, int64_t n,
                                     int64_t c, int64_t vocab, int64_t chunk, T* scratch, T* dx,
                                     T* dw);
template <typename T, typename I>
void LinearCrossEntropyGradFast(const T* x, const T* w, const I* targets, T dloss, int64_t n,
                                int64_t c, int64_t vocab, int64_t chunk, T* scratch, T* dx, T* dw);

}  // namespace sluice::kernels
