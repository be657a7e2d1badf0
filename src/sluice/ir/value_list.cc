#include "sluice/ir/value_list.h"

#include <stdexcept>
#include <string>

namespace sluice {

ValueId ValueList::at(size_t i) const {
  if (i >= size_) {
    throw std::out_of_range("ValueList::at: index " + std::to_string(i) + " of " +
                            std::to_string(size_));
  }
  return data()[i];
}

void ValueList::Assign(std::span<const ValueId> ids) {
  if (ids.size() > capacity_) {
    Free();
    Grow(static_cast<uint32_t>(ids.size()));
  }
  std::copy(ids.begin(), ids.end(), data());
  size_ = static_cast<uint32_t>(ids.size());
}

void ValueList::Grow(uint32_t capacity) {
  ValueId* heap = new ValueId[capacity];
  std::copy(begin(), end(), heap);
  if (on_heap()) delete[] heap_;
  heap_ = heap;
  capacity_ = capacity;
}

}  // namespace sluice
