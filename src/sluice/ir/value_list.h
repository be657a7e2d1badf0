// ValueList: the input or output value ids of one instruction — a small vector that keeps up to
// four ids inline, in the instruction itself, and only longer lists on the heap.
//
// Nearly every instruction takes at most four inputs and gives at most one output, and a program
// of a million instructions would otherwise hold two heap blocks per instruction (docs/
// benchmarks.md, "Setup"). A ValueList reads like a std::vector<ValueId> — size, indexing,
// iteration, push_back, comparison — and converts to a span; it is a value type (copies are deep).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <vector>

namespace sluice {

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

class ValueList {
 public:
  ValueList() = default;
  ValueList(std::initializer_list<ValueId> ids) { Assign(std::span(ids.begin(), ids.size())); }
  // From any list of ids (a std::vector<ValueId> converts implicitly).
  ValueList(std::span<const ValueId> ids) { Assign(ids); }  // NOLINT(google-explicit-constructor)
  ValueList(const std::vector<ValueId>& ids) : ValueList(std::span(ids)) {}  // NOLINT
  ValueList(const ValueList& other) { Assign(other); }
  ValueList(ValueList&& other) noexcept { Steal(other); }
  ValueList& operator=(const ValueList& other) {
    if (this != &other) Assign(other);
    return *this;
  }
  ValueList& operator=(ValueList&& other) noexcept {
    if (this != &other) {
      Free();
      Steal(other);
    }
    return *this;
  }
  ~ValueList() { Free(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const ValueId* data() const { return on_heap() ? heap_ : inline_; }
  ValueId* data() { return on_heap() ? heap_ : inline_; }
  const ValueId* begin() const { return data(); }
  const ValueId* end() const { return data() + size_; }
  ValueId* begin() { return data(); }
  ValueId* end() { return data() + size_; }
  ValueId operator[](size_t i) const { return data()[i]; }
  ValueId& operator[](size_t i) { return data()[i]; }
  // Bounds-checked like std::vector::at (throws std::out_of_range).
  ValueId at(size_t i) const;
  ValueId front() const { return data()[0]; }
  ValueId back() const { return data()[size_ - 1]; }
  operator std::span<const ValueId>() const { return {data(), size_}; }  // NOLINT
  std::vector<ValueId> ToVector() const { return {begin(), end()}; }

  void push_back(ValueId id) {
    if (size_ == capacity_) Grow(2 * capacity_);
    data()[size_++] = id;
  }
  void pop_back() { --size_; }

  bool operator==(const ValueList& other) const {
    return size_ == other.size_ && std::equal(begin(), end(), other.begin());
  }

 private:
  static constexpr uint32_t kInline = 4;

  bool on_heap() const { return capacity_ > kInline; }
  void Assign(std::span<const ValueId> ids);
  void Grow(uint32_t capacity);
  void Free() {
    if (on_heap()) delete[] heap_;
    capacity_ = kInline;
    size_ = 0;
  }
  void Steal(ValueList& other) {
    size_ = other.size_;
    capacity_ = other.capacity_;
    if (other.on_heap()) {
      heap_ = other.heap_;
    } else {
      std::memcpy(inline_, other.inline_, sizeof(inline_));
    }
    other.size_ = 0;
    other.capacity_ = kInline;
  }

  uint32_t size_ = 0;
  uint32_t capacity_ = kInline;  // > kInline: the ids are in heap_
  union {
    ValueId inline_[kInline] = {};
    ValueId* heap_;
  };
};

}  // namespace sluice
