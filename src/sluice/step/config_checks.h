// The ranges of TrainConfig's numbers: each number `sluice train` takes is checked here, where it
// enters, so that a NaN learning rate or a negative clip norm is an error before any work rather
// than NaN weights after it. ValidateTrainConfig (step/task.h) calls it.
//
// Failure: InvalidArgument naming the option, the value given and what is allowed, e.g.
//   "--min-lr must be a finite number from 0 to --lr (0.003), got -1".
// Thread-safety: a pure function.
#pragma once

#include "sluice/step/train_config.h"

namespace sluice {

// Learning rates, weight decay, betas, momentum and clip finite and in range (min-lr ≤ lr); counts
// (warmup, eval and save intervals, model sizes, threads) within their bounds.
void ValidateTrainRanges(const TrainConfig& config);

}  // namespace sluice
