// The type of a value's gradient, one rule shared by autodiff and the ops' VJP rules.
//
// A gradient has its value's type, except that a bf16 value's gradient is f32: mixed precision
// carries gradients in f32, as autocast does; only the operands of the backward products are
// rounded to bf16, by those products' VJP rules (ir/ops/linalg.cc). One exception is a unit
// boundary (GradientSpec::bf16_gradients, autodiff/autodiff.h): there the summed gradient is
// rounded to bf16, and the VJP of the value's producer reads it widened back to this type. After
// the VJPs have run, autodiff lets an op round a gradient that only a product's rounding reads
// where it makes it ("bf16 where it is made", autodiff/autodiff.h): the same bits, never f32 in
// memory.
#pragma once

#include "sluice/ir/op_registry.h"

namespace sluice {

inline TensorType GradientType(const TensorType& t) {
  return {t.dtype == DType::kBF16 ? DType::kF32 : t.dtype, t.shape};
}

}  // namespace sluice
