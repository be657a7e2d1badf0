#include "sluice/core/storage.h"

namespace sluice {

std::shared_ptr<Storage> Storage::Create(Allocator& allocator, size_t nbytes) {
  void* data = nbytes > 0 ? allocator.Allocate(nbytes) : nullptr;
  try {
    return std::shared_ptr<Storage>(new Storage(&allocator, data, nbytes));
  } catch (...) {
    if (data != nullptr) allocator.Deallocate(data, nbytes);
    throw;
  }
}

Storage::~Storage() {
  if (data_ != nullptr) allocator_->Deallocate(data_, nbytes_);
}

}  // namespace sluice
