// Optimizer update ops: they update a parameter and its optimizer state in place and have no
// outputs (OpKind::kInPlace: never pruned, no VJP). Learning rate and step are scalar tensors
// (program inputs) rather than attributes because they change every step; hyperparameters that
// stay fixed are attributes. Semantics are exactly PyTorch 1.13's torch.optim.SGD (dampening 0,
// no Nesterov) and torch.optim.AdamW; kernels/optimizer.h spells out the formulas.
//
// Each has an *_into form that leaves the state as it is and writes the updated state to buffers
// of its own (the last inputs, which the op updates in place; they must not share storage with the
// others): what post-validation's double buffer runs (step/stage_program.h).
//
// Shapes: param, grad and every state buffer have the parameter's shape (any), all of one float
// dtype; lr [] is f32 or f64; step [] is f32, f64 or i64.
//
// Example (one AdamW step for one parameter inside an optimizer program):
//   Var lr = b.Input("lr", DType::kF32, {});
//   Var step = b.Input("step", DType::kI64, {});   // t = 1 on the first update
//   AdamWUpdate(w, w_grad, w_m, w_v, lr, step, {.weight_decay = 0.1});
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {

struct SgdOptions {
  double momentum = 0;
  double weight_decay = 0;
};

// p -= lr · (momentum buffer or d), d = grad + weight_decay · p. Op "sgd_update", inputs
// (param, grad, momentum_buf, lr), attributes momentum, weight_decay. The buffer input is always
// there (start it at zeros); with momentum 0 it is not touched, so any tensor of the parameter's
// shape will do.
void SgdUpdate(Var param, Var grad, Var momentum_buf, Var lr, const SgdOptions& options = {});
// The same step read from param and momentum_buf and written to param_out and momentum_out. Op
// "sgd_update_into", inputs (param, grad, momentum_buf, lr, param_out, momentum_out).
void SgdUpdateInto(Var param, Var grad, Var momentum_buf, Var lr, Var param_out, Var momentum_out,
                   const SgdOptions& options = {});

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // PyTorch's AdamW default
};

// One AdamW update of param and its moments m and v (start them at zeros). step is the 1-based
// count t of this update, used for bias correction; the op reads it and does not increment it.
// Op "adamw_update", inputs (param, grad, m, v, lr, step), attributes beta1, beta2, eps,
// weight_decay.
void AdamWUpdate(Var param, Var grad, Var m, Var v, Var lr, Var step,
                 const AdamWOptions& options = {});
// The same step read from param, m and v and written to param_out, m_out and v_out. Op
// "adamw_update_into", inputs (param, grad, m, v, lr, step, param_out, m_out, v_out).
void AdamWUpdateInto(Var param, Var grad, Var m, Var v, Var lr, Var step, Var param_out, Var m_out,
                     Var v_out, const AdamWOptions& options = {});

}  // namespace sluice
