// Helpers shared by the op family files (ir/ops/*.cc); not part of the public API.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/ir/op_registry.h"

namespace sluice::ops {

// Throws ShapeError unless every input has the same floating dtype; returns it.
inline DType SameFloatDType(std::span<const TensorType> in) {
  for (const TensorType& t : in) {
    if (t.dtype != in[0].dtype) {
      throw ShapeError(fmt::format("dtypes differ: {} vs {}", Name(in[0].dtype), Name(t.dtype)));
    }
  }
  if (in[0].dtype != DType::kF32 && in[0].dtype != DType::kF64) {
    throw ShapeError(fmt::format("expected f32 or f64, got {}", Name(in[0].dtype)));
  }
  return in[0].dtype;
}

// Mixed precision's operand rule for an op with bf16 kernels: when the input at bf16_at[0] is bf16,
// every input in bf16_at must be bf16 and every other one f32 (parameters, gradients, statistics);
// returns bf16. Otherwise SameFloatDType.
inline DType MixedFloatDType(std::span<const TensorType> in,
                             std::initializer_list<size_t> bf16_at) {
  if (in[*bf16_at.begin()].dtype != DType::kBF16) return SameFloatDType(in);
  for (size_t i = 0; i < in.size(); ++i) {
    const bool bf16 = std::find(bf16_at.begin(), bf16_at.end(), i) != bf16_at.end();
    const DType want = bf16 ? DType::kBF16 : DType::kF32;
    if (in[i].dtype != want) {
      throw ShapeError(fmt::format("operand {} must be {} beside bf16 operand {}, got {}", i,
                                   Name(want), *bf16_at.begin(), Name(in[i].dtype)));
    }
  }
  return DType::kBF16;
}

inline std::vector<int64_t> ShapeToVector(const Shape& s) {
  return std::vector<int64_t>(s.dims().begin(), s.dims().end());
}

}  // namespace sluice::ops
