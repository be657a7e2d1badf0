#include "sluice/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace sluice {

namespace {

double LoadAsDouble(const void* base, int64_t index, DType t) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[index];
    case DType::kF64:
      return static_cast<const double*>(base)[index];
    case DType::kI32:
      return static_cast<const int32_t*>(base)[index];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(base)[index]);
    case DType::kBF16:
      return BF16ToFloat(static_cast<const BFloat16*>(base)[index]);
    case DType::kF16:
      break;
  }
  throw ShapeError(fmt::format("elements of dtype {} cannot be read as numbers", Name(t)));
}

void StoreFromDouble(void* base, int64_t index, DType t, double v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[index] = static_cast<float>(v);
      return;
    case DType::kF64:
      static_cast<double*>(base)[index] = v;
      return;
    case DType::kI32:
      static_cast<int32_t*>(base)[index] = static_cast<int32_t>(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(base)[index] = static_cast<int64_t>(v);
      return;
    case DType::kBF16:  // through f32: v rounded to f32, then to the nearest bf16
      static_cast<BFloat16*>(base)[index] = FloatToBF16(static_cast<float>(v));
      return;
    case DType::kF16:
      break;
  }
  throw ShapeError(fmt::format("elements of dtype {} cannot be written as numbers", Name(t)));
}

}  // namespace

Tensor Tensor::Empty(const Shape& shape, DType dtype, Allocator& allocator) {
  size_t bytes = static_cast<size_t>(shape.numel()) * SizeOf(dtype);
  return Tensor(Storage::Create(allocator, bytes), 0, shape, shape.ContiguousStrides(), dtype);
}

void Tensor::AssignEmpty(const Shape& shape, DType dtype, Allocator& allocator) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * SizeOf(dtype);
  const bool same_layout = dtype_ == dtype && offset_ == 0 && shape_ == shape && is_contiguous();
  if (same_layout && storage_ != nullptr && storage_->vacant() && storage_->nbytes() == bytes &&
      storage_->allocator() == &allocator && storage_.use_count() == 1) {
    storage_->Refill();
    return;
  }
  std::shared_ptr<Storage> storage = Storage::Create(allocator, bytes);
  if (!same_layout) {
    shape_ = shape;
    strides_ = shape.ContiguousStrides();
    offset_ = 0;
    dtype_ = dtype;
  }
  storage_ = std::move(storage);
}

Tensor Tensor::OnStorage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * SizeOf(dtype);
  if (storage == nullptr || storage->nbytes() < bytes) {
    throw ShapeError(fmt::format("a tensor of {}{} ({} bytes) does not fit a storage of {} bytes",
                                 Name(dtype), shape.ToString(), bytes,
                                 storage == nullptr ? 0 : storage->nbytes()));
  }
  return Tensor(std::move(storage), 0, shape, shape.ContiguousStrides(), dtype);
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Allocator& allocator) {
  Tensor t = Empty(shape, dtype, allocator);
  if (t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::Full(const Shape& shape, double value, DType dtype, Allocator& allocator) {
  Tensor t = Empty(shape, dtype, allocator);
  for (int64_t i = 0, n = t.numel(); i < n; ++i) StoreFromDouble(t.raw_data(), i, dtype, value);
  return t;
}

template <typename T>
Tensor Tensor::FromVector(const Shape& shape, const std::vector<T>& values, Allocator& allocator) {
  if (static_cast<int64_t>(values.size()) != shape.numel()) {
    throw ShapeError(fmt::format("FromVector: {} values do not fill shape {} ({} elements)",
                                 values.size(), shape.ToString(), shape.numel()));
  }
  Tensor t = Empty(shape, DTypeOf<T>(), allocator);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}
template Tensor Tensor::FromVector<float>(const Shape&, const std::vector<float>&, Allocator&);
template Tensor Tensor::FromVector<double>(const Shape&, const std::vector<double>&, Allocator&);
template Tensor Tensor::FromVector<int32_t>(const Shape&, const std::vector<int32_t>&, Allocator&);
template Tensor Tensor::FromVector<int64_t>(const Shape&, const std::vector<int64_t>&, Allocator&);

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = shape_.rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void Tensor::ThrowTypeMismatch(DType expected) const {
  if (!defined()) throw ShapeError("access to the data of an undefined tensor");
  throw ShapeError(fmt::format("tensor of dtype {} accessed as {}", Name(dtype_), Name(expected)));
}

int64_t Tensor::LogicalToStorageIndex(int64_t i) const {
  int64_t index = 0;
  for (int d = shape_.rank() - 1; d >= 0; --d) {
    int64_t n = shape_[d];
    index += (i % n) * strides_[d];
    i /= n;
  }
  return index;
}

double Tensor::At(std::span<const int64_t> index) const {
  if (static_cast<int>(index.size()) != rank()) {
    throw ShapeError(
        fmt::format("index of rank {} into tensor of shape {}", index.size(), shape_.ToString()));
  }
  int64_t pos = 0;
  for (int d = 0; d < rank(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d]) {
      throw ShapeError(fmt::format("index {} out of range for dimension {} of shape {}", index[d],
                                   d, shape_.ToString()));
    }
    pos += index[d] * strides_[d];
  }
  return LoadAsDouble(raw_data(), pos, dtype_);
}

double Tensor::FlatAt(int64_t i) const {
  SLUICE_CHECK(i >= 0 && i < numel(), "flat index {} of {}", i, numel());
  return LoadAsDouble(raw_data(), LogicalToStorageIndex(i), dtype_);
}

void Tensor::FlatSet(int64_t i, double value) const {
  SLUICE_CHECK(i >= 0 && i < numel(), "flat index {} of {}", i, numel());
  StoreFromDouble(raw_data(), LogicalToStorageIndex(i), dtype_, value);
}

Tensor Tensor::Reshape(std::span<const int64_t> dims) const {
  std::array<int64_t, kMaxRank> out{};
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    throw ShapeError(
        fmt::format("reshape to rank {} exceeds the maximum rank {}", dims.size(), kMaxRank));
  }
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (inferred >= 0) throw ShapeError("reshape: only one dimension may be -1");
      inferred = static_cast<int>(i);
    } else {
      known *= dims[i];
    }
    out[i] = dims[i];
  }
  if (inferred >= 0) {
    if (known == 0 || numel() % known != 0) {
      throw ShapeError(fmt::format("reshape: cannot infer -1 reshaping {} to [{}]",
                                   shape_.ToString(), fmt::join(dims, ", ")));
    }
    out[inferred] = numel() / known;
  }
  Shape shape(std::span<const int64_t>(out.data(), dims.size()));
  if (shape.numel() != numel()) {
    throw ShapeError(fmt::format("reshape: {} has {} elements but {} has {}", shape_.ToString(),
                                 numel(), shape.ToString(), shape.numel()));
  }
  if (!is_contiguous()) return Clone(*storage_->allocator()).Reshape(dims);
  return Tensor(storage_, offset_, shape, shape.ContiguousStrides(), dtype_);
}

Tensor Tensor::Transpose(int64_t a, int64_t b) const {
  int ia = shape_.Axis(a), ib = shape_.Axis(b);
  Tensor t = *this;
  std::swap(t.shape_[ia], t.shape_[ib]);
  std::swap(t.strides_[ia], t.strides_[ib]);
  return t;
}

Tensor Tensor::Permute(std::span<const int64_t> order) const {
  if (static_cast<int>(order.size()) != rank()) {
    throw ShapeError(fmt::format("permute: order [{}] does not match rank {} of {}",
                                 fmt::join(order, ", "), rank(), shape_.ToString()));
  }
  std::array<bool, kMaxRank> seen{};
  Tensor t = *this;
  for (int i = 0; i < rank(); ++i) {
    int src = shape_.Axis(order[i]);
    if (seen[src]) {
      throw ShapeError(
          fmt::format("permute: axis {} appears twice in [{}]", src, fmt::join(order, ", ")));
    }
    seen[src] = true;
    t.shape_[i] = shape_[src];
    t.strides_[i] = strides_[src];
  }
  return t;
}

Tensor Tensor::Slice(int64_t axis, int64_t start, int64_t end) const {
  int a = shape_.Axis(axis);
  if (start < 0 || end < start || end > shape_[a]) {
    throw ShapeError(fmt::format("slice [{}, {}) out of range for axis {} of shape {}", start, end,
                                 a, shape_.ToString()));
  }
  Tensor t = *this;
  t.shape_[a] = end - start;
  t.offset_ += start * strides_[a];
  return t;
}

Tensor Tensor::Clone(Allocator& allocator) const {
  Tensor out = Empty(shape_, dtype_, allocator);
  out.CopyFrom(*this);
  return out;
}

Tensor Tensor::Contiguous(Allocator& allocator) const {
  return is_contiguous() ? *this : Clone(allocator);
}

void Tensor::CopyFrom(const Tensor& src) const {
  if (src.shape_ != shape_ || src.dtype_ != dtype_) {
    throw ShapeError(fmt::format("copy: source {}{} does not match destination {}{}",
                                 Name(src.dtype_), src.shape_.ToString(), Name(dtype_),
                                 shape_.ToString()));
  }
  const size_t elem = SizeOf(dtype_);
  if (is_contiguous() && src.is_contiguous()) {
    if (nbytes() > 0) std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  char* dst = static_cast<char*>(raw_data());
  const char* from = static_cast<const char*>(src.raw_data());
  for (int64_t i = 0, n = numel(); i < n; ++i) {
    std::memcpy(dst + LogicalToStorageIndex(i) * elem, from + src.LogicalToStorageIndex(i) * elem,
                elem);
  }
}

std::shared_ptr<Storage> Tensor::DetachStorage() {
  std::shared_ptr<Storage> s = std::move(storage_);
  storage_.reset();
  return s;
}

std::string Tensor::ToString(int64_t max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  std::string body;
  const int64_t n = numel();
  const int64_t shown = std::min(n, max_elements);
  // Nested brackets by row-major position.
  for (int64_t i = 0; i < shown; ++i) {
    int64_t rem = i;
    int opens = 0;
    for (int d = rank() - 1; d >= 0 && shape_[d] > 0 && rem % shape_[d] == 0; --d) {
      ++opens;
      rem /= shape_[d];
    }
    if (i > 0) body += opens > 0 ? ", " : ", ";
    body.append(opens, '[');
    // Integers exactly: an i64 past 2^53 rounds as a double, and 2^63 - 1 rounds to 2^63, which
    // no int64_t holds (a cast back was undefined behaviour).
    const int64_t at = LogicalToStorageIndex(i);
    if (dtype_ == DType::kI64) {
      body += fmt::format("{}", static_cast<const int64_t*>(raw_data())[at]);
    } else if (dtype_ == DType::kI32) {
      body += fmt::format("{}", static_cast<const int32_t*>(raw_data())[at]);
    } else {
      body += fmt::format("{:.6g}", LoadAsDouble(raw_data(), at, dtype_));
    }
    int64_t next = i + 1;
    int closes = 0;
    for (int d = rank() - 1; d >= 0 && shape_[d] > 0 && next % shape_[d] == 0; --d) {
      ++closes;
      next /= shape_[d];
    }
    body.append(closes, ']');
  }
  if (shown < n) body += fmt::format(", ... ({} more)", n - shown);
  return fmt::format("Tensor({}{}, {})", Name(dtype_), shape_.ToString(), body);
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.Contiguous(), cb = b.Contiguous();
  return a.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), a.nbytes()) == 0;
}

double MaxRelativeDifference(const Tensor& a, const Tensor& b, double floor) {
  if (a.shape() != b.shape()) {
    throw ShapeError(fmt::format("compare: shapes differ: {} vs {}", a.shape().ToString(),
                                 b.shape().ToString()));
  }
  double worst = 0;
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    double x = a.FlatAt(i), y = b.FlatAt(i);
    double denom = std::max({std::abs(x), std::abs(y), floor});
    worst = std::max(worst, std::abs(x - y) / denom);
  }
  return worst;
}

}  // namespace sluice
