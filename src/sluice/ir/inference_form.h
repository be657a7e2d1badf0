// The inference form of a program: what PyTorch's module.eval() runs where the program is what
// module.train() runs. Ops that keep running statistics (OpDef::updates_buffers, such as
// batch_norm_update_stats) are dropped, and every instruction whose op declares a `training`
// attribute (batch_norm) gets `training = false`, so that batch norm normalises by its running
// statistics and leaves them alone. Everything else — values, names, units, parameters, constants,
// buffers, outputs — is copied as it is. A program without such ops comes back equal.
//
// Training's evaluation runs the inference form of the training program (train/trainer.cc), so
// evaluating never moves the running statistics, as PyTorch's evaluation under module.eval().
//
// Thread-safety: a pure function. Failure modes: none beyond those of building the copy.
//
// Example:
//   Program eval = InferenceForm(model.forward);   // same loss output, running statistics
#pragma once

#include "sluice/ir/program.h"

namespace sluice {

Program InferenceForm(const Program& program);

// Whether InferenceForm would change `program` (it has a training-only op or a `training`
// attribute).
bool HasTrainingMode(const Program& program);

}  // namespace sluice
