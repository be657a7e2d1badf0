#include "sluice/core/shape.h"

#include <algorithm>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    throw ShapeError(
        fmt::format("shape of rank {} exceeds the maximum rank {}", dims.size(), kMaxRank));
  }
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) {
    if (dims[i] < 0) {
      throw ShapeError(fmt::format("shape dimension {} is negative ({})", i, dims[i]));
    }
    dims_[i] = dims[i];
  }
}

Strides Shape::ContiguousStrides() const {
  Strides s{};
  int64_t acc = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= dims_[i];
  }
  return s;
}

int Shape::Axis(int64_t axis) const {
  int64_t a = axis < 0 ? axis + rank_ : axis;
  if (a < 0 || a >= rank_) {
    throw ShapeError(fmt::format("axis {} is out of range for shape {}", axis, ToString()));
  }
  return static_cast<int>(a);
}

std::string Shape::ToString() const { return fmt::format("[{}]", fmt::join(dims(), ", ")); }

Shape Broadcast(const Shape& a, const Shape& b) {
  int rank = std::max(a.rank(), b.rank());
  std::array<int64_t, kMaxRank> out{};
  for (int i = 0; i < rank; ++i) {
    int ia = a.rank() - rank + i;
    int ib = b.rank() - rank + i;
    int64_t da = ia >= 0 ? a[ia] : 1;
    int64_t db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(fmt::format("cannot broadcast {} with {}: dimension {} is {} vs {}",
                                   a.ToString(), b.ToString(), i - rank, da, db));
    }
    out[i] = da == 1 ? db : da;
  }
  return Shape(std::span<const int64_t>(out.data(), rank));
}

}  // namespace sluice
