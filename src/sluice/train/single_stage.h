// The single-stage step engine (train/step_engine.h): the whole model on the calling thread, all
// tensors from one CachingAllocator.
//
// One step:
//   for each of M micro-batches (batch B/M each):
//     forward   (keeps the values backward reads)   ids, targets, params → loss, saved values
//     backward  (frees saved values at last use)     saved, params → "<p>.grad"
//     accumulate the gradients (BLAS axpy)
//   mean over micro-batches, clip to the global norm, optimizer program (in place).
// The step's peak is the largest of its runs' peaks of the engine's allocator.
//
// Thread-safety: one thread at a time. Failure modes: Step rethrows the failing run's error.
//
// Example:
//   Trainer trainer(config, MakeSingleStageEngine);   // what Trainer(config) does
#pragma once

#include <memory>

#include "sluice/train/step_engine.h"

namespace sluice {

std::unique_ptr<StepEngine> MakeSingleStageEngine(const EngineContext& context);

}  // namespace sluice
