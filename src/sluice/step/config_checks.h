// The ranges of TrainConfig's numbers: each number `sluice train` takes is checked here, where it
// enters, so that a NaN learning rate or a negative clip norm is an error before any work rather
// than NaN weights after it. ValidateTrainConfig (step/task.h) calls it.
//
// Failure: InvalidArgument naming the option, the value given and what is allowed, e.g.
//   "--min-lr must be a finite number from 0 to --lr (0.003), got -1".
// Thread-safety: a pure function.
#pragma once

#include "sluice/step/train_config.h"

#include <cstdint>

namespace sluice {

// Bounds of the sizes. They keep every tensor a step can make — the logits [B, T, V], a naive
// attention's scores [B, H, T, T], a weight [V, C] or [C, 4C] — far below 2^63 bytes, so a size
// typed by mistake is an error at once, not an overflow or hours of setup; a model this large
// does not fit in memory anyway (the allocator reports that, OutOfMemory).
inline constexpr int64_t kMaxLayers = 10'000;
inline constexpr int64_t kMaxWidth = 65'536;  // --dim, --heads; mlp --features, --hidden, --classes
inline constexpr int64_t kMaxSeq = 16'384;
inline constexpr int64_t kMaxVocab = int64_t{1} << 20;
inline constexpr int64_t kMaxBatch = 16'384;
// Validation batches are drawn at random from the held-out split, as many as asked: a bound keeps
// an evaluation (run every --eval-every steps) from running for days.
inline constexpr int64_t kMaxEvalBatches = 10'000;

// Learning rates, weight decay, betas, momentum and clip finite and in range (min-lr ≤ lr); counts
// (warmup, eval and save intervals, model sizes, threads) within their bounds.
void ValidateTrainRanges(const TrainConfig& config);
// `--reserved-headroom`: throws InvalidArgument naming it unless 0 <= headroom <= 1 (finite).
// ValidateTrainRanges checks it too; the CLI checks it first, before any allocator is made.
void ValidateReservedHeadroom(double headroom);

}  // namespace sluice
