#include "sluice/core/memory_stats.h"

#include <algorithm>

#include "sluice/core/clock.h"

namespace sluice {

namespace {
thread_local const char* current_tag = "";
}  // namespace

ScopedMemoryTag::ScopedMemoryTag(const char* tag) : previous_(current_tag) { current_tag = tag; }
ScopedMemoryTag::~ScopedMemoryTag() { current_tag = previous_; }
const char* ScopedMemoryTag::Current() { return current_tag; }

MemoryStatsRecorder::MemoryStatsRecorder() : origin_ns_(NowNs()) {}

void MemoryStatsRecorder::OnAllocate(int64_t requested_bytes) {
  stats_.allocated_bytes += requested_bytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.num_allocs;
  if (timeline_on_) Record(requested_bytes);
}

void MemoryStatsRecorder::OnFree(int64_t requested_bytes) {
  stats_.allocated_bytes -= requested_bytes;
  ++stats_.num_frees;
  if (timeline_on_) Record(-requested_bytes);
}

void MemoryStatsRecorder::OnReserve(int64_t bytes) {
  OnGrow(bytes);
  ++stats_.num_os_allocs;
}

void MemoryStatsRecorder::OnUnreserve(int64_t bytes) {
  OnShrink(bytes);
  ++stats_.num_os_frees;
}

void MemoryStatsRecorder::OnGrow(int64_t bytes) {
  stats_.reserved_bytes += bytes;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

void MemoryStatsRecorder::OnShrink(int64_t bytes) { stats_.reserved_bytes -= bytes; }

void MemoryStatsRecorder::ResetPeak() {
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void MemoryStatsRecorder::EnableTimeline(bool on) {
  timeline_on_ = on;
  timeline_.clear();
}

void MemoryStatsRecorder::RecordEvent(int64_t delta_bytes, int64_t allocated_after) {
  if (!timeline_on_) return;
  timeline_.push_back({NowNs() - origin_ns_, delta_bytes, allocated_after, current_tag});
}

}  // namespace sluice
