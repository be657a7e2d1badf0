// Batch normalization (nn.BatchNorm1d/2d): the normalisation, its gradient ops, and the update of
// the running statistics. Kernels: kernels/batch_norm.h.
//
// x is [B, C, ...]: the statistics of channel c are over every other axis (the batch and the
// positions). `running_mean` and `running_var` [C] are *buffers* (Program::AddBuffer, `buffer`
// in text): state that no gradient reaches and no optimizer steps, which the update op writes in
// place and checkpoints keep.
//
// Training and evaluation. A training program normalises by the batch's statistics
// (`{training = true}`, the default) and moves the running statistics towards them with a
// `batch_norm_update_stats` after each `batch_norm`, as PyTorch's module.train() forward does;
// its evaluation form (ir/inference_form.h InferenceForm) normalises by the running statistics
// (`{training = false}`) and leaves them alone, as module.eval() does.
//
// Example (a ResNet's convolution, batch norm and ReLU):
//   Var h = Conv2d(x, w);                                   // [B, 16, 8, 8]
//   Var y = BatchNorm(h, gamma, beta, running_mean, running_var);
//   BatchNormUpdateStats(h, running_mean, running_var);    // in place
//   Var a = Relu(y);
#pragma once

#include <utility>

#include "sluice/ir/builder.h"

namespace sluice {

struct BatchNormOptions {
  double eps = 1e-5;
  bool training = true;  // the batch's statistics; false: the running ones
};

// x [B, C, ...], weight, bias, running_mean, running_var [C] -> y [B, C, ...]. Op "batch_norm",
// attributes eps, training. VJP (training): batch_norm_grad_x (x) and batch_norm_grad_params
// (weight, bias); (inference form): batch_norm of dy and sums, per channel.
Var BatchNorm(Var x, Var weight, Var bias, Var running_mean, Var running_var,
              const BatchNormOptions& options = {});
// dy, x [B, C, ...], weight [C] -> dx, under the batch's statistics. Op "batch_norm_grad_x".
Var BatchNormGradX(Var dy, Var x, Var weight, double eps);
// dy, x [B, C, ...] -> {dweight, dbias} [C], under the batch's statistics. Op
// "batch_norm_grad_params".
std::pair<Var, Var> BatchNormGradParams(Var dy, Var x, double eps);
// Moves running_mean and running_var [C] towards x's batch statistics (the variance unbiased), in
// place: running = (1 − momentum)·running + momentum·batch. Op "batch_norm_update_stats"
// (training only: InferenceForm drops it).
void BatchNormUpdateStats(Var x, Var running_mean, Var running_var, double momentum = 0.1);

void RegisterBatchNormOps(OpRegistry& registry);

}  // namespace sluice
