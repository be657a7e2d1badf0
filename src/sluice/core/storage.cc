#include "sluice/core/storage.h"

#include <utility>

#include "sluice/core/error.h"
#include "sluice/core/storage_pool.h"

namespace sluice {

std::shared_ptr<Storage> Storage::Create(Allocator& allocator, size_t nbytes) {
  // The Storage and its reference count in one node of the StoragePool (allocate_shared): in
  // steady state a tensor costs no heap allocation besides the allocator's memory. A local class
  // may call the private constructor.
  struct Made final : Storage {
    Made(Allocator* allocator, void* data, size_t nbytes, uintptr_t token)
        : Storage(allocator, data, nbytes, /*owns=*/true, token) {}
  };
  // The control block: a vtable pointer and two 32-bit counts before the object.
  static_assert(sizeof(Made) + 2 * sizeof(void*) <= StoragePool::kNodeBytes);
  uintptr_t token = 0;
  void* data = nbytes > 0 ? allocator.AllocateWithToken(nbytes, &token) : nullptr;
  try {
    return std::allocate_shared<Made>(StorageNodeAllocator<Made>(), &allocator, data, nbytes,
                                      token);
  } catch (...) {
    if (data != nullptr) allocator.DeallocateWithToken(data, nbytes, token);
    throw;
  }
}

std::shared_ptr<Storage> Storage::Borrowed(Allocator& allocator, size_t nbytes) {
  struct Made final : Storage {
    Made(Allocator* allocator, size_t nbytes)
        : Storage(allocator, nullptr, nbytes, /*owns=*/false, /*token=*/0) {}
  };
  return std::allocate_shared<Made>(StorageNodeAllocator<Made>(), &allocator, nbytes);
}

void Storage::Rebind(void* data) {
  SLUICE_CHECK(!owns_, "Rebind of a storage that owns its memory");
  data_ = data;
}

void Storage::SwapMemory(Storage& a, Storage& b) {
  SLUICE_CHECK(a.owns_ && b.owns_, "SwapMemory of a borrowed storage");
  SLUICE_CHECK(a.nbytes_ == b.nbytes_ && a.allocator_ == b.allocator_,
               "SwapMemory of storages of {} and {} bytes{}", a.nbytes_, b.nbytes_,
               a.allocator_ == b.allocator_ ? "" : " from different allocators");
  std::swap(a.data_, b.data_);
  std::swap(a.token_, b.token_);
}

void Storage::Vacate() {
  SLUICE_CHECK(owns_, "Vacate of a borrowed storage");
  if (data_ != nullptr) allocator_->DeallocateWithToken(data_, nbytes_, token_);
  data_ = nullptr;
}

void Storage::Refill() {
  if (nbytes_ > 0) data_ = allocator_->AllocateWithToken(nbytes_, &token_);
}

Storage::~Storage() {
  if (owns_ && data_ != nullptr) allocator_->DeallocateWithToken(data_, nbytes_, token_);
}

}  // namespace sluice
