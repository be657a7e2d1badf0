// Every schedule kind at P = 2 and 4, each with layers and micro-batches it can run: the cases the
// pipeline tests hold bit for bit against one stage (tests/pipeline/pipeline_engine_test.cc) and
// against the synchronous run (tests/pipeline/interlocked_steps_test.cc).
#pragma once

#include <cstdint>

#include "sluice/schedule/schedules.h"

namespace sluice::testing_support {

struct ScheduleCase {
  pipeline::ScheduleKind kind;
  int stages;
  int layers;
  int64_t microbatches = 4;
};

inline constexpr ScheduleCase kScheduleCases[] = {
    {pipeline::ScheduleKind::kGPipe, 2, 4},
    {pipeline::ScheduleKind::kGPipe, 4, 4},
    {pipeline::ScheduleKind::kOneFOneB, 2, 4},
    {pipeline::ScheduleKind::kOneFOneB, 4, 4},
    {pipeline::ScheduleKind::kZeroBubbleH1, 2, 4},
    {pipeline::ScheduleKind::kZeroBubbleH1, 4, 4},
    {pipeline::ScheduleKind::kZeroBubbleH2, 2, 4},
    {pipeline::ScheduleKind::kZeroBubbleH2, 4, 4},
    {pipeline::ScheduleKind::kInterleaved, 2, 4},
    {pipeline::ScheduleKind::kInterleaved, 4, 8},  // V = 2: 4 and 8 virtual stages
    {pipeline::ScheduleKind::kZeroBubbleV, 2, 4},
    {pipeline::ScheduleKind::kZeroBubbleV, 4, 8, 8},  // M ≥ 2P − 1
    {pipeline::ScheduleKind::kVHalf, 2, 4},
    {pipeline::ScheduleKind::kVHalf, 4, 8, 8},
    {pipeline::ScheduleKind::kVMin, 2, 4},
    {pipeline::ScheduleKind::kVMin, 4, 8, 8},
};

}  // namespace sluice::testing_support
