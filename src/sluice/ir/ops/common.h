// Helpers shared by the op family files (ir/ops/*.cc); not part of the public API.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <optional>
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

// The dtype of a gradient op's outputs under its optional attribute `dtype`: `computed` (the
// dtype it computes in) when absent or named; "bf16" where `may_round` — the gradient rounded as it
// is stored, for bf16 products alone to read (autodiff/autodiff.h, "bf16 where it is made").
inline DType GradientDTypeAttr(DType computed, const Attrs& attrs, bool may_round) {
  if (!attrs.Has("dtype")) return computed;
  const std::optional<DType> want = ParseDType(attrs.GetString("dtype"));
  if (want != computed && !(want == DType::kBF16 && may_round)) {
    throw ShapeError(fmt::format("dtype '{}' for the gradient: it is {} here{}",
                                 attrs.GetString("dtype"), Name(computed),
                                 may_round ? " or bf16" : ""));
  }
  return *want;
}

inline std::vector<int64_t> ShapeToVector(const Shape& s) {
  return std::vector<int64_t>(s.dims().begin(), s.dims().end());
}

}  // namespace sluice::ops
