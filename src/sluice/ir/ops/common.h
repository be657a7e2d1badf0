// Helpers shared by the op family files (ir/ops/*.cc); not part of the public API.
#pragma once

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

inline std::vector<int64_t> ShapeToVector(const Shape& s) {
  return std::vector<int64_t>(s.dims().begin(), s.dims().end());
}

}  // namespace sluice::ops
