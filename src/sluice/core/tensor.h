// Tensor: a typed, shaped view onto a Storage.
//
// A Tensor is storage + offset (elements) + shape + strides (elements) + dtype. Copying a Tensor
// is cheap and shares the storage (like a shared_ptr). Views — Reshape of a contiguous tensor,
// Transpose, Permute, Slice — share the storage of their base, so a view sees writes through its
// base and keeps the memory alive.
//
// A default-constructed Tensor is undefined (defined() == false) and owns nothing.
// Thread-safety: as for std::shared_ptr — distinct Tensor objects may be used from different
// threads; the element data has no synchronization of its own.
//
// Example:
//   Tensor x = Tensor::Zeros({2, 3}, DType::kF32);
//   x.data<float>()[4] = 1.0f;          // x[1, 1]
//   Tensor xt = x.Transpose(0, 1);      // shape [3, 2], strides [1, 3], same storage
//   xt.At({1, 1});                      // 1.0
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/core/dtype.h"
#include "sluice/core/error.h"
#include "sluice/core/shape.h"
#include "sluice/core/storage.h"

namespace sluice {

class Tensor {
 public:
  Tensor() = default;

  // A new contiguous tensor with uninitialized contents.
  static Tensor Empty(const Shape& shape, DType dtype, Allocator& allocator = DefaultAllocator());
  static Tensor Zeros(const Shape& shape, DType dtype, Allocator& allocator = DefaultAllocator());
  // Every element set to `value` (converted to dtype).
  static Tensor Full(const Shape& shape, double value, DType dtype,
                     Allocator& allocator = DefaultAllocator());
  // A contiguous tensor of `shape` on `storage` from its first byte, sharing it (no allocation
  // beyond what the handle costs). Throws ShapeError when the storage is too small.
  static Tensor OnStorage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);
  // A contiguous tensor holding `values` (row-major); values.size() must equal shape.numel().
  template <typename T>
  static Tensor FromVector(const Shape& shape, const std::vector<T>& values,
                           Allocator& allocator = DefaultAllocator());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  // Bytes of the elements this tensor spans when contiguous: numel() * SizeOf(dtype()).
  size_t nbytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const;

  // Pointer to the first element. Throws ShapeError if T does not match dtype().
  template <typename T>
  T* data() const {
    CheckType(DTypeOf<T>());
    return static_cast<T*>(storage_->data()) + offset_;  // checked: T is the element type
  }
  void* raw_data() const {
    return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(SizeOf(dtype_));
  }

  // Element at a multi-index, converted to double (for tests and debugging; slow).
  double At(std::span<const int64_t> index) const;
  double At(std::initializer_list<int64_t> index) const {
    return At(std::span(index.begin(), index.size()));
  }
  // Element i in row-major logical order, converted to double.
  double FlatAt(int64_t i) const;
  // Sets element i in row-major logical order (converted from double).
  void FlatSet(int64_t i, double value) const;

  // Views. Reshape returns a view when the tensor is contiguous and copies otherwise; the new
  // shape must have the same numel (one dimension may be -1 and is inferred).
  Tensor Reshape(std::span<const int64_t> dims) const;
  Tensor Reshape(std::initializer_list<int64_t> dims) const {
    return Reshape(std::span(dims.begin(), dims.size()));
  }
  Tensor Transpose(int64_t a, int64_t b) const;
  Tensor Permute(std::span<const int64_t> order) const;
  // Elements [start, end) along `axis`.
  Tensor Slice(int64_t axis, int64_t start, int64_t end) const;

  // A contiguous copy in new storage from `allocator`.
  Tensor Clone(Allocator& allocator = DefaultAllocator()) const;
  // This tensor if contiguous, otherwise Clone().
  Tensor Contiguous(Allocator& allocator = DefaultAllocator()) const;
  // Copies the elements of `src` (same shape and dtype) into this tensor.
  void CopyFrom(const Tensor& src) const;

  // *this = Empty(shape, dtype, allocator) without the temporary: when this tensor already has
  // `shape` and `dtype`, contiguous from offset 0 (an interpreter's output slot, run after run),
  // only its storage is replaced — and when that storage is vacant (Storage::Vacate), from
  // `allocator`, of the size needed and referenced by this tensor alone, it is refilled instead of
  // made anew. The new memory is allocated before the old reference is dropped; if allocation
  // throws, the tensor is unchanged.
  void AssignEmpty(const Shape& shape, DType dtype, Allocator& allocator = DefaultAllocator());

  // Drops this handle's reference; returns the storage so the caller decides where it dies.
  std::shared_ptr<Storage> DetachStorage();

  // "Tensor(f32[2, 3], [[1, 2, 3], [4, 5, 6]])" with at most `max_elements` shown.
  std::string ToString(int64_t max_elements = 64) const;

 private:
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
         const Strides& strides, DType dtype)
      : storage_(std::move(storage)),
        offset_(offset),
        shape_(shape),
        strides_(strides),
        dtype_(dtype) {}
  // Inline check, out-of-line throw: data<T>() runs several times per instruction.
  void CheckType(DType expected) const {
    if (storage_ == nullptr || dtype_ != expected) ThrowTypeMismatch(expected);
  }
  [[noreturn]] void ThrowTypeMismatch(DType expected) const;
  int64_t LogicalToStorageIndex(int64_t i) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Strides strides_{};
  DType dtype_ = DType::kF32;
};

// True when both tensors have the same shape, dtype and bitwise-identical elements.
bool BitwiseEqual(const Tensor& a, const Tensor& b);
// Largest |a - b| / max(|a|, |b|, floor) over elements (shapes must match).
double MaxRelativeDifference(const Tensor& a, const Tensor& b, double floor = 1e-12);

}  // namespace sluice
