// Optimizer update kernels: update a parameter and its optimizer state in place, elementwise.
// The formulas are PyTorch's (torch.optim.SGD and torch.optim.AdamW, 1.13, single-tensor path),
// checked against PyTorch in tests/ops/optimizer_test.cc.
//
// SGD, with d the descent direction and buf the momentum buffer (start it at zeros):
//   d = g + weight_decay · p
//   momentum ≠ 0:  buf = momentum · buf + d;  d = buf      (PyTorch's first step copies d into
//                  buf; from zeros, momentum · 0 + d is the same)
//   p = p − lr · d
// With momentum 0 the buffer is neither read nor written.
//
// AdamW, step t = 1, 2, ... counting this update (the caller counts; the kernel does not):
//   p = p · (1 − lr · weight_decay)                       (decoupled weight decay)
//   m = β1 · m + (1 − β1) · g
//   v = β2 · v + (1 − β2) · g²
//   p = p − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps)
// The scalar factors are computed in double, the per-element work in T, as PyTorch does.
//
// Buffers are contiguous with n elements each and must not alias one another. Each update has an
// out-of-place form (`*_out` buffers): it reads the state from the first buffers and writes the new
// state to the others, each of which is its input (the in-place form is that) or overlaps no
// buffer — post-validation's double buffer (step/stage_program.h), which keeps the old state
// without a copy.
// *Reference: the formulas element by element. *Fast: scalars hoisted, branches outside the loop,
// __restrict so the loop vectorizes. Thread-safety: plain functions; concurrent calls on distinct
// parameters are safe. Failure modes: none; a zero step gives 1 − β^0 = 0 and so inf/NaN (the op
// documents that t counts from 1).
//
// Example:
//   kernels::AdamWUpdateFast<float>(p, g, m, v, n, {.weight_decay = 0.1}, /*lr=*/3e-4, /*step=*/1);
#pragma once

#include <cstdint>

namespace sluice::kernels {

struct SgdHyper {
  double momentum = 0;
  double weight_decay = 0;
};

struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // PyTorch's AdamW default
};

template <typename T>
void SgdUpdateReference(T* param, const T* grad, T* momentum_buf, int64_t n, const SgdHyper& h,
                        double lr);
template <typename T>
void SgdUpdateFast(T* param, const T* grad, T* momentum_buf, int64_t n, const SgdHyper& h,
                   double lr);
template <typename T>
void SgdUpdateReference(const T* param, const T* grad, const T* momentum_buf, T* param_out,
                        T* momentum_out, int64_t n, const SgdHyper& h, double lr);
template <typename T>
void SgdUpdateFast(const T* param, const T* grad, const T* momentum_buf, T* param_out,
                   T* momentum_out, int64_t n, const SgdHyper& h, double lr);

template <typename T>
void AdamWUpdateReference(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& h,
                          double lr, double step);
template <typename T>
void AdamWUpdateFast(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& h, double lr,
                     double step);
template <typename T>
void AdamWUpdateReference(const T* param, const T* grad, const T* m, const T* v, T* param_out,
                          T* m_out, T* v_out, int64_t n, const AdamWHyper& h, double lr,
                          double step);
template <typename T>
void AdamWUpdateFast(const T* param, const T* grad, const T* m, const T* v, T* param_out, T* m_out,
                     T* v_out, int64_t n, const AdamWHyper& h, double lr, double step);

}  // namespace sluice::kernels
