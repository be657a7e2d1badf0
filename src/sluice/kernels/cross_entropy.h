// Cross-entropy loss over logits, fused with its softmax, and its gradient.
//
// Buffers: logits [N, vocab] (N rows = tokens, vocab classes, contiguous), targets [N] (int32_t or
// int64_t), one loss for all tokens:
//   loss      = (1/N) Σ_n ( lse_n − logits[n, targets[n]] )
//   lse_n     = m_n + log Σ_v e^(logits[n, v] − m_n),  m_n = max_v logits[n, v]
//               (log-sum-exp never overflows; the loss of a row is ≥ 0).
//   grad      dlogits[n, v] = (dloss / N) · ( softmax(logits[n])[v] − [v == targets[n]] )
// With label smoothing ε (PyTorch's label_smoothing) a row's loss is (1 − ε)·(lse_n − logits[n, t])
// + ε·(lse_n − mean_v logits[n, v]) — the target's share moved evenly onto every class — and its
// gradient softmax − (1 − ε)·onehot − ε / vocab. CrossEntropyOptions::sum gives the sum over the
// counted tokens instead of the mean (PyTorch's reduction="sum"); the gradient's factor is then
// dloss, not dloss / N.
// A target of kIgnoreTarget (-1, PyTorch's ignore_index=-1) adds nothing: the mean is over the
// counted tokens and an ignored row's gradient is zero. With no counted token the loss and the
// gradient are 0 (PyTorch would give NaN).
// The gradient recomputes the softmax from the logits: forward saves no probabilities, so the
// [N, vocab] probability tensor (the largest activation of a language model) never outlives a
// kernel. The per-token losses are summed in double in both kernels so the mean does not drift
// with N.
//
// Failure modes: a target outside [0, vocab) throws InvalidArgument naming the target, its
// position and vocab. *Reference: plain loops and std::exp/std::log. *Fast: the runtime-dispatched
// SIMD row kernels (kernels/simd_kernels.h).
// Thread-safety: plain functions over caller-owned memory.
//
// Example:
//   // logits [B·T, vocab], targets [B·T] -> mean loss
//   float loss = kernels::CrossEntropyFast<float, int64_t>(logits, targets, B * T, vocab);
#pragma once

#include <cstdint>

#include "sluice/core/dtype.h"

namespace sluice::kernels {

// The target that adds nothing to the loss (PyTorch's ignore_index=-1): datasets write it where a
// position is not to be predicted (nn/data.h).
inline constexpr int64_t kIgnoreTarget = -1;

// Label smoothing and the reduction (the op's attributes label_smoothing and reduction).
struct CrossEntropyOptions {
  double smoothing = 0;  // ε in [0, 1]
  bool sum = false;      // the sum over the counted tokens, not their mean
};

template <typename T, typename I>
T CrossEntropyReference(const T* logits, const I* targets, int64_t n, int64_t vocab,
                        CrossEntropyOptions options = {});
template <typename T, typename I>
T CrossEntropyFast(const T* logits, const I* targets, int64_t n, int64_t vocab,
                   CrossEntropyOptions options = {});

// dlogits [N, vocab] (overwritten) for the upstream gradient dloss of the loss.
template <typename T, typename I>
void CrossEntropyGradReference(const T* logits, const I* targets, T dloss, T* dlogits, int64_t n,
                               int64_t vocab, CrossEntropyOptions options = {});
template <typename T, typename I>
void CrossEntropyGradFast(const T* logits, const I* targets, T dloss, T* dlogits, int64_t n,
                          int64_t vocab, CrossEntropyOptions options = {});

// dlogits rounded to bf16 as they are stored, from f32 logits: bit for bit the f32 kernel's
// result cast to bf16 (a gradient that only bf16 products read, autodiff/autodiff.h). The fast
// kernel computes a chunk of rows at a time into a heap buffer of about kChunkCost floats.
template <typename I>
void CrossEntropyGradBF16Reference(const float* logits, const I* targets, float dloss,
                                   BFloat16* dlogits, int64_t n, int64_t vocab,
                                   CrossEntropyOptions options = {});
template <typename I>
void CrossEntropyGradBF16Fast(const float* logits, const I* targets, float dloss, BFloat16* dlogits,
                              int64_t n, int64_t vocab, CrossEntropyOptions options = {});

// The pieces of the mean above, for a loss computed over chunks of rows
// (kernels/linear_cross_entropy.h); the functions above are made of them. `first_row` is the
// chunk's first row in the whole, for error messages.
// Tokens that count in the mean: targets other than kIgnoreTarget.
template <typename I>
int64_t CountTargets(const I* targets, int64_t n);
// Σ over the counted rows of lse_n − logits[n, targets[n]] (with smoothing ε: the smoothed row
// loss above), in double.
template <typename T, typename I>
double CrossEntropySumReference(const T* logits, const I* targets, int64_t n, int64_t vocab,
                                int64_t first_row = 0, double smoothing = 0);
template <typename T, typename I>
double CrossEntropySumFast(const T* logits, const I* targets, int64_t n, int64_t vocab,
                           int64_t first_row = 0, double smoothing = 0);
// dlogits[n, v] = scale · (softmax(logits[n])[v] − (1 − ε)·[v == targets[n]] − ε / vocab), zero
// on ignored rows. dlogits may be logits itself (each row is read before it is written).
template <typename T, typename I>
void CrossEntropyGradScaledReference(const T* logits, const I* targets, T scale, T* dlogits,
                                     int64_t n, int64_t vocab, int64_t first_row = 0,
                                     double smoothing = 0);
template <typename T, typename I>
void CrossEntropyGradScaledFast(const T* logits, const I* targets, T scale, T* dlogits, int64_t n,
                                int64_t vocab, int64_t first_row = 0, double smoothing = 0);

}  // namespace sluice::kernels
