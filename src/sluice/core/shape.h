// Shape: the dimensions of a tensor, stored inline (no heap allocation) up to kMaxRank.
//
// Glossary used on every kernel and op signature in sluice (docs/glossary.md):
//   B batch, T sequence, C channels, H heads, P stages, M micro-batches, V chunks (virtual stages
//   per rank); the vocabulary size is spelled out: vocab.
//
// A Shape is a value type; copying is cheap. Rank 0 is a scalar with numel() == 1.
// Dimensions are non-negative (zero-sized tensors are allowed).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace sluice {

inline constexpr int kMaxRank = 8;

// Strides in elements, one per dimension (same inline storage as Shape).
using Strides = std::array<int64_t, kMaxRank>;

class Shape {
 public:
  Shape() = default;
  // Throws ShapeError if rank > kMaxRank or a dimension is negative.
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int axis) const { return dims_[axis]; }
  int64_t& operator[](int axis) { return dims_[axis]; }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }

  // Row-major strides of a contiguous tensor of this shape.
  Strides ContiguousStrides() const;

  // Normalizes a possibly negative axis (-1 is the last); throws ShapeError when out of range.
  int Axis(int64_t axis) const;

  // Inline, a plain loop: the executor's and the kernels' equal-shapes checks run per instruction.
  bool operator==(const Shape& other) const {
    if (rank_ != other.rank_) return false;
    for (int i = 0; i < rank_; ++i) {
      if (dims_[i] != other.dims_[i]) return false;
    }
    return true;
  }
  bool operator!=(const Shape& other) const { return !(*this == other); }

  // "[2, 3]"; a scalar prints as "[]".
  std::string ToString() const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// NumPy broadcasting of two shapes (align trailing dimensions; a dimension of 1 stretches).
// Throws ShapeError naming both shapes and the axis that does not fit.
Shape Broadcast(const Shape& a, const Shape& b);

}  // namespace sluice
