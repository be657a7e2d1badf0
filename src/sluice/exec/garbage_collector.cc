#include "sluice/exec/garbage_collector.h"

#include <fmt/format.h>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"

namespace sluice {

namespace {

const AsyncGcOptions& Validated(const AsyncGcOptions& options) {
  if (options.queue_batches == 0) {
    throw InvalidArgument("async GC: the queue must hold at least one batch (queue_batches = 0)");
  }
  if (options.min_batch_bytes < 0) {
    throw InvalidArgument(
        fmt::format("async GC: min_batch_bytes must be ≥ 0, got {}", options.min_batch_bytes));
  }
  if (options.max_pending_bytes < 0) {
    throw InvalidArgument(
        fmt::format("async GC: max_pending_bytes must be ≥ 0, got {}", options.max_pending_bytes));
  }
  return options;
}

}  // namespace

std::string_view Name(GcMode mode) { return EnumName(kGcModeNames, mode); }

std::optional<GcMode> ParseGcMode(std::string_view name) { return ParseEnum(kGcModeNames, name); }

GcMode ResolveGcMode(GcMode requested, const Allocator& allocator) {
  if (requested != GcMode::kAuto) return requested;
  return allocator.free_cost() == FreeCost::kExpensive ? GcMode::kAsync : GcMode::kSync;
}

std::string DescribeGcMode(GcMode requested, GcMode resolved) {
  if (requested == GcMode::kAuto) return fmt::format("auto ({})", Name(resolved));
  return std::string(Name(resolved));
}

void GarbageBatch::Add(std::shared_ptr<Storage> storage) {
  SLUICE_CHECK(static_cast<size_t>(count_) < handles_.size(),
               "garbage batch of instruction {} is full ({})", tag_, handles_.size());
  if (storage) bytes_ += static_cast<int64_t>(storage->nbytes());
  handles_[count_++] = std::move(storage);
}

void GarbageBatch::Destroy() {
  for (int32_t k = 0; k < count_; ++k) handles_[k].reset();
  count_ = 0;
  bytes_ = 0;
}

AsyncGarbageCollector::AsyncGarbageCollector(AsyncGcOptions options, bool multi_producer)
    : options_(Validated(options)),
      multi_producer_(multi_producer),
      queue_(options.queue_batches),
      worker_([this] { WorkerLoop(); }) {}

AsyncGarbageCollector::~AsyncGarbageCollector() {
  queue_.wait_enqueue(&shutdown_);
  worker_.join();
}

bool AsyncGarbageCollector::Submit(GarbageBatch* batch) {
  MutexLockIf lock(&producer_mu_, multi_producer_);
  const int64_t bytes = batch->bytes();
  const int64_t pending = pending_bytes_.fetch_add(bytes, std::memory_order_acq_rel) + bytes;
  if (pending > options_.max_pending_bytes || !queue_.try_enqueue(batch)) {
    pending_bytes_.fetch_sub(bytes, std::memory_order_acq_rel);
    return false;
  }
  if (pending > pending_peak_) pending_peak_ = pending;
  submitted_since_drain_ = true;
  return true;
}

void AsyncGarbageCollector::Drain() {
  {
    MutexLockIf lock(&producer_mu_, multi_producer_);
    if (submitted_since_drain_) {
      queue_.wait_enqueue(&fence_);
      drained_.acquire();
      submitted_since_drain_ = false;
    }
  }
  std::exception_ptr error;
  {
    MutexLock lock(&error_mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

int64_t AsyncGarbageCollector::TakePendingPeak() {
  MutexLockIf lock(&producer_mu_, multi_producer_);
  const int64_t peak = pending_peak_;
  pending_peak_ = 0;
  return peak;
}

void AsyncGarbageCollector::WorkerLoop() {
  for (;;) {
    GarbageBatch* batch = nullptr;
    queue_.wait_dequeue(batch);
    if (batch == &shutdown_) return;
    if (batch == &fence_) {
      drained_.release();
      continue;
    }
    Destroy(batch);
  }
}

void AsyncGarbageCollector::Destroy(GarbageBatch* batch) {
  GcListener* listener = listener_.load(std::memory_order_acquire);
  const int64_t begin = listener != nullptr ? NowNs() : 0;
  const int32_t storages = batch->count();
  const int64_t bytes = batch->bytes();
  batch->Destroy();
  pending_bytes_.fetch_sub(bytes, std::memory_order_acq_rel);
  batches_destroyed_.fetch_add(1, std::memory_order_acq_rel);
  if (listener == nullptr) return;
  try {
    listener->OnBatchDestroyed(batch->tag(), storages, bytes, begin, NowNs());
  } catch (...) {
    MutexLock lock(&error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

}  // namespace sluice
