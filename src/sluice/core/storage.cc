#include "sluice/core/storage.h"

#include "sluice/core/error.h"

namespace sluice {

std::shared_ptr<Storage> Storage::Create(Allocator& allocator, size_t nbytes) {
  // The Storage and its reference count in one heap block (make_shared): the only heap allocation
  // of a tensor besides the allocator's. A local class may call the private constructor.
  struct Made final : Storage {
    Made(Allocator* allocator, void* data, size_t nbytes)
        : Storage(allocator, data, nbytes, /*owns=*/true) {}
  };
  void* data = nbytes > 0 ? allocator.Allocate(nbytes) : nullptr;
  try {
    return std::make_shared<Made>(&allocator, data, nbytes);
  } catch (...) {
    if (data != nullptr) allocator.Deallocate(data, nbytes);
    throw;
  }
}

std::shared_ptr<Storage> Storage::Borrowed(Allocator& allocator, size_t nbytes) {
  struct Made final : Storage {
    Made(Allocator* allocator, size_t nbytes)
        : Storage(allocator, nullptr, nbytes, /*owns=*/false) {}
  };
  return std::make_shared<Made>(&allocator, nbytes);
}

void Storage::Rebind(void* data) {
  SLUICE_CHECK(!owns_, "Rebind of a storage that owns its memory");
  data_ = data;
}

Storage::~Storage() {
  if (owns_ && data_ != nullptr) allocator_->Deallocate(data_, nbytes_);
}

}  // namespace sluice
