// The single-stage step engine (step/step_engine.h): the whole model as one chunk of a
// StageProgram (step/stage_program.h — the same builder every pipeline rank uses) on the calling
// thread, all tensors from one CachingAllocator.
//
// One step:
//   for each of M micro-batches (B/M sequences each):
//     forward   (keeps the values backward reads)   ids, targets, params → loss, saved values
//     backward  (frees saved values at last use)     saved, params → "<p>.grad", accumulated
//   mean over micro-batches, the global norm, clipping, optimizer program (in place).
// The step's peak is the allocator's peak from the step's start to its end.
//
// Thread-safety: one thread at a time. Failure modes: Step rethrows the failing run's error.
//
// Example:
//   Trainer trainer(config, MakeSingleStageEngine);   // what Trainer(config) does
#pragma once

#include <memory>

#include "sluice/step/step_engine.h"

namespace sluice {

std::unique_ptr<StepEngine> MakeSingleStageEngine(const EngineContext& context);

}  // namespace sluice
